"""OnwardDurability and spend, on embedded SQLite: each model call counted once in the ledger,
and budgets held before a call as the runner holds them for its own runs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic_ai import Agent
from pydantic_ai.models.function import FunctionModel
from support.spend import Outage
from support.stores import Stores

from integrations.pydantic_ai.world import (
    TENANT,
    Crash,
    Faults,
    Script,
    booking_agent,
    durability_on,
)
from onward.errors import (
    BackendUnavailableError,
    BudgetExceededError,
    ConfigurationError,
    InvalidInputError,
)
from onward.eventlog import Event, ModelAnswered, RunFinished, RunStarted
from onward.integrations.pydantic_ai import DurableRunResult, OnwardDurability
from onward.runtime.demo_ledger import Ledger
from onward.runtime.spend import PriceTable, SpendEntry, SqliteSpendLedger

RUN = "r-1"


@pytest.fixture
async def spend(tmp_path: Path) -> AsyncIterator[SqliteSpendLedger]:
    async with SqliteSpendLedger(tmp_path / "onward.db") as ledger:
        yield ledger


def priced(script: Script, input_micros: str, output_micros: str) -> PriceTable:
    """Prices for the model `booking_agent` builds around ``script`` (by its name)."""
    return PriceTable({FunctionModel(script.answer).model_name: (input_micros, output_micros)})


async def events(stores: Stores, run_id: str = RUN) -> list[Event]:
    return [stored.event for stored in await stores.log.read_run(run_id)]


async def booked(
    durability: OnwardDurability[None], ledger: Ledger, script: Script, **budgets: int
) -> DurableRunResult:
    """Run `booking_agent` around ``script`` as run `RUN`, with these budgets."""
    agent = booking_agent(durability, ledger, script)
    return await durability.run(agent, "book seat 3A", run_id=RUN, **budgets)


async def first_call_cost(
    stores: Stores, spend: SqliteSpendLedger, ledger: Ledger, prices: PriceTable
) -> int:
    """What the script's first model call costs at ``prices``, from an unbudgeted run of the
    same script (the model's usage is the same whenever it is asked the same)."""
    durability = durability_on(stores, worker="here", spend=spend, prices=prices)
    done = await durability.run(booking_agent(durability, ledger), "book seat 3A", run_id="free")
    assert done.status == "completed"
    return (await spend.entries("free"))[0].micros


async def test_each_model_answer_is_counted_in_the_spend_ledger_once(
    stores: Stores, spend: SqliteSpendLedger, ledger: Ledger
) -> None:
    """Counted under the seq of its answer, at the price of the agent's model, recorded before
    the answer, never again when a resume replays it."""
    script = Script(faults=Faults({"second_answer"}))
    durability = durability_on(stores, worker="here", spend=spend, prices=priced(script, "2", "5"))
    with pytest.raises(Crash):
        await booked(durability, ledger, script)
    assert [e.seq for e in await spend.entries(RUN)] == [
        e.seq for e in await events(stores) if isinstance(e, ModelAnswered)
    ]
    done = await durability.resume(booking_agent(durability, ledger, script), RUN)
    assert done.status == "completed"
    entries = await spend.entries(RUN)
    answers = [e for e in await events(stores) if isinstance(e, ModelAnswered)]
    assert script.asked == 3  # the first answer was replayed on resume, not asked again
    assert len(answers) == 2
    model_name = FunctionModel(script.answer).model_name
    assert [(e.seq, e.model, e.input_tokens, e.output_tokens) for e in entries] == [
        (a.seq, model_name, a.usage.input_tokens, a.usage.output_tokens) for a in answers
    ]
    assert all(a.usage.input_tokens > 0 for a in answers)
    assert [e.micros for e in entries] == [
        2 * a.usage.input_tokens + 5 * a.usage.output_tokens for a in answers
    ]
    total = await spend.run_total(RUN)
    assert total.calls == 2
    assert total.micros == sum(e.micros for e in entries)
    assert (await spend.tenant_total(TENANT)).micros == total.micros


async def test_a_run_budget_stops_the_call_that_would_pass_it_and_the_run_fails(
    stores: Stores, spend: SqliteSpendLedger, ledger: Ledger
) -> None:
    """Output priced, input free: the first call is estimated at nothing and made; the second
    at the run's mean output, which the budget (exactly the first call's cost) has no room for."""
    prices = priced(Script(), "0", "1")
    budget = await first_call_cost(stores, spend, ledger, prices)
    assert budget > 0
    script = Script()
    durability = durability_on(stores, worker="here", spend=spend, prices=prices)
    with pytest.raises(BudgetExceededError) as refused:
        await booked(durability, ledger, script, budget_micros=budget)
    assert refused.value.scope == "run"
    assert script.asked == 1
    recorded = await events(stores)
    started, finished = recorded[0], recorded[-1]
    assert isinstance(started, RunStarted)
    assert started.options["budget_micros"] == budget
    assert isinstance(finished, RunFinished)
    assert finished.status == "failed"
    assert finished.error is not None
    assert finished.error.startswith("BudgetExceededError")
    total = await spend.run_total(RUN)
    assert (total.calls, total.micros) == (1, budget)
    # Nothing is left held for the call that was not made: a hold of nothing more fits the
    # budget only if the run's recorded spend is all it has.
    probe = SpendEntry(run_id=RUN, tenant=TENANT, seq=1_000, model="probe")
    assert (await spend.hold(probe, run_budget=budget)).held
    await spend.release(RUN, 1_000)


async def test_a_resumed_run_keeps_the_budget_it_was_started_with(
    stores: Stores, spend: SqliteSpendLedger, ledger: Ledger
) -> None:
    """Killed in its (retry-safe) tool before the second call, the run is resumed by a fresh
    capability: the budget its `RunStarted` recorded stops that call."""
    prices = priced(Script(), "0", "1")
    budget = await first_call_cost(stores, spend, ledger, prices)
    script = Script(faults=Faults({"after_effect"}))

    def agent_of(durability: OnwardDurability[None]) -> Agent[None, object]:
        return booking_agent(durability, ledger, script, book_options={"retry_safe": True})

    durability = durability_on(stores, worker="here", spend=spend, prices=prices)
    with pytest.raises(Crash):
        await durability.run(agent_of(durability), "book seat 3A", run_id=RUN, budget_micros=budget)
    assert script.asked == 1
    again = durability_on(stores, worker="there", spend=spend, prices=prices)
    with pytest.raises(BudgetExceededError):
        await again.resume(agent_of(again), RUN)
    assert script.asked == 1  # the first answer replayed; the second call never made
    finished = (await events(stores))[-1]
    assert isinstance(finished, RunFinished)
    assert finished.status == "failed"
    assert (await spend.run_total(RUN)).calls == 1


async def test_a_tenant_budget_its_other_runs_used_up_stops_the_first_call(
    stores: Stores, spend: SqliteSpendLedger, ledger: Ledger
) -> None:
    prices = priced(Script(), "0", "1")
    await first_call_cost(stores, spend, ledger, prices)
    spent = (await spend.tenant_total(TENANT)).micros
    script = Script()
    durability = durability_on(stores, worker="here", spend=spend, prices=prices)
    with pytest.raises(BudgetExceededError) as refused:
        await booked(durability, ledger, script, tenant_budget_micros=spent - 1)
    assert refused.value.scope == "tenant"
    assert script.asked == 0
    assert (await spend.tenant_total(TENANT)).micros == spent


async def test_a_budget_that_could_not_be_kept_is_refused_before_anything_is_written(
    stores: Stores, spend: SqliteSpendLedger, ledger: Ledger
) -> None:
    unledgered = durability_on(stores, worker="here")
    with pytest.raises(ConfigurationError, match="no spend ledger"):
        await unledgered.run(booking_agent(unledgered, ledger), "go", run_id=RUN, budget_micros=100)
    unpriced = durability_on(stores, worker="here", spend=spend)
    with pytest.raises(ConfigurationError):
        await unpriced.run(booking_agent(unpriced, ledger), "go", run_id=RUN, budget_micros=100)
    with pytest.raises(InvalidInputError, match="tenant_budget_micros"):
        await unpriced.run(
            booking_agent(unpriced, ledger), "go", run_id=RUN, tenant_budget_micros=-1
        )
    assert await events(stores) == []


async def test_a_model_call_that_raises_gives_its_hold_back(
    stores: Stores, spend: SqliteSpendLedger, ledger: Ledger
) -> None:
    budget = 1_000_000
    script = Script(faults=Faults({"second_answer"}))  # raised inside the second call
    durability = durability_on(stores, worker="here", spend=spend, prices=priced(script, "1", "1"))
    with pytest.raises(Crash):
        await booked(durability, ledger, script, budget_micros=budget)
    recorded = (await spend.run_total(RUN)).micros
    assert 0 < recorded < budget
    # The rest of the budget can be held whole only if the failed call's hold is gone.
    rest = SpendEntry(run_id=RUN, tenant=TENANT, seq=1_000, model="probe", micros=budget - recorded)
    assert (await spend.hold(rest, run_budget=budget)).held


async def _dies_in_second_call(
    stores: Stores,
    spend: SqliteSpendLedger,
    ledger: Ledger,
    prices: PriceTable,
    run_id: str,
    budget: int,
) -> Script:
    """Run `booking_agent` as ``run_id`` in a process that dies waiting for the second answer,
    leaving the hold of that call behind (a dead process releases nothing)."""
    script = Script(faults=Faults({"second_answer"}))
    dead = durability_on(stores, worker="dead", spend=spend, prices=prices)

    async def died(run_id: str, seq: int) -> None:
        return None

    dead._runs.runner.release_hold = died  # type: ignore[method-assign]
    agent = booking_agent(dead, ledger, script)
    with pytest.raises(Crash):
        await dead.run(agent, "book seat 3A", run_id=run_id, budget_micros=budget)
    return script


async def test_a_hold_a_worker_left_dying_mid_call_is_released_when_the_run_resumes(
    stores: Stores, spend: SqliteSpendLedger, ledger: Ledger
) -> None:
    """As the runner's resume does: the claim takes the seq the lost answer would have taken,
    and the hold the dead worker left there is released, so it does not count against the
    run's budget beside the hold of the call made again in its place."""
    prices = priced(Script(), "1", "1")
    await _dies_in_second_call(stores, spend, ledger, prices, "scout", 10**9)
    first = (await spend.run_total("scout")).micros
    probe = SpendEntry(run_id="probe", tenant=TENANT, seq=1, model="probe")
    left_held = (await spend.hold(probe)).tenant_micros - first
    assert first > 0
    assert left_held > 0  # the estimate of the call the process died in
    # Room for the first call and one more estimated as the lost one was, no more.
    script = await _dies_in_second_call(stores, spend, ledger, prices, RUN, first + left_held)
    again = durability_on(stores, worker="there", spend=spend, prices=prices)
    done = await again.resume(booking_agent(again, ledger, script), RUN)
    assert done.status == "completed"
    assert script.asked == 3
    assert (await spend.run_total(RUN)).calls == 2


async def test_a_call_paid_while_the_ledger_was_down_is_counted_after_a_crash(
    stores: Stores, spend: SqliteSpendLedger, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger stops answering at the first answer's record, and the run stops at its next
    call's hold; its process is gone before the ledger is back. Resumed by another, each
    call the model was paid for is counted once: the first too, which only the dead process
    kept."""
    script = Script()
    outage = Outage(spend, monkeypatch)
    prices = priced(script, "2", "5")
    durability = durability_on(stores, worker="here", spend=spend, prices=prices)
    with pytest.raises(BackendUnavailableError):
        await booked(durability, ledger, script, budget_micros=10**9)
    assert outage.began
    outage.end()

    again = durability_on(stores, worker="there", spend=spend, prices=prices)
    done = await again.resume(booking_agent(again, ledger, script), RUN)
    assert done.status == "completed"
    answers = [e for e in await events(stores) if isinstance(e, ModelAnswered)]
    entries = await spend.entries(RUN)
    assert (await spend.run_total(RUN)).calls == script.asked, "a paid call is not counted"
    assert [(e.seq, e.input_tokens) for e in entries] == [
        (a.seq, a.usage.input_tokens) for a in answers
    ]


async def test_a_claim_the_ledger_did_not_answer_leaves_nothing_kept_once_the_run_is_let_go(
    stores: Stores, spend: SqliteSpendLedger, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long-lived worker resumes runs that wait on a person while the ledger is down: the
    answers still to check are the holding's, and go with it, not kept by the runner for
    every run it ever claimed."""
    script = Script()
    prices = priced(script, "2", "5")
    durability = durability_on(stores, worker="here", spend=spend, prices=prices)
    agent = booking_agent(durability, ledger, script, requires_approval=True)
    waiting = await durability.run(agent, "book seat 3A", run_id=RUN, budget_micros=10**9)
    assert waiting.status == "waiting"
    outage = Outage(spend, monkeypatch)
    outage.began = outage.down = True

    again = await durability.resume(agent, RUN)

    assert again.status == "waiting"
    assert durability._runs.runner._answers_to_check == {}, "kept after the run was let go"
