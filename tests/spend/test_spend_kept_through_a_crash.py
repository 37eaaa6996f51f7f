"""A paid model call whose record finds the spend ledger down, and whose runner's process then
dies before the ledger is back: the call's spend must still reach the ledger, exactly once,
when the run is resumed elsewhere, and the run's budget must be weighed with it. Kept only in
the dead process's memory, it would be lost for good: the run (and its tenant) could pass a
budget by that call, and every report under-counts it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import pytest_asyncio
from support.pg import fresh_schema
from support.spend import CALL_MICROS, MODEL, Outage, stepper, steps

from onward.errors import BackendUnavailableError, BudgetExceededError
from onward.eventlog import MemoryEventLog, ModelAnswered
from onward.runtime.options import Options
from onward.runtime.providers import Provider
from onward.runtime.runner import AgentRunner
from onward.runtime.spend import PostgresSpendLedger, PriceTable, SpendLedger, SqliteSpendLedger

TENANT = "acme"


@pytest_asyncio.fixture(params=["sqlite", "postgres"])
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SpendLedger]:
    async with AsyncExitStack() as stack:
        opened: SpendLedger
        if request.param == "sqlite":
            opened = await SqliteSpendLedger.open(tmp_path / "spend.db")
        else:
            database_url = request.getfixturevalue("database_url")
            schema = await stack.enter_async_context(fresh_schema(database_url))
            opened = await PostgresSpendLedger.open(database_url, schema=schema)
        async with opened:
            yield opened


def runner_on(log: MemoryEventLog, ledger: SpendLedger, provider: Provider) -> AgentRunner:
    """A runner of a process of its own on the shared stores (a new one: the last one died)."""
    return AgentRunner(
        provider=provider,
        log=log,
        worker="w",
        spend=ledger,
        prices=PriceTable({MODEL: (1, 5)}),
    )


async def answers(log: MemoryEventLog, run_id: str) -> list[int]:
    return [s.event.seq for s in await log.read_run(run_id) if isinstance(s.event, ModelAnswered)]


async def test_a_call_paid_while_the_ledger_was_down_is_recorded_once_after_a_crash(
    ledger: SpendLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, model = MemoryEventLog(), steps(finish_after=2)
    outage = Outage(ledger, monkeypatch)
    budget = Options(budget_micros=10 * CALL_MICROS).recorded()
    with pytest.raises(BackendUnavailableError):
        await runner_on(log, ledger, model).run(
            stepper(), "go", tenant=TENANT, run_id="blink", options=budget
        )
    assert outage.began
    outage.end()  # the ledger is back; the runner that kept the entry is gone

    result = await runner_on(log, ledger, model).resume(stepper(), "blink", tenant=TENANT)
    assert result.status == "completed", result
    spent = await ledger.run_total("blink")
    assert spent.calls == model.calls, "a call the provider was paid for is not in the ledger"
    assert spent.micros == model.calls * CALL_MICROS == result.spend_micros
    assert [e.seq for e in await ledger.entries("blink")] == await answers(log, "blink")
    assert (await ledger.tenant_total(TENANT)).micros == spent.micros

    # Resumed again (a settled run): nothing is counted twice.
    again = await runner_on(log, ledger, model).resume(stepper(), "blink", tenant=TENANT)
    assert again.spend_micros == spent.micros
    assert await ledger.tenant_total(TENANT) == spent


async def test_a_budget_is_weighed_with_the_call_paid_while_the_ledger_was_down(
    ledger: SpendLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run may spend one and a half calls. Its first call is paid while the ledger is
    down and its runner then dies; resumed, the run must stop before a second call, which
    would pass the budget, rather than see nothing spent and make it."""
    log, model = MemoryEventLog(), steps()
    outage = Outage(ledger, monkeypatch)
    budget = Options(budget_micros=CALL_MICROS + CALL_MICROS // 2).recorded()
    with pytest.raises(BackendUnavailableError):
        await runner_on(log, ledger, model).run(
            stepper(), "go", tenant=TENANT, run_id="tight", options=budget
        )
    outage.end()

    with pytest.raises(BudgetExceededError):
        await runner_on(log, ledger, model).resume(stepper(), "tight", tenant=TENANT)
    spent = await ledger.run_total("tight")
    assert model.calls == 1
    assert spent.micros == model.calls * CALL_MICROS
