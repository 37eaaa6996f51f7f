"""Budgets on the production backend: Kafka for the log, PostgreSQL for the spend ledger (and
frontiers), Redis for leases. The run stops before the call that would pass its budget, and
``onward inspect`` against the same deployment prints its spend in micros."""

from __future__ import annotations

import asyncio
import json

import pytest
from support.deployment import kafka_settings
from support.servers import KafkaServers
from support.spend import (
    CALL_MICROS,
    PRICES,
    a_crowd_never_passes_its_tenants_budget,
    stops_before_the_call_that_would_pass_its_budget,
)
from typer.testing import CliRunner

from onward.runtime.backends import open_backends
from onward.runtime.cli import app as cli
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
