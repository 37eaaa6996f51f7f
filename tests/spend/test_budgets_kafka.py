"""Budgets on the production backend: Kafka for the log, PostgreSQL for the spend ledger (and
frontiers), Redis for leases. The run stops before the call that would pass its budget, and
``onward inspect`` against the same deployment prints its spend in micros."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from support.deployment import kafka_settings
from support.servers import KafkaServers
from support.spend import (
    CALL_MICROS,
    PRICES,
    Outage,
    a_crowd_never_passes_its_tenants_budget,
    stepper,
    steps,
    stops_before_the_call_that_would_pass_its_budget,
)
from typer.testing import CliRunner

from onward.errors import BackendUnavailableError
from onward.eventlog import ModelAnswered
from onward.runtime.backends import open_backends
from onward.runtime.cli import app as cli
from onward.runtime.options import Options
from onward.runtime.spend import PostgresSpendLedger

pytestmark = pytest.mark.kafka
PARTITIONS = 3


async def test_on_kafka_a_run_stops_before_the_call_that_would_pass_its_budget(
    kafka_servers: KafkaServers,
) -> None:
    async with kafka_servers.log(partitions=PARTITIONS):
        pass  # the events topic, created once, as a deployment creates it
    settings = kafka_settings(kafka_servers, PARTITIONS, model_prices=PRICES)
    async with open_backends(settings) as backends:
        assert isinstance(backends.spend, PostgresSpendLedger)
        run_id = await stops_before_the_call_that_would_pass_its_budget(backends)

    def inspect(*extra: str) -> tuple[int, str, str]:
        env = kafka_servers.env(partitions=PARTITIONS)
        result = CliRunner().invoke(cli, ["inspect", run_id, "--tenant", "acme", *extra], env=env)
        return result.exit_code, result.stdout, result.stderr

    code, out, err = await asyncio.to_thread(inspect)
    assert code == 0, err
    spend_line = next(line for line in out.splitlines() if line.startswith("spend"))
    assert spend_line.split() == ["spend", str(2 * CALL_MICROS), "micros", "(2", "calls)"]
    code, out, err = await asyncio.to_thread(inspect, "--json")
    assert code == 0, err
    assert json.loads(out)["spend"] == {"micros": 2 * CALL_MICROS, "calls": 2}


async def test_on_kafka_runs_of_one_tenant_calling_at_once_never_pass_its_budget_together(
    kafka_servers: KafkaServers,
) -> None:
    async with kafka_servers.log(partitions=PARTITIONS):
        pass
    settings = kafka_settings(kafka_servers, PARTITIONS, model_prices=PRICES)
    async with open_backends(settings) as backends:
        await a_crowd_never_passes_its_tenants_budget(backends)


async def test_on_kafka_a_call_paid_while_the_ledger_was_down_is_recorded_after_a_crash(
    kafka_servers: KafkaServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger stops answering at a paid call's record and its runner is gone before the
    ledger is back: another runner's resume records the call from the log, once."""
    async with kafka_servers.log(partitions=PARTITIONS):
        pass
    settings = kafka_settings(kafka_servers, PARTITIONS, model_prices=PRICES)
    run_id = f"blink-{uuid.uuid4().hex[:8]}"
    async with open_backends(settings) as backends:
        ledger = backends.spend
        assert ledger is not None
        model = steps(finish_after=2)
        outage = Outage(ledger, monkeypatch)
        budget = Options(budget_micros=10 * CALL_MICROS).recorded()
        with pytest.raises(BackendUnavailableError):
            await backends.runner(model).run(
                stepper(), "go", tenant="acme", run_id=run_id, options=budget
            )
        outage.end()
        result = await backends.runner(model).resume(stepper(), run_id, tenant="acme")
        assert result.status == "completed", result
        assert (await ledger.run_total(run_id)).calls == model.calls == 2
        answers = [
            s.event.seq
            for s in await backends.log.read_run(run_id)
            if isinstance(s.event, ModelAnswered)
        ]
        assert [e.seq for e in await ledger.entries(run_id)] == answers
