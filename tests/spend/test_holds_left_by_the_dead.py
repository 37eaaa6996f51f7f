"""Holds a worker left dying mid-call, when something else was written to the run before it
was resumed: the resume's claim then does not take the seq the dead call was held under, and
the hold must still be dropped, not count against the run's budget until its end (or, for a
run carried on into another, for ever against its tenant's)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from support.crashes import Crash
from support.spend import (
    CALL_MICROS,
    MODEL,
    PRICES,
    DiesMidCall,
    dead_runner_on,
    stepper,
    steps,
)

from onward.errors import BackendUnavailableError
from onward.eventlog import Tagged
from onward.runtime.backends import Backends, open_backends
from onward.runtime.continuation import ContinuationPolicy
from onward.runtime.options import Options
from onward.runtime.settings import Settings
from onward.runtime.spend import SpendEntry

TENANT = "acme"


@pytest_asyncio.fixture
async def sqlite(tmp_path: Path) -> AsyncIterator[Backends]:
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db", model_prices=PRICES)
    async with open_backends(settings) as backends:
        yield backends


@pytest_asyncio.fixture(params=["sqlite", "memory"])
async def embedded(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backends]:
    settings = Settings(
        backend=request.param, sqlite_path=tmp_path / "onward.db", model_prices=PRICES
    )
    async with open_backends(settings, in_process=request.param == "memory") as backends:
        yield backends


async def test_a_hold_left_mid_call_is_dropped_on_resume_after_a_person_tagged_the_run(
    embedded: Backends,
) -> None:
    """The run may spend two calls (4000 micros). Its first holder dies in its first call,
    holding that call's estimate under seq 2; a person then tags the run (seq 2 is the tag's
    now), and the resume's claim takes seq 3. The dead call's hold must go with the claim, or
    the second call of the resumed run (4000 with it) is refused over a budget it fits."""
    ledger = embedded.spend
    assert ledger is not None
    model = DiesMidCall()
    agent = stepper()
    dead = dead_runner_on(embedded, model)
    budget = Options(budget_micros=2 * CALL_MICROS).recorded()
    with pytest.raises(Crash):
        await dead.run(agent, "go", tenant=TENANT, run_id="left", options=budget)
    probe = SpendEntry(run_id="probe", tenant=TENANT, seq=1, model=MODEL)
    assert (await ledger.hold(probe)).tenant_micros > 0  # the dead call's estimate

    runner = embedded.runner(model)
    tagged = await runner.tag("left", "looked at", tenant=TENANT, seq=1, by="ops")
    assert tagged == 1
    events = [s.event for s in await embedded.log.read_run("left")]
    assert isinstance(events[-1], Tagged)
    assert events[-1].seq == 2  # the seq the dead call was held under

    result = await runner.resume(agent, "left", tenant=TENANT)
    assert result.status == "completed", result
    assert result.spend_micros == 2 * CALL_MICROS
    assert (await ledger.hold(probe)).tenant_micros == 2 * CALL_MICROS  # nothing held


async def test_a_run_carried_on_into_another_leaves_nothing_held(
    sqlite: Backends, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose first holder died mid-call is resumed while the ledger does not answer,
    so the claim cannot drop the dead call's hold, and is then carried on into a new run:
    its `RunContinued` ends it, and must drop what it holds as a `RunFinished` does, or the
    hold counts against the tenant's budget for ever (the run never ends otherwise)."""
    ledger = sqlite.spend
    assert ledger is not None
    agent = stepper(tenant_budget_micros=10**9)
    with pytest.raises(Crash):
        await dead_runner_on(sqlite, DiesMidCall()).run(agent, "go", tenant=TENANT, run_id="left")
    probe = SpendEntry(run_id="probe", tenant=TENANT, seq=1, model=MODEL)
    assert (await ledger.hold(probe)).tenant_micros > 0  # the dead call's estimate

    lost = {"once": True}
    release, release_run = ledger.release, ledger.release_run

    def unreachable_once() -> None:
        if lost.pop("once", False):
            raise BackendUnavailableError("the spend ledger did not answer")

    async def release_once(run_id: str, seq: int) -> None:
        unreachable_once()
        await release(run_id, seq)

    async def release_run_once(run_id: str) -> int:
        unreachable_once()
        return await release_run(run_id)

    monkeypatch.setattr(ledger, "release", release_once)
    monkeypatch.setattr(ledger, "release_run", release_run_once)
    runner = sqlite.runner(steps(finish_after=4))
    runner.continuation = ContinuationPolicy(max_steps=4)
    result = await runner.resume(agent, "left", tenant=TENANT)
    assert not lost  # the claim's release failed
    assert result.status == "completed"
    assert result.run_id != "left"  # carried on
    left = await runner.inspect("left", tenant=TENANT)
    assert left.status == "continued", left
    spent = (await ledger.tenant_total(TENANT)).micros
    assert spent == 4 * CALL_MICROS
    assert (await ledger.hold(probe)).tenant_micros == spent  # nothing held any more


async def test_holds_of_a_run_that_ended_while_the_ledger_was_down_are_dropped_later(
    embedded: Backends, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run holding a dead call's estimate is ended (a person cancels it) while the ledger
    does not answer, so its end cannot drop the hold. Nothing claims a run that ended, so the
    hold must be dropped once the ledger answers again (here at the tenant's next run), or it
    counts against the tenant's budget for good."""
    ledger = embedded.spend
    assert ledger is not None
    agent = stepper(tenant_budget_micros=10**9)
    with pytest.raises(Crash):
        await dead_runner_on(embedded, DiesMidCall()).run(agent, "go", tenant=TENANT, run_id="left")
    probe = SpendEntry(run_id="probe", tenant=TENANT, seq=1, model=MODEL)
    assert (await ledger.hold(probe)).tenant_micros > 0  # the dead call's estimate

    lost = {"once": True}
    release_run = ledger.release_run

    async def release_run_once(run_id: str) -> int:
        if lost.pop("once", False):
            raise BackendUnavailableError("the spend ledger did not answer")
        return await release_run(run_id)

    monkeypatch.setattr(ledger, "release_run", release_run_once)
    runner = embedded.runner(steps(finish_after=2))
    await runner.cancel("left", tenant=TENANT, by="ops", why="given up on")
    assert not lost  # the end's release failed
    assert (await runner.inspect("left", tenant=TENANT)).status == "cancelled"

    result = await runner.run(agent, "go again", tenant=TENANT, run_id="next")
    assert result.status == "completed", result
    spent = (await ledger.tenant_total(TENANT)).micros
    assert spent == 2 * CALL_MICROS
    assert (await ledger.hold(probe)).tenant_micros == spent  # nothing held any more


async def test_a_call_answered_while_the_ledger_was_down_is_still_counted(
    embedded: Backends, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The provider answers the run's first call (it is paid for), but the ledger does not
    answer its record. The answer is written all the same (asked for again, it would be paid
    for twice) and the call counted once the ledger is back, here at the run's next call:
    lost, the run would pass its budget by a call each time the ledger blinks."""
    ledger = embedded.spend
    assert ledger is not None
    model = steps(finish_after=2)
    agent = stepper()
    lost = {"once": True}
    record = ledger.record

    async def record_once(entry: SpendEntry) -> bool:
        if lost.pop("once", False):
            raise BackendUnavailableError("the spend ledger did not answer")
        return await record(entry)

    monkeypatch.setattr(ledger, "record", record_once)
    runner = embedded.runner(model)
    budget = Options(budget_micros=10 * CALL_MICROS).recorded()
    result = await runner.run(agent, "go", tenant=TENANT, run_id="blink", options=budget)
    assert not lost
    assert result.status == "completed", result
    assert model.calls == 2
    assert (await ledger.run_total("blink")).calls == 2
    assert result.spend_micros == 2 * CALL_MICROS
