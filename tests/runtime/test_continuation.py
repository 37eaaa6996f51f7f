"""Continuation: a long run carried into a new run keeps its conversation, usage, iteration count
and the approvals and grants it acts under; dropping one is refused; crashes on the way lose
nothing and repeat nothing.

The scenario: a run looks two things up, asks to pay (a tool a person must approve), and waits.
Ann approves. The run is resumed by a runner whose `ContinuationPolicy` finds it long enough:
it is carried into ``<run>~c1``, which pays without asking again and finishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sqlite3
import sys
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from support.appapi import until
from support.crashes import Crash, CrashAt
from support.runners import embedded_log
from support.servers import KafkaServers
from typer.testing import CliRunner

from onward.errors import (
    BackendUnavailableError,
    CheckpointFormatError,
    ConfigurationError,
    FencedError,
    HistoryUnavailableError,
    InvalidInputError,
    NothingToResumeError,
)
from onward.eventlog import (
    EVENT_FORMAT,
    MemoryEventLog,
    Message,
    SqliteEventLog,
    ToolCall,
    kind_of,
)
from onward.eventlog.base import EventLog, LogRead, LogRecord
from onward.eventlog.events import (
    ApprovalRequested,
    ResumePlanned,
    RunContinued,
    RunStarted,
    ToolDispatched,
)
from onward.projections.frontier import Frontier
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime import Agent, AgentRunner, ScriptedProvider, reply, tool
from onward.runtime.application.messages import MessageMapper
from onward.runtime.backends import open_backends
from onward.runtime.cli import app
from onward.runtime.cli.runs import chain_of
from onward.runtime.continuation import (
    Continuation,
    ContinuationPolicy,
    continued,
    successor_id,
    successor_ids,
)
from onward.runtime.fleet.requests import CancelRun
from onward.runtime.fleet.worker import Worker
from onward.runtime.leases import CancelAsked, RunLease, SqliteLeaseStore
from onward.runtime.leases.base import unheard
from onward.runtime.limits import MAX_NAME_LENGTH
from onward.runtime.providers import ModelReply
from onward.runtime.settings import Settings
from onward.runtime.spend import MemorySpendLedger
from onward.runtime.tools import idempotency_key

TENANT = "acme"
RUN = "r"
NEXT = "r~c1"


@dataclass
class Ledger:
    """The tools' own record of what took effect."""

    effects: list[tuple[str, str]] = field(default_factory=list)

    def agent(self) -> Agent:
        @tool
        async def lookup(what: str, *, idempotency_key: str) -> str:
            self.effects.append(("lookup", idempotency_key))
            return f"{what}: found"

        @tool(requires_approval=True)
        async def pay(amount: int, *, idempotency_key: str) -> str:
            self.effects.append(("pay", idempotency_key))
            return f"paid {amount}"

        return Agent(name="payer", instructions="pay once approved", tools=[lookup, pay])

    def count(self, name: str) -> int:
        return sum(1 for tool_name, _ in self.effects if tool_name == name)


class Recording:
    """The scripted model, keeping every conversation it was called with.

    The script answers by how many assistant messages the conversation holds, so a run carried
    on without its history would be answered wrongly (it would look things up again).
    """

    def __init__(self) -> None:
        self.inner = ScriptedProvider(
            [
                reply("", ToolCall(call_id="a", tool="lookup", args={"what": "invoice"})),
                reply("", ToolCall(call_id="b", tool="lookup", args={"what": "account"})),
                reply("", ToolCall(call_id="p", tool="pay", args={"amount": 10})),
                reply("paid"),
            ]
        )
        self.seen: list[list[Message]] = []

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        self.seen.append(list(messages))
        return await self.inner.complete(agent, messages)


@dataclass
class World:
    """A log and how to make runners on it (with or without a frontier store)."""

    log: EventLog
    options: dict[str, Any]
    ledger: Ledger = field(default_factory=Ledger)
    model: Recording = field(default_factory=Recording)

    def runner(self, **options: Any) -> AgentRunner:
        return AgentRunner(provider=self.model, log=self.log, **self.options, **options)

    async def kinds(self, run_id: str) -> list[str]:
        return [kind_of(type(s.event)) for s in await self.log.read_run(run_id)]

    async def waiting_then_approved(self) -> None:
        """The run up to Ann's approval of ``p``; 12 events, so it is long enough to carry."""
        result = await self.runner().run(
            self.ledger.agent(), "pay the invoice", tenant=TENANT, run_id=RUN
        )
        assert result.status == "waiting"
        await self.runner().approve(RUN, "p", tenant=TENANT, by="ann", value={"limit": 10})

    async def carried_until_it_dies(self, point: str) -> Agent:
        """Approved, then resumed by a runner that carries the run on and dies at ``point``."""
        await self.waiting_then_approved()
        agent = self.ledger.agent()
        crashing = self.runner(continuation=POLICY, observer=CrashAt(point))
        with pytest.raises(Crash):
            await crashing.resume(agent, RUN, tenant=TENANT)
        return agent


POLICY = ContinuationPolicy(max_steps=10)


@pytest_asyncio.fixture(params=["memory", "sqlite"])
async def world(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[World]:
    async with embedded_log(request.param, tmp_path) as (log, options):
        yield World(log, options)


async def test_a_run_carried_into_a_new_run_keeps_its_approval_and_its_conversation(
    world: World,
) -> None:
    await world.waiting_then_approved()
    agent = world.ledger.agent()
    result = await world.runner(continuation=POLICY).resume(agent, RUN, tenant=TENANT)

    assert (result.run_id, result.status, result.output) == (NEXT, "completed", "paid")
    assert world.ledger.effects.count(("pay", idempotency_key(RUN, "p"))) == 1
    assert world.ledger.count("lookup") == 2
    old = await world.runner().inspect(RUN, tenant=TENANT)
    new = await world.runner().inspect(NEXT, tenant=TENANT)
    assert (old.status, old.continued_to) == ("continued", NEXT)
    assert new.continuation_of == RUN
    assert new.iteration == 4  # three model calls in the old run, one in the new
    assert (new.input_tokens, new.output_tokens) == (40, 20)
    kinds = await world.kinds(NEXT)
    assert kind_of(ApprovalRequested) not in kinds  # not asked again
    assert kinds[0] == kind_of(RunStarted)
    assert (await world.kinds(RUN))[-1] == kind_of(RunContinued)
    (started,) = [
        s.event for s in await world.log.read_run(NEXT) if isinstance(s.event, RunStarted)
    ]
    assert started.carried is not None
    assert started.carried.approved == ["p"]
    assert [(g.request_id, g.by, g.value) for g in started.carried.grants] == [
        ("p", "ann", {"limit": 10})
    ]
    assert [(h.run_id, h.through_seq) for h in started.carried.history] == [(RUN, old.last_seq - 1)]
    # The last model call saw the old run's conversation, then the payment, and nothing twice.
    last = world.model.seen[-1]
    assert [m.role for m in last] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]
    assert last[1].content == "pay the invoice"
    assert last[-1].content == "paid 10"


async def test_a_continuation_that_drops_a_grant_is_refused_and_writes_nothing(
    world: World,
) -> None:
    class Forgetful(ContinuationPolicy):
        def continued(self, frontier: Frontier) -> Continuation:
            return dataclasses.replace(continued(frontier), grants=())

    await world.waiting_then_approved()
    before = await world.kinds(RUN)
    agent = world.ledger.agent()
    with pytest.raises(ConfigurationError, match=r"drops what the run acts under.*grant of p"):
        await world.runner(continuation=Forgetful(max_steps=10)).resume(agent, RUN, tenant=TENANT)
    assert await world.log.read_run(NEXT) == []
    after = await world.kinds(RUN)
    assert kind_of(RunContinued) not in after
    assert world.ledger.count("pay") == 0
    assert after[: len(before)] == before
    # Nothing was lost: a resume that carries everything over finishes the run.
    result = await world.runner(continuation=POLICY).resume(agent, RUN, tenant=TENANT)
    assert (result.run_id, result.status) == (NEXT, "completed")
    assert world.ledger.count("pay") == 1


def test_continued_refuses_to_drop_an_approval_or_a_grant() -> None:
    frontier = Frontier(
        run_id=RUN,
        tenant=TENANT,
        status="running",
        last_seq=12,
        approved=("p",),
        grants=(),
    )
    carry = continued(frontier)
    assert carry.approved == ("p",)
    dropped = Continuation(
        run_id=RUN, new_run_id=NEXT, history=carry.history, iteration=0, usage=carry.usage
    )
    with pytest.raises(ConfigurationError, match="drops what the run acts under \\(p\\)"):
        dropped.check(frontier)
    carry.check(frontier)


async def test_resume_of_the_new_run_after_a_crash_finishes_it_with_the_whole_history(
    world: World,
) -> None:
    agent = await world.carried_until_it_dies("turn.settled")  # dies in the new run, after paying
    assert world.ledger.count("pay") == 1
    result = await world.runner(continuation=POLICY).resume(agent, NEXT, tenant=TENANT)
    assert (result.run_id, result.status, result.output) == (NEXT, "completed", "paid")
    assert world.ledger.count("pay") == 1
    assert [m.role for m in world.model.seen[-1]][:4] == ["system", "user", "assistant", "tool"]


async def test_a_carry_cut_short_between_the_two_runs_is_finished_by_the_next_resume(
    world: World,
) -> None:
    agent = await world.carried_until_it_dies("run.started")  # the new run started, the old goes on
    assert kind_of(RunContinued) not in await world.kinds(RUN)
    result = await world.runner(continuation=POLICY).resume(agent, RUN, tenant=TENANT)
    assert (result.run_id, result.status) == (NEXT, "completed")
    assert (await world.kinds(NEXT)).count(kind_of(RunStarted)) == 1
    assert await world.log.read_run(successor_id(NEXT)) == []
    assert world.ledger.count("pay") == 1


def test_the_policy_says_when_and_refuses_what_cannot_work() -> None:
    frontier = Frontier(run_id=RUN, tenant=TENANT, status="running", last_seq=9, resume_seq=8)
    assert not ContinuationPolicy(max_steps=10).due(frontier)
    assert ContinuationPolicy(max_steps=9).due(frontier)
    assert ContinuationPolicy(max_history_bytes=100).due(frontier, history_bytes=100)
    assert not ContinuationPolicy(max_history_bytes=100).due(frontier, history_bytes=99)
    fresh = msgspec.structs.replace(frontier, resume_seq=0)  # no boundary of its own yet
    assert not ContinuationPolicy(max_steps=2).due(fresh)
    for bad in ({}, {"max_steps": 1}, {"max_history_bytes": 0}):
        with pytest.raises(ConfigurationError):
            ContinuationPolicy(**bad)
    assert successor_id("r") == "r~c1"
    assert successor_id("r~c1") == "r~c2"
    assert successor_id("a~cb") == "a~cb~c1"
    dispatched = msgspec.structs.replace(frontier, status="waiting")
    with pytest.raises(InvalidInputError, match="cannot be carried on now"):
        continued(dispatched)


@pytest.mark.kafka
async def test_continuation_on_kafka_postgres_and_redis(kafka_servers: KafkaServers) -> None:
    d = kafka_servers
    async with d.log() as log, d.frontiers() as frontiers, d.leases() as leases:
        world = World(log, {"frontiers": frontiers, "leases": leases})
        agent = await world.carried_until_it_dies("turn.settled")
        result = await world.runner(continuation=POLICY).resume(agent, NEXT, tenant=TENANT)
        assert (result.run_id, result.status, result.output) == (NEXT, "completed", "paid")
        assert world.ledger.count("pay") == 1
        dispatched = [
            s.event for s in await log.read_run(NEXT) if isinstance(s.event, ToolDispatched)
        ]
        assert [(e.call_id, e.idempotency_key) for e in dispatched] == [
            ("p", idempotency_key(RUN, "p"))
        ]


async def test_a_hole_in_the_history_it_was_carried_on_from_stops_the_new_run(
    tmp_path: Path,
) -> None:
    path = tmp_path / "onward.db"
    async with SqliteEventLog(path) as log, SqliteFrontierStore(path) as frontiers:
        world = World(log, {"frontiers": frontiers, "checkpoint_inline": True})
        agent = await world.carried_until_it_dies("turn.settled")
        with contextlib.closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("DELETE FROM onward_transcript WHERE run_id = ? AND seq = 2", (RUN,))
        calls = len(world.model.seen)
        with pytest.raises(
            HistoryUnavailableError, match=r"'r~c1' was carried on from 'r'.*1 of the 6 messages"
        ):
            await world.runner(continuation=POLICY).resume(agent, NEXT, tenant=TENANT)
        assert len(world.model.seen) == calls  # the model was not called


async def test_inspect_follows_the_chain_both_ways(tmp_path: Path) -> None:
    path = tmp_path / "onward.db"
    async with SqliteEventLog(path) as log, SqliteFrontierStore(path) as frontiers:
        world = World(log, {"frontiers": frontiers, "checkpoint_inline": True})
        await world.waiting_then_approved()
        agent = world.ledger.agent()
        await world.runner(continuation=POLICY).resume(agent, RUN, tenant=TENANT)
    env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(path)}

    async def inspect(run_id: str) -> str:
        args = ["inspect", run_id, "--tenant", TENANT]
        # The command runs its own event loop, so it gets a thread of its own.
        result = await asyncio.to_thread(CliRunner().invoke, app, args, env=env)
        assert result.exit_code == 0, result.output
        return " ".join(result.stdout.split())

    old, new = await inspect(RUN), await inspect(NEXT)
    assert "continued as r~c1" in old
    assert "resume r~c1 instead" in old
    assert "chain [r] (continued) -> r~c1 (completed)" in old
    assert "continued from r" in new
    assert "chain r (continued) -> [r~c1] (completed)" in new


async def test_a_carry_never_lands_in_another_tenants_run(world: World) -> None:
    """Tenant B owns a run under the id tenant A's run would be carried into: the carry writes
    nothing into B's run, which stays B's alone (security review #1), and goes to another id."""
    other = await world.runner().run(
        world.ledger.agent(), "pay the invoice", tenant="globex", run_id=NEXT
    )
    assert other.status == "waiting"
    before = await world.log.read_run(NEXT)
    await world.waiting_then_approved()
    done = await world.runner(continuation=POLICY).resume(world.ledger.agent(), RUN, tenant=TENANT)
    assert (done.run_id, done.status) == (successor_ids(RUN)[1], "completed")
    assert await world.log.read_run(NEXT) == before
    with pytest.raises(NothingToResumeError):
        await world.runner().inspect(NEXT, tenant=TENANT)
    assert (await world.runner().inspect(NEXT, tenant="globex")).waiting_on == "p"
    assert world.ledger.count("pay") == 1


async def test_cancelling_a_run_carried_on_names_the_run_it_goes_on_as(world: World) -> None:
    """A person cancels a run once it was carried on: the refusal says where the work goes
    on (a run ``continued`` is not ended work), and cancelling that run ends it."""
    await world.waiting_then_approved()
    runner = world.runner(continuation=POLICY)
    append = runner.writer.append

    async def waiting_in_the_new_run(run: Any, events: Sequence[Any]) -> None:
        if run.run_id == NEXT and any(isinstance(e, ToolDispatched) for e in events):
            raise Crash("before the payment")
        await append(run, events)

    runner.writer.append = waiting_in_the_new_run  # type: ignore[method-assign]
    with pytest.raises(Crash):
        await runner.resume(world.ledger.agent(), RUN, tenant=TENANT)
    with pytest.raises(InvalidInputError, match=r"ended already \(continued\).*'r~c1'"):
        await world.runner().cancel(RUN, tenant=TENANT, by="ann")
    ended = await world.runner().cancel(NEXT, tenant=TENANT, by="ann")
    assert ended.status == "cancelled"
    assert world.ledger.count("pay") == 0


async def test_a_cancel_asked_as_the_run_is_carried_on_ends_the_run_it_goes_on_as(
    world: World,
) -> None:
    """Ann asks the run's holder to cancel it while the run is being carried on, after its
    holder last looked for an ask: the ask is taken (a holding was asked), so the run it goes
    on as must end ``cancelled`` without paying, not pay and complete."""
    await world.waiting_then_approved()
    runner = world.runner(continuation=POLICY)
    append = runner.writer.append

    async def asked_as_it_hands_over(run: Any, events: Sequence[Any]) -> None:
        if any(isinstance(e, RunContinued) for e in events):
            assert await world.runner().ask_to_cancel(RUN, tenant=TENANT, by="ann") is not None
        await append(run, events)

    runner.writer.append = asked_as_it_hands_over  # type: ignore[method-assign]
    done = await runner.resume(world.ledger.agent(), RUN, tenant=TENANT)

    assert (done.run_id, done.status) == (NEXT, "cancelled")
    assert "ann" in (done.error or "")
    assert world.ledger.count("pay") == 0
    assert (await world.runner().inspect(RUN, tenant=TENANT)).continued_to == NEXT


@pytest.mark.parametrize("taken_up", ["as_it_is_handed_over", "as_the_ask_finds_it_free"])
async def test_a_cancel_asked_as_the_run_is_carried_on_reaches_whoever_took_up_the_new_run(
    world: World, taken_up: str
) -> None:
    """As above, but a fleet worker takes the new run up once it is handed over, before the
    carrying holder has passed Ann's ask on (or right after it found the new run free): the
    ask must reach that worker (it ends the run at its next boundary), not be lost while the
    new run goes on and pays."""
    await world.waiting_then_approved()
    runner = world.runner(continuation=POLICY)
    leases = runner.leases
    append, ask = runner.writer.append, leases.ask_to_cancel

    async def take_up() -> None:
        await leases.acquire(NEXT, tenant=TENANT, holder="fleet", ttl_s=60)

    async def asked_as_it_hands_over(run: Any, events: Sequence[Any]) -> None:
        handing_over = any(isinstance(e, RunContinued) for e in events)
        if handing_over:
            assert await world.runner().ask_to_cancel(RUN, tenant=TENANT, by="ann") is not None
        await append(run, events)
        if handing_over and taken_up == "as_it_is_handed_over":
            await take_up()

    async def taken_up_once_found_free(run_id: str, **how: Any) -> RunLease | None:
        asked = await ask(run_id, **how)
        if run_id == NEXT and asked is None and taken_up == "as_the_ask_finds_it_free":
            await take_up()
        return asked

    runner.writer.append = asked_as_it_hands_over  # type: ignore[method-assign]
    leases.ask_to_cancel = taken_up_once_found_free  # type: ignore[method-assign]
    done = await runner.resume(world.ledger.agent(), RUN, tenant=TENANT)

    assert (done.run_id, done.status, done.continued_to) == (RUN, "continued", NEXT)
    held = await leases.current(NEXT)
    assert held is not None
    assert (held.holder, held.cancel_asked) == ("fleet", CancelAsked("ann"))
    assert world.ledger.count("pay") == 0


async def test_a_cancel_asked_as_the_run_is_carried_on_outlasts_a_lease_store_blip(
    world: World,
) -> None:
    """As above, and the lease store fails once as the ask is passed on to the new run: the
    carry has succeeded, so the resume must neither fail with the store's error nor drop
    Ann's ask (the new run would then go on and pay): the pass is tried again, and the run
    the old one goes on as ends ``cancelled``."""
    await world.waiting_then_approved()
    runner = world.runner(continuation=POLICY)
    append, ask = runner.writer.append, runner.leases.ask_to_cancel
    failed: list[str] = []

    async def asked_as_it_hands_over(run: Any, events: Sequence[Any]) -> None:
        if any(isinstance(e, RunContinued) for e in events):
            assert await world.runner().ask_to_cancel(RUN, tenant=TENANT, by="ann") is not None
        await append(run, events)

    async def failing_once(run_id: str, **how: Any) -> RunLease | None:
        if run_id == NEXT and not failed:
            failed.append(run_id)
            raise BackendUnavailableError("the lease store is down")
        return await ask(run_id, **how)

    runner.writer.append = asked_as_it_hands_over  # type: ignore[method-assign]
    runner.leases.ask_to_cancel = failing_once  # type: ignore[method-assign]
    done = await runner.resume(world.ledger.agent(), RUN, tenant=TENANT)

    assert failed
    assert (done.run_id, done.status) == (NEXT, "cancelled")
    assert "ann" in (done.error or "")
    assert world.ledger.count("pay") == 0


async def test_a_cancel_asked_as_the_run_is_carried_on_outlasts_losing_the_new_runs_lease(
    world: World,
) -> None:
    """As above, but the carrying holder loses the new run's lease as it ends it (a worker
    took it over meanwhile): the carry has succeeded, so the resume must not fail with that
    fence; the ask is passed on again, and the new run ends ``cancelled``, never paying."""
    await world.waiting_then_approved()
    runner = world.runner(continuation=POLICY)
    append, append_held = runner.writer.append, runner.writer.append_while_held
    fenced: list[str] = []

    async def asked_as_it_hands_over(run: Any, events: Sequence[Any]) -> None:
        if any(isinstance(e, RunContinued) for e in events):
            assert await world.runner().ask_to_cancel(RUN, tenant=TENANT, by="ann") is not None
        await append(run, events)

    async def fenced_once(run: Any, events: Sequence[Any], *, what: str) -> None:
        if run.run_id == NEXT and not fenced:
            fenced.append(run.run_id)
            raise FencedError("taken over meanwhile", run_id=NEXT, holder="fleet")
        await append_held(run, events, what=what)

    runner.writer.append = asked_as_it_hands_over  # type: ignore[method-assign]
    runner.writer.append_while_held = fenced_once  # type: ignore[method-assign]
    done = await runner.resume(world.ledger.agent(), RUN, tenant=TENANT)

    assert fenced
    assert (done.run_id, done.status) == (NEXT, "cancelled")
    assert world.ledger.count("pay") == 0


async def test_a_carry_whose_new_run_a_worker_took_up_at_once_is_no_conflict(
    world: World,
) -> None:
    """A fleet worker takes the new run up the moment it is handed over: the resume that
    carried the run succeeded, so it returns the run ``continued`` into the new run (whose
    holder carries it on), not a `ResumeConflictError` naming a run the caller never asked
    for."""
    await world.waiting_then_approved()
    runner = world.runner(continuation=POLICY)
    append = runner.writer.append

    async def taken_up_as_it_is_handed_over(run: Any, events: Sequence[Any]) -> None:
        await append(run, events)
        if any(isinstance(e, RunContinued) for e in events):
            await runner.leases.acquire(NEXT, tenant=TENANT, holder="fleet", ttl_s=60)

    runner.writer.append = taken_up_as_it_is_handed_over  # type: ignore[method-assign]
    done = await runner.resume(world.ledger.agent(), RUN, tenant=TENANT)

    assert (done.run_id, done.status, done.continued_to) == (RUN, "continued", NEXT)
    assert world.ledger.count("pay") == 0


@pytest.mark.parametrize("tenant", [TENANT, "globex"])
async def test_a_run_whose_successors_id_another_run_holds_is_carried_on(
    world: World, tenant: str
) -> None:
    """A person named a run ``r~c1``, the id ``r`` is carried into: ``r`` is carried into an
    id derived from its own, every time it comes due, rather than refused at each boundary
    (its resumes failing for good); the other run is left as it was."""
    other = await world.runner().run(
        world.ledger.agent(), "pay the invoice", tenant=tenant, run_id=NEXT
    )
    assert other.status == "waiting"
    before = await world.log.read_run(NEXT)
    await world.waiting_then_approved()
    agent = world.ledger.agent()

    done = await world.runner(continuation=POLICY).resume(agent, RUN, tenant=TENANT)

    assert done.status == "completed"
    assert done.run_id not in (RUN, NEXT)
    assert len(done.run_id) <= MAX_NAME_LENGTH
    assert world.ledger.effects.count(("pay", idempotency_key(RUN, "p"))) == 1
    assert await world.log.read_run(NEXT) == before
    old = await world.runner().inspect(RUN, tenant=TENANT)
    new = await world.runner().inspect(done.run_id, tenant=TENANT)
    assert (old.continued_to, new.continuation_of) == (done.run_id, RUN)
    assert [f.run_id for f in await chain_of(world.runner(), new)] == [RUN, done.run_id]


async def test_a_run_whose_successors_id_is_held_this_moment_goes_on(world: World) -> None:
    """Another worker holds the lease of the id the run is carried into (starting a run a
    person named ``r~c1``): the resume that carries the run must not fail with a conflict
    over a run the caller never named, leaving the run held by nobody; it goes on where it
    is, and pays once."""
    await world.waiting_then_approved()
    runner = world.runner(continuation=POLICY)
    await runner.leases.acquire(NEXT, tenant=TENANT, holder="starter", ttl_s=60)

    done = await runner.resume(world.ledger.agent(), RUN, tenant=TENANT)

    assert (done.run_id, done.status) == (RUN, "completed")
    assert world.ledger.count("pay") == 1


def test_the_ids_a_carry_tries_are_its_own_and_fit() -> None:
    assert successor_ids("r")[0] == successor_id("r") == "r~c1"
    for run_id in ("r~c01", "r~c1", "r" * MAX_NAME_LENGTH, "r~c" + "9" * (MAX_NAME_LENGTH - 3)):
        ids = successor_ids(run_id)
        assert len(set(ids)) == len(ids) > 1
        assert all(len(i) <= MAX_NAME_LENGTH and i != run_id for i in ids)
    assert set(successor_ids("r~c01")[1:]).isdisjoint(successor_ids("r~c1"))


async def test_two_runs_numbered_alike_are_each_carried_on(world: World) -> None:
    """``r~c01`` and ``r~c1`` both number their successor ``r~c2``: the second carried on must
    not be refused for good because the first took it."""
    agent = world.ledger.agent()
    results = []
    for run_id in ("r~c01", "r~c1"):
        world.model = Recording()
        assert (await world.runner().run(agent, "pay", tenant=TENANT, run_id=run_id)).waiting_on
        await world.runner().approve(run_id, "p", tenant=TENANT, by="ann")
        results.append(await world.runner(continuation=POLICY).resume(agent, run_id, tenant=TENANT))
    assert [r.status for r in results] == ["completed", "completed"]
    assert results[0].run_id != results[1].run_id
    for run_id, result in zip(("r~c01", "r~c1"), results, strict=True):
        assert (await world.runner().inspect(run_id, tenant=TENANT)).continued_to == result.run_id
    assert world.ledger.count("pay") == 2


@pytest.mark.parametrize("policy", [None, POLICY], ids=["fleet", "carrying"])
async def test_a_carry_cut_short_into_an_id_of_its_own_is_found_again(
    world: World, policy: ContinuationPolicy | None
) -> None:
    """As above, and the carry dies between the new run's start and the old run's end: the
    next resume finds the run it started (not a third id), and the payment is made once."""
    await world.runner().run(world.ledger.agent(), "pay", tenant="globex", run_id=NEXT)
    agent = await world.carried_until_it_dies("run.started")
    first, second = successor_ids(RUN)[1:3]
    assert (await world.runner().inspect(first, tenant=TENANT)).continuation_of == RUN

    done = await world.runner(continuation=policy).resume(agent, RUN, tenant=TENANT)

    assert (done.run_id, done.status) == (first, "completed")
    assert await world.log.read_run(second) == []
    assert world.ledger.effects.count(("pay", idempotency_key(RUN, "p"))) == 1


async def test_a_carry_cut_short_into_an_id_of_its_own_is_finished_from_the_new_run(
    world: World,
) -> None:
    """As above, the new run resumed first: it ends the old run into itself, then pays."""
    await world.runner().run(world.ledger.agent(), "pay", tenant="globex", run_id=NEXT)
    agent = await world.carried_until_it_dies("run.started")
    first = successor_ids(RUN)[1]

    done = await world.runner().resume(agent, first, tenant=TENANT)

    assert (done.run_id, done.status) == (first, "completed")
    assert (await world.runner().inspect(RUN, tenant=TENANT)).continued_to == first
    assert world.ledger.effects.count(("pay", idempotency_key(RUN, "p"))) == 1


async def test_another_tenants_event_in_a_run_does_not_make_it_theirs(world: World) -> None:
    """An event of tenant A appended into B's run (as the continuation takeover did) is refused
    by the fold and changes nothing about whose run it is."""
    await world.runner().run(world.ledger.agent(), "pay the invoice", tenant="globex", run_id=RUN)
    forged = RunStarted(
        run_id=RUN, tenant=TENANT, seq=1, fence=99, at=1, agent="payer", revision="x"
    )
    await world.log.append([forged])
    with pytest.raises(NothingToResumeError):
        await world.runner().inspect(RUN, tenant=TENANT)
    with pytest.raises(NothingToResumeError):
        await world.runner().approve(RUN, "p", tenant=TENANT, by="mallory")
    assert (await world.runner().inspect(RUN, tenant="globex")).waiting_on == "p"


@pytest.mark.parametrize("new_first", [False, True], ids=["old-first", "new-first"])
async def test_a_carry_cut_short_is_finished_by_a_resume_without_a_policy(
    world: World, new_first: bool
) -> None:
    """The carry died between the new run's start and the old run's end, and both runs are
    then resumed by runners that carry nothing on (a fleet worker, `onward run --resume`), in
    either order: the payment the old run handed over is made once, in the new run."""
    agent = await world.carried_until_it_dies("run.started")
    assert kind_of(RunContinued) not in await world.kinds(RUN)
    order = [NEXT, RUN] if new_first else [RUN, NEXT]
    results = [await world.runner().resume(agent, run_id, tenant=TENANT) for run_id in order]
    assert world.ledger.count("pay") == 1
    assert (await world.runner().inspect(RUN, tenant=TENANT)).status == "continued"
    assert {(r.run_id, r.status) for r in results} == {(NEXT, "completed")}


async def test_a_call_a_person_settled_before_its_dispatch_is_not_made_after_a_carry(
    world: World,
) -> None:
    """Ann pays by hand, settles the waiting call ``p`` as completed and lets the run go on:
    carried into a new run or not, ``pay`` is never called (the outcome is not dropped)."""
    result = await world.runner().run(
        world.ledger.agent(), "pay the invoice", tenant=TENANT, run_id=RUN
    )
    assert result.status == "waiting"
    await world.runner().resolve(
        RUN,
        "p",
        tenant=TENANT,
        outcome="completed",
        by="ann",
        why="paid by hand",
        result="paid 10 by hand",
    )
    await world.runner().approve(RUN, "p", tenant=TENANT, by="ann")
    done = await world.runner(continuation=POLICY).resume(world.ledger.agent(), RUN, tenant=TENANT)
    assert done.status == "completed"
    assert world.ledger.count("pay") == 0


@contextlib.asynccontextmanager
async def two_lease_stores(
    tmp_path: Path,
) -> AsyncIterator[tuple[World, SqliteLeaseStore, SqliteLeaseStore]]:
    """A world in one SQLite file, with two lease stores on it: the holder's that loses the run,
    and another worker's."""
    path = tmp_path / "onward.db"
    async with (
        SqliteEventLog(path) as log,
        SqliteFrontierStore(path) as frontiers,
        SqliteLeaseStore(path) as losing_leases,
        SqliteLeaseStore(path) as other_leases,
    ):
        yield (
            World(log, {"frontiers": frontiers, "checkpoint_inline": True}),
            losing_leases,
            other_leases,
        )


async def test_a_holder_that_lost_the_run_mid_carry_starts_no_successor(tmp_path: Path) -> None:
    """While the holder takes its successor's lease, its own lease is lost without its knowing
    (a lease store that forgot it: a wiped Redis) and another worker carries the old run on to
    its end, paying. The holder must not then start the successor it had handed the turn to:
    that run would pay again."""
    async with two_lease_stores(tmp_path) as (world, losing_leases, other_leases):
        await world.waiting_then_approved()
        agent = world.ledger.agent()
        other = world.runner(leases=other_leases)
        acquire = losing_leases.acquire
        lost: list[RunLease] = []

        async def lost_at_the_successor(run_id: str, **options: Any) -> RunLease:
            if run_id == NEXT and not lost:
                held = await other_leases.current(RUN)
                assert held is not None
                lost.append(held)
                await other_leases.release(held)  # forgotten by the store
                assert (await other.resume(agent, RUN, tenant=TENANT)).status == "completed"
            return await acquire(run_id, **options)

        losing_leases.acquire = lost_at_the_successor  # type: ignore[method-assign]
        losing = world.runner(leases=losing_leases, continuation=POLICY)
        with pytest.raises(FencedError):
            await losing.resume(agent, RUN, tenant=TENANT)
        with pytest.raises(NothingToResumeError):
            await world.runner().resume(agent, NEXT, tenant=TENANT)
    assert world.ledger.count("pay") == 1


async def lost_as_the_successor_starts(
    world: World, losing_leases: SqliteLeaseStore, other_leases: SqliteLeaseStore, *, dies: bool
) -> None:
    """Ann approves ``p``; a runner carrying runs on resumes the run and confirms its lease,
    then pauses before its successor's `RunStarted` lands. Meanwhile the store forgets that
    lease and a runner carrying nothing on resumes the old run, finds no successor, and pays.
    The successor's start then lands; with ``dies``, its writer dies right after."""
    await world.waiting_then_approved()
    agent = world.ledger.agent()
    other = world.runner(leases=other_leases)
    losing = world.runner(leases=losing_leases, continuation=POLICY)
    append = losing.writer.append
    lost: list[RunLease] = []

    async def paused_at_the_hand_over(run: Any, events: Sequence[Any]) -> None:
        if run.run_id != NEXT or lost:
            await append(run, events)
            return
        held = await other_leases.current(RUN)
        assert held is not None
        lost.append(held)
        await other_leases.release(held)  # forgotten by the store
        await other.resume(agent, RUN, tenant=TENANT)
        assert world.ledger.effects.count(("pay", idempotency_key(RUN, "p"))) == 1
        await append(run, events)
        if dies:
            raise Crash("after the successor's start")

    losing.writer.append = paused_at_the_hand_over  # type: ignore[method-assign]
    with contextlib.suppress(FencedError, Crash):
        await losing.resume(agent, RUN, tenant=TENANT)
    assert lost
    assert (await world.runner().inspect(NEXT, tenant=TENANT)).continuation_of == RUN


async def test_a_holder_that_loses_the_run_as_its_successor_starts_hands_nothing_over(
    tmp_path: Path,
) -> None:
    """The successor written after the old run went on must never pay: a carry hands the turn
    over only once the old run's `RunContinued` into it is counted (it is refused here, written
    under a lost lease). The successor is ended without acting."""
    async with two_lease_stores(tmp_path) as (world, losing_leases, other_leases):
        await lost_as_the_successor_starts(world, losing_leases, other_leases, dies=False)
        agent = world.ledger.agent()
        again = await world.runner().resume(agent, NEXT, tenant=TENANT)
        assert (again.status, again.run_id) == ("failed", NEXT)
        assert "went on without it" in (again.error or "")
        assert (await world.runner().inspect(RUN, tenant=TENANT)).status == "completed"
        # No link of a chain: `onward inspect` of it shows it alone.
        ended = await world.runner().inspect(NEXT, tenant=TENANT)
        assert [f.run_id for f in await chain_of(world.runner(), ended)] == [NEXT]
    assert world.ledger.count("pay") == 1


async def test_a_successor_ended_as_overtaken_gives_its_spend(tmp_path: Path) -> None:
    """The successor's writer died, so its resume is what ends it as overtaken: its result
    says what it cost (nothing: it never called the model), as every result of a runner with
    a spend ledger does, rather than leave ``spend_micros`` unset."""
    async with two_lease_stores(tmp_path) as (world, losing_leases, other_leases):
        await lost_as_the_successor_starts(world, losing_leases, other_leases, dies=True)
        runner = world.runner(spend=MemorySpendLedger())
        again = await runner.resume(world.ledger.agent(), NEXT, tenant=TENANT)
        assert (again.status, again.spend_micros) == ("failed", 0)


async def test_a_successor_the_old_run_went_on_without_is_never_carried_into(
    tmp_path: Path,
) -> None:
    """As above, but the successor's writer dies, so nobody resumes the successor, and the old
    run goes on to a second payment a person approves. Resumed then by a runner carrying runs
    on, the old run must neither end into that stale successor (which holds the first payment's
    turn: paid again) nor start it again: it is carried into the next id of its own instead
    (its first is taken for good; going on uncarried at every boundary, its log would grow
    without end), which pays the second one once."""
    async with two_lease_stores(tmp_path) as (world, losing_leases, other_leases):
        world.model.inner = ScriptedProvider(
            [
                reply("", ToolCall(call_id="a", tool="lookup", args={"what": "invoice"})),
                reply("", ToolCall(call_id="b", tool="lookup", args={"what": "account"})),
                reply("", ToolCall(call_id="p", tool="pay", args={"amount": 10})),
                reply("", ToolCall(call_id="q", tool="pay", args={"amount": 20})),
                reply("paid both"),
            ]
        )
        await lost_as_the_successor_starts(world, losing_leases, other_leases, dies=True)
        assert (await world.runner().inspect(RUN, tenant=TENANT)).waiting_on == "q"
        await world.runner().approve(RUN, "q", tenant=TENANT, by="ann")
        agent = world.ledger.agent()
        done = await world.runner(continuation=POLICY).resume(agent, RUN, tenant=TENANT)
        assert (done.run_id, done.status) == (successor_ids(RUN)[1], "completed")
        assert (await world.runner().inspect(RUN, tenant=TENANT)).continued_to == done.run_id
        ended = await world.runner().resume(agent, NEXT, tenant=TENANT)
        assert ended.status == "failed"
    assert world.ledger.effects.count(("pay", idempotency_key(RUN, "p"))) == 1
    assert world.ledger.effects.count(("pay", idempotency_key(RUN, "q"))) == 1


@pytest.mark.parametrize("policy", [None, POLICY], ids=["fleet", "carrying"])
async def test_a_carry_cut_short_past_a_stale_successor_is_found_again(
    tmp_path: Path, policy: ContinuationPolicy | None
) -> None:
    """As above, and the carry into the run's next id dies between the new run's start and
    the old run's end: the next resume finds that carry past the stale successor (a fleet
    worker too), and the second payment is made once, in the new run."""
    async with two_lease_stores(tmp_path) as (world, losing_leases, other_leases):
        world.model.inner = ScriptedProvider(
            [
                reply("", ToolCall(call_id="a", tool="lookup", args={"what": "invoice"})),
                reply("", ToolCall(call_id="b", tool="lookup", args={"what": "account"})),
                reply("", ToolCall(call_id="p", tool="pay", args={"amount": 10})),
                reply("", ToolCall(call_id="q", tool="pay", args={"amount": 20})),
                reply("paid both"),
            ]
        )
        await lost_as_the_successor_starts(world, losing_leases, other_leases, dies=True)
        await world.runner().approve(RUN, "q", tenant=TENANT, by="ann")
        agent = world.ledger.agent()
        crashing = world.runner(continuation=POLICY, observer=CrashAt("run.started"))
        with pytest.raises(Crash):
            await crashing.resume(agent, RUN, tenant=TENANT)
        first, second = successor_ids(RUN)[1:3]

        done = await world.runner(continuation=policy).resume(agent, RUN, tenant=TENANT)

        assert (done.run_id, done.status) == (first, "completed")
        assert await world.log.read_run(second) == []
    assert world.ledger.effects.count(("pay", idempotency_key(RUN, "p"))) == 1
    assert world.ledger.effects.count(("pay", idempotency_key(RUN, "q"))) == 1


@pytest.mark.parametrize(
    "long_id",
    ["r" * MAX_NAME_LENGTH, "r~c" + "9" * (MAX_NAME_LENGTH - 3)],
    ids=["name", "numbered"],
)
async def test_a_run_whose_id_is_as_long_as_ids_go_is_carried_into_one_that_can_be_resumed(
    world: World, long_id: str
) -> None:
    """A run id of the longest length allowed (`MAX_NAME_LENGTH`) is carried into a run whose
    id is no longer: one past it would be refused by every resume, the run stranded. Also
    when the id is mostly a successor's number (its base alone would not leave room)."""
    result = await world.runner().run(
        world.ledger.agent(), "pay the invoice", tenant=TENANT, run_id=long_id
    )
    assert result.status == "waiting"
    await world.runner().approve(long_id, "p", tenant=TENANT, by="ann", value={"limit": 10})
    agent = world.ledger.agent()

    result = await world.runner(continuation=POLICY).resume(agent, long_id, tenant=TENANT)

    assert (result.status, result.output) == ("completed", "paid")
    assert result.run_id != long_id
    assert len(result.run_id) <= MAX_NAME_LENGTH
    assert world.ledger.count("pay") == 1
    old = await world.runner().inspect(long_id, tenant=TENANT)
    assert old.continued_to == result.run_id
    assert successor_id(result.run_id) != result.run_id
    assert len(successor_id(result.run_id)) <= MAX_NAME_LENGTH


@pytest.mark.parametrize("run_id", ["r~c\u00b2", "r~c\u2460"], ids=["superscript", "circled"])
async def test_a_run_whose_id_ends_in_a_digit_int_refuses_is_resumed_and_carried_on(
    world: World, run_id: str
) -> None:
    """A run id that looks like a successor's but whose number is a digit `int` refuses (a
    superscript two): its resume, which looks for a successor a cut carry left, and its
    carry go on rather than fail with a ValueError at every resume, the run stranded."""
    result = await world.runner().run(
        world.ledger.agent(), "pay the invoice", tenant=TENANT, run_id=run_id
    )
    assert result.status == "waiting"
    await world.runner().approve(run_id, "p", tenant=TENANT, by="ann", value={"limit": 10})
    agent = world.ledger.agent()

    result = await world.runner(continuation=POLICY).resume(agent, run_id, tenant=TENANT)

    assert (result.run_id, result.status, result.output) == (f"{run_id}~c1", "completed", "paid")
    assert world.ledger.count("pay") == 1
    assert successor_id(run_id) == f"{run_id}~c1"


async def test_a_wiped_lease_store_does_not_stop_a_run_whose_stale_successor_it_forgot(
    tmp_path: Path,
) -> None:
    """As above, but the old run is then resumed under a lease store that was wiped (it never
    saw the stale successor's id): the log, not the store, says the id holds a carry the run
    went on without, so the run is carried into its next id, rather than into that carry or
    fail at every boundary."""
    async with two_lease_stores(tmp_path) as (world, losing_leases, other_leases):
        world.model.inner = ScriptedProvider(
            [
                reply("", ToolCall(call_id="a", tool="lookup", args={"what": "invoice"})),
                reply("", ToolCall(call_id="b", tool="lookup", args={"what": "account"})),
                reply("", ToolCall(call_id="p", tool="pay", args={"amount": 10})),
                reply("", ToolCall(call_id="q", tool="pay", args={"amount": 20})),
                reply("paid both"),
            ]
        )
        await lost_as_the_successor_starts(world, losing_leases, other_leases, dies=True)
        await world.runner().approve(RUN, "q", tenant=TENANT, by="ann")
        agent = world.ledger.agent()
        async with SqliteLeaseStore(tmp_path / "wiped.db") as wiped:
            runner = world.runner(leases=wiped, continuation=POLICY)
            done = await runner.resume(agent, RUN, tenant=TENANT)
        assert (done.run_id, done.status) == (successor_ids(RUN)[1], "completed")
    assert world.ledger.effects.count(("pay", idempotency_key(RUN, "p"))) == 1
    assert world.ledger.effects.count(("pay", idempotency_key(RUN, "q"))) == 1


async def test_a_turn_too_large_to_carry_goes_on_in_the_run_it_is_in() -> None:
    """Two payments approved with values (a person's edits) that each fit a record of the log,
    but not both in one: the new run's `RunStarted` carrying both could never be written, so
    the turn is made in the run it is in, each payment once, rather than the run fail at
    every resume; it is carried on once the turn has settled."""
    world = World(MemoryEventLog(max_batch_bytes=8_000), {})
    world.model.inner = ScriptedProvider(
        [
            reply(
                "",
                ToolCall(call_id="p", tool="pay", args={"amount": 10}),
                ToolCall(call_id="q", tool="pay", args={"amount": 20}),
            ),
            reply("paid both"),
        ]
    )
    agent = world.ledger.agent()
    runner = world.runner()
    edits = {"note": "x" * 5_000}
    assert (await runner.run(agent, "pay both", tenant=TENANT, run_id=RUN)).waiting_on == "p"
    await runner.approve(RUN, "p", tenant=TENANT, by="ann", value=edits)
    assert (await runner.resume(agent, RUN, tenant=TENANT)).waiting_on == "q"
    await runner.approve(RUN, "q", tenant=TENANT, by="ann", value=edits)
    assert world.ledger.count("pay") == 0

    done = await world.runner(continuation=ContinuationPolicy(max_steps=2)).resume(
        agent, RUN, tenant=TENANT
    )

    assert (done.status, done.output) == ("completed", "paid both")
    assert world.ledger.count("pay") == 2  # in the old run; carried on once the turn settled
    assert kind_of(ToolDispatched) not in await world.kinds(done.run_id)


class CountingLog(MemoryEventLog):
    """A log counting the reads of each run's records."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: Counter[str | None] = Counter()

    async def _read_records(self, request: LogRead) -> list[LogRecord]:
        self.reads[request.run_id] += 1
        return await super()._read_records(request)


async def test_resuming_a_chain_reads_each_run_of_it_a_bounded_number_of_times() -> None:
    """A resume walks a chain of continued runs to its last: a run already carried on has
    nothing to do, so it rebuilds no conversation, and the chain is read once over rather
    than every earlier run's transcript again at each run of it."""
    log = CountingLog()
    world = World(log, {})
    links = 12
    world.model.inner = ScriptedProvider(
        [
            *(
                reply("", ToolCall(call_id=f"l{n}", tool="lookup", args={"what": str(n)}))
                for n in range(links)
            ),
            reply("done"),
        ]
    )
    agent = dataclasses.replace(world.ledger.agent(), max_iterations=100)
    carrying = world.runner(continuation=ContinuationPolicy(max_steps=2))
    done = await carrying.run(agent, "look it all up", tenant=TENANT, run_id=RUN)
    assert done.status == "completed"
    log.reads.clear()

    again = await world.runner().resume(agent, RUN, tenant=TENANT)

    assert (again.status, again.run_id) == ("completed", done.run_id)
    assert log.reads[RUN] == log.reads[done.run_id]


class Depths:
    """A scripted model keeping how deep the stack is at each call."""

    def __init__(self, inner: ScriptedProvider) -> None:
        self.inner = inner
        self.depths: list[int] = []

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        depth = 0
        frame: FrameType | None = sys._getframe()
        while frame is not None:
            depth, frame = depth + 1, frame.f_back
        self.depths.append(depth)
        return await self.inner.complete(agent, messages)


async def test_a_run_carried_on_run_after_run_goes_no_deeper_at_each() -> None:
    """One call drives a run through every run it is carried into: were each taken up inside
    the last one's call, a chain of some hundreds of runs would end in a RecursionError."""
    model = Depths(
        ScriptedProvider(
            [
                *(
                    reply("", ToolCall(call_id=f"l{n}", tool="lookup", args={"what": str(n)}))
                    for n in range(8)
                ),
                reply("done"),
            ]
        )
    )
    agent = dataclasses.replace(Ledger().agent(), max_iterations=100)
    runner = AgentRunner(
        provider=model, log=MemoryEventLog(), continuation=ContinuationPolicy(max_steps=2)
    )
    done = await runner.run(agent, "look it all up", tenant=TENANT, run_id=RUN)
    assert (done.status, done.run_id) == ("completed", "r~c8")
    assert len(set(model.depths[1:])) == 1, model.depths


async def test_a_run_carried_into_a_new_run_counts_its_tools_done_across_the_chain(
    world: World,
) -> None:
    """The new run's messages count model calls from the old run's on (``iteration`` spans
    the chain): they count the tool calls done the same way, not from 0 again."""
    await world.waiting_then_approved()
    result = await world.runner(continuation=POLICY).resume(
        world.ledger.agent(), RUN, tenant=TENANT
    )
    assert (result.run_id, result.status) == (NEXT, "completed")

    mapper = MessageMapper()
    said = [m for s in await world.log.read_run(NEXT) for m in mapper.messages(s.event)]

    progress = [(m.iteration, m.tools_done) for m in said if m.type == "progress"]
    assert progress == [(3, 3)]  # two lookups in the old run, the payment in the new
    assert (said[-1].type, said[-1].iteration, said[-1].tools_done) == ("result", 4, 3)


class NamedCarry(ContinuationPolicy):
    """A policy carrying a run into an id of its own choosing (a policy may override
    `continued`)."""

    def continued(self, frontier: Frontier) -> Continuation:
        return continued(frontier, new_run_id=f"{frontier.run_id}-next")


async def test_a_carry_cut_short_into_an_id_a_policy_chose_is_finished_from_the_new_run(
    world: World,
) -> None:
    """A policy named the new run; the carry died between the new run's start and the old
    run's end, and the new run is resumed first by a runner without that policy (a fleet
    worker, `onward run --resume`): it ends the old run into itself, then pays, as a new run
    under a derived id does, rather than have the old run pay and itself be left running."""
    named = "r-next"
    await world.waiting_then_approved()
    agent = world.ledger.agent()
    crashing = world.runner(continuation=NamedCarry(max_steps=10), observer=CrashAt("run.started"))
    with pytest.raises(Crash):
        await crashing.resume(agent, RUN, tenant=TENANT)
    assert (await world.runner().inspect(named, tenant=TENANT)).continuation_of == RUN

    done = await world.runner().resume(agent, named, tenant=TENANT)

    assert (done.run_id, done.status) == (named, "completed")
    assert (await world.runner().inspect(RUN, tenant=TENANT)).continued_to == named
    assert world.ledger.effects.count(("pay", idempotency_key(RUN, "p"))) == 1
    again = await world.runner().resume(agent, RUN, tenant=TENANT)
    assert (again.run_id, again.status) == (named, "completed")
    assert world.ledger.count("pay") == 1


@pytest.mark.parametrize("new_id", ["x" * (MAX_NAME_LENGTH + 1), "r\x01next"], ids=["long", "ctrl"])
async def test_a_continuation_into_an_id_no_run_may_have_is_refused_and_writes_nothing(
    world: World, new_id: str
) -> None:
    """A policy names the new run with an id no run may have (over the length limit, or
    holding a control character): carried into it, the old run would be ended into a run no
    resume takes, and its payment never made. Refused as a policy that drops a grant is, with
    nothing written; a resume with a policy that works carries the run on."""

    class Misnamed(ContinuationPolicy):
        def continued(self, frontier: Frontier) -> Continuation:
            return continued(frontier, new_run_id=new_id)

    await world.waiting_then_approved()
    before = await world.kinds(RUN)
    agent = world.ledger.agent()
    with pytest.raises(ConfigurationError, match="new_run_id"):
        await world.runner(continuation=Misnamed(max_steps=10)).resume(agent, RUN, tenant=TENANT)
    after = await world.kinds(RUN)
    assert kind_of(RunContinued) not in after
    assert after[: len(before)] == before
    assert await world.log.read_run(new_id) == []
    result = await world.runner(continuation=POLICY).resume(agent, RUN, tenant=TENANT)
    assert (result.run_id, result.status) == (NEXT, "completed")
    assert world.ledger.count("pay") == 1


async def test_a_continuation_into_the_run_itself_is_refused_and_writes_nothing(
    world: World,
) -> None:
    """A policy names the run itself as its new run: the run's own lease would refuse the new
    run at every boundary and the run would go on uncarried. Refused, nothing carried or paid."""

    class IntoItself(ContinuationPolicy):
        def continued(self, frontier: Frontier) -> Continuation:
            return continued(frontier, new_run_id=frontier.run_id)

    await world.waiting_then_approved()
    before = await world.kinds(RUN)
    agent = world.ledger.agent()
    with pytest.raises(ConfigurationError, match="names the run itself"):
        await world.runner(continuation=IntoItself(max_steps=10)).resume(agent, RUN, tenant=TENANT)
    after = await world.kinds(RUN)
    assert kind_of(RunContinued) not in after
    assert after[: len(before)] == before
    assert world.ledger.count("pay") == 0


async def resumed_ends_cancelled(
    world: World, agent: Agent, resumed: str, *, ends: str | None = None, paid: str
) -> None:
    """A resume of ``resumed`` ends the run it goes on as (``ends``, else ``resumed``)
    ``cancelled`` as Ann asked, and nothing paid (else fail saying ``paid``)."""
    result = await world.runner().resume(agent, resumed, tenant=TENANT)
    assert world.ledger.count("pay") == 0, paid
    assert (result.run_id, result.status, result.error) == (
        ends or resumed,
        "cancelled",
        "cancelled by ann: stop it",
    )


async def test_an_ask_kept_for_a_new_run_a_cut_carry_started_ends_it_resumed_first(
    world: World,
) -> None:
    """The carry died between the new run's start and the old run's end, holding the new run
    as Ann asked it to cancel (the ask kept with its lease): a resume of the new run first ends
    the old run into it, and must then end it as asked, not go on and pay."""
    agent = await world.carried_until_it_dies("run.started")
    runner = world.runner()
    dying = await runner.leases.acquire(NEXT, tenant=TENANT, holder="the carry", ttl_s=60)
    assert await runner.ask_to_cancel(NEXT, tenant=TENANT, by="ann", why="stop it")
    await runner.leases.release(unheard(dying))  # it died without hearing the ask

    await resumed_ends_cancelled(world, agent, NEXT, paid="a run asked to cancel paid")


async def test_a_cancel_asked_as_the_carried_run_is_let_go_ends_the_run_it_goes_on_as(
    world: World,
) -> None:
    """Ann asks the run's holder to cancel it once it was carried on, as its holder lets go of
    it (after its last look for an ask): the ask is taken (a holding was asked), so the run it
    goes on as must end ``cancelled`` without paying, not be left with a run nobody drives."""
    await world.waiting_then_approved()
    runner = world.runner(continuation=POLICY)
    leases = runner.leases
    release = leases.release
    asked: list[RunLease | None] = []

    async def asked_as_it_lets_go(lease: RunLease) -> None:
        if lease.run_id == RUN and lease.holder == runner.worker and not asked:
            asked.append(await world.runner().ask_to_cancel(RUN, tenant=TENANT, by="ann"))
        await release(lease)

    leases.release = asked_as_it_lets_go  # type: ignore[method-assign]
    done = await runner.resume(world.ledger.agent(), RUN, tenant=TENANT)

    (holding,) = asked
    assert holding is not None
    assert world.ledger.count("pay") == 0, "a run asked to cancel paid"
    assert (await world.runner().inspect(NEXT, tenant=TENANT)).status == "cancelled"
    assert done.run_id == NEXT


async def test_a_cancel_asked_by_nobody_named_as_the_run_is_carried_on_is_passed_on(
    world: World,
) -> None:
    """The run's holder hears, as it carries the run on, an ask an older Onward kept with the
    lease without an asker's name (which a new ask must have): the carry has succeeded, so the
    resume must not fail on that name (losing the ask, the new run going on to pay), and the
    run it goes on as ends ``cancelled``."""
    await world.waiting_then_approved()
    runner = world.runner(continuation=POLICY)
    append, renew = runner.writer.append, runner.leases.renew
    handed_over: list[str] = []

    async def handing_over(run: Any, events: Sequence[Any]) -> None:
        await append(run, events)
        if any(isinstance(e, RunContinued) for e in events):
            handed_over.append(run.run_id)

    async def kept_by_an_older_onward(lease: RunLease, **how: Any) -> RunLease:
        renewed = await renew(lease, **how)
        if lease.run_id == RUN and handed_over:
            return dataclasses.replace(renewed, cancel_asked=CancelAsked(""))
        return renewed

    runner.writer.append = handing_over  # type: ignore[method-assign]
    runner.leases.renew = kept_by_an_older_onward  # type: ignore[method-assign]
    done = await runner.resume(world.ledger.agent(), RUN, tenant=TENANT)

    assert (done.run_id, done.status) == (NEXT, "cancelled")
    assert world.ledger.count("pay") == 0


async def test_a_fleet_cancel_of_a_run_carried_on_before_it_arrived_ends_the_run_it_goes_on_as(
    tmp_path: Path,
) -> None:
    """Ann's cancel of a running run was sent to the fleet (the app told her it was), and the
    run was carried on before the worker took the cancel up: the run it goes on as must end
    ``cancelled``, not be left to go on and pay while only a warning says it was not."""
    settings = Settings.model_validate(
        {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "fleet.db")}
    )
    ledger, model = Ledger(), Recording()
    agent = ledger.agent()
    async with open_backends(settings) as backends:
        waiting = await backends.runner(model).run(agent, "pay", tenant=TENANT, run_id=RUN)
        assert waiting.status == "waiting"
        await backends.runner(model).approve(RUN, "p", tenant=TENANT, by="ann", value={"x": 1})
        carrying = backends.runner(model)
        carrying.continuation = POLICY
        append = carrying.writer.append

        async def dies_in_the_new_run(run: Any, events: Sequence[Any]) -> None:
            if run.run_id == NEXT and any(isinstance(e, ToolDispatched) for e in events):
                raise Crash("before the payment")
            await append(run, events)

        carrying.writer.append = dies_in_the_new_run  # type: ignore[method-assign]
        with pytest.raises(Crash):
            await carrying.resume(agent, RUN, tenant=TENANT)
        worker = Worker(backends, model, {"payer": agent}, backoff_s=0)

        worker.submit(CancelRun(run_id=RUN, tenant=TENANT, by="ann", why="stop it"))
        await worker.drained()

        ended = await worker.runner.inspect(NEXT, tenant=TENANT)
        assert (ended.status, ended.error) == ("cancelled", "cancelled by ann: stop it")
        assert ledger.count("pay") == 0


async def test_a_run_a_producer_named_out_of_bounds_is_carried_by_the_default_continuation(
    world: World,
) -> None:
    """A run a producer wrote under an id holding a control character (which resume takes as
    stored) reaches a boundary under a runner that carries runs on: the derived successor keeps
    the run's own name, and must be taken, not refused as a name the policy chose, or every
    resume of the run fails with a `ConfigurationError` and it never goes on."""
    odd = "r\x1b[2J"
    await world.waiting_then_approved()
    stored = [msgspec.structs.replace(s.event, run_id=odd) for s in await world.log.read_run(RUN)]
    await world.log.append(stored)
    agent = world.ledger.agent()

    result = await world.runner(continuation=POLICY).resume(agent, odd, tenant=TENANT)

    assert (result.run_id, result.status) == (successor_id(odd), "completed")
    assert (await world.runner().inspect(odd, tenant=TENANT)).continued_to == successor_id(odd)
    assert world.ledger.count("pay") == 1


@pytest.mark.parametrize("resumed", [RUN, NEXT])
async def test_an_ask_kept_for_a_run_whose_carry_was_cut_short_ends_the_run_it_goes_on_as(
    world: World, resumed: str
) -> None:
    """The carry died between the new run's start and the old run's end, holding the old run
    as Ann asked it to cancel (the ask kept with its lease). The next resume (of either run)
    ends the old run into the new one, hearing the ask: the new run must end ``cancelled``,
    not go on unasked and pay while Ann was told her ask was taken."""
    agent = await world.carried_until_it_dies("run.started")
    runner = world.runner()
    dying = await runner.leases.acquire(RUN, tenant=TENANT, holder="the carry", ttl_s=60)
    assert await runner.ask_to_cancel(RUN, tenant=TENANT, by="ann", why="stop it")
    await runner.leases.release(unheard(dying))  # it died without hearing the ask

    await resumed_ends_cancelled(
        world, agent, resumed, ends=NEXT, paid="a run asked to cancel paid"
    )
    assert (await world.runner().inspect(RUN, tenant=TENANT)).continued_to == NEXT


async def test_onward_cancel_wait_follows_a_run_carried_on_as_its_holder_was_asked(
    tmp_path: Path,
) -> None:
    """``onward cancel --wait`` asks the run's holder to cancel it just as the holder carries
    it on: the ask goes on with the carry, and the run it goes on as ends ``cancelled``. The
    command must report that run cancelled (exit 0), not exit 2 saying the run ended
    ``continued`` and to cancel a run that is cancelled already."""
    path = tmp_path / "onward.db"
    env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(path)}
    async with (
        SqliteEventLog(path) as log,
        SqliteFrontierStore(path) as frontiers,
        SqliteLeaseStore(path) as leases,
    ):
        world = World(log, {"frontiers": frontiers, "leases": leases, "checkpoint_inline": True})
        await world.waiting_then_approved()
        runner = world.runner(continuation=POLICY, worker="carrier")
        append = runner.writer.append
        handing_over = asyncio.Event()

        async def asked() -> bool:
            held = await leases.current(RUN)
            return held is not None and held.cancel_asked is not None

        async def asked_as_it_hands_over(run: Any, events: Sequence[Any]) -> None:
            if any(isinstance(e, RunContinued) for e in events):
                handing_over.set()
                await until(asked, "the command's ask")
            await append(run, events)

        runner.writer.append = asked_as_it_hands_over  # type: ignore[method-assign]
        carrying = asyncio.create_task(runner.resume(world.ledger.agent(), RUN, tenant=TENANT))
        await asyncio.wait_for(handing_over.wait(), 10)
        args = ["cancel", RUN, "--tenant", TENANT, "--by", "ops", "--wait", "30"]
        result = await asyncio.to_thread(CliRunner().invoke, app, args, env=env)
        done = await carrying

    assert (done.run_id, done.status) == (NEXT, "cancelled")
    assert world.ledger.count("pay") == 0
    assert result.exit_code == 0, result.output
    assert f"cancelled run {NEXT} (by ops)" in result.stdout


async def test_a_cancel_asked_as_the_carry_confirms_the_lease_ends_the_run_before_it_pays(
    world: World,
) -> None:
    """Ann asks the run's holder to cancel it after the holder last looked for an ask at the
    boundary, and the carry due there hears it as it confirms the lease (so the run goes on
    uncarried): the run must end ``cancelled`` there, as asked, not first make the approved
    payment of its turn and end only at the boundary after."""
    await world.waiting_then_approved()
    runner = world.runner(continuation=POLICY)
    append = runner.writer.append

    async def asked_once_planned(run: Any, events: Sequence[Any]) -> None:
        await append(run, events)
        if any(isinstance(e, ResumePlanned) for e in events):
            assert await world.runner().ask_to_cancel(RUN, tenant=TENANT, by="ann") is not None

    runner.writer.append = asked_once_planned  # type: ignore[method-assign]
    done = await runner.resume(world.ledger.agent(), RUN, tenant=TENANT)

    assert world.ledger.count("pay") == 0, "a run asked to cancel paid"
    assert (done.run_id, done.status, done.error) == (RUN, "cancelled", "cancelled by ann")
    assert await world.log.read_run(NEXT) == []


async def test_a_cancel_of_a_run_whose_carry_was_cut_short_cancels_the_new_run_too(
    world: World,
) -> None:
    """The carry died between the new run's start and the old run's end, and Ann then cancels
    the run (nobody holds it): the new run the carry started must end ``cancelled`` as she
    asked, not show ``running`` and then end ``failed`` as a run its old run went on without,
    and nothing of it may be done."""
    agent = await world.carried_until_it_dies("run.started")

    await world.runner().cancel(RUN, tenant=TENANT, by="ann", why="stop it")

    new = await world.runner().inspect(NEXT, tenant=TENANT)
    assert (new.status, new.error) == ("cancelled", "cancelled by ann: stop it")
    result = await world.runner().resume(agent, NEXT, tenant=TENANT)
    assert (result.run_id, result.status) == (NEXT, "cancelled")
    assert world.ledger.count("pay") == 0


async def test_a_new_run_whose_cut_carry_was_cancelled_meanwhile_ends_cancelled_when_resumed(
    world: World,
) -> None:
    """As above, but the new run was held as the run was cancelled (its holder let go without
    ending it): its next resume must end it ``cancelled``, saying by whom, not ``failed`` as
    a run whose holder lost the old run while starting it."""
    agent = await world.carried_until_it_dies("run.started")
    runner = world.runner()
    holding = await runner.leases.acquire(NEXT, tenant=TENANT, holder="someone", ttl_s=60)
    await runner.cancel(RUN, tenant=TENANT, by="ann", why="stop it")
    await runner.leases.release(holding)

    await resumed_ends_cancelled(world, agent, NEXT, paid="a run asked to cancel paid")


async def test_a_cancel_of_the_new_run_a_cut_carry_started_stops_the_work(world: World) -> None:
    """The carry died between the new run's start and the old run's end, and Ann cancels the
    new run (the last of the chain, running as far as she can see): the turn was handed to it,
    so the old run must not go on and make its calls when next resumed."""
    agent = await world.carried_until_it_dies("run.started")

    await world.runner().cancel(NEXT, tenant=TENANT, by="ann", why="stop it")
    result = await world.runner().resume(agent, RUN, tenant=TENANT)

    assert world.ledger.count("pay") == 0, "the work Ann cancelled went on and paid"
    assert result.status == "cancelled"
    assert (await world.runner().inspect(NEXT, tenant=TENANT)).status == "cancelled"


async def test_a_cancel_of_the_new_run_a_cut_carry_started_asks_whoever_holds_the_old_run(
    world: World,
) -> None:
    """As above, with the old run held this moment (by a worker that then dies without hearing
    the ask): its holder is asked, and the old run's next resume ends it ``cancelled`` as Ann
    asked, without paying."""
    agent = await world.carried_until_it_dies("run.started")
    runner = world.runner()
    dying = await runner.leases.acquire(RUN, tenant=TENANT, holder="a worker", ttl_s=60)

    await runner.cancel(NEXT, tenant=TENANT, by="ann", why="stop it")
    await runner.leases.release(unheard(dying))
    await resumed_ends_cancelled(world, agent, RUN, paid="the work Ann cancelled went on and paid")


async def test_a_resume_of_the_new_run_that_meets_a_cancel_of_the_old_leaves_neither_running(
    world: World,
) -> None:
    """The carry died between the new run's start and the old run's end; a resume of the new
    run finds the old one where it was carried and goes to end it into the new run, and Ann
    cancels the old run just then (the new run still held, so her cancel cannot end it): the
    new run must not be left showing ``running`` once the resume is done."""
    agent = await world.carried_until_it_dies("run.started")
    runner = world.runner()
    leases = runner.leases
    release = leases.release

    async def cancelled_as_it_lets_go(lease: RunLease) -> None:
        if lease.run_id == NEXT:
            leases.release = release  # type: ignore[method-assign]
            await world.runner().cancel(RUN, tenant=TENANT, by="ann", why="stop it")
        await release(lease)

    leases.release = cancelled_as_it_lets_go  # type: ignore[method-assign]
    result = await runner.resume(agent, NEXT, tenant=TENANT)

    assert (result.run_id, result.status) == (NEXT, "cancelled")
    new = await world.runner().inspect(NEXT, tenant=TENANT)
    assert (new.status, new.error) == ("cancelled", "cancelled by ann: stop it")
    assert world.ledger.count("pay") == 0


async def test_a_cancel_of_the_new_run_a_cut_carry_started_retries_when_the_old_run_is_let_go(
    world: World,
) -> None:
    """As above, with the old run's holder letting go of it between the cancel finding it held
    and the ask (nobody holds it to be asked then): Ann's one cancel must end both runs
    ``cancelled``, not fail with a conflict naming the old run she never asked about."""
    agent = await world.carried_until_it_dies("run.started")
    runner = world.runner()
    leases = runner.leases
    holding = await leases.acquire(RUN, tenant=TENANT, holder="a worker", ttl_s=60)
    ask = leases.ask_to_cancel

    async def let_go_before_the_ask(run_id: str, **kwargs: Any) -> RunLease | None:
        if run_id == RUN:
            leases.ask_to_cancel = ask  # type: ignore[method-assign]
            await leases.release(holding)
        return await ask(run_id, **kwargs)

    leases.ask_to_cancel = let_go_before_the_ask  # type: ignore[method-assign]
    await runner.cancel(NEXT, tenant=TENANT, by="ann", why="stop it")
    await resumed_ends_cancelled(world, agent, RUN, paid="the work Ann cancelled went on and paid")
    assert (await world.runner().inspect(NEXT, tenant=TENANT)).status == "cancelled"


async def cancelled_by_ann(world: World, caplog: pytest.LogCaptureFixture, run_id: str) -> None:
    """Ann's cancel of ``run_id``, what it warns kept in ``caplog``: it must end the run
    ``cancelled`` as she asked."""
    with caplog.at_level(logging.WARNING, logger="onward.runner"):
        ended = await world.runner().cancel(run_id, tenant=TENANT, by="ann", why="stop it")
    assert (ended.status, ended.error) == ("cancelled", "cancelled by ann: stop it")


async def cancelled_though_a_run_cannot_be_read(
    world: World, caplog: pytest.LogCaptureFixture, *, unreadable: str, cancelled: str
) -> None:
    """The carry died between the new run's start and the old run's end, and ``unreadable``'s
    history holds a record nobody can read: Ann's cancel of ``cancelled`` must still end it
    ``cancelled``, without paying, and say that ``unreadable`` could not be read, naming it."""
    await world.carried_until_it_dies("run.started")
    assert isinstance(world.log, MemoryEventLog | SqliteEventLog)
    world.log.write_raw(unreadable, b"not an event")

    await cancelled_by_ann(world, caplog, cancelled)
    assert f"run {unreadable!r}" in caplog.text, f"{unreadable}'s problem was not told"
    assert world.ledger.count("pay") == 0


async def test_a_cancel_ends_the_run_though_a_carry_it_started_cannot_be_read(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """The carry died between the new run's start and the old run's end, and the new run's
    history holds a record nobody can read: Ann's cancel of the old run must still end it
    ``cancelled`` (it failed, naming the new run, and the old run went on showing running),
    and say that the new run could not be read, naming it."""
    await cancelled_though_a_run_cannot_be_read(world, caplog, unreadable=NEXT, cancelled=RUN)
    assert (await world.runner().inspect(RUN, tenant=TENANT)).status == "cancelled"
    assert "cancel that run too" in caplog.text, "the new run's problem was not told"


async def test_a_cancel_of_the_new_run_ends_it_though_the_old_run_cannot_be_read(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """The carry died between the new run's start and the old run's end, and the old run's
    history holds a record nobody can read: Ann's cancel of the new run must still end it
    ``cancelled`` (no resume carries the old run on while it cannot be read), saying so."""
    await cancelled_though_a_run_cannot_be_read(world, caplog, unreadable=RUN, cancelled=NEXT)


async def test_a_cancel_of_the_new_run_is_refused_while_a_newer_onward_wrote_the_old_run(
    world: World,
) -> None:
    """The carry died between the new run's start and the old run's end, and a newer Onward
    (a rolling upgrade) claimed the old run since, in a format this code cannot read: a newer
    worker can resume it, and with the new run ended would make the turn's calls itself. Ann's
    cancel of the new run must be refused, saying to upgrade, and write nothing, not end the
    new run alone and leave the work she stopped to go on."""
    await world.carried_until_it_dies("run.started")
    assert isinstance(world.log, MemoryEventLog | SqliteEventLog)
    old = await world.runner().inspect(RUN, tenant=TENANT)
    claimed = {"kind": "run.claimed", "run_id": RUN, "seq": old.last_seq + 1}
    world.log.write_raw(RUN, msgspec.json.encode({**claimed, "format": EVENT_FORMAT + 1}))

    with pytest.raises(CheckpointFormatError, match="upgrade Onward"):
        await world.runner().cancel(NEXT, tenant=TENANT, by="ann", why="stop it")

    assert (await world.runner().inspect(NEXT, tenant=TENANT)).status != "cancelled"


async def test_a_cancel_that_cannot_read_a_carry_it_started_names_that_run(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """As above, the unreadable record under the new run's id naming no run it can be told by
    (a run id holding a NUL): the warning must still name the run Ann is to cancel too, not
    tell her to cancel run ``None``."""
    await world.carried_until_it_dies("run.started")
    assert isinstance(world.log, MemoryEventLog | SqliteEventLog)
    (*_, last) = await world.log.read_run(NEXT)
    foreign = msgspec.structs.replace(last.event, run_id=f"{NEXT}\x00", seq=last.event.seq + 1)
    world.log.write_raw(NEXT, msgspec.json.encode(foreign))

    await cancelled_by_ann(world, caplog, RUN)
    assert "run None" not in caplog.text
    assert f"without the run under an id a carry of it takes ({NEXT!r} first)" in caplog.text
