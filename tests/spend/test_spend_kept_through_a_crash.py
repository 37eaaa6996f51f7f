"""A paid model call whose record finds the spend ledger down, and whose runner's process then
dies before the ledger is back: the call's spend must still reach the ledger, exactly once,
when the run is resumed elsewhere, and the run's budget must be weighed with it. Kept only in
the dead process's memory, it would be lost for good: the run (and its tenant) could pass a
budget by that call, and every report under-counts it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import pytest_asyncio
from support.crashes import Crash
from support.pg import fresh_schema
from support.spend import (
    CALL_MICROS,
    IN,
    MODEL,
    OUT,
    PRICES,
    DeadRunner,
    Outage,
    stepper,
    steps,
)

from onward.errors import BackendUnavailableError, BudgetExceededError
from onward.eventlog import (
    MemoryEventLog,
    Message,
    ModelAnswered,
    RunClaimed,
    RunStarted,
    SqliteEventLog,
    TurnSettled,
    Usage,
)
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.log_projector import LogProjector
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.backends import Backends, open_backends
from onward.runtime.continuation import ContinuationPolicy
from onward.runtime.options import Options
from onward.runtime.providers import Provider
from onward.runtime.runner import AgentRunner
from onward.runtime.settings import Settings
from onward.runtime.spend import (
    PostgresSpendLedger,
    PriceTable,
    SpendEntry,
    SpendLedger,
    SqliteSpendLedger,
)
from onward.runtime.writer import HeldRun
from onward.testing.eventlog import Envelope

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


class DiesAfterRecording(AgentRunner):
    """A runner whose process dies right after a call's spend is recorded, before its answer
    is written: the ledger keeps an entry under a seq the log never holds an answer at."""

    async def record_spend(self, run: HeldRun, answered: ModelAnswered) -> None:
        await super().record_spend(run, answered)
        raise Crash("the process died before the answer was written")


async def test_a_call_cut_off_after_its_record_does_not_hide_one_whose_entry_was_lost(
    ledger: SpendLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two crashes and an outage on one run. Its first call is recorded and its process dies
    before the answer is written; its second is answered while the ledger is down and that
    process dies too. The ledger then has as many entries (and tokens) as the log has answers,
    but not the second call's: resumed, the run must count both paid calls and stop before a
    third, which would pass its budget of two and a half."""
    log, model = MemoryEventLog(), steps()
    budget = Options(budget_micros=2 * CALL_MICROS + CALL_MICROS // 2).recorded()
    first = DiesAfterRecording(
        provider=model, log=log, worker="w", spend=ledger, prices=PriceTable({MODEL: (1, 5)})
    )
    with pytest.raises(Crash):
        await first.run(stepper(), "go", tenant=TENANT, run_id="twice", options=budget)
    assert await answers(log, "twice") == []
    assert (await ledger.run_total("twice")).calls == 1

    outage = Outage(ledger, monkeypatch)
    with pytest.raises(BackendUnavailableError):
        await runner_on(log, ledger, model).resume(stepper(), "twice", tenant=TENANT)
    assert outage.began
    outage.end()
    assert model.calls == 2
    assert len(await answers(log, "twice")) == 1

    with pytest.raises(BudgetExceededError):
        await runner_on(log, ledger, model).resume(stepper(), "twice", tenant=TENANT)
    assert model.calls == 2, "a third call was made: the budget was passed"
    spent = await ledger.run_total("twice")
    assert spent.calls == model.calls, "a call the provider was paid for is not in the ledger"
    assert spent.micros == model.calls * CALL_MICROS
    assert (await ledger.tenant_total(TENANT)).micros == spent.micros


class DeadAfterRecording(DeadRunner):
    """`DiesAfterRecording` on a deployment's stores, leaving its lease and holds as a dead
    process does."""

    async def record_spend(self, run: HeldRun, answered: ModelAnswered) -> None:
        await super().record_spend(run, answered)
        raise Crash("the process died before the answer was written")


@pytest_asyncio.fixture(params=["sqlite", "memory"])
async def embedded(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backends]:
    settings = Settings(
        backend=request.param, sqlite_path=tmp_path / "onward.db", model_prices=PRICES
    )
    async with open_backends(settings, in_process=request.param == "memory") as backends:
        yield backends


async def test_a_lost_entry_is_found_through_the_runs_transcript(
    embedded: Backends, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same two crashes and outage, on a deployment with frontier rows: the resume learns
    the run's answers from the transcript its claim reads, not from the log."""
    ledger = embedded.spend
    assert ledger is not None
    model, agent = steps(), stepper()
    budget = Options(budget_micros=2 * CALL_MICROS + CALL_MICROS // 2).recorded()
    dead = DeadAfterRecording(
        provider=model,
        log=embedded.log,
        frontiers=embedded.frontiers,
        checkpoint_inline=True,
        leases=embedded.leases,
        worker="w1",
        spend=ledger,
        prices=embedded.settings.price_table(),
    )
    with pytest.raises(Crash):
        await dead.run(agent, "go", tenant=TENANT, run_id="twice", options=budget)

    outage = Outage(ledger, monkeypatch)
    with pytest.raises(BackendUnavailableError):
        await embedded.runner(model).resume(agent, "twice", tenant=TENANT)
    outage.end()
    assert model.calls == 2

    with pytest.raises(BudgetExceededError):
        await embedded.runner(model).resume(agent, "twice", tenant=TENANT)
    assert model.calls == 2, "a third call was made: the budget was passed"
    spent = await ledger.run_total("twice")
    assert (spent.calls, spent.micros) == (2, 2 * CALL_MICROS)


async def test_a_run_carried_on_from_another_is_taken_without_writing_to_the_ledger(
    embedded: Backends, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run carried on from another starts its frontier's token counts at the other's, and
    its ledger at zero: nothing it answered is missing from the ledger, so taking it up again
    must not read its log and record each answer again (a write a call, at every claim)."""
    ledger = embedded.spend
    assert ledger is not None
    runner = embedded.runner(steps(finish_after=4))
    runner.continuation = ContinuationPolicy(max_steps=2)
    result = await runner.run(stepper(), "go", tenant=TENANT, run_id="first")
    assert result.status == "completed"
    assert result.run_id != "first"  # carried on
    carried = await runner.inspect(result.run_id, tenant=TENANT)
    assert carried.input_tokens > (await ledger.run_total(result.run_id)).input_tokens

    records: list[SpendEntry] = []
    record = ledger.record

    async def counted(entry: SpendEntry) -> bool:
        records.append(entry)
        return await record(entry)

    monkeypatch.setattr(ledger, "record", counted)
    again = await embedded.runner(steps()).resume(stepper(), result.run_id, tenant=TENANT)
    assert again.spend_micros == result.spend_micros
    assert records == []


async def test_an_answer_cut_from_the_log_does_not_keep_the_rest_from_being_recorded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Three answers of a run lack their ledger entries; the log was then cut past the
    first (compaction, or retention). The claim cannot count that one: it must still record
    the two the log holds, and say which answer it cannot count and why, rather than give
    up on all of them at every claim as if the ledger were down."""
    db = tmp_path / "onward.db"
    now = time.time_ns() // 1_000

    def env(seq: int) -> Envelope:
        return Envelope(run_id="cut", tenant=TENANT, seq=seq, fence=1, at=now + seq)

    def answer(seq: int) -> ModelAnswered:
        return ModelAnswered(
            **env(seq),
            message=Message(role="assistant", content=f"a{seq}"),
            usage=Usage(input_tokens=IN, output_tokens=OUT),
        )

    async with (
        SqliteEventLog(db, partitions=1) as log,
        SqliteFrontierStore(db) as frontiers,
        SqliteSpendLedger(db) as ledger,
    ):
        await log.append(
            [
                RunStarted(**env(1), agent="stepper", revision="r1", input="go"),
                RunClaimed(**env(2), worker="w1"),
                answer(3),
                TurnSettled(**env(4), iteration=1, call_ids=[]),
                answer(5),
                TurnSettled(**env(6), iteration=2, call_ids=[]),
                answer(7),
            ]
        )
        await LogProjector(log, FrontierProjection(frontiers, log)).catch_up()
        stored = await frontiers.get("cut")
        assert stored is not None
        assert stored.frontier is not None
        cut_at = [s.position.offset for s in await log.read_run("cut")][3]
        await log.truncate_before(0, cut_at)

        runner = AgentRunner(
            provider=steps(), log=log, worker="w", spend=ledger, prices=PriceTable({MODEL: (1, 5)})
        )
        await runner.record_answers_left(stepper(), stored.frontier, {3, 5, 7})
        recorded = [entry.seq for entry in await ledger.entries("cut")]
    assert recorded == [5, 7]
    assert "seq 3" in caplog.text


@pytest.mark.parametrize("blips", [1, 2])
async def test_a_ledger_blip_at_the_claim_does_not_let_the_budget_pass(
    ledger: SpendLedger, monkeypatch: pytest.MonkeyPatch, blips: int
) -> None:
    """The run may spend one and a half calls; its first call is paid while the ledger is down
    and its runner dies. The resume's claim finds the ledger down for a moment (it cannot
    count that call). Back by the next model call's budget check, the check must weigh the
    call the claim could not count, not let a second call pass the budget; still down then,
    the run stops before the call, as a budget nobody can weigh is not passed."""
    log, model = MemoryEventLog(), steps()
    outage = Outage(ledger, monkeypatch)
    budget = Options(budget_micros=CALL_MICROS + CALL_MICROS // 2).recorded()
    with pytest.raises(BackendUnavailableError):
        await runner_on(log, ledger, model).run(
            stepper(), "go", tenant=TENANT, run_id="blip", options=budget
        )
    outage.end()
    entries = ledger.entries
    blip = {"left": blips}

    async def entries_after_a_blip(run_id: str) -> list[SpendEntry]:
        if blip["left"]:
            blip["left"] -= 1
            raise BackendUnavailableError("the spend ledger did not answer")
        return await entries(run_id)

    monkeypatch.setattr(ledger, "entries", entries_after_a_blip)
    stopped = BudgetExceededError if blips == 1 else BackendUnavailableError
    with pytest.raises(stopped):
        await runner_on(log, ledger, model).resume(stepper(), "blip", tenant=TENANT)
    assert not blip["left"]
    assert model.calls == 1, "a second call was made: the budget was passed"
    if blips > 1:  # resumed once the ledger is back: the budget stops it
        with pytest.raises(BudgetExceededError):
            await runner_on(log, ledger, model).resume(stepper(), "blip", tenant=TENANT)
        assert model.calls == 1
    assert (await ledger.run_total("blip")).micros == CALL_MICROS
