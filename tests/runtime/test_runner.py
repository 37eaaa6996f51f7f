"""The runner on the in-memory log: the loop, write-ahead dispatch, approvals, resume decisions."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest
from support.crash_world import search_and_book
from support.crashes import Crash, CrashAt

from onward.errors import (
    BackendUnavailableError,
    CheckpointFormatError,
    ConfigurationError,
    HistoryUnavailableError,
    IndeterminateToolCallError,
    InvalidInputError,
    NothingToResumeError,
    RevisionMismatchError,
)
from onward.eventlog import (
    EVENT_FORMAT,
    ApprovalRequested,
    Event,
    MemoryEventLog,
    Position,
    ToolCall,
    ToolCompleted,
    ToolDispatched,
    kind_of,
)
from onward.projections.memory import MemoryFrontierStore
from onward.runtime.agent import Agent
from onward.runtime.blobs import MemoryBlobStore
from onward.runtime.leases.base import RunLease
from onward.runtime.leases.memory import MemoryLeaseStore
from onward.runtime.planning import ResumePlan, ToolDisposition
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.runner import AgentRunner
from onward.runtime.tools import Reconciled, Tool, tool

TENANT = "acme"


class Side:
    """The tools' own ledger of side effects."""

    def __init__(self) -> None:
        self.effects: list[tuple[str, str]] = []

    def tools(self, *, retry_safe_book: bool = False, reconcile: bool = False) -> list[Tool]:
        effects = self.effects

        @tool(retry_safe=True)
        async def search(query: str, *, idempotency_key: str) -> str:
            effects.append(("search", idempotency_key))
            return f"found {query}"

        async def status(key: str) -> Reconciled | None:
            done = ("book", key) in effects
            return Reconciled("completed", {"ok": True}) if done else Reconciled("never_ran")

        @tool(retry_safe=retry_safe_book, reconcile=status if reconcile else None)
        async def book(seat: str, *, idempotency_key: str) -> dict[str, Any]:
            effects.append(("book", idempotency_key))
            return {"seat": seat}

        return [search, book]

    def count(self, tool_name: str) -> int:
        return sum(1 for name, _ in self.effects if name == tool_name)


def runner(log: MemoryEventLog, **options: Any) -> AgentRunner:
    options.setdefault("provider", search_and_book("on it", "done"))
    return AgentRunner(log=log, worker="w", **options)


def agent(tools: list[Tool], **options: Any) -> Agent:
    return Agent(name="booker", instructions="book", tools=tools, **options)


async def crashed(crash: CrashAt, **tool_options: bool) -> tuple[MemoryEventLog, Side, list[Tool]]:
    """Run ``r`` of the booker crashed by ``crash``: its log, the side effects, its tools."""
    log, side = MemoryEventLog(), Side()
    tools = side.tools(**tool_options)
    with pytest.raises(Crash):
        await runner(log, observer=crash).run(agent(tools), "go", tenant=TENANT, run_id="r")
    return log, side, tools


async def crashed_after_a_large_result(
    log: MemoryEventLog, blobs: MemoryBlobStore, fill: str
) -> tuple[Tool, ScriptedProvider]:
    """Run ``r`` crashed once its one call returned 600,000 ``fill`` characters."""

    @tool
    async def fetch(*, idempotency_key: str) -> str:
        return fill * 600_000

    provider = ScriptedProvider([reply("", ToolCall(call_id="f", tool="fetch")), reply("ok")])
    with pytest.raises(Crash):
        await runner(log, provider=provider, blobs=blobs, observer=CrashAt("turn.settled")).run(
            agent([fetch]), "go", tenant=TENANT, run_id="r"
        )
    return fetch, provider


async def resumed_to_completion(log: MemoryEventLog, tools: list[Tool]) -> ResumePlan:
    """Resume run ``r``; it completes; what the resume decided."""
    result = await runner(log).resume(agent(tools), "r", tenant=TENANT)
    assert result.status == "completed"
    assert result.plan is not None
    return result.plan


async def kinds(log: MemoryEventLog, run_id: str) -> list[str]:
    return [kind_of(type(s.event)) for s in await log.read_run(run_id)]


async def test_a_run_writes_every_step_and_finishes() -> None:
    log, side = MemoryEventLog(), Side()
    result = await runner(log).run(agent(side.tools()), "go", tenant=TENANT, run_id="r1")
    assert (result.status, result.output, result.iteration) == ("completed", "done", 2)
    assert await kinds(log, "r1") == [
        "run.started",
        "model.answered",
        "tool.dispatched",
        "tool.dispatched",
        "tool.completed",
        "tool.completed",
        "turn.settled",
        "model.answered",
        "run.finished",
    ]
    assert side.count("book") == 1


async def test_every_dispatch_is_in_the_log_before_its_tool_runs() -> None:
    log = MemoryEventLog()
    seen: list[bool] = []

    @tool
    async def check(*, idempotency_key: str) -> None:
        stored = await log.read_run("r2")
        seen.append(any(isinstance(s.event, ToolDispatched) for s in stored))

    provider = ScriptedProvider([reply("", ToolCall(call_id="c", tool="check")), reply("ok")])
    await runner(log, provider=provider).run(agent([check]), "go", tenant=TENANT, run_id="r2")
    assert seen == [True]


class FailingDispatch(MemoryEventLog):
    """A log that cannot take `ToolDispatched` (the broker refuses, the disk is full)."""

    async def append(self, events: Sequence[Event]) -> list[Position]:
        if any(isinstance(e, ToolDispatched) for e in events):
            raise OSError("the log is unavailable")
        return await super().append(events)


async def test_a_tool_is_not_called_when_its_dispatch_cannot_be_written() -> None:
    log, side = FailingDispatch(), Side()
    with pytest.raises(OSError, match="unavailable"):
        await runner(log).run(agent(side.tools()), "go", tenant=TENANT, run_id="r3")
    assert side.effects == []


class UnconfirmedOnce(MemoryLeaseStore):
    """A lease store that does not answer the one renewal asked for right after a dispatch
    (the write-ahead's confirmation of the lease) once ``armed``."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False

    async def renew(self, lease: RunLease, *, ttl_s: float) -> RunLease:
        if self.armed:
            self.armed = False
            raise BackendUnavailableError("the lease store did not answer")
        return await super().renew(lease, ttl_s=ttl_s)


class ArmOnDispatch(MemoryEventLog):
    def __init__(self, leases: UnconfirmedOnce) -> None:
        super().__init__()
        self.leases = leases
        self.times = 1

    async def append(self, events: Sequence[Event]) -> list[Position]:
        positions = await super().append(events)
        if self.times and any(isinstance(e, ToolDispatched) for e in events):
            self.times -= 1
            self.leases.armed = True
        return positions


async def test_a_call_dispatched_under_a_lease_that_could_not_be_confirmed_is_made_on_resume() -> (
    None
):
    """The dispatch is durable and the lease store does not answer the confirmation that
    comes before the call: the tool is not called, and the run stops retryably. The call never
    ran, and the log says so, so a resume makes it, rather than leave it to a person as a call
    that may have run."""
    leases = UnconfirmedOnce()
    log, side = ArmOnDispatch(leases), Side()
    with pytest.raises(BackendUnavailableError):
        await runner(log, leases=leases).run(agent(side.tools()), "go", tenant=TENANT, run_id="r")
    assert side.effects == []
    result = await runner(log, leases=leases).resume(agent(side.tools()), "r", tenant=TENANT)
    assert result.status == "completed"
    assert (side.count("search"), side.count("book")) == (1, 1)


class SilentOnce(UnconfirmedOnce):
    """A lease store that never answers the one renewal asked for once ``armed``; ``asked``
    is set once it is asked."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = asyncio.Event()

    async def renew(self, lease: RunLease, *, ttl_s: float) -> RunLease:
        if self.armed:
            self.armed = False
            self.asked.set()
            await asyncio.Event().wait()
        return await super().renew(lease, ttl_s=ttl_s)


async def test_a_call_whose_lease_confirmation_was_cancelled_is_made_on_resume() -> None:
    """The run is cancelled (its caller gave up on it, the process shuts down) while the lease
    is confirmed after a dispatch: the tool was not called, and the log says so, so a resume
    makes the call rather than leave it to a person as one that may have run."""
    leases = SilentOnce()
    log, side = ArmOnDispatch(leases), Side()
    running = asyncio.ensure_future(
        runner(log, leases=leases).run(agent(side.tools()), "go", tenant=TENANT, run_id="r")
    )
    await asyncio.wait_for(leases.asked.wait(), 5)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert side.effects == []
    result = await runner(log, leases=leases).resume(agent(side.tools()), "r", tenant=TENANT)
    assert result.status == "completed"
    assert (side.count("search"), side.count("book")) == (1, 1)


async def test_calls_of_one_turn_run_concurrently() -> None:
    both = asyncio.Barrier(2)

    @tool
    async def left(*, idempotency_key: str) -> str:
        await asyncio.wait_for(both.wait(), 5)
        return "l"

    @tool
    async def right(*, idempotency_key: str) -> str:
        await asyncio.wait_for(both.wait(), 5)
        return "r"

    provider = ScriptedProvider(
        [
            reply("", ToolCall(call_id="l", tool="left"), ToolCall(call_id="r", tool="right")),
            reply("ok"),
        ]
    )
    result = await runner(MemoryEventLog(), provider=provider).run(
        agent([left, right]), "go", tenant=TENANT
    )
    assert result.status == "completed"


async def test_max_iterations_stops_the_run() -> None:
    looping = ScriptedProvider(
        lambda messages: reply("again", ToolCall(call_id="s", tool="search", args={"query": "x"}))
    )
    side = Side()
    result = await runner(MemoryEventLog(), provider=looping).run(
        agent(side.tools(), max_iterations=3), "go", tenant=TENANT
    )
    assert (result.status, result.iteration) == ("failed", 3)
    assert result.error is not None
    assert "max_iterations=3" in result.error


async def test_a_tool_error_is_recorded_and_the_run_goes_on() -> None:
    @tool
    async def flaky(*, idempotency_key: str) -> None:
        raise TimeoutError("airline timed out")

    provider = ScriptedProvider([reply("", ToolCall(call_id="f", tool="flaky")), reply("sorry")])
    log = MemoryEventLog()
    result = await runner(log, provider=provider).run(
        agent([flaky]), "go", tenant=TENANT, run_id="r4"
    )
    assert result.status == "completed"
    completed = [
        s.event for s in await log.read_run("r4") if kind_of(type(s.event)) == "tool.completed"
    ]
    assert msgspec.to_builtins(completed[0])["error"] == {
        "type": "TimeoutError",
        "message": "airline timed out",
    }


@pytest.mark.parametrize(
    ("point", "call_id"),
    [
        ("model.call", None),
        ("turn.settled", None),
        ("tool.completed", None),
    ],
)
async def test_crashes_at_unambiguous_points_resume_without_repeating(
    point: str, call_id: str | None
) -> None:
    log, side, tools = await crashed(CrashAt(point, call_id))
    plan = await resumed_to_completion(log, tools)
    assert side.count("book") == 1
    assert plan.safe


class Batches:
    """An observer keeping the kinds of each durable batch."""

    def __init__(self) -> None:
        self.kinds: list[list[str]] = []

    async def appended(self, events: Sequence[Event]) -> None:
        self.kinds.append([kind_of(type(e)) for e in events])

    async def tool_returned(self, call_id: str) -> None:
        return None

    async def before_model_call(self) -> None:
        return None


async def test_the_outcome_of_a_turns_one_call_settles_the_turn_in_its_batch() -> None:
    batches = Batches()
    provider = ScriptedProvider(
        [reply("", ToolCall(call_id="b", tool="book", args={"seat": "3A"})), reply("done")]
    )
    result = await runner(MemoryEventLog(), provider=provider, observer=batches).run(
        agent(Side().tools()), "go", tenant=TENANT, run_id="r"
    )
    assert result.status == "completed"
    assert batches.kinds == [
        ["run.started"],
        ["model.answered", "tool.dispatched"],
        ["tool.completed", "turn.settled"],
        ["model.answered", "run.finished"],
    ]


async def test_an_answer_is_written_with_its_dispatches_and_a_crash_after_it_runs_nothing() -> None:
    log, side, tools = await crashed(CrashAt("model.answered"))
    kinds = [kind_of(type(s.event)) for s in await log.read_run("r")]
    assert kinds == ["run.started", "model.answered", "tool.dispatched", "tool.dispatched"]
    assert side.effects == []
    # Dispatched and no outcome: the search is retry-safe, the booking is left for a person.
    with pytest.raises(IndeterminateToolCallError) as caught:
        await runner(log).resume(agent(tools), "r", tenant=TENANT)
    assert [c.call_id for c in caught.value.calls] == ["b"]
    assert side.effects == []


async def test_an_answer_goes_alone_when_a_call_waits_on_approval_and_a_crash_after_it_asks() -> (
    None
):
    @tool(requires_approval=True)
    async def book(seat: str, *, idempotency_key: str) -> dict[str, Any]:
        booked.append(idempotency_key)
        return {"seat": seat}

    booked: list[str] = []
    provider = ScriptedProvider(
        [reply("", ToolCall(call_id="b", tool="book", args={"seat": "3A"})), reply("done")]
    )
    log = MemoryEventLog()
    with pytest.raises(Crash):
        await runner(log, provider=provider, observer=CrashAt("model.answered")).run(
            agent([book]), "go", tenant=TENANT, run_id="r"
        )
    kinds = [kind_of(type(s.event)) for s in await log.read_run("r")]
    assert kinds == ["run.started", "model.answered"]
    # Answered and not dispatched: the resume asks for the approval, then books once.
    waiting = await runner(log, provider=provider).resume(agent([book]), "r", tenant=TENANT)
    assert (waiting.status, booked) == ("waiting", [])
    await runner(log, provider=provider).approve("r", "b", tenant=TENANT, by="ann")
    done = await runner(log, provider=provider).resume(agent([book]), "r", tenant=TENANT)
    assert (done.status, len(booked)) == ("completed", 1)


async def test_the_last_outcome_of_a_turn_settles_it() -> None:
    batches = Batches()
    result = await runner(MemoryEventLog(), observer=batches).run(
        agent(Side().tools()), "go", tenant=TENANT, run_id="r"
    )
    assert result.status == "completed"
    # Two calls at once: the one recorded second finds the other recorded, and settles.
    assert batches.kinds[1:4] == [
        ["model.answered", "tool.dispatched", "tool.dispatched"],
        ["tool.completed"],
        ["tool.completed", "turn.settled"],
    ]


async def test_a_call_killed_after_its_side_effect_is_indeterminate_and_refused() -> None:
    log, side, tools = await crashed(CrashAt("tool.returned", "b"))
    with pytest.raises(IndeterminateToolCallError) as caught:
        await runner(log).resume(agent(tools), "r", tenant=TENANT)
    assert [c.call_id for c in caught.value.calls] == ["b"]
    assert caught.value.retryable is False
    assert "book" in str(caught.value)
    assert side.count("book") == 1
    planned = [
        s.event for s in await log.read_run("r") if kind_of(type(s.event)) == "resume.planned"
    ]
    assert msgspec.to_builtins(planned[-1])["undecided"] == ["b"]


async def test_a_person_settles_an_undecided_call_and_the_run_carries_on() -> None:
    log, side, tools = await crashed(CrashAt("tool.returned", "b"))
    with pytest.raises(IndeterminateToolCallError):
        await runner(log).resume(agent(tools), "r", tenant=TENANT)
    await runner(log).resolve(
        "r",
        "b",
        tenant=TENANT,
        outcome="completed",
        result={"seat": "3A"},
        by="ops",
        why="airline confirmed",
    )
    result = await runner(log).resume(agent(tools), "r", tenant=TENANT)
    assert result.status == "completed"
    assert side.count("book") == 1
    with pytest.raises(InvalidInputError, match="no undecided call"):
        await runner(log).resolve("r", "b", tenant=TENANT, outcome="never_ran", by="ops", why="x")


async def test_a_reconciling_tool_settles_its_own_call() -> None:
    log, side, tools = await crashed(CrashAt("tool.returned", "b"), reconcile=True)
    plan = await resumed_to_completion(log, tools)
    assert side.count("book") == 1
    book = next(p for p in plan.calls if p.call.call_id == "b")
    assert (book.disposition, book.call.resolved_by) == (ToolDisposition.COMPLETED, "reconcile")
    assert "tool.resolved" in await kinds(log, "r")


async def test_a_dispatch_that_never_reached_its_tool_is_reconciled_as_never_ran() -> None:
    log, side, tools = await crashed(CrashAt("tool.dispatched"), reconcile=True)
    assert side.effects == []
    plan = await resumed_to_completion(log, tools)
    assert side.count("book") == 1
    assert {c.call_id for c in plan.to_dispatch} == {"s", "b"}


async def test_a_retry_safe_call_is_dispatched_again() -> None:
    log, side, tools = await crashed(CrashAt("tool.returned", "b"), retry_safe_book=True)
    plan = await resumed_to_completion(log, tools)
    assert side.count("book") == 2
    assert [c.call_id for c in plan.to_dispatch] == ["b"]


async def test_a_run_waits_on_approval_and_continues_after_approve() -> None:
    log, side = MemoryEventLog(), Side()

    @tool(requires_approval=True)
    async def pay(amount: int, *, idempotency_key: str) -> str:
        side.effects.append(("pay", idempotency_key))
        return "paid"

    provider = ScriptedProvider(
        [reply("", ToolCall(call_id="p", tool="pay", args={"amount": 5})), reply("ok")]
    )
    the_agent = agent([pay])
    waiting = await runner(log, provider=provider).run(the_agent, "go", tenant=TENANT, run_id="r")
    assert (waiting.status, waiting.waiting_on) == ("waiting", "p")
    assert side.effects == []
    still = await runner(log, provider=provider).resume(the_agent, "r", tenant=TENANT)
    assert still.status == "waiting"
    await runner(log, provider=provider).approve("r", "p", tenant=TENANT, by="ann")
    with pytest.raises(InvalidInputError, match="not waiting"):
        await runner(log, provider=provider).approve("r", "p", tenant=TENANT, by="bob")
    done = await runner(log, provider=provider).resume(the_agent, "r", tenant=TENANT)
    assert done.status == "completed"
    assert side.count("pay") == 1


async def test_deny_ends_the_run() -> None:
    log = MemoryEventLog()

    @tool(requires_approval=True)
    async def pay(*, idempotency_key: str) -> str:
        raise AssertionError("a denied call must not run")

    provider = ScriptedProvider([reply("", ToolCall(call_id="p", tool="pay")), reply("ok")])
    await runner(log, provider=provider).run(agent([pay]), "go", tenant=TENANT, run_id="r")
    await runner(log, provider=provider).deny("r", "p", tenant=TENANT, by="ann")
    result = await runner(log, provider=provider).resume(agent([pay]), "r", tenant=TENANT)
    assert (result.status, result.error) == ("cancelled", "approval p denied by ann")


async def test_resume_refuses_another_revision() -> None:
    log, side, _ = await crashed(CrashAt("model.answered"))
    changed = Agent(name="booker", instructions="book, and upsell", tools=side.tools())
    with pytest.raises(RevisionMismatchError, match="revision"):
        await runner(log).resume(changed, "r", tenant=TENANT)


async def test_resume_of_nothing_or_of_another_tenant() -> None:
    log, side = MemoryEventLog(), Side()
    with pytest.raises(NothingToResumeError):
        await runner(log).resume(agent(side.tools()), "missing", tenant=TENANT)
    await runner(log).run(agent(side.tools()), "go", tenant=TENANT, run_id="r")
    with pytest.raises(NothingToResumeError):
        await runner(log).resume(agent(side.tools()), "r", tenant="someone-else")


async def test_resume_refuses_a_newer_event_format() -> None:
    log, side, _ = await crashed(CrashAt("model.answered"))
    seq = len(await log.read_run("r")) + 1
    log.write_raw(
        "r",
        msgspec.json.encode(
            {
                "kind": "run.claimed",
                "run_id": "r",
                "tenant": TENANT,
                "seq": seq,
                "fence": 9,
                "worker": "x",
                "format": EVENT_FORMAT + 1,
            }
        ),
    )
    with pytest.raises(CheckpointFormatError):
        await runner(log).resume(agent(side.tools()), "r", tenant=TENANT)
    assert side.count("book") == 0


async def test_large_results_go_out_of_line_and_come_back() -> None:
    log, blobs = MemoryEventLog(), MemoryBlobStore()
    fetch, _ = await crashed_after_a_large_result(log, blobs, "x")
    records = [msgspec.json.encode(s.event) for s in await log.read_run("r")]
    assert max(len(r) for r in records) < 10_000
    seen: list[int] = []

    def answer(messages: Sequence[Any]) -> Any:
        seen.append(max(len(str(m.content)) for m in messages))
        return reply("ok")

    result = await runner(log, provider=ScriptedProvider(answer), blobs=blobs).resume(
        agent([fetch]), "r", tenant=TENANT
    )
    assert result.status == "completed"
    assert seen == [600_000]


async def test_a_result_too_large_for_the_log_is_the_calls_error_and_the_run_goes_on() -> None:
    """Without a blob store, a result over the log's limit cannot be recorded. The tool
    returned, so its effect is done: the refusal is the call's outcome and the model is told
    why, rather than the call left undecided for a person (or, retry-safe, made again at every
    resume and refused again)."""
    log, fetched = MemoryEventLog(), list[str]()

    @tool
    async def fetch(*, idempotency_key: str) -> str:
        fetched.append(idempotency_key)
        return "x" * 3_000_000

    provider = ScriptedProvider([reply("", ToolCall(call_id="f", tool="fetch")), reply("too big")])
    result = await runner(log, provider=provider).run(
        agent([fetch]), "go", tenant=TENANT, run_id="r"
    )
    assert result.status == "completed"
    assert len(fetched) == 1
    (completed,) = [s.event for s in await log.read_run("r") if isinstance(s.event, ToolCompleted)]
    assert completed.result is None
    assert completed.error is not None
    assert completed.error.type == "PayloadTooLarge"
    assert "fetch returned a value too large to record" in completed.error.message


async def test_a_calls_outcome_the_log_did_not_take_is_named_for_the_person_who_settles_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The tool returned and the log failed as its outcome was written: resume cannot tell
    whether the call ran, and leaves it for a person; the worker that saw it return says so,
    naming the call, so that person need not guess."""
    log, side = MemoryEventLog(), Side()
    append = log.append

    async def failing(events: Sequence[Event]) -> Any:
        if any(isinstance(e, ToolCompleted) and e.call_id == "b" for e in events):
            raise BackendUnavailableError("the log did not acknowledge the batch")
        return await append(events)

    log.append = failing  # type: ignore[method-assign]
    with (
        caplog.at_level(logging.WARNING, logger="onward.runner"),
        pytest.raises(BackendUnavailableError),
    ):
        await runner(log).run(agent(side.tools()), "go", tenant=TENANT, run_id="r")
    assert side.count("book") == 1
    assert "b (book) returned a result, but its outcome could not be recorded" in caplog.text
    log.append = append  # type: ignore[method-assign]
    with pytest.raises(IndeterminateToolCallError, match=r"b \(book"):
        await runner(log).resume(agent(side.tools()), "r", tenant=TENANT)


async def test_a_missing_blob_stops_the_resume() -> None:
    log, blobs = MemoryEventLog(), MemoryBlobStore()
    fetch, provider = await crashed_after_a_large_result(log, blobs, "y")
    for stored in await log.read_run("r"):
        result = msgspec.to_builtins(stored.event).get("result")
        if isinstance(result, dict) and "$blob" in result:
            blobs.forget(result["$blob"])
    with pytest.raises(HistoryUnavailableError, match="hole"):
        await runner(log, provider=provider, blobs=blobs).resume(agent([fetch]), "r", tenant=TENANT)


async def test_an_oversized_checkpoint_is_reported_and_the_run_goes_on() -> None:
    log, store = MemoryEventLog(), MemoryFrontierStore()

    @tool
    async def fetch(blob: str, *, idempotency_key: str) -> int:
        return len(blob)

    # At the after_model_call boundary the frontier holds the turn's calls and their arguments.
    big = ToolCall(call_id="f", tool="fetch", args={"blob": "z" * 300_000})
    provider = ScriptedProvider([reply("", big), reply("ok")])
    the_runner = runner(log, provider=provider, frontiers=store, checkpoint_inline=True)
    assert the_runner.checkpointer is not None
    the_runner.checkpointer.projection.max_bytes = 100_000
    seen_errors: list[str | None] = []

    class Watch:
        async def appended(self, events: Sequence[Event]) -> None:
            assert the_runner.checkpointer is not None
            seen_errors.append(the_runner.checkpointer.last_error)

        async def tool_returned(self, call_id: str) -> None:
            return None

        async def before_model_call(self) -> None:
            return None

    the_runner.writer.observer = Watch()
    result = await the_runner.run(agent([fetch]), "go", tenant=TENANT, run_id="r")
    assert result.status == "completed"
    assert any(e is not None and "cap" in e for e in seen_errors)
    row = await store.get("r")
    assert row is not None
    assert row.frontier is not None
    assert row.frontier.status == "completed"


async def test_the_same_run_id_cannot_start_twice() -> None:
    log, side = MemoryEventLog(), Side()
    await runner(log).run(agent(side.tools()), "go", tenant=TENANT, run_id="r")
    with pytest.raises(InvalidInputError, match="already exists"):
        await runner(log).run(agent(side.tools()), "go", tenant=TENANT, run_id="r")


async def test_a_tag_lands_on_the_latest_boundary_or_the_named_seq_under_the_lease() -> None:
    log = MemoryEventLog()
    the_runner = runner(log)
    agent = Agent(name="a", instructions="", tools=Side().tools())
    await the_runner.run(agent, "go", tenant=TENANT, run_id="r")
    frontier = await the_runner.inspect("r", tenant=TENANT)
    assert await the_runner.tag("r", "reviewed", tenant=TENANT) == frontier.resume_seq
    assert await the_runner.tag("r", "first", tenant=TENANT, seq=1) == 1
    tagged = await the_runner.inspect("r", tenant=TENANT)
    assert [(t.seq, t.label) for t in tagged.tags] == [
        (frontier.resume_seq, "reviewed"),
        (1, "first"),
    ]
    assert tagged.fence > frontier.fence  # written under a lease of its own
    with pytest.raises(InvalidInputError, match="no event 99"):
        await the_runner.tag("r", "late", tenant=TENANT, seq=99)
    with pytest.raises(InvalidInputError, match="non-empty"):
        await the_runner.tag("r", " ", tenant=TENANT)


def a_large_write() -> tuple[Tool, list[int], ScriptedProvider]:
    """A ``write`` tool, the lengths it was called with, and a model asking it to write 1 MB."""
    written: list[int] = []

    @tool
    async def write(text: str, *, idempotency_key: str) -> int:
        written.append(len(text))
        return len(text)

    big = ToolCall(call_id="w", tool="write", args={"text": "z" * 1_000_000})
    return write, written, ScriptedProvider([reply("", big), reply("written")])


async def test_large_tool_arguments_go_out_of_line_and_come_back() -> None:
    log, blobs = MemoryEventLog(), MemoryBlobStore()
    write, written, provider = a_large_write()
    result = await runner(log, provider=provider, blobs=blobs).run(
        agent([write]), "go", tenant=TENANT, run_id="r"
    )
    assert (result.status, result.output) == ("completed", "written")
    assert written == [1_000_000]
    records = [msgspec.json.encode(s.event) for s in await log.read_run("r")]
    assert max(len(r) for r in records) < 10_000


async def test_an_answer_too_large_for_the_log_fails_the_run_once() -> None:
    """Without a blob store, a model answer over the log's limit cannot be recorded: the run
    ends failed naming why, rather than a resume asking the (paid) model again, for ever."""
    log = MemoryEventLog()
    write, written, provider = a_large_write()
    result = await runner(log, provider=provider).run(
        agent([write]), "go", tenant=TENANT, run_id="r"
    )
    assert result.status == "failed"
    assert result.error is not None
    assert "too large" in result.error
    assert written == []
    assert provider.calls == 1


async def test_answer_text_too_large_for_the_log_fails_the_run_once() -> None:
    log = MemoryEventLog()
    provider = ScriptedProvider([reply("y" * 1_100_000)])
    result = await runner(log, provider=provider).run(agent([]), "go", tenant=TENANT, run_id="r")
    assert result.status == "failed"
    assert result.error is not None
    assert "too large" in result.error


async def test_large_tool_arguments_come_back_on_resume() -> None:
    log, blobs = MemoryEventLog(), MemoryBlobStore()
    written: list[int] = []

    @tool(retry_safe=True)
    async def write(text: str, *, idempotency_key: str) -> int:
        written.append(len(text))
        return len(text)

    big = ToolCall(call_id="w", tool="write", args={"text": "z" * 1_000_000})
    provider = ScriptedProvider([reply("", big), reply("written")])
    with pytest.raises(Crash):
        await runner(log, provider=provider, blobs=blobs, observer=CrashAt("model.answered")).run(
            agent([write]), "go", tenant=TENANT, run_id="r"
        )
    assert written == []
    result = await runner(log, provider=provider, blobs=blobs).resume(
        agent([write]), "r", tenant=TENANT
    )
    assert (result.status, result.output) == ("completed", "written")
    assert written == [1_000_000]


async def test_tool_arguments_shaped_like_a_reference_are_never_fetched() -> None:
    """Only the claim check makes references: arguments that merely look like one are never
    fetched from the blob store (shared by every tenant, keyed by content alone)."""
    log, blobs = MemoryEventLog(), MemoryBlobStore()
    secret = await blobs.put(b'{"text": "another tenant\'s"}')

    @tool
    async def echo(size: int, *, idempotency_key: str) -> int:
        return size

    forged = ToolCall(call_id="e", tool="echo", args={"$blob": secret, "size": 1})
    provider = ScriptedProvider([reply("", forged), reply("ok")])
    with pytest.raises(Crash):
        await runner(log, provider=provider, blobs=blobs, observer=CrashAt("turn.settled")).run(
            agent([echo]), "go", tenant=TENANT, run_id="r"
        )
    seen: list[str] = []

    def answer(messages: Sequence[Any]) -> Any:
        seen.extend(str(m.content) for m in messages)
        return reply("ok")

    result = await runner(log, provider=ScriptedProvider(answer), blobs=blobs).resume(
        agent([echo]), "r", tenant=TENANT
    )
    assert result.status == "completed"
    assert any(secret in s for s in seen)
    assert not any("another tenant" in s for s in seen)
    assert not any("$literal" in s for s in seen)


async def test_an_approval_of_a_call_with_large_arguments_shows_them() -> None:
    """The person asked to allow a call sees the arguments the model gave, not the blob
    store's reference to them."""
    log, blobs = MemoryEventLog(), MemoryBlobStore()
    written: list[int] = []

    @tool(requires_approval=True)
    async def write(text: str, *, idempotency_key: str) -> int:
        written.append(len(text))
        return len(text)

    big = ToolCall(call_id="w", tool="write", args={"text": "z" * 1_000_000})
    provider = ScriptedProvider([reply("", big), reply("written")])
    the_runner = runner(log, provider=provider, blobs=blobs)
    result = await the_runner.run(agent([write]), "go", tenant=TENANT, run_id="r")
    assert result.status == "waiting"
    (request,) = [
        await the_runner.writer.restore(s.event)
        for s in await log.read_run("r")
        if isinstance(s.event, ApprovalRequested)
    ]
    assert isinstance(request, ApprovalRequested)
    assert "$blob" not in request.prompt
    assert request.prompt.startswith('allow write with {"text":"zzz')
    assert request.details["args"] == {"text": "z" * 1_000_000}
    await the_runner.approve("r", "w", tenant=TENANT, by="ann")
    result = await the_runner.resume(agent([write]), "r", tenant=TENANT)
    assert (result.status, written) == ("completed", [1_000_000])


async def test_a_call_awaiting_approval_with_long_arguments_is_asked_about() -> None:
    """Arguments the log took in line (no blob store) are not written twice into the
    request (its prompt and its details), which the log would refuse at every resume: the
    prompt shows their start, the details hold them whole."""
    log, written = MemoryEventLog(), list[int]()

    @tool(requires_approval=True)
    async def write(text: str, *, idempotency_key: str) -> int:
        written.append(len(text))
        return len(text)

    big = ToolCall(call_id="w", tool="write", args={"text": "z" * 600_000})
    the_runner = runner(log, provider=ScriptedProvider([reply("", big), reply("written")]))
    result = await the_runner.run(agent([write]), "go", tenant=TENANT, run_id="r")
    assert result.status == "waiting"
    (request,) = [
        s.event for s in await log.read_run("r") if isinstance(s.event, ApprovalRequested)
    ]
    assert request.prompt.endswith("... (600011 characters in all)?")
    assert request.details["args"] == {"text": "z" * 600_000}
    await the_runner.approve("r", "w", tenant=TENANT, by="ann")
    result = await the_runner.resume(agent([write]), "r", tenant=TENANT)
    assert (result.status, written) == ("completed", [600_000])


class SlowBlobs(MemoryBlobStore):
    """A blob store whose reads never answer once ``armed``; ``asked`` is set when one is."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.asked = asyncio.Event()

    async def get(self, digest: str) -> bytes:
        if self.armed:
            self.asked.set()
            await asyncio.Event().wait()
        return await super().get(digest)


class ArmBlobsOnDispatch(MemoryEventLog):
    """A log that arms ``blobs`` once a dispatch is written, or, ``forget``, drops every body
    then (a blob store that lost them)."""

    def __init__(self, blobs: SlowBlobs, *, forget: bool = False) -> None:
        super().__init__()
        self.blobs, self.forget, self.times = blobs, forget, 1

    async def append(self, events: Sequence[Event]) -> list[Position]:
        positions = await super().append(events)
        if self.times and any(isinstance(e, ToolDispatched) for e in events):
            self.times -= 1
            if self.forget:
                saved = dict(self.blobs._bodies)
                self.blobs._bodies.clear()
                self.blobs.saved = saved  # type: ignore[attr-defined]
            else:
                self.blobs.armed = True
        return positions


def large_write(written: list[int]) -> tuple[Tool, ScriptedProvider]:
    """A tool ``write`` and a model that calls it once with arguments stored out of line."""

    @tool
    async def write(text: str, *, idempotency_key: str) -> int:
        written.append(len(text))
        return len(text)

    big = ToolCall(call_id="w", tool="write", args={"text": "z" * 1_000_000})
    return write, ScriptedProvider([reply("", big), reply("written")])


async def test_a_call_cancelled_while_its_arguments_were_read_is_made_on_resume() -> None:
    """The run is cancelled (its caller gave up, the process shuts down) while the arguments
    of a dispatched call are read from the blob store: the tool was not called, and the log
    says so, so a resume makes the call rather than leave it to a person."""
    blobs, written = SlowBlobs(), list[int]()
    log = ArmBlobsOnDispatch(blobs)
    write, provider = large_write(written)
    running = asyncio.ensure_future(
        runner(log, provider=provider, blobs=blobs).run(
            agent([write]), "go", tenant=TENANT, run_id="r"
        )
    )
    await asyncio.wait_for(blobs.asked.wait(), 5)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert written == []
    blobs.armed = False
    result = await runner(log, provider=provider, blobs=blobs).resume(
        agent([write]), "r", tenant=TENANT
    )
    assert (result.status, written) == ("completed", [1_000_000])


async def test_a_call_whose_arguments_the_blob_store_lost_is_recorded_never_ran() -> None:
    """The blob store no longer holds a dispatched call's arguments: the run stops, and the
    tool, never called, is recorded as never ran, so once the store is restored a resume
    makes the call rather than leave it to a person as one that may have run."""
    blobs, written = SlowBlobs(), list[int]()
    log = ArmBlobsOnDispatch(blobs, forget=True)
    write, provider = large_write(written)
    with pytest.raises(HistoryUnavailableError):
        await runner(log, provider=provider, blobs=blobs).run(
            agent([write]), "go", tenant=TENANT, run_id="r"
        )
    assert written == []
    blobs._bodies.update(blobs.saved)  # type: ignore[attr-defined]
    result = await runner(log, provider=provider, blobs=blobs).resume(
        agent([write]), "r", tenant=TENANT
    )
    assert (result.status, written) == ("completed", [1_000_000])


class AlterBlobsOnDispatch(MemoryEventLog):
    """A log that, once a dispatch is written, alters every body of ``blobs`` in place under
    its digest (``z`` become ``y``), as a corrupted or tampered blob store would hold them."""

    def __init__(self, blobs: MemoryBlobStore) -> None:
        super().__init__()
        self.blobs = blobs

    async def append(self, events: Sequence[Event]) -> list[Position]:
        positions = await super().append(events)
        if any(isinstance(e, ToolDispatched) for e in events):
            bodies = self.blobs._bodies
            for digest, body in bodies.items():
                bodies[digest] = body.replace(b"z", b"y")
        return positions


async def test_a_call_whose_arguments_were_altered_in_the_blob_store_is_never_made() -> None:
    """The blob store holds other bytes under the digest of a dispatched call's arguments:
    the tool is not called with arguments the model never gave; the run stops, the history
    unavailable."""
    blobs, written = MemoryBlobStore(), list[str]()

    @tool
    async def write(text: str, *, idempotency_key: str) -> int:
        written.append(text[:1])
        return len(text)

    big = ToolCall(call_id="w", tool="write", args={"text": "z" * 1_000_000})
    provider = ScriptedProvider([reply("", big), reply("written")])
    with pytest.raises(HistoryUnavailableError, match="altered or corrupted"):
        await runner(AlterBlobsOnDispatch(blobs), provider=provider, blobs=blobs).run(
            agent([write]), "go", tenant=TENANT, run_id="r"
        )
    assert written == []


@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        (
            {"provider": None},
            r"^provider must be a chat model .*; NoModel\(\) for a runner that only reads runs .*"
            r"got NoneType",
        ),
        ({"max_tool_calls_per_turn": "3"}, r"^max_tool_calls_per_turn must be .* got '3'"),
        ({"max_tool_calls_per_turn": True}, r"^max_tool_calls_per_turn must be .* got True"),
        ({"worker": 123}, r"^worker must be a string, got int"),
        ({"worker": "w\n2"}, r"^worker holds the control character"),
    ],
)
def test_a_runner_refuses_a_bad_argument_when_made_naming_it(
    options: dict[str, Any], refusal: str
) -> None:
    """A provider that is no model, a call cap that is not a whole number and a worker name
    that cannot be stored are refused when the runner is made, naming the argument: before,
    the first run failed on an AttributeError ("'int' object has no attribute 'startswith'",
    "'NoneType' object has no attribute 'complete'") or a bare comparison TypeError."""
    arguments: dict[str, Any] = {"provider": ScriptedProvider([reply("hi")]), **options}
    with pytest.raises((ConfigurationError, InvalidInputError), match=refusal):
        AgentRunner(log=MemoryEventLog(), **arguments)
