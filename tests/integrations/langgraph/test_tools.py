"""`OnwardToolMiddleware`: LangGraph tool calls written ahead, replayed, or put to a person.

The crash tests SIGKILL a real process running the graph (``tool_child``) right after the
tool's side effect, or right after its outcome is recorded, and resume the thread here: the
side effect is never repeated, and the call either comes back as recorded or as a question.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.errors import ParentCommand
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, interrupt
from support.processes import Spares
from support.servers import KafkaServers

from onward.errors import BackendUnavailableError, ResumeConflictError, RunCancelledError
from onward.eventlog import (
    Event,
    Position,
    RunFinished,
    ToolCompleted,
    ToolDispatched,
    ToolResolved,
)
from onward.integrations.langgraph import (
    OnwardSaver,
    current_fence,
    current_idempotency_key,
    current_lease_expires_at,
)
from onward.integrations.langgraph import tools as middleware
from onward.integrations.langgraph.tools import QUESTION
from onward.runtime import idempotency_key
from onward.runtime.leases import LeasePolicy, RunLease
from onward.runtime.tools import ToolCancelledError

from .agents import (
    CALL_ID,
    FLIGHT,
    GRAPH_KINDS,
    GraphKind,
    as_book,
    asks_to_book,
    booking_tool,
    graph,
    ledger_lines,
    model,
    thread_config,
)
from .worlds import TENANT, World, kafka_spec, kafka_world, sqlite_spec, sqlite_world

TESTS = Path(__file__).resolve().parents[2]
TTL_S = 1.5
START = {"messages": [HumanMessage(content="book me a seat")]}


def _done() -> AIMessage:
    return AIMessage(content="done")


async def _kinds(world: World, thread_id: str) -> list[str]:
    """The tool events of the thread's call that every reader counts, in log order."""
    refused = {r.stored.position for r in (await _reader(world).aread_thread(thread_id)).refused}
    return [
        type(s.event).__name__
        for s in await world.log.read_run(thread_id)
        if s.position not in refused
        and isinstance(s.event, ToolDispatched | ToolCompleted | ToolResolved)
        and s.event.call_id == CALL_ID
    ]


def _reader(world: World) -> OnwardSaver:
    return world.saver(holder="reader")


def _tool_messages(out: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(m.status, m.content) for m in out["messages"] if isinstance(m, ToolMessage)]


async def _question(run: CompiledStateGraph[Any], thread_id: str) -> dict[str, Any]:
    (asked,) = (await run.aget_state(thread_config(thread_id))).interrupts
    value: dict[str, Any] = asked.value
    return value


@pytest.fixture(params=GRAPH_KINDS)
def kind(request: pytest.FixtureRequest) -> GraphKind:
    """Each graph: ``create_agent``, and the hand-built ``ToolNode`` loop."""
    value: GraphKind = request.param
    return value


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    """Where the tool writes one line per booking."""
    return tmp_path / "ledger"


# -- in one process ---------------------------------------------------------------------------


async def test_a_call_is_recorded_before_the_tool_runs_and_its_outcome_after(
    world: World, ledger: Path, kind: GraphKind
) -> None:
    in_log_when_called: list[list[str]] = []

    def book(flight: str) -> str:
        raise AssertionError("the async path runs")

    async def book_async(flight: str) -> str:
        in_log_when_called.append(await _kinds(world, "t"))
        with ledger.open("a") as out:
            out.write(f"{flight}\n")
        return f"booked {flight}"

    tool = as_book(book, book_async)
    async with world.saver() as saver:
        run = graph(kind, saver, model(asks_to_book(), _done()), tool)
        out = await run.ainvoke(START, thread_config("t"))
    assert _tool_messages(out) == [("success", f"booked {FLIGHT}")]
    assert in_log_when_called == [["ToolDispatched"]]  # durable before the tool ran
    assert await _kinds(world, "t") == ["ToolDispatched", "ToolCompleted"]
    dispatched = next(
        s.event for s in await world.log.read_run("t") if isinstance(s.event, ToolDispatched)
    )
    assert dispatched.idempotency_key == idempotency_key("t", CALL_ID)
    assert dispatched.tool == "book"
    assert ledger_lines(ledger) == [FLIGHT]


async def test_a_cancel_heard_while_a_tool_runs_lets_its_outcome_be_recorded_first(
    world: World, ledger: Path, kind: GraphKind
) -> None:
    """The holder hears the ask (by a renewal) while the tool runs: the tool's outcome is
    recorded all the same, so the call is not left undecided, and the graph run's next write
    ends it cancelled. The lease is long (a loaded machine's stall could outlast a short one,
    the write then refused as fenced) and renewed every half second, so the ask is heard soon."""
    saver = world.saver(ttl_s=30, renew_within_s=29.5)  # renews every 0.5 s

    def book(flight: str) -> str:
        raise AssertionError("the async path runs")

    async def book_async(flight: str) -> str:
        asked = await world.leases.ask_to_cancel("t", tenant=TENANT, by="ops", why="stop")
        assert asked is not None
        await until_heard(saver)
        with ledger.open("a") as out:
            out.write(f"{flight}\n")
        return f"booked {flight}"

    async with saver:
        run = graph(kind, saver, model(asks_to_book(), _done()), as_book(book, book_async))
        with pytest.raises(RunCancelledError, match="cancelled by ops: stop"):
            await run.ainvoke(START, thread_config("t"))
    assert await _kinds(world, "t") == ["ToolDispatched", "ToolCompleted"]
    ends = [s.event for s in await world.log.read_run("t") if isinstance(s.event, RunFinished)]
    assert [(e.status, e.error) for e in ends] == [("cancelled", "cancelled by ops: stop")]
    assert ledger_lines(ledger) == [FLIGHT]


async def test_a_cancel_heard_before_langgraph_saves_the_steps_checkpoint_still_records_the_outcome(
    world: World, ledger: Path, kind: GraphKind
) -> None:
    """LangGraph saves a step's checkpoint beside the step's tasks: when the cancel is heard
    (by a renewal) before that save reaches the saver, the save must not end the run under
    the running tool, or its outcome is refused and the call left to a person though it ran.
    Before the fix the log held ``ToolDispatched`` only (what made the test above flaky)."""
    saver = world.saver(ttl_s=30, renew_within_s=29.5)  # renews every 0.5 s
    tool_running = asyncio.Event()
    saving = saver.aput

    async def late_aput(
        config: RunnableConfig, checkpoint: Any, metadata: Any, versions: Any
    ) -> RunnableConfig:
        if metadata.get("step") == 1:  # the model's step: saved as the tool step runs
            await tool_running.wait()
            await until_heard(saver)
        return await saving(config, checkpoint, metadata, versions)

    saver.aput = late_aput  # type: ignore[method-assign,assignment]

    def book(flight: str) -> str:
        raise AssertionError("the async path runs")

    async def book_async(flight: str) -> str:
        tool_running.set()
        await world.leases.ask_to_cancel("t", tenant=TENANT, by="ops", why="stop")
        await until_heard(saver)
        await asyncio.sleep(0.2)  # the checkpoint's save goes first
        with ledger.open("a") as out:
            out.write(f"{flight}\n")
        return f"booked {flight}"

    async with saver:
        run = graph(kind, saver, model(asks_to_book(), _done()), as_book(book, book_async))
        with pytest.raises(RunCancelledError, match="cancelled by ops: stop"):
            await run.ainvoke(START, thread_config("t"))
    assert ledger_lines(ledger) == [FLIGHT]
    assert await _kinds(world, "t") == ["ToolDispatched", "ToolCompleted"]
    ends = [s.event for s in await world.log.read_run("t") if isinstance(s.event, RunFinished)]
    assert [(e.status, e.error) for e in ends] == [("cancelled", "cancelled by ops: stop")]


async def until_heard(saver: OnwardSaver) -> None:
    """Wait until the saver's renewals of thread ``t`` have heard a cancel ask."""
    deadline = time.monotonic() + 10
    while (lease := saver.lease("t")) is None or lease.cancel_asked is None:
        assert time.monotonic() < deadline, "no renewal heard the ask"
        await asyncio.sleep(0.05)


async def _dispatched_keys(world: World, thread_id: str) -> list[tuple[str, str]]:
    """Each counted dispatch of the thread, as its call id and the key it was recorded with."""
    refused = {r.stored.position for r in (await _reader(world).aread_thread(thread_id)).refused}
    return [
        (s.event.call_id, s.event.idempotency_key)
        for s in await world.log.read_run(thread_id)
        if isinstance(s.event, ToolDispatched) and s.position not in refused
    ]


async def _dispatched_fences(world: World, thread_id: str) -> list[int]:
    return [
        s.event.fence
        for s in await world.log.read_run(thread_id)
        if isinstance(s.event, ToolDispatched)
    ]


async def test_a_tool_reads_the_key_fence_and_lease_expiry_of_its_dispatch(
    world: World, kind: GraphKind
) -> None:
    """The key and fence are the ones recorded with the call's dispatch, so a service can
    deduplicate and fence on them."""
    seen: list[tuple[str | None, int | None, float | None]] = []

    def book(flight: str) -> str:
        raise AssertionError("the async path runs")

    async def book_async(flight: str) -> str:
        seen.append((current_idempotency_key(), current_fence(), current_lease_expires_at()))
        return f"booked {flight}"

    async with world.saver() as saver:
        async with saver.hold("t"):  # an earlier claim: the graph's is a higher fence
            pass
        before = time.time()
        run = graph(kind, saver, model(asks_to_book(), _done()), as_book(book, book_async))
        await run.ainvoke(START, thread_config("t"))
    ((key, fence, expires),) = seen
    assert await _dispatched_keys(world, "t") == [(CALL_ID, idempotency_key("t", CALL_ID))]
    assert key == idempotency_key("t", CALL_ID)
    assert await _dispatched_fences(world, "t") == [2]
    assert fence == 2
    ttl = LeasePolicy().ttl_s
    assert expires is not None
    assert before + ttl - 1 < expires < time.time() + ttl + 1
    outside_a_call = (current_idempotency_key(), current_fence(), current_lease_expires_at())
    assert outside_a_call == (None, None, None)


async def test_a_sync_tool_in_a_worker_thread_reads_the_key_and_fence(
    world: World, kind: GraphKind
) -> None:
    keys: list[str | None] = []
    fences: list[int | None] = []

    def book(flight: str) -> str:
        keys.append(current_idempotency_key())
        fences.append(current_fence())
        return f"booked {flight}"

    async with world.saver() as saver:
        run = graph(kind, saver, model(asks_to_book(), _done()), as_book(book))
        # LangGraph's sync API, in a thread of its own: the saver's loop is this one.
        await asyncio.to_thread(run.invoke, START, thread_config("t"))
    assert fences == await _dispatched_fences(world, "t") == [1]
    assert keys == [idempotency_key("t", CALL_ID)]


def _stuck_tool(ledger: Path, started: asyncio.Event) -> BaseTool:
    """``book`` whose side effect happens, then it hangs until cancelled."""

    def book(flight: str) -> str:
        raise AssertionError("the async path runs")

    async def book_async(flight: str) -> str:
        with ledger.open("a") as out:
            out.write(f"{flight}\n")
        started.set()
        await asyncio.Event().wait()
        return "unreachable"

    return as_book(book, book_async)


async def _cancel_mid_tool(saver: OnwardSaver, kind: GraphKind, ledger: Path) -> None:
    """Run the graph until the tool has had its effect, then cancel the run."""
    started = asyncio.Event()
    run = graph(kind, saver, model(asks_to_book()), _stuck_tool(ledger, started))
    task = asyncio.create_task(run.ainvoke(START, thread_config("t")))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cancelled_call_is_put_to_a_person_and_retry_runs_it_again(
    world: World, ledger: Path, kind: GraphKind
) -> None:
    async with world.saver() as saver:
        await _cancel_mid_tool(saver, kind, ledger)
        assert await _kinds(world, "t") == ["ToolDispatched"]
        run = graph(kind, saver, model(_done()), booking_tool(ledger))
        await run.ainvoke(None, thread_config("t"))
        question = await _question(run, "t")
        assert question["kind"] == QUESTION
        assert question["tool_call_id"] == CALL_ID
        assert question["tool"] == "book"
        assert question["args"] == {"flight": FLIGHT}
        assert question["idempotency_key"] == idempotency_key("t", CALL_ID)
        assert ledger_lines(ledger) == [FLIGHT]  # asking ran nothing
        out = await run.ainvoke(
            Command(resume={"decision": "retry", "by": "ops"}), thread_config("t")
        )
    assert _tool_messages(out) == [("success", f"booked {FLIGHT}")]
    assert ledger_lines(ledger) == [FLIGHT, FLIGHT]  # the person chose to book again
    assert await _kinds(world, "t") == [
        "ToolDispatched",
        "ToolResolved",
        "ToolDispatched",
        "ToolCompleted",
    ]
    state = await _reader(world).aread_thread("t")
    assert state.calls[CALL_ID].outcome == "completed"


async def test_a_failed_decision_comes_back_as_an_error_message(world: World, ledger: Path) -> None:
    async with world.saver() as saver:
        await _cancel_mid_tool(saver, "agent", ledger)
        run = graph("agent", saver, model(_done()), booking_tool(ledger))
        await run.ainvoke(None, thread_config("t"))
        out = await run.ainvoke(
            Command(resume={"decision": "failed", "error": "the fare expired"}), thread_config("t")
        )
    assert _tool_messages(out) == [("error", "SettledAsFailed: the fare expired")]
    assert ledger_lines(ledger) == [FLIGHT]
    assert await _kinds(world, "t") == ["ToolDispatched", "ToolResolved"]
    resolved = (await _reader(world).aread_thread("t")).calls[CALL_ID]
    assert (resolved.outcome, resolved.resolved_by) == ("error", "person")


async def test_an_answer_that_decides_nothing_is_asked_again(world: World, ledger: Path) -> None:
    async with world.saver() as saver:
        await _cancel_mid_tool(saver, "agent", ledger)
        run = graph("agent", saver, model(_done()), booking_tool(ledger))
        await run.ainvoke(None, thread_config("t"))
        await run.ainvoke(Command(resume={"decision": "maybe"}), thread_config("t"))
        question = await _question(run, "t")
        assert "needs an answer like" in question["invalid_answer"]
        assert "'maybe'" in question["invalid_answer"]
        assert await _kinds(world, "t") == ["ToolDispatched"]
        out = await run.ainvoke(
            Command(resume={"decision": "completed", "result": {"seat": "12A"}}),
            thread_config("t"),
        )
    assert _tool_messages(out) == [("success", '{"seat":"12A"}')]
    assert ledger_lines(ledger) == [FLIGHT]


@pytest.mark.parametrize(
    ("answer", "named"),
    [
        ({"decision": "retry", "by": "ops\n2026-12-06 root: approved"}, "by"),
        ({"decision": "retry", "by": "o" * 201}, "by"),
        ({"decision": "retry", "why": "w" * 10_001}, "why"),
        ({"decision": "retry", "why": "a bell \x07"}, "why"),
        ({"decision": "failed", "error": "e" * 10_001}, "error"),
    ],
)
async def test_an_answer_whose_by_or_why_the_runner_refuses_is_asked_again(
    world: World, ledger: Path, answer: dict[str, Any], named: str
) -> None:
    """A person's ``by`` or ``why`` is held to the limits `onward resolve` holds them to (a
    name: one line, 200 characters; a note: no control character but tab and newline, 10,000
    characters; a failed decision's ``error`` too): out of them, the question is put again
    naming the field, nothing recorded."""
    async with world.saver() as saver:
        await _cancel_mid_tool(saver, "agent", ledger)
        run = graph("agent", saver, model(_done()), booking_tool(ledger))
        await run.ainvoke(None, thread_config("t"))
        await run.ainvoke(Command(resume=answer), thread_config("t"))
        question = await _question(run, "t")
        assert named in question["invalid_answer"]
        assert await _kinds(world, "t") == ["ToolDispatched"]
    assert ledger_lines(ledger) == [FLIGHT]


async def test_a_retry_safe_tool_runs_again_without_asking(world: World, ledger: Path) -> None:
    async with world.saver() as saver:
        await _cancel_mid_tool(saver, "agent", ledger)
        run = graph("agent", saver, model(_done()), booking_tool(ledger), retry_safe=["book"])
        out = await run.ainvoke(None, thread_config("t"))
    assert _tool_messages(out) == [("success", f"booked {FLIGHT}")]
    assert ledger_lines(ledger) == [FLIGHT, FLIGHT]
    assert await _kinds(world, "t") == ["ToolDispatched", "ToolDispatched", "ToolCompleted"]


def _unconfirmed_after_the_dispatch(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease store does not answer the one renewal asked for right after the first
    dispatch is appended (its confirmation, before the tool would run)."""
    armed = [False, True]  # now, and once still to come
    renew, append = world.leases.renew, world.log.append

    async def unanswered(lease: RunLease, *, ttl_s: float) -> RunLease:
        if armed[0]:
            armed[0] = False
            raise BackendUnavailableError("the lease store did not answer")
        return await renew(lease, ttl_s=ttl_s)

    async def arming(batch: Sequence[Event]) -> list[Position]:
        positions = await append(batch)
        if armed[1] and any(isinstance(e, ToolDispatched) for e in batch):
            armed[:] = [True, False]
        return positions

    monkeypatch.setattr(world.leases, "renew", unanswered)
    monkeypatch.setattr(world.log, "append", arming)


async def test_a_call_dispatched_under_a_lease_that_could_not_be_confirmed_runs_when_invoked_again(
    world: World, ledger: Path, kind: GraphKind, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dispatch is durable and the lease store does not answer its confirmation: the tool
    is not called and the graph run stops. The log says the call never ran, so the next
    invocation makes it, once, rather than put it to a person as one that may have run."""
    _unconfirmed_after_the_dispatch(world, monkeypatch)
    async with world.saver() as saver:
        run = graph(kind, saver, model(asks_to_book(), _done()), booking_tool(ledger))
        with pytest.raises(BackendUnavailableError):
            await run.ainvoke(START, thread_config("t"))
        assert ledger_lines(ledger) == []
        out = await run.ainvoke(None, thread_config("t"))
    assert _tool_messages(out) == [("success", f"booked {FLIGHT}")]
    assert ledger_lines(ledger) == [FLIGHT]
    assert await _kinds(world, "t") == [
        "ToolDispatched",
        "ToolResolved",
        "ToolDispatched",
        "ToolCompleted",
    ]


def _silent_after_the_dispatch(world: World, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """The lease store never answers the one renewal asked for right after the first dispatch
    is appended; the event returned is set once it is asked."""
    armed = [False, True]  # now, and once still to come
    asked = asyncio.Event()
    renew, append = world.leases.renew, world.log.append

    async def silent(lease: RunLease, *, ttl_s: float) -> RunLease:
        if armed[0]:
            armed[0] = False
            asked.set()
            await asyncio.Event().wait()
        return await renew(lease, ttl_s=ttl_s)

    async def arming(batch: Sequence[Event]) -> list[Position]:
        positions = await append(batch)
        if armed[1] and any(isinstance(e, ToolDispatched) for e in batch):
            armed[:] = [True, False]
        return positions

    monkeypatch.setattr(world.leases, "renew", silent)
    monkeypatch.setattr(world.log, "append", arming)
    return asked


async def test_a_call_whose_lease_confirmation_was_cancelled_runs_when_invoked_again(
    world: World, ledger: Path, kind: GraphKind, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The graph run is cancelled (its caller gave up, the process shuts down) while the lease
    is confirmed after a dispatch: the tool was not called, and the log says so, so the next
    invocation makes the call rather than put it to a person as one that may have run."""
    asked = _silent_after_the_dispatch(world, monkeypatch)
    async with world.saver() as saver:
        run = graph(kind, saver, model(asks_to_book(), _done()), booking_tool(ledger))
        running = asyncio.ensure_future(run.ainvoke(START, thread_config("t")))
        await asyncio.wait_for(asked.wait(), 5)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert ledger_lines(ledger) == []
        out = await run.ainvoke(None, thread_config("t"))
    assert _tool_messages(out) == [("success", f"booked {FLIGHT}")]
    assert ledger_lines(ledger) == [FLIGHT]
    assert await _kinds(world, "t") == [
        "ToolDispatched",
        "ToolResolved",
        "ToolDispatched",
        "ToolCompleted",
    ]


async def test_a_result_too_large_for_the_log_is_the_calls_error_and_the_graph_goes_on(
    world: World, ledger: Path, kind: GraphKind
) -> None:
    """A result over the log's limit cannot be recorded. The tool returned, so its effect is
    done: the refusal is the call's outcome and the model reads why, rather than the graph
    run failing with the call left for a person (or, retry-safe, made again at every
    invocation and refused again)."""

    def book(flight: str) -> str:
        with ledger.open("a") as out:
            out.write(f"{flight}\n")
        return "x" * 1_500_000

    async def book_async(flight: str) -> str:
        return book(flight)

    async with world.saver() as saver:
        run = graph(
            kind,
            saver,
            model(asks_to_book(), _done()),
            as_book(book, book_async),
            retry_safe=["book"],
        )
        out = await run.ainvoke(START, thread_config("t"))
    ((status, content),) = _tool_messages(out)
    assert status == "error"
    assert "book returned a value too large to record" in content
    assert ledger_lines(ledger) == [FLIGHT]
    assert await _kinds(world, "t") == ["ToolDispatched", "ToolCompleted"]
    assert (await _reader(world).aread_thread("t")).calls[CALL_ID].outcome == "error"


async def test_a_tool_that_raised_is_replayed_as_its_error_not_run_again(
    world: World, ledger: Path
) -> None:

    def fail() -> None:
        raise RuntimeError("the airline said no")

    async with world.saver() as saver:
        run = graph(
            "toolnode", saver, model(asks_to_book()), booking_tool(ledger, after_effect=fail)
        )
        with pytest.raises(RuntimeError, match="the airline said no"):
            await run.ainvoke(START, thread_config("t"))
        again = graph("toolnode", saver, model(_done()), booking_tool(ledger))
        out = await again.ainvoke(None, thread_config("t"))
    assert _tool_messages(out) == [("error", "RuntimeError: the airline said no")]
    assert ledger_lines(ledger) == [FLIGHT]
    assert await _kinds(world, "t") == ["ToolDispatched", "ToolCompleted"]


async def test_a_cancelled_error_from_a_tools_own_await_is_recorded_as_its_error(
    world: World, ledger: Path, kind: GraphKind
) -> None:
    """Something the tool awaited was cancelled (a shared request its pool closed), not the
    graph run: the call's outcome is that error, as for any other the tool raises, rather than
    `CancelledError` reaching a caller nobody cancelled with the call left for a person."""
    shared: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def book(flight: str) -> str:
        raise AssertionError("the async path runs")

    async def book_async(flight: str) -> str:
        with ledger.open("a") as out:
            out.write(f"{flight}\n")
        asyncio.get_running_loop().call_soon(shared.cancel)
        return await shared

    async with world.saver() as saver:
        run = graph(kind, saver, model(asks_to_book()), as_book(book, book_async))
        with pytest.raises(ToolCancelledError, match="raised CancelledError"):
            await run.ainvoke(START, thread_config("t"))
        again = graph(kind, saver, model(_done()), booking_tool(ledger))
        out = await again.ainvoke(None, thread_config("t"))
    ((status, content),) = _tool_messages(out)
    assert status == "error"
    assert content.startswith("ToolCancelledError: the tool raised CancelledError")
    assert ledger_lines(ledger) == [FLIGHT]
    assert await _kinds(world, "t") == ["ToolDispatched", "ToolCompleted"]


async def test_a_tool_that_interrupts_runs_again_when_answered(world: World, ledger: Path) -> None:

    def book(flight: str) -> str:
        """Book a seat, once a person agrees."""
        if interrupt({"confirm": flight}) != "yes":
            return "not booked"
        with ledger.open("a") as out:
            out.write(f"{flight}\n")
        return f"booked {flight}"

    asking = as_book(book)
    async with world.saver() as saver:
        run = graph("agent", saver, model(asks_to_book(), _done()), asking)
        await run.ainvoke(START, thread_config("t"))
        assert await _question(run, "t") == {"confirm": FLIGHT}
        out = await run.ainvoke(Command(resume="yes"), thread_config("t"))
    assert _tool_messages(out) == [("success", f"booked {FLIGHT}")]
    assert ledger_lines(ledger) == [FLIGHT]
    assert await _kinds(world, "t") == [
        "ToolDispatched",
        "ToolResolved",
        "ToolDispatched",
        "ToolCompleted",
    ]


async def test_a_tool_sent_again_by_a_person_that_interrupts_gets_its_own_answer(
    world: World, ledger: Path, kind: GraphKind
) -> None:
    """A person sends an undecided call again and its tool then asks a question of its own.
    LangGraph hands a task's answers out by order each time it runs the task again: the
    middleware, which had the person's ``retry`` first, no longer asks once it is recorded, so
    the tool's own ``interrupt()`` got ``{"decision": "retry"}`` instead of its answer."""
    got: list[Any] = []

    def book(flight: str) -> str:
        """Book a seat, once a person agrees."""
        got.append(interrupt({"confirm": flight}))
        if got[-1] != "yes":
            return "not booked"
        with ledger.open("a") as out:
            out.write(f"{flight}\n")
        return f"booked {flight}"

    async with world.saver() as saver:
        await _cancel_mid_tool(saver, kind, ledger)
        run = graph(kind, saver, model(_done()), as_book(book))
        await run.ainvoke(None, thread_config("t"))
        assert (await _question(run, "t"))["kind"] == QUESTION
        await run.ainvoke(Command(resume={"decision": "retry"}), thread_config("t"))
        assert await _question(run, "t") == {"confirm": FLIGHT}
        out = await run.ainvoke(Command(resume="yes"), thread_config("t"))
    assert got == ["yes"]
    assert _tool_messages(out) == [("success", f"booked {FLIGHT}")]
    assert ledger_lines(ledger) == [FLIGHT, FLIGHT]


async def test_a_tool_that_hands_its_graph_a_command_is_not_run_again_on_a_replay(
    world: World, ledger: Path, kind: GraphKind
) -> None:
    """A tool that ends by raising `ParentCommand` (a subgraph it ran returned
    ``Command(graph=Command.PARENT)``) has had its effect: its command is its outcome, and
    replaying the step (a fork from the checkpoint before it) raises it again, the tool not
    run. Before the fix it was recorded as never run (taken for an interrupt) and ran again."""

    def book(flight: str) -> str:
        raise AssertionError("the async path runs")

    async def book_async(flight: str) -> str:
        with ledger.open("a") as out:
            out.write(f"{flight}\n")
        handed = ToolMessage(content="handed over", tool_call_id=CALL_ID, name="book")
        raise ParentCommand(Command(graph="tools", update={"messages": [handed]}))

    async with world.saver() as saver:
        run = graph(kind, saver, model(asks_to_book(), _done(), _done()), as_book(book, book_async))
        out = await run.ainvoke(START, thread_config("t"))
        assert _tool_messages(out) == [("success", "handed over")]
        assert await _kinds(world, "t") == ["ToolDispatched", "ToolCompleted"]
        history = [s async for s in run.aget_state_history(thread_config("t"))]
        before_tools = next(s for s in history if s.next == ("tools",))
        out = await run.ainvoke(None, before_tools.config)
    assert _tool_messages(out) == [("success", "handed over")]
    assert ledger_lines(ledger) == [FLIGHT]
    assert await _kinds(world, "t") == ["ToolDispatched", "ToolCompleted"]


async def test_the_sync_api_asks_and_records_the_same_way(world: World, ledger: Path) -> None:
    async with world.saver() as saver:
        await _cancel_mid_tool(saver, "toolnode", ledger)
        run = graph("toolnode", saver, model(_done()), booking_tool(ledger))
        # LangGraph's sync API, in a thread of its own: the saver's loop is this one.
        await asyncio.to_thread(run.invoke, None, thread_config("t"))
        assert (await _question(run, "t"))["tool_call_id"] == CALL_ID
        answer: Command[Any] = Command(
            resume={"decision": "completed", "result": "booked by phone"}
        )
        out = await asyncio.to_thread(run.invoke, answer, thread_config("t"))
    assert _tool_messages(out) == [("success", "booked by phone")]
    assert ledger_lines(ledger) == [FLIGHT]
    assert await _kinds(world, "t") == ["ToolDispatched", "ToolResolved"]


def _two_bookings() -> AIMessage:
    """The model's first answer: two calls of ``book`` at once, which a ``ToolNode`` runs in
    one task."""
    calls = [
        {"name": "book", "args": {"flight": "A1"}, "id": "c1"},
        {"name": "book", "args": {"flight": "B2"}, "id": "c2"},
    ]
    return AIMessage(content="", tool_calls=calls)


async def _cancel_both_mid_tool(saver: OnwardSaver, ledger: Path) -> None:
    """Run the ``ToolNode`` graph until both calls have had their effect, then cancel it."""
    both = asyncio.Event()

    def book(flight: str) -> str:
        raise AssertionError("the async path runs")

    async def book_async(flight: str) -> str:
        with ledger.open("a") as out:
            out.write(f"{flight}\n")
        if len(ledger_lines(ledger)) == 2:
            both.set()
        await asyncio.Event().wait()
        return "unreachable"

    run = graph("toolnode", saver, model(_two_bookings()), as_book(book, book_async))
    task = asyncio.create_task(run.ainvoke(START, thread_config("t")))
    await both.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_two_undecided_calls_of_one_tool_node_step_each_get_the_answer_naming_them(
    world: World, ledger: Path
) -> None:
    """A ``ToolNode`` runs both calls of a step in one task, and LangGraph hands that task's
    answers to its ``interrupt()`` calls by their order. Once ``c1`` is settled it no longer
    asks, so the answer given for it came back first to ``c2``'s question: ``c2`` was recorded
    and answered with ``c1``'s result, and the person's answer for ``c2`` was never used."""
    answers = {
        "c1": {"tool_call_id": "c1", "decision": "completed", "result": "A1 booked by phone"},
        "c2": {"tool_call_id": "c2", "decision": "failed", "error": "no seat on B2"},
    }
    async with world.saver() as saver:
        await _cancel_both_mid_tool(saver, ledger)
        run = graph("toolnode", saver, model(_done()), booking_tool(ledger))
        out = await run.ainvoke(None, thread_config("t"))
        asked: list[str] = []
        while interrupts := (await run.aget_state(thread_config("t"))).interrupts:
            assert len(asked) < 4, f"still asking after {asked}"
            (question,) = [i.value for i in interrupts]
            asked.append(question["tool_call_id"])
            out = await run.ainvoke(Command(resume=answers[asked[-1]]), thread_config("t"))
    assert sorted(asked) == ["c1", "c2"]
    messages = {
        m.tool_call_id: (m.status, m.content) for m in out["messages"] if isinstance(m, ToolMessage)
    }
    assert messages == {
        "c1": ("success", "A1 booked by phone"),
        "c2": ("error", "SettledAsFailed: no seat on B2"),
    }
    calls = (await _reader(world).aread_thread("t")).calls
    assert (calls["c1"].outcome, calls["c1"].result) == ("completed", "A1 booked by phone")
    assert calls["c2"].outcome == "error"
    assert sorted(ledger_lines(ledger)) == ["A1", "B2"]


async def test_a_call_sent_again_that_still_runs_when_its_step_stops_is_not_put_to_a_person(
    world: World, ledger: Path
) -> None:
    """``c1`` is sent again and runs; ``c2`` asks meanwhile, and a ``ToolNode`` (one task,
    ``asyncio.gather``) ends the step at that question without waiting for ``c1``, whose tool
    runs on. Resumed before it finished, the middleware took ``c1`` (dispatched, no outcome)
    for a call cut off and asked the person about it: a ``retry`` made it twice at once. It
    waits for the call's outcome instead, and replays it."""
    release = asyncio.Event()

    def book(flight: str) -> str:
        raise AssertionError("the async path runs")

    async def book_async(flight: str) -> str:
        with ledger.open("a") as out:
            out.write(f"{flight}\n")
        await release.wait()
        return f"booked {flight}"

    async with world.saver() as saver:
        await _cancel_both_mid_tool(saver, ledger)
        run = graph("toolnode", saver, model(_done()), as_book(book, book_async))
        await run.ainvoke(None, thread_config("t"))
        assert (await _question(run, "t"))["tool_call_id"] == "c1"
        sent_again = {"tool_call_id": "c1", "decision": "retry"}
        await run.ainvoke(Command(resume=sent_again), thread_config("t"))
        assert (await _question(run, "t"))["tool_call_id"] == "c2"
        for _ in range(200):  # c1's tool runs on, after the step stopped
            if len(ledger_lines(ledger)) == 3:
                break
            await asyncio.sleep(0.01)
        assert sorted(ledger_lines(ledger)) == ["A1", "A1", "B2"]
        failed = {"tool_call_id": "c2", "decision": "failed", "error": "no seat on B2"}
        answered = asyncio.create_task(run.ainvoke(Command(resume=failed), thread_config("t")))
        await asyncio.sleep(0.3)
        release.set()
        out = await answered
        assert (await run.aget_state(thread_config("t"))).interrupts == ()
    messages = {
        m.tool_call_id: (m.status, m.content) for m in out["messages"] if isinstance(m, ToolMessage)
    }
    assert messages == {
        "c1": ("success", "booked A1"),
        "c2": ("error", "SettledAsFailed: no seat on B2"),
    }
    assert sorted(ledger_lines(ledger)) == ["A1", "A1", "B2"]


async def test_a_retry_answered_once_does_not_send_the_call_again_when_that_attempt_is_undecided(
    world: World, ledger: Path, kind: GraphKind
) -> None:
    """A person sends an undecided call again, and that attempt too is cut off mid-tool.
    LangGraph hands the earlier ``retry`` back to the question the middleware asks when the
    graph goes on; taken as the answer about the new attempt, the tool ran a third time with
    nobody asked. It is a replay of an answer already acted on: the person is asked again."""
    async with world.saver() as saver:
        await _cancel_mid_tool(saver, kind, ledger)
        run = graph(kind, saver, model(_done()), booking_tool(ledger))
        await run.ainvoke(None, thread_config("t"))
        started = asyncio.Event()
        run = graph(kind, saver, model(_done()), _stuck_tool(ledger, started))
        task = asyncio.create_task(
            run.ainvoke(Command(resume={"decision": "retry"}), thread_config("t"))
        )
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ledger_lines(ledger) == [FLIGHT, FLIGHT]  # the person chose to book again

        run = graph(kind, saver, model(_done()), booking_tool(ledger))
        await run.ainvoke(None, thread_config("t"))
        assert ledger_lines(ledger) == [FLIGHT, FLIGHT]
        assert (await _question(run, "t"))["tool_call_id"] == CALL_ID
        out = await run.ainvoke(
            Command(resume={"decision": "failed", "error": "booked twice"}), thread_config("t")
        )
    assert _tool_messages(out) == [("error", "SettledAsFailed: booked twice")]
    assert ledger_lines(ledger) == [FLIGHT, FLIGHT]
    assert await _kinds(world, "t") == [
        "ToolDispatched",
        "ToolResolved",
        "ToolDispatched",
        "ToolResolved",
    ]


# -- killed processes -------------------------------------------------------------------------


@pytest_asyncio.fixture(scope="module")
async def children() -> AsyncIterator[Spares]:
    """``tool_child`` processes started one kill ahead: the next imports LangGraph while this
    one runs and the test waits out its lease (each kill still has a process of its own)."""
    spares = Spares(
        lambda: asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "integrations.langgraph.tool_child",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(TESTS)},
        )
    )
    try:
        yield spares
    finally:
        await spares.close()


async def _killed(
    children: Spares, spec: dict[str, str], thread_id: str, kind: GraphKind, ledger: Path, at: str
) -> None:
    """Run the graph in a child process and SIGKILL it where it stops itself (``at``)."""
    child = await children.take(
        json.dumps([json.dumps(spec), thread_id, kind, str(ledger), at, str(TTL_S)])
    )
    try:
        assert child.stdout is not None
        said = await asyncio.wait_for(child.stdout.readline(), 60)
        assert said.decode().strip() == at
    finally:
        if child.returncode is None:
            child.kill()
        returncode = await child.wait()
    assert returncode == -signal.SIGKILL


async def _take_over(saver: OnwardSaver, thread_id: str) -> None:
    """Hold the thread once the killed process's lease has run out."""
    for _ in range(200):
        try:
            await saver.aclaim(thread_id)
        except ResumeConflictError:
            await asyncio.sleep(0.05)
        else:
            return
    raise AssertionError(f"the killed process's lease on {thread_id!r} never ran out")


@asynccontextmanager
async def _resumed(
    children: Spares, world: World, spec: dict[str, str], kind: GraphKind, ledger: Path, at: str
) -> AsyncIterator[tuple[CompiledStateGraph[Any], RunnableConfig]]:
    """Kill a process running the graph at ``at`` (one booking made), then hold its thread here
    and yield the graph and the thread's config to resume it with."""
    thread_id = f"t-{uuid.uuid4().hex[:8]}"
    await _killed(children, spec, thread_id, kind, ledger, at)
    assert ledger_lines(ledger) == [FLIGHT]
    async with world.saver(holder="resumer") as saver:
        await _take_over(saver, thread_id)
        yield graph(kind, saver, model(_done()), booking_tool(ledger)), thread_config(thread_id)
    assert ledger_lines(ledger) == [FLIGHT]


async def _killed_after_the_effect(
    children: Spares, world: World, spec: dict[str, str], kind: GraphKind, tmp: Path
) -> None:
    ledger = tmp / f"ledger-{kind}-effect"
    async with _resumed(children, world, spec, kind, ledger, "effect") as (run, cfg):
        await run.ainvoke(None, cfg)
        (asked,) = (await run.aget_state(cfg)).interrupts
        assert (asked.value["kind"], asked.value["tool_call_id"]) == (QUESTION, CALL_ID)
        answer = {"decision": "completed", "result": "booked, says the airline", "by": "ops"}
        out = await run.ainvoke(Command(resume=answer), cfg)
    assert _tool_messages(out) == [("success", "booked, says the airline")]
    assert out["messages"][-1].content == "done"
    thread_id = cfg["configurable"]["thread_id"]
    assert await _kinds(world, thread_id) == ["ToolDispatched", "ToolResolved"]
    assert (await _reader(world).aread_thread(thread_id)).calls[CALL_ID].resolved_by == "ops"


async def _killed_after_the_outcome(
    children: Spares, world: World, spec: dict[str, str], kind: GraphKind, tmp: Path
) -> None:
    ledger = tmp / f"ledger-{kind}-outcome"
    async with _resumed(children, world, spec, kind, ledger, "outcome") as (run, cfg):
        out = await run.ainvoke(None, cfg)
        assert (await run.aget_state(cfg)).interrupts == ()
    assert _tool_messages(out) == [("success", f"booked {FLIGHT}")]  # as recorded
    assert out["messages"][-1].content == "done"
    assert await _kinds(world, cfg["configurable"]["thread_id"]) == [
        "ToolDispatched",
        "ToolCompleted",
    ]


@pytest.mark.slow
async def test_killed_mid_tool_on_sqlite(tmp_path: Path, kind: GraphKind, children: Spares) -> None:
    path = tmp_path / "onward.db"
    async with sqlite_world(path) as world:
        await _killed_after_the_effect(children, world, sqlite_spec(path), kind, tmp_path)
        await _killed_after_the_outcome(children, world, sqlite_spec(path), kind, tmp_path)


@pytest.mark.kafka
@pytest.mark.slow
async def test_killed_mid_tool_on_kafka_postgres_redis(
    tmp_path: Path, kind: GraphKind, kafka_servers: KafkaServers, children: Spares
) -> None:
    servers = kafka_servers
    async with kafka_world(*servers) as world:
        await _killed_after_the_effect(children, world, kafka_spec(*servers), kind, tmp_path)
        await _killed_after_the_outcome(children, world, kafka_spec(*servers), kind, tmp_path)


# -- the recorded key -------------------------------------------------------------------------
#
# A call the log knows is dispatched again with the key recorded for it, whatever the
# derivation says now: the tests change it (for calls the log has never seen) before resuming.

NEXT_CALL_ID = "call-2"


def _new_derivation(run_id: str, call_id: str) -> str:
    return f"new-{call_id}"


def _asks_to_book_again() -> AIMessage:
    """The model's answer once the first booking is made: another call of ``book``."""
    call = {"name": "book", "args": {"flight": FLIGHT}, "id": NEXT_CALL_ID}
    return AIMessage(content="", tool_calls=[call])


def _key_reporting_tool(ledger: Path, keys: list[str | None]) -> BaseTool:
    """``book`` that notes the idempotency key it is called with, then books."""

    def book(flight: str) -> str:
        keys.append(current_idempotency_key())
        with ledger.open("a") as out:
            out.write(f"{flight}\n")
        return f"booked {flight}"

    async def book_async(flight: str) -> str:
        return book(flight)

    return as_book(book, book_async)


async def _retry_safe_call_dispatched_again_after_a_kill(
    children: Spares,
    world: World,
    spec: dict[str, str],
    kind: GraphKind,
    tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ledger = tmp / f"ledger-{kind}-key"
    thread_id = f"t-{uuid.uuid4().hex[:8]}"
    await _killed(children, spec, thread_id, kind, ledger, "effect")
    recorded = idempotency_key(thread_id, CALL_ID)
    assert await _dispatched_keys(world, thread_id) == [(CALL_ID, recorded)]
    monkeypatch.setattr(middleware, "idempotency_key", _new_derivation)
    keys: list[str | None] = []
    async with world.saver(holder="resumer") as saver:
        await _take_over(saver, thread_id)
        tool = _key_reporting_tool(ledger, keys)
        chat = model(_asks_to_book_again(), _done())
        run = graph(kind, saver, chat, tool, retry_safe=["book"])
        out = await run.ainvoke(None, thread_config(thread_id))
    assert out["messages"][-1].content == "done"
    assert keys == [recorded, f"new-{NEXT_CALL_ID}"]
    assert await _dispatched_keys(world, thread_id) == [
        (CALL_ID, recorded),
        (CALL_ID, recorded),  # dispatched again: the key the killed process recorded
        (NEXT_CALL_ID, f"new-{NEXT_CALL_ID}"),  # a call the log never saw: derived now
    ]
    assert ledger_lines(ledger) == [FLIGHT, FLIGHT, FLIGHT]


@pytest.mark.slow
async def test_a_retry_safe_call_run_again_after_a_kill_sends_its_recorded_key_on_sqlite(
    tmp_path: Path, kind: GraphKind, monkeypatch: pytest.MonkeyPatch, children: Spares
) -> None:
    path = tmp_path / "onward.db"
    async with sqlite_world(path) as world:
        await _retry_safe_call_dispatched_again_after_a_kill(
            children, world, sqlite_spec(path), kind, tmp_path, monkeypatch
        )


@pytest.mark.kafka
@pytest.mark.slow
async def test_a_retry_safe_call_run_again_after_a_kill_sends_its_recorded_key_on_kafka(
    tmp_path: Path,
    kind: GraphKind,
    kafka_servers: KafkaServers,
    monkeypatch: pytest.MonkeyPatch,
    children: Spares,
) -> None:
    async with kafka_world(*kafka_servers) as world:
        await _retry_safe_call_dispatched_again_after_a_kill(
            children, world, kafka_spec(*kafka_servers), kind, tmp_path, monkeypatch
        )


async def _call_a_person_sends_again(
    world: World, kind: GraphKind, ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with world.saver() as saver:
        await _cancel_mid_tool(saver, kind, ledger)
    recorded = idempotency_key("t", CALL_ID)
    monkeypatch.setattr(middleware, "idempotency_key", _new_derivation)
    keys: list[str | None] = []
    async with world.saver(holder="resumer") as saver:
        chat = model(_asks_to_book_again(), _done())
        run = graph(kind, saver, chat, _key_reporting_tool(ledger, keys))
        await run.ainvoke(None, thread_config("t"))
        question = await _question(run, "t")
        assert question["idempotency_key"] == recorded  # the key the service saw
        out = await run.ainvoke(Command(resume={"decision": "retry"}), thread_config("t"))
    assert out["messages"][-1].content == "done"
    assert keys == [recorded, f"new-{NEXT_CALL_ID}"]
    assert await _dispatched_keys(world, "t") == [
        (CALL_ID, recorded),
        (CALL_ID, recorded),
        (NEXT_CALL_ID, f"new-{NEXT_CALL_ID}"),
    ]
    assert ledger_lines(ledger) == [FLIGHT, FLIGHT, FLIGHT]


async def test_a_call_a_person_sends_again_carries_its_recorded_key_on_sqlite(
    world: World, ledger: Path, kind: GraphKind, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _call_a_person_sends_again(world, kind, ledger, monkeypatch)


@pytest.mark.kafka
async def test_a_call_a_person_sends_again_carries_its_recorded_key_on_kafka(
    ledger: Path, kind: GraphKind, kafka_servers: KafkaServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with kafka_world(*kafka_servers) as world:
        await _call_a_person_sends_again(world, kind, ledger, monkeypatch)
