"""Budgets on the embedded backends: a run stops before the model call that would pass its
budget (or its tenant's), continuation does not carry spend, a call made again after a crash
counts once, and ``inspect``, ``onward runs`` and an application's stream show spend."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import pytest_asyncio
from support.crashes import Crash, CrashAt
from support.readme import run_example
from support.spend import (
    CALL_MICROS,
    IN,
    MODEL,
    OUT,
    PRICES,
    DeadRunner,
    DiesMidCall,
    a_crowd_never_passes_its_tenants_budget,
    dead_runner_on,
    stepper,
    steps,
    stops_before_the_call_that_would_pass_its_budget,
)
from typer.testing import CliRunner

import onward
from onward.errors import (
    BackendUnavailableError,
    BudgetExceededError,
    ConfigurationError,
    InvalidInputError,
)
from onward.eventlog import Event, MemoryEventLog, ModelAnswered, Position, SqliteEventLog
from onward.eventlog.events import Message
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.cli import app as cli
from onward.runtime.cli import frontier_main
from onward.runtime.continuation import ContinuationPolicy
from onward.runtime.fleet.requests import ResumeRun
from onward.runtime.fleet.worker import Worker
from onward.runtime.options import Options
from onward.runtime.providers import ModelReply, reply
from onward.runtime.runner import AgentRunner
from onward.runtime.settings import Settings
from onward.runtime.spend import (
    Budgets,
    MemorySpendLedger,
    PriceTable,
    Spend,
    SpendEntry,
    SqliteSpendLedger,
    estimate_usage,
)

TENANT = "acme"


def sqlite_settings(path: Path) -> Settings:
    return Settings(backend="sqlite", sqlite_path=path, model_prices=PRICES)


@pytest_asyncio.fixture
async def sqlite(tmp_path: Path) -> AsyncIterator[Backends]:
    async with open_backends(sqlite_settings(tmp_path / "onward.db")) as backends:
        yield backends


@pytest_asyncio.fixture
async def memory() -> AsyncIterator[Backends]:
    settings = Settings(backend="memory", model_prices=PRICES)
    async with open_backends(settings, in_process=True) as backends:
        yield backends


async def onward_cli(db: Path, *args: str) -> tuple[int, str, str]:
    """The command line on the SQLite file ``db``, in a thread: it runs its own event loop."""
    env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)}
    result = await asyncio.to_thread(CliRunner().invoke, cli, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


# -- the acceptance line ---------------------------------------------------------------------


async def test_on_sqlite_a_run_stops_before_the_call_that_would_pass_its_budget(
    sqlite: Backends, tmp_path: Path
) -> None:
    run_id = await stops_before_the_call_that_would_pass_its_budget(sqlite)
    code, out, err = await onward_cli(tmp_path / "onward.db", "inspect", run_id, "--tenant", TENANT)
    assert code == 0, err
    spend_line = next(line for line in out.splitlines() if line.startswith("spend"))
    assert spend_line.split() == ["spend", "4000", "micros", "(2", "calls)"]
    assert "BudgetExceededError" in out


async def test_in_memory_the_same(memory: Backends) -> None:
    await stops_before_the_call_that_would_pass_its_budget(memory)


# -- which budget ----------------------------------------------------------------------------


async def test_a_tenant_budget_counts_every_run_of_the_tenant(sqlite: Backends) -> None:
    agent = stepper(tenant_budget_micros=7000)
    runner = sqlite.runner(steps(finish_after=2))
    first = await runner.run(agent, "go", tenant=TENANT)
    assert (first.status, first.spend_micros) == ("completed", 2 * CALL_MICROS)

    provider = steps(finish_after=2)
    with pytest.raises(BudgetExceededError) as caught:
        await sqlite.runner(provider).run(agent, "go", tenant=TENANT)
    assert provider.calls == 1  # 4000 + 2000 fit in 7000; another 2000 would not
    assert (caught.value.scope, caught.value.spent_micros) == ("tenant", 3 * CALL_MICROS)
    assert "tenant 'acme'" in str(caught.value)

    other = await sqlite.runner(steps(finish_after=2)).run(agent, "go", tenant="other")
    assert other.status == "completed"
    assert sqlite.spend is not None
    assert (await sqlite.spend.tenant_total(TENANT)).micros == 3 * CALL_MICROS


@pytest_asyncio.fixture(params=["sqlite", "memory"])
async def embedded(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backends]:
    settings = (
        sqlite_settings(tmp_path / "onward.db")
        if request.param == "sqlite"
        else Settings(backend="memory", model_prices=PRICES)
    )
    async with open_backends(settings, in_process=request.param == "memory") as backends:
        yield backends


async def test_runs_of_one_tenant_calling_at_once_never_pass_its_budget_together(
    embedded: Backends,
) -> None:
    """Eight runs of one tenant reach their first model call at the same moment; the tenant's
    budget has room for three estimated calls. Checked against the spend alone, all eight saw
    room (nothing was spent yet) and all eight called the model; each now holds its estimate
    in the same step as its check, so three call and five stop."""
    await a_crowd_never_passes_its_tenants_budget(embedded)


async def test_options_lower_the_agents_budget_and_never_raise_it(sqlite: Backends) -> None:
    lowered = Options(budget_micros=3000).recorded()
    provider = steps()
    with pytest.raises(BudgetExceededError) as caught:
        await sqlite.runner(provider).run(
            stepper(budget_micros=100_000), "go", tenant=TENANT, options=lowered
        )
    assert (provider.calls, caught.value.budget_micros) == (1, 3000)
    assert caught.value.run_id is not None
    frontier = await sqlite.runner(provider).inspect(caught.value.run_id, tenant=TENANT)
    assert frontier.budget_micros == 3000  # recorded in RunStarted, folded from it

    raised = Options(budget_micros=100_000).recorded()
    provider = steps()
    with pytest.raises(BudgetExceededError) as caught:
        await sqlite.runner(provider).run(
            stepper(budget_micros=3000), "go", tenant=TENANT, options=raised
        )
    assert (provider.calls, caught.value.budget_micros) == (1, 3000)


@pytest.mark.parametrize("bad", [-1, "3000", 3000.0, True])
@pytest.mark.parametrize("name", ["budget_micros", "tenant_budget_micros"])
async def test_a_budget_option_that_is_not_whole_micros_is_refused_naming_it(
    sqlite: Backends, name: str, bad: object
) -> None:
    """Not read as no budget at all: the run would spend without a bound its starter set."""
    provider = steps(finish_after=2)
    with pytest.raises(InvalidInputError, match=name):
        await sqlite.runner(provider).run(
            stepper(), "go", tenant=TENANT, run_id="odd", options={name: bad}
        )
    assert provider.calls == 0
    assert await sqlite.log.read_run("odd") == []


async def test_max_tokens_bounds_the_estimate_of_an_answer(sqlite: Backends) -> None:
    # Output bounded at 1000 tokens: 5000 micros of output alone, over a 4000 budget.
    agent = stepper(budget_micros=4000, model_settings={"max_tokens": 1000})
    provider = steps()
    with pytest.raises(BudgetExceededError) as caught:
        await sqlite.runner(provider).run(agent, "go", tenant=TENANT)
    assert provider.calls == 0
    assert caught.value.spent_micros == 0
    assert (caught.value.estimate_micros or 0) > 5000


def test_the_estimate_grows_with_the_conversation_and_never_falls_below_the_mean() -> None:
    agent = stepper()
    short = [onward.eventlog.events.Message(role="user", content="x")]
    long = [onward.eventlog.events.Message(role="user", content="x" * 4000)]
    assert estimate_usage(agent, long, Spend()).input_tokens >= 1000
    assert estimate_usage(agent, short, Spend()).input_tokens < 1000
    spent = Spend(micros=1, input_tokens=3000, output_tokens=300, calls=3)
    assert estimate_usage(agent, short, spent) == onward.eventlog.events.Usage(
        input_tokens=1000, output_tokens=100
    )


async def test_a_runs_own_budget_holds_when_another_worker_carries_it_on(
    sqlite: Backends,
) -> None:
    # The budget is the run's options' alone, so the resuming worker reads it from the log.
    options = Options(budget_micros=3000).recorded()
    provider = steps()
    crashing = sqlite.runner(provider, worker="w1", observer=CrashAt("turn.settled"))
    with pytest.raises(Crash):
        await crashing.run(stepper(), "go", tenant=TENANT, run_id="carried", options=options)
    assert provider.calls == 1
    with pytest.raises(BudgetExceededError) as caught:
        await sqlite.runner(provider, worker="w2").resume(stepper(), "carried", tenant=TENANT)
    assert provider.calls == 1  # 2000 spent; another 2000 would pass 3000
    assert (caught.value.budget_micros, caught.value.spent_micros) == (3000, CALL_MICROS)


async def test_a_worker_that_finds_a_run_over_its_budget_counts_it_failed(
    sqlite: Backends,
) -> None:
    options = Options(budget_micros=3000).recorded()
    provider = steps()
    crashing = sqlite.runner(provider, worker="w1", observer=CrashAt("turn.settled"))
    with pytest.raises(Crash):
        await crashing.run(stepper(), "go", tenant=TENANT, run_id="lapsed", options=options)
    worker = Worker(sqlite, provider, {"stepper": stepper()}, name="w2")
    assert await worker.recover(range(sqlite.log.partitions)) == 1
    await worker.drained()
    assert provider.calls == 1
    assert (worker.stats.statuses, worker.stats.failures) == ({"failed": 1}, 0)
    frontier = await sqlite.runner(provider).inspect("lapsed", tenant=TENANT)
    assert frontier.status == "failed"


# -- refusals --------------------------------------------------------------------------------


async def test_a_budget_on_a_model_without_a_price_is_refused_before_anything_is_written(
    sqlite: Backends,
) -> None:
    agent = Agent(name="free", instructions="x", model="unpriced", budget_micros=10)
    runner = sqlite.runner(steps())
    with pytest.raises(ConfigurationError, match="'unpriced'"):
        await runner.run(agent, "go", tenant=TENANT, run_id="run-unpriced")
    assert not await runner.resumer.exists("run-unpriced")


async def test_a_budget_without_a_ledger_is_refused() -> None:
    runner = AgentRunner(provider=steps(), log=MemoryEventLog(), prices=PriceTable())
    with pytest.raises(ConfigurationError, match="no spend ledger"):
        await runner.run(stepper(budget_micros=10), "go", tenant=TENANT)


async def test_a_model_without_a_price_is_recorded_at_zero(sqlite: Backends) -> None:
    agent = Agent(name="free", instructions="x", model="unpriced")
    result = await sqlite.runner(steps(finish_after=1)).run(agent, "go", tenant=TENANT)
    assert result.spend_micros == 0
    assert sqlite.spend is not None
    [recorded] = await sqlite.spend.entries(result.run_id)
    assert (recorded.model, recorded.input_tokens, recorded.micros) == ("unpriced", IN, 0)


def test_budgets_are_the_lower_of_agent_and_options() -> None:
    agent = stepper(budget_micros=10, tenant_budget_micros=None)
    assert Budgets.of(agent, 5, 7) == Budgets(run_micros=5, tenant_micros=7)
    assert Budgets.of(agent, 50, None) == Budgets(run_micros=10, tenant_micros=None)
    assert not Budgets.of(stepper(), None, None).bounded
    with pytest.raises(ConfigurationError, match="budget_micros"):
        stepper(budget_micros=-1)


# -- what is not carried, and what is not counted twice --------------------------------------


async def test_a_continued_run_starts_its_spend_at_zero(sqlite: Backends) -> None:
    # Each run of the chain may spend 5000 (two calls): carried on every two turns, the chain
    # makes five calls, 10000 micros, which spend carried across would have stopped at two.
    runner = sqlite.runner(steps(finish_after=5))
    runner.continuation = ContinuationPolicy(max_steps=6)
    result = await runner.run(stepper(budget_micros=5000), "go", tenant=TENANT, run_id="chain")
    assert result.status == "completed"
    assert result.run_id != "chain"
    assert sqlite.spend is not None
    first = await sqlite.spend.run_total("chain")
    last = await sqlite.spend.run_total(result.run_id)
    assert first.micros == 2 * CALL_MICROS
    assert 0 < last.micros <= 2 * CALL_MICROS
    assert result.spend_micros == last.micros
    assert (await sqlite.spend.tenant_total(TENANT)).micros == 5 * CALL_MICROS


class DiesBeforeAnAnswerIsDurable(MemoryEventLog):
    """A log whose writer 'dies' the first time it appends a model's answer: the call was
    made (and paid for), its answer never written."""

    died = False

    async def append(self, events: Sequence[Event]) -> list[Position]:
        if not self.died and any(isinstance(e, ModelAnswered) for e in events):
            self.died = True
            raise Crash("model answered, answer not durable")
        return await super().append(events)


async def test_a_call_whose_answer_was_lost_in_a_crash_stays_counted() -> None:
    log, ledger = DiesBeforeAnAnswerIsDurable(), MemorySpendLedger()
    prices = PriceTable({MODEL: (1, 5)})
    provider = steps(finish_after=2)

    def runner() -> AgentRunner:
        return AgentRunner(provider=provider, log=log, worker="w", spend=ledger, prices=prices)

    with pytest.raises(Crash):
        await runner().run(stepper(), "go", tenant=TENANT, run_id="dies")
    # Recorded before the answer was to be written: the provider was paid for it.
    assert await ledger.run_total("dies") == Spend(
        micros=CALL_MICROS, input_tokens=IN, output_tokens=OUT, calls=1
    )
    result = await runner().resume(stepper(), "dies", tenant=TENANT)
    assert result.status == "completed"
    assert provider.calls == 3  # the first call made again on resume
    answers = [
        s.event.seq for s in await log.read_run("dies") if isinstance(s.event, ModelAnswered)
    ]
    entries = [e.seq for e in await ledger.entries("dies")]
    assert len(entries) == 3
    assert set(answers) < set(entries)  # one entry per call paid for, answered or not
    assert result.spend_micros == (await ledger.run_total("dies")).micros == 3 * CALL_MICROS


async def test_a_hold_a_worker_left_dying_mid_call_is_released_when_the_run_resumes() -> None:
    log, ledger = MemoryEventLog(), MemorySpendLedger()
    prices = PriceTable({MODEL: (1, 5)})
    model = DiesMidCall()
    agent = stepper(tenant_budget_micros=10**9)
    probes = iter(range(1, 100))

    async def tenant_held_and_spent() -> int:
        probe = SpendEntry(run_id="probe", tenant=TENANT, seq=next(probes), model=MODEL)
        return (await ledger.hold(probe)).tenant_micros

    dead = DeadRunner(provider=model, log=log, worker="w1", spend=ledger, prices=prices)
    with pytest.raises(Crash):
        await dead.run(agent, "go", tenant=TENANT, run_id="left")
    assert await ledger.run_total("left") == Spend()
    left_held = await tenant_held_and_spent()
    assert left_held > 0  # the estimate of the call the process died in
    resumed = AgentRunner(provider=model, log=log, worker="w2", spend=ledger, prices=prices)
    result = await resumed.resume(agent, "left", tenant=TENANT)
    assert result.status == "completed"
    assert model.calls == 3
    spent = await ledger.run_total("left")
    assert spent == Spend(
        micros=2 * CALL_MICROS, input_tokens=2 * IN, output_tokens=2 * OUT, calls=2
    )
    assert await tenant_held_and_spent() == spent.micros  # nothing held any more


class AlwaysDies:
    """A model no call of which ever answers: each process making one dies (`Crash`)."""

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        self.calls += 1
        raise Crash("the process died waiting for the model")


async def test_a_run_given_up_leaves_nothing_held_by_the_holder_that_died_mid_call(
    sqlite: Backends,
) -> None:
    """A run whose last attempt died mid-call is ended ``failed`` by the fleet without being
    carried on (so no resume releases that attempt's hold): its end drops the hold, which
    would otherwise count against the tenant's budget for ever."""
    ledger = sqlite.spend
    assert ledger is not None
    model = AlwaysDies()
    agent = stepper(tenant_budget_micros=10**9)
    dead = dead_runner_on(sqlite, model)
    with pytest.raises(Crash):
        await dead.run(agent, "go", tenant=TENANT, run_id="left")
    with pytest.raises(Crash):
        await dead.resume(agent, "left", tenant=TENANT)  # the run's one attempt, dying too
    probe = SpendEntry(run_id="probe", tenant=TENANT, seq=1, model=MODEL)
    assert (await ledger.hold(probe)).tenant_micros > 0  # the dying attempt's estimate
    worker = Worker(sqlite, model, {agent.name: agent}, max_attempts=1, backoff_s=0)
    worker.submit(ResumeRun(run_id="left", tenant=TENANT))
    await worker.drained()
    frontier = await worker.runner.inspect("left", tenant=TENANT)
    assert frontier.status == "failed", frontier
    assert (frontier.error or "").startswith("gave up"), frontier.error
    assert model.calls == 2  # given up, not carried on
    assert (await ledger.hold(probe)).tenant_micros == 0
    assert await ledger.run_total("left") == Spend()


async def test_onward_cancel_releases_what_a_run_left_dead_mid_call_holds(
    sqlite: Backends, tmp_path: Path
) -> None:
    """A run whose process died mid-call, which nobody carries on: a person cancels it, and
    its hold stops counting against the tenant's budget."""
    ledger = sqlite.spend
    assert ledger is not None
    agent = stepper(tenant_budget_micros=10**9)
    dead = dead_runner_on(sqlite, AlwaysDies())
    with pytest.raises(Crash):
        await dead.run(agent, "go", tenant=TENANT, run_id="left")
    probe = SpendEntry(run_id="probe", tenant=TENANT, seq=1, model=MODEL)
    assert (await ledger.hold(probe)).tenant_micros > 0
    args = ["left", "--tenant", TENANT, "--by", "ops"]
    code, out, err = await onward_cli(tmp_path / "onward.db", "cancel", *args)
    assert code == 0, err
    assert "cancelled run left (by ops)" in out
    assert (await ledger.hold(probe)).tenant_micros == 0


class LedgerLostAtTheEnd(MemorySpendLedger):
    """A ledger that stops answering as the run ends: dropping its holds fails."""

    async def release_run(self, run_id: str) -> int:
        raise BackendUnavailableError("the spend ledger did not answer")


async def test_a_run_ends_as_it_did_when_its_holds_cannot_be_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The run's end is durable before its holds are dropped: a ledger lost at that moment
    is logged, and the run still ends completed with its spend recorded."""
    ledger = LedgerLostAtTheEnd()
    runner = AgentRunner(
        provider=steps(finish_after=1),
        log=MemoryEventLog(),
        spend=ledger,
        prices=PriceTable({MODEL: (1, 5)}),
    )
    with caplog.at_level(logging.WARNING, logger="onward.runtime.writer"):
        result = await runner.run(stepper(budget_micros=10**9), "go", tenant=TENANT, run_id="r")
    assert result.status == "completed"
    assert (await ledger.run_total("r")).micros == CALL_MICROS
    assert any("run r finished; its held spend stays" in r.getMessage() for r in caplog.records), (
        caplog.text
    )


class LedgerUnreadAtTheEnd(MemorySpendLedger):
    """A ledger that records and holds, and stops answering reads of a run's total."""

    async def run_total(self, run_id: str) -> Spend:
        raise BackendUnavailableError("the spend ledger did not answer")


async def test_a_run_that_ended_is_returned_when_its_spend_cannot_be_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The spend is read after the run's end is durable: a ledger lost then leaves the result
    without it (logged) instead of raising for a run that completed, which a caller would
    retry and `run` refuse (the run exists)."""
    ledger = LedgerUnreadAtTheEnd()
    runner = AgentRunner(
        provider=steps(finish_after=1),
        log=MemoryEventLog(),
        spend=ledger,
        prices=PriceTable({MODEL: (1, 5)}),
    )
    with caplog.at_level(logging.WARNING, logger="onward.runner"):
        result = await runner.run(stepper(), "go", tenant=TENANT, run_id="r")
    assert result.status == "completed"
    assert result.spend_micros is None
    assert [e.micros for e in await ledger.entries("r")] == [CALL_MICROS]
    assert "run r is completed; its spend could not be read: the spend ledger did not answer" in (
        caplog.text
    )


async def test_recording_a_call_again_changes_nothing(sqlite: Backends) -> None:
    result = await sqlite.runner(steps(finish_after=2)).run(stepper(), "go", tenant=TENANT)
    assert sqlite.spend is not None
    before = await sqlite.spend.run_total(result.run_id)
    for recorded in await sqlite.spend.entries(result.run_id):
        assert not await sqlite.spend.record(recorded)
    assert await sqlite.spend.run_total(result.run_id) == before
    assert (await sqlite.spend.tenant_total(TENANT)).micros == before.micros == 2 * CALL_MICROS


# -- where spend shows -----------------------------------------------------------------------


async def test_onward_runs_shows_each_runs_spend(sqlite: Backends, tmp_path: Path) -> None:
    spent = await sqlite.runner(steps(finish_after=2)).run(stepper(), "go", tenant=TENANT)
    free = await sqlite.runner(steps(finish_after=1)).run(
        Agent(name="free", instructions="x", model="unpriced"), "go", tenant=TENANT
    )
    code, out, err = await onward_cli(tmp_path / "onward.db", "runs", "--json")
    assert code == 0, err
    lines = {row["run"]: row for row in map(json.loads, out.splitlines())}
    assert lines[spent.run_id]["spend_micros"] == 2 * CALL_MICROS
    assert lines[free.run_id]["spend_micros"] == 0
    code, out, err = await onward_cli(tmp_path / "onward.db", "runs")
    assert code == 0, err
    assert "SPEND" in out
    row = next(line for line in out.splitlines() if line.startswith(spent.run_id[:12]))
    assert row.split()[-1] == str(2 * CALL_MICROS)


async def test_inspect_json_gives_spend_in_micros(sqlite: Backends, tmp_path: Path) -> None:
    result = await sqlite.runner(steps(finish_after=2)).run(stepper(), "go", tenant=TENANT)
    code, out, err = await onward_cli(
        tmp_path / "onward.db", "inspect", result.run_id, "--tenant", TENANT, "--json"
    )
    assert code == 0, err
    assert json.loads(out)["spend"] == {"micros": 2 * CALL_MICROS, "calls": 2}


async def test_an_applications_stream_ends_with_the_runs_spend(tmp_path: Path) -> None:
    settings = sqlite_settings(tmp_path / "app.db")
    async with onward.open(settings, agents=[stepper()], provider=steps(finish_after=3)) as app:
        messages = await app.query("go").collect()
        assert messages[-1].type == "result"
        assert messages[-1].metadata["spend_micros"] == 3 * CALL_MICROS
        assert await app.resume(messages[-1].run_id).collect() == messages

    stopped = steps()
    budgeted = stepper(budget_micros=5000)
    async with onward.open(settings, agents=[budgeted], provider=stopped) as app:
        messages = await app.query("go").collect()
        assert (messages[-1].type, messages[-1].status) == ("error", "failed")
        assert "BudgetExceededError" in messages[-1].content
        assert messages[-1].metadata["spend_micros"] == 2 * CALL_MICROS
        assert stopped.calls == 2


async def test_a_stream_hands_out_the_runs_end_when_its_spend_cannot_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    settings = sqlite_settings(tmp_path / "app.db")
    async with onward.open(settings, agents=[stepper()], provider=steps(finish_after=1)) as app:
        ended = (await app.query("go").collect())[-1]

        async def unanswered(run_id: str) -> Spend:
            raise BackendUnavailableError("the spend ledger did not answer")

        monkeypatch.setattr(app.backends.spend, "run_total", unanswered)
        with caplog.at_level(logging.WARNING, logger="onward.app"):
            again = (await app.resume(ended.run_id).collect())[-1]
    assert (again.type, again.status, again.position) == ("result", "completed", ended.position)
    assert "spend_micros" not in again.metadata
    assert "its spend could not be read: the spend ledger did not answer" in caplog.text


def test_the_model_name_of_the_helpers_is_priced() -> None:
    assert (
        Settings(model_prices=PRICES)
        .price_table()
        .cost(MODEL, reply("", input_tokens=IN, output_tokens=OUT).usage)
        == CALL_MICROS
    )


def test_a_products_own_inspect_prints_its_runners_spend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "product.db"

    @asynccontextmanager
    async def opened() -> AsyncIterator[AgentRunner]:
        async with SqliteEventLog(db) as log, SqliteSpendLedger(db, sharing=log) as spend:
            yield AgentRunner(
                provider=steps(finish_after=2),
                log=log,
                worker="oncall",
                spend=spend,
                prices=PriceTable({MODEL: (1, 5)}),
            )

    async def run() -> None:
        async with opened() as runner:
            await runner.run(stepper(), "go", tenant=TENANT, run_id="product-run")

    asyncio.run(run())
    assert frontier_main(["product-run", "--tenant", TENANT], runner=opened) == 0
    printed = capsys.readouterr().out.splitlines()
    assert "spend 4000 micros (2 calls)" in [" ".join(line.split()) for line in printed]


def test_the_readme_example_stops_before_the_third_call(tmp_path: Path) -> None:
    text, printed = run_example("Spend and budgets", tmp_path)
    assert printed.splitlines() == ["540 + 270 > 600", "spent 540 micros"]
    assert "It prints `540 + 270 > 600` and `spent 540 micros`" in " ".join(text.split())


async def test_resuming_a_run_that_ended_gives_its_spend(sqlite: Backends) -> None:
    """Nothing is carried on, but the result still says what the run cost, as it did when
    the run ended: ``spend_micros`` is ``None`` only without a ledger or an answer from it."""
    ended = await sqlite.runner(steps(finish_after=2)).run(stepper(), "go", tenant=TENANT)
    assert ended.spend_micros == 2 * CALL_MICROS

    again = await sqlite.runner(steps()).resume(stepper(), ended.run_id, tenant=TENANT)

    assert (again.status, again.spend_micros) == ("completed", 2 * CALL_MICROS)
