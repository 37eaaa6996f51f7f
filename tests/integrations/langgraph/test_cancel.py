"""`onward cancel --wait` stops a LangGraph graph run that is writing its thread.

The graph loops with no end of its own. The command finds the thread held by the saver and
asks the holding (the ask kept with its lease); the saver hears it with its next write's
confirmation, records the run's end (who and why) under the lease, lets the thread go and
raises `RunCancelledError` out of ``ainvoke``. The thread itself lives on: the next
invocation reads it, writes on from its last checkpoint, and its row is ``new`` again.
Embedded SQLite, and Kafka + PostgreSQL + Redis with no request key (the lease is the only
way to the saver).
"""

from __future__ import annotations

import asyncio
import gc
import json
import operator
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
import pytest_asyncio
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, interrupt
from support.appapi import until
from support.deployment import postgres_fleet_settings
from support.servers import KafkaServers
from typer.testing import CliRunner, Result

import onward
from onward.errors import BackendUnavailableError, InvalidInputError, RunCancelledError
from onward.eventlog import (
    ApprovalRequested,
    Event,
    EventLog,
    GraphCheckpointed,
    Position,
    RunFinished,
)
from onward.integrations.langgraph import OnwardSaver
from onward.runtime.backends import open_backends
from onward.runtime.cli import app as cli
from onward.runtime.fleet.requests_postgres import PostgresRequests
from onward.runtime.leases import LeaseStore, RunLease
from onward.testing.eventlog import WrappedEventLog
from onward.testing.leases import WrappedLeaseStore, policy

from .graphs import config, steps_graph
from .worlds import TENANT, World, kafka_world, sqlite_world


class Looping(TypedDict):
    steps: Annotated[list[int], operator.add]
    until: int


def looping_graph(checkpointer: OnwardSaver) -> CompiledStateGraph[Any]:
    """A graph whose one node adds a step and goes round again until ``until`` steps."""

    async def step(state: Looping) -> dict[str, list[int]]:
        await asyncio.sleep(0.01)
        return {"steps": [len(state["steps"]) + 1]}

    def again(state: Looping) -> str:
        return "step" if len(state["steps"]) < state["until"] else END

    builder = StateGraph(Looping)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", again, ["step", END])
    return builder.compile(checkpointer=checkpointer)


@pytest_asyncio.fixture
async def placed(
    clustered: KafkaServers | None, tmp_path: Path
) -> AsyncIterator[tuple[World, dict[str, str]]]:
    """A world and the environment `onward` opens the same stores from."""
    if clustered is None:
        path = tmp_path / "onward.db"
        env = {
            "ONWARD_BACKEND": "sqlite",
            "ONWARD_SQLITE_PATH": str(path),
            "ONWARD_PARTITIONS": "4",
        }
        async with sqlite_world(path) as world:
            yield world, env
        return
    env = {k: v for k, v in clustered.env(partitions=2).items() if k != "ONWARD_REQUEST_KEY"}
    async with kafka_world(*clustered) as world:
        yield world, env


async def until_heard(saver: OnwardSaver, thread_id: str) -> None:
    """Wait until the saver's renewals of the thread have heard a cancel ask."""

    async def heard() -> bool:
        lease = saver.lease(thread_id)
        return lease is not None and lease.cancel_asked is not None

    await until(heard, "a renewal hearing the ask")


@asynccontextmanager
async def a_held_thread_that_heard_a_cancel(
    world: World, *, by: str
) -> AsyncIterator[tuple[OnwardSaver, CompiledStateGraph[Any], str]]:
    """A long-lived saver whose looping graph wrote a new thread (two steps) and which keeps
    it between invocations; a cancel asked by ``by`` then, heard by its renewal. Yields the
    saver, the graph and the thread's id."""
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    async with world.saver(holder="graph-a", ttl_s=3, renew_within_s=2.7) as saver:
        graph = looping_graph(saver)
        await graph.ainvoke({"steps": [], "until": 2}, config(thread_id))
        assert await world.leases.ask_to_cancel(thread_id, tenant=TENANT, by=by)
        await until_heard(saver, thread_id)
        yield saver, graph, thread_id


def cancel(env: dict[str, str], thread_id: str) -> Result:
    """``onward cancel THREAD --wait``, as an operator runs it."""
    argv = ["cancel", thread_id, "--tenant", TENANT, "--by", "ops", "--why", "runaway"]
    return CliRunner().invoke(cli, [*argv, "--wait", "30", "--json"], env=env)


def ends_in(events: list[Any]) -> list[tuple[str, str | None]]:
    """How each `RunFinished` among ``events`` ended the thread's invocation, and why."""
    return [(e.status, e.error) for e in events if isinstance(e, RunFinished)]


async def test_a_graph_run_writing_its_thread_is_cancelled_and_the_thread_lives_on(
    placed: tuple[World, dict[str, str]],
) -> None:
    world, env = placed
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    async with world.saver(holder="graph-a") as saver:
        graph = looping_graph(saver)
        invocation: RunnableConfig = {**config(thread_id), "recursion_limit": 100_000}
        running = asyncio.create_task(
            graph.ainvoke({"steps": [], "until": 50_000}, invocation, durability="sync")
        )

        async def three_steps_in() -> bool:
            assert not running.done(), running
            latest = await saver.aget_tuple(config(thread_id))
            # The input's checkpoint, before the first step, may hold no steps channel yet.
            steps = [] if latest is None else latest.checkpoint["channel_values"].get("steps", [])
            return len(steps) >= 3

        await until(three_steps_in, "the graph run's third step")

        result = await asyncio.to_thread(cancel, env, thread_id)

        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["status"] == "cancelled"
        with pytest.raises(RunCancelledError, match="cancelled by ops: runaway") as stopped:
            await asyncio.wait_for(running, 30)
        assert (stopped.value.by, stopped.value.why) == ("ops", "runaway")
        assert not saver.holds(thread_id)
        # Another write of the same graph run is refused, not a new claim of the thread.
        with pytest.raises(RunCancelledError):
            await saver.aput_writes(
                {
                    "configurable": {
                        "thread_id": thread_id,
                        "checkpoint_ns": "",
                        "checkpoint_id": "x",
                    }
                },
                [("steps", [0])],
                "task",
            )

    events = [stored.event for stored in await world.log.read_run(thread_id)]
    ends = [e for e in events if isinstance(e, RunFinished)]
    assert [(e.status, e.error) for e in ends] == [("cancelled", "cancelled by ops: runaway")]
    assert not any(isinstance(e, GraphCheckpointed) for e in events[events.index(ends[0]) :])

    # The thread lives on: a new invocation reads it and writes on from its last checkpoint.
    async with world.saver(holder="graph-b") as saver:
        before = await saver.aget_tuple(config(thread_id))
        assert before is not None
        done = len(before.checkpoint["channel_values"]["steps"])
        graph = looping_graph(saver)
        out = await graph.ainvoke({"steps": [], "until": done + 2}, config(thread_id))
        assert out["steps"] == list(range(1, done + 3))
    argv = ["inspect", thread_id, "--tenant", TENANT, "--json"]
    shown = await asyncio.to_thread(CliRunner().invoke, cli, argv, env=env)
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["status"] == "new"


class LandsThenFails(WrappedEventLog):
    """Appends the first `RunFinished` and then says the append failed, as a broker that took
    the batch and lost the answer does."""

    def __init__(self, inner: EventLog) -> None:
        super().__init__(inner)
        self.failed = False

    async def append(self, events: Sequence[Event]) -> list[Position]:
        positions = await super().append(events)
        if not self.failed and any(isinstance(e, RunFinished) for e in events):
            self.failed = True
            raise BackendUnavailableError("the answer to the append was lost")
        return positions


async def test_an_end_whose_append_was_in_doubt_is_recorded_once(tmp_path: Path) -> None:
    async with sqlite_world(tmp_path / "onward.db") as world:
        log = LandsThenFails(world.log)
        saver = OnwardSaver(log, world.leases, tenant=TENANT, frontiers=world.frontiers)
        async with saver:
            graph = looping_graph(saver)
            await graph.ainvoke({"steps": [], "until": 2}, config("t"))
            write: RunnableConfig = {
                "configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "x"}
            }
            assert await world.leases.ask_to_cancel("t", tenant=TENANT, by="ops")
            # The graph run writes on: the write's confirmation hears the ask.
            await saver.aput_writes(write, [("steps", [0])], "task")
            with pytest.raises(BackendUnavailableError):
                await saver.aput_writes(write, [("steps", [0])], "task-2")
            # The graph run's last write finds the end in the log and stops there; a new
            # invocation writes on.
            with pytest.raises(RunCancelledError):
                await saver.aput_writes(write, [("steps", [0])], "task-3")
            out = await graph.ainvoke({"steps": [], "until": 4}, config("t"))
            assert out["steps"] == [1, 2, 3, 4]
        events = [stored.event for stored in await world.log.read_run("t")]
    assert ends_in(events) == [("cancelled", "cancelled by ops")]


async def test_a_read_by_anyone_else_does_not_let_a_cancelled_graph_run_write_on(
    tmp_path: Path,
) -> None:
    """A graph run is cancelled while another of its nodes is still going; a UI reads the
    thread (``aget_state``) meanwhile. That node's write must still be refused: the run is
    over, and carrying on would claim the thread again and run its next node."""
    async with sqlite_world(tmp_path / "onward.db") as world:
        async with world.saver(holder="graph-a") as saver:
            graph = looping_graph(saver)
            await graph.ainvoke({"steps": [], "until": 2}, config("t"))
            write: RunnableConfig = {
                "configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "x"}
            }
            heard = asyncio.Event()
            ui_read = asyncio.Event()

            async def writes_on() -> None:
                """A write's confirmation hears the ask; the next ends the run."""
                for i in range(100):
                    await saver.aput_writes(write, [("steps", [0])], f"task-{i}")
                    await asyncio.sleep(0.05)

            async def run() -> None:
                """The graph run: reads the thread, writes, is cancelled, then its other node's
                write comes after the UI's read. In a task: a context of its own."""
                assert await saver.aget_tuple(config("t")) is not None
                await saver.aput_writes(write, [("steps", [0])], "task-1")
                assert await world.leases.ask_to_cancel("t", tenant=TENANT, by="ops")
                with pytest.raises(RunCancelledError):
                    await writes_on()
                heard.set()
                await ui_read.wait()
                await saver.aput_writes(write, [("steps", [0])], "other-node")

            running = asyncio.create_task(run())
            await asyncio.wait(
                [running, asyncio.create_task(heard.wait())],
                timeout=30,
                return_when=asyncio.FIRST_COMPLETED,
            )
            assert heard.is_set(), running
            assert await saver.aget_tuple(config("t")) is not None  # the UI's read
            ui_read.set()
            with pytest.raises(RunCancelledError):
                await asyncio.wait_for(running, 30)
            assert not saver.holds("t")
            # A new invocation reads the thread first and writes on.
            out = await graph.ainvoke({"steps": [], "until": 4}, config("t"))
            assert out["steps"] == [1, 2, 3, 4]
        events = [stored.event for stored in await world.log.read_run("t")]
    assert ends_in(events) == [("cancelled", "cancelled by ops")]


async def test_an_ask_its_invocation_completed_before_hearing_does_not_end_the_next(
    placed: tuple[World, dict[str, str]],
) -> None:
    """The cancel is asked as the graph run completes, after its last write (an operator's
    `App.cancel` racing the end): that invocation is over, and the saver lets the thread go.
    A cancel ends one invocation, not the thread: the next invocation, whenever it comes and
    whichever process makes it, writes on rather than being cancelled at its first write."""
    world, _ = placed
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    async with world.saver(holder="graph-a") as saver:
        graph = looping_graph(saver)
        async with saver.hold(thread_id):
            out = await graph.ainvoke({"steps": [], "until": 2}, config(thread_id))
            assert out["steps"] == [1, 2]
            assert await world.leases.ask_to_cancel(thread_id, tenant=TENANT, by="ops")
    async with world.saver(holder="graph-b") as saver:
        out = await looping_graph(saver).ainvoke({"steps": [], "until": 4}, config(thread_id))
        assert out["steps"] == [1, 2, 3, 4]
    events = [stored.event for stored in await world.log.read_run(thread_id)]
    assert not any(isinstance(e, RunFinished) for e in events)


async def test_a_thread_no_graph_run_is_writing_is_not_reported_cancelled(
    placed: tuple[World, dict[str, str]],
) -> None:
    """Its last invocation completed (as when it completes while `onward cancel --wait` waits
    for it): there is no invocation to end, and a cancel ends one invocation, not the thread.
    The command says so (exit 2) rather than report ``cancelled``, and records no end."""
    world, env = placed
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    async with world.saver(holder="graph-a") as saver:
        out = await looping_graph(saver).ainvoke({"steps": [], "until": 2}, config(thread_id))
        assert out["steps"] == [1, 2]

    result = await asyncio.to_thread(cancel, env, thread_id)

    assert result.exit_code == 2, result.output
    assert "no graph run is writing" in result.output
    events = [stored.event for stored in await world.log.read_run(thread_id)]
    assert not any(isinstance(e, RunFinished) for e in events)
    argv = ["inspect", thread_id, "--tenant", TENANT, "--json"]
    shown = await asyncio.to_thread(CliRunner().invoke, cli, argv, env=env)
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["status"] == "new"


async def test_a_fleet_apps_cancel_of_a_thread_no_graph_run_is_writing_is_refused_at_once(
    database_url: str, pg_schema: str
) -> None:
    """`App.cancel` through a fleet (no worker in the app) refuses it as the in-process app
    does, nothing sent: the fleet's worker refused it and said so in its own log alone, the
    caller told nothing."""
    settings = postgres_fleet_settings(database_url, pg_schema)
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    async with open_backends(settings.model_copy(update={"app_mode": "in_process"})) as stores:
        world = World(stores.log, stores.leases, stores.frontiers, stores.embedded)
        async with world.saver(holder="graph-a") as saver:
            out = await looping_graph(saver).ainvoke({"steps": [], "until": 2}, config(thread_id))
            assert out["steps"] == [1, 2]
    async with (
        onward.open(settings, tenant=TENANT) as app,
        PostgresRequests(database_url, schema=pg_schema) as requests,
    ):
        with pytest.raises(InvalidInputError, match="no graph run is writing"):
            await app.cancel(thread_id, by="ops", why="runaway")
        assert not await requests.stored_for(thread_id)
        state = await app.get_session_state(thread_id)
        assert state is not None
        assert state.status == "new"


class Buying(TypedDict):
    bought: int


def buying_graph(checkpointer: OnwardSaver, purchases: list[str]) -> CompiledStateGraph[Any]:
    """A graph whose one node asks a person, then buys (``purchases`` counts each purchase)."""

    def buy(state: Buying) -> dict[str, int]:
        answer = interrupt("buy?")
        purchases.append(answer)
        return {"bought": state["bought"] + 1}

    builder = StateGraph(Buying)
    builder.add_node("buy", buy)
    builder.add_edge(START, "buy")
    builder.add_edge("buy", END)
    return builder.compile(checkpointer=checkpointer)


async def cancelled_at_an_interrupt(
    world: World, env: dict[str, str], purchases: list[str]
) -> tuple[str, Result]:
    """A new thread stopped at the buying graph's interrupt, then `onward cancel`ed (exit 0):
    its id, and what the command said."""
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    async with world.saver(holder="graph-a") as saver:
        out = await buying_graph(saver, purchases).ainvoke({"bought": 0}, config(thread_id))
        assert "__interrupt__" in out
    result = await asyncio.to_thread(cancel, env, thread_id)
    assert result.exit_code == 0, result.output
    return thread_id, result


async def test_a_cancelled_interrupt_resumed_later_does_not_run_its_node(
    placed: tuple[World, dict[str, str]],
) -> None:
    """`onward cancel` of a thread stopped at an interrupt ends that invocation: a later
    ``Command(resume=...)`` of it is refused (`RunCancelledError`), and the node waiting on the
    answer never runs (nothing is bought). The thread lives on: a new input runs it afresh."""
    world, env = placed
    purchases: list[str] = []
    thread_id, result = await cancelled_at_an_interrupt(world, env, purchases)
    assert json.loads(result.stdout)["status"] == "cancelled"

    async with world.saver(holder="graph-b") as saver:
        with pytest.raises(RunCancelledError, match="cancelled by ops: runaway"):
            await buying_graph(saver, purchases).ainvoke(Command(resume="yes"), config(thread_id))
        assert purchases == []
        # A new input is a new invocation: it runs the node from its start, and asks again.
        out = await buying_graph(saver, purchases).ainvoke({"bought": 0}, config(thread_id))
        assert "__interrupt__" in out
        out = await buying_graph(saver, purchases).ainvoke(Command(resume="ok"), config(thread_id))
    assert purchases == ["ok"]
    assert out["bought"] == 1


async def test_a_cancel_asked_while_a_held_thread_waits_on_an_interrupt_ends_it(
    placed: tuple[World, dict[str, str]],
) -> None:
    """The saver still holds the thread, stopped at an interrupt, when the cancel is asked:
    the interrupted invocation is not over (it waits on a person), so the ask ends it
    cancelled when the saver lets the thread go, and a later resume does not buy."""
    world, _ = placed
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    purchases: list[str] = []
    async with world.saver(holder="graph-a") as saver, saver.hold(thread_id):
        out = await buying_graph(saver, purchases).ainvoke({"bought": 0}, config(thread_id))
        assert "__interrupt__" in out
        assert await world.leases.ask_to_cancel(thread_id, tenant=TENANT, by="ops")
    events = [stored.event for stored in await world.log.read_run(thread_id)]
    assert ends_in(events) == [("cancelled", "cancelled by ops")]
    async with world.saver(holder="graph-b") as saver:
        with pytest.raises(RunCancelledError):
            await buying_graph(saver, purchases).ainvoke(Command(resume="yes"), config(thread_id))
    assert purchases == []


async def test_an_ask_made_between_invocations_does_not_end_the_next(
    placed: tuple[World, dict[str, str]],
) -> None:
    """One long-lived saver, ``ainvoke`` called again and again (no ``hold``): it keeps the
    thread's lease between invocations. A cancel asked after one invocation completed, and
    heard by the holding's renewal then, was for no invocation: the next one, started after
    it, writes on rather than being cancelled."""
    world, _ = placed
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    async with world.saver(holder="graph-a", ttl_s=3, renew_within_s=2.7) as saver:
        graph = looping_graph(saver)
        out = await graph.ainvoke({"steps": [], "until": 2}, config(thread_id))
        assert out["steps"] == [1, 2]
        assert saver.holds(thread_id)
        assert await world.leases.ask_to_cancel(thread_id, tenant=TENANT, by="ops")
        await until_heard(saver, thread_id)

        out = await graph.ainvoke({"steps": [], "until": 4}, config(thread_id))

        assert out["steps"] == [1, 2, 3, 4]
    events = [stored.event for stored in await world.log.read_run(thread_id)]
    assert not any(isinstance(e, RunFinished) for e in events)


async def test_the_invocation_after_an_ask_made_between_invocations_can_be_cancelled(
    placed: tuple[World, dict[str, str]],
) -> None:
    """The ask made between invocations (the saver holding the thread idle) ends nothing, and
    does not stand in the way of the next ask: the invocation after it, cancelled while it
    writes the thread, ends cancelled by whoever asked then, once."""
    world, env = placed
    async with a_held_thread_that_heard_a_cancel(world, by="early") as (saver, graph, thread_id):
        invocation: RunnableConfig = {**config(thread_id), "recursion_limit": 100_000}
        running = asyncio.create_task(
            graph.ainvoke({"steps": [], "until": 50_000}, invocation, durability="sync")
        )

        async def three_steps_on() -> bool:
            assert not running.done(), running
            latest = await saver.aget_tuple(config(thread_id))
            assert latest is not None
            return len(latest.checkpoint["channel_values"].get("steps", [])) >= 5

        await until(three_steps_on, "the second invocation's third step")

        result = await asyncio.to_thread(cancel, env, thread_id)

        assert result.exit_code == 0, result.output
        with pytest.raises(RunCancelledError, match="cancelled by ops: runaway"):
            await asyncio.wait_for(running, 30)
    events = [stored.event for stored in await world.log.read_run(thread_id)]
    assert ends_in(events) == [("cancelled", "cancelled by ops: runaway")]


async def test_an_ask_a_read_by_anyone_else_hears_still_ends_the_graph_run_writing(
    tmp_path: Path,
) -> None:
    """A UI reads the thread (``aget_state``) after the holding heard a cancel asked of the
    graph run writing it, before that run wrote again: the ask is still that graph run's to
    end (once), not the reader's to answer."""
    async with sqlite_world(tmp_path / "onward.db") as world:
        async with world.saver(holder="graph-a", ttl_s=3, renew_within_s=2.7) as saver:
            graph = looping_graph(saver)
            await graph.ainvoke({"steps": [], "until": 2}, config("t"))
            write: RunnableConfig = {
                "configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "x"}
            }
            wrote = asyncio.Event()
            ui_read = asyncio.Event()

            async def run() -> None:
                """The graph run: reads the thread, writes, then writes again after the UI's
                read. In a task: a context of its own."""
                assert await saver.aget_tuple(config("t")) is not None
                await saver.aput_writes(write, [("steps", [0])], "task-1")
                wrote.set()
                await ui_read.wait()
                await saver.aput_writes(write, [("steps", [0])], "task-2")

            running = asyncio.create_task(run())
            await asyncio.wait_for(wrote.wait(), 30)
            assert await world.leases.ask_to_cancel("t", tenant=TENANT, by="ops")
            await until_heard(saver, "t")
            assert await saver.aget_tuple(config("t")) is not None  # the UI's read
            ui_read.set()
            with pytest.raises(RunCancelledError):
                await asyncio.wait_for(running, 30)
            out = await graph.ainvoke({"steps": [], "until": 4}, config("t"))
            assert out["steps"] == [1, 2, 3, 4]
        events = [stored.event for stored in await world.log.read_run("t")]
    assert ends_in(events) == [("cancelled", "cancelled by ops")]


async def test_a_cancel_heard_while_a_long_lived_saver_holds_a_thread_at_an_interrupt_ends_it(
    placed: tuple[World, dict[str, str]],
) -> None:
    """One long-lived saver (no ``hold``) keeps the thread stopped at an interrupt, and its
    renewal hears a cancel: the interrupted invocation waits on a person, it is not over, so
    the saver ends it cancelled and lets the thread go, and the resume does not buy."""
    world, _ = placed
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    purchases: list[str] = []
    async with world.saver(holder="graph-a", ttl_s=3, renew_within_s=2.7) as saver:
        graph = buying_graph(saver, purchases)
        out = await graph.ainvoke({"bought": 0}, config(thread_id))
        assert "__interrupt__" in out
        assert saver.holds(thread_id)
        assert await world.leases.ask_to_cancel(thread_id, tenant=TENANT, by="ops")

        async def let_go() -> bool:
            return not saver.holds(thread_id)

        await until(let_go, "the saver answering the ask its renewal heard")
        with pytest.raises(RunCancelledError):
            await graph.ainvoke(Command(resume="yes"), config(thread_id))
    assert purchases == []
    events = [stored.event for stored in await world.log.read_run(thread_id)]
    assert ends_in(events) == [("cancelled", "cancelled by ops")]


async def test_a_cancelled_interrupt_resumed_by_a_sync_invoke_is_refused_too(
    placed: tuple[World, dict[str, str]],
) -> None:
    """A graph's sync ``invoke`` (in a thread, the saver's loop running) resuming an interrupt
    a cancel ended is refused as ``ainvoke``'s is, not taken silently with nothing run."""
    world, env = placed
    purchases: list[str] = []
    thread_id, _ = await cancelled_at_an_interrupt(world, env, purchases)

    async with world.saver(holder="graph-b") as saver:
        graph = buying_graph(saver, purchases)
        with pytest.raises(RunCancelledError, match="cancelled by ops: runaway"):
            await asyncio.to_thread(graph.invoke, Command(resume="yes"), config(thread_id))
    assert purchases == []


async def test_a_cancelled_interrupt_stays_over_once_its_thread_is_pruned(
    placed: tuple[World, dict[str, str]],
) -> None:
    """Pruning a thread a cancel ended at an interrupt (keeping its latest checkpoint, the
    one the interrupt was asked at) does not make the interrupt pending again: a later
    answer is still refused, and nothing is bought."""
    world, env = placed
    purchases: list[str] = []
    thread_id, _ = await cancelled_at_an_interrupt(world, env, purchases)

    async with world.saver(holder="graph-b") as saver:
        await saver.aprune([thread_id], strategy="keep_latest")
        with pytest.raises(RunCancelledError, match="cancelled by ops: runaway"):
            await buying_graph(saver, purchases).ainvoke(Command(resume="yes"), config(thread_id))
    assert purchases == []


class Slow(TypedDict):
    steps: Annotated[list[str], operator.add]


@pytest.mark.parametrize("release", ["close", "arelease"])
async def test_an_ask_heard_as_the_saver_lets_go_of_a_thread_still_written_ends_its_run(
    placed: tuple[World, dict[str, str]], release: str
) -> None:
    """The saver is closed (or lets the thread go) while its graph run is in a slow node, a
    cancel asked just before and not heard by a renewal yet. The release hears the ask, and
    the asker is told the invocation ends: the run's next write must end it ``cancelled``,
    not claim the thread again and run its next node."""
    world, _ = placed
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    entered = asyncio.Event()
    go_on = asyncio.Event()
    after: list[str] = []

    async def slow(state: Slow) -> dict[str, list[str]]:
        entered.set()
        await go_on.wait()
        return {"steps": ["slow"]}

    async def next_node(state: Slow) -> dict[str, list[str]]:
        after.append("next")
        return {"steps": ["next"]}

    saver = world.saver(holder="graph-a")
    async with saver:
        builder = StateGraph(Slow)
        builder.add_node("slow", slow)
        builder.add_node("next", next_node)
        builder.add_edge(START, "slow")
        builder.add_edge("slow", "next")
        builder.add_edge("next", END)
        graph = builder.compile(checkpointer=saver)
        running = asyncio.create_task(
            graph.ainvoke({"steps": []}, config(thread_id), durability="sync")
        )
        await asyncio.wait_for(entered.wait(), 30)
        assert saver.holds(thread_id)
        assert await world.leases.ask_to_cancel(thread_id, tenant=TENANT, by="ops")
        if release == "close":
            await saver.close()
        else:
            await saver.arelease(thread_id)
        go_on.set()
        with pytest.raises(RunCancelledError, match="cancelled by ops"):
            await asyncio.wait_for(running, 30)
        assert after == []
    events = [stored.event for stored in await world.log.read_run(thread_id)]
    ends = [e for e in events if isinstance(e, RunFinished)]
    assert [(e.status, e.error) for e in ends] == [("cancelled", "cancelled by ops")]
    assert not any(isinstance(e, GraphCheckpointed) for e in events[events.index(ends[0]) :])


async def test_cancel_wait_of_a_thread_a_long_lived_saver_holds_at_an_interrupt_ends_it(
    placed: tuple[World, dict[str, str]],
) -> None:
    """One long-lived saver keeps the thread stopped at an interrupt, and no invocation comes:
    `onward cancel --wait` is answered as the saver's renewal hears the ask (exit 0,
    ``cancelled``), not after waiting out its whole time with the thread still held (exit 3);
    a later resume is refused and does not buy."""
    world, env = placed
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    purchases: list[str] = []
    async with world.saver(holder="graph-a", ttl_s=3, renew_within_s=2.7) as saver:
        graph = buying_graph(saver, purchases)
        out = await graph.ainvoke({"bought": 0}, config(thread_id))
        assert "__interrupt__" in out
        assert saver.holds(thread_id)

        result = await asyncio.to_thread(cancel, env, thread_id)

        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["status"] == "cancelled"
        assert not saver.holds(thread_id)
        with pytest.raises(RunCancelledError, match="cancelled by ops: runaway"):
            await graph.ainvoke(Command(resume="yes"), config(thread_id))
    assert purchases == []
    events = [stored.event for stored in await world.log.read_run(thread_id)]
    assert ends_in(events) == [("cancelled", "cancelled by ops: runaway")]


async def test_cancel_wait_of_a_thread_a_long_lived_saver_holds_idle_says_what_happens(
    placed: tuple[World, dict[str, str]],
) -> None:
    """One long-lived saver keeps the thread between invocations (the last one completed), and
    no invocation comes: `onward cancel --wait` runs out (exit 3), and says what its ask comes
    to for a LangGraph thread (nothing is cancelled; the next invocation runs), not that the
    holder ends the run at its next boundary, which it never does."""
    world, env = placed
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    async with world.saver(holder="graph-a", ttl_s=3, renew_within_s=2.7) as saver:
        graph = looping_graph(saver)
        out = await graph.ainvoke({"steps": [], "until": 2}, config(thread_id))
        assert out["steps"] == [1, 2]
        argv = ["cancel", thread_id, "--tenant", TENANT, "--by", "ops", "--wait", "2"]

        result = await asyncio.to_thread(CliRunner().invoke, cli, argv, env=env)

        assert result.exit_code == 3, result.output
        assert "next boundary" not in result.output
        assert "nothing is cancelled and the thread's next invocation runs" in result.output
        out = await graph.ainvoke({"steps": [], "until": 4}, config(thread_id))
        assert out["steps"] == [1, 2, 3, 4]
    events = [stored.event for stored in await world.log.read_run(thread_id)]
    assert not any(isinstance(e, RunFinished) for e in events)


async def test_a_resume_reading_a_thread_as_a_cancel_heard_at_its_interrupt_ends_it_is_refused(
    placed: tuple[World, dict[str, str]],
) -> None:
    """A resume's first read of the thread is under way when the saver's renewal hears a
    cancel and ends the invocation stopped at the interrupt: what the resume read is older
    than that end, and built on it the interrupted node would run after the asker was told the
    run was cancelled."""
    world, _ = placed
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    purchases: list[str] = []
    async with world.saver(holder="graph-a", ttl_s=3, renew_within_s=2.7) as saver:
        graph = buying_graph(saver, purchases)
        assert "__interrupt__" in await graph.ainvoke({"bought": 0}, config(thread_id))
        reading, go_on = asyncio.Event(), asyncio.Event()
        state_of = saver._state

        async def read_held_up(thread: str, **how: Any) -> Any:
            if not reading.is_set():
                reading.set()
                await go_on.wait()
            return await state_of(thread, **how)

        saver._state = read_held_up  # type: ignore[method-assign,assignment]
        resumed = asyncio.create_task(graph.ainvoke(Command(resume="yes"), config(thread_id)))
        await asyncio.wait_for(reading.wait(), 30)
        assert await world.leases.ask_to_cancel(thread_id, tenant=TENANT, by="ops")

        async def let_go() -> bool:
            return not saver.holds(thread_id)

        await until(let_go, "the saver answering the ask its renewal heard")
        go_on.set()
        with pytest.raises(RunCancelledError):
            await resumed
    assert purchases == []


class ReleaseFailsOnce(WrappedLeaseStore):
    """A lease store whose first release fails (a blip of its server), as a store error."""

    def __init__(self, inner: LeaseStore) -> None:
        super().__init__(inner)
        self.failed = False

    async def release(self, lease: RunLease) -> None:
        if not self.failed:
            self.failed = True
            raise BackendUnavailableError("lease store down for a moment")
        await super().release(lease)


async def test_a_cancel_answered_at_an_interrupt_as_the_lease_store_blips_leaves_no_stray_error(
    tmp_path: Path,
) -> None:
    """A long-lived saver's renewal hears a cancel of a thread it holds at an interrupt and ends
    it; handing the lease back then fails once (the store blipped). The end stands, the lease
    is handed back once the store takes writes again, and nothing is left for asyncio to
    report as a task exception never retrieved: the saver says what happened itself."""
    unretrieved: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    purchases: list[str] = []
    try:
        async with sqlite_world(tmp_path / "onward.db") as world:
            saver = OnwardSaver(
                world.log,
                ReleaseFailsOnce(world.leases),
                tenant=TENANT,
                frontiers=world.frontiers,
                checkpoint_inline=True,
                holder="graph-a",
                policy=policy(3, 2.7),
            )
            async with saver:
                graph = buying_graph(saver, purchases)
                assert "__interrupt__" in await graph.ainvoke({"bought": 0}, config(thread_id))
                assert await world.leases.ask_to_cancel(thread_id, tenant=TENANT, by="ops")

                async def let_go() -> bool:
                    return not saver.holds(thread_id)

                await until(let_go, "the saver answering the ask its renewal heard")

                async def handed_back() -> bool:
                    return await world.leases.current(thread_id) is None

                await until(handed_back, "the release retried in the background")
                await asyncio.sleep(0)
            events = [stored.event for stored in await world.log.read_run(thread_id)]
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert ends_in(events) == [("cancelled", "cancelled by ops")]
    assert [context.get("message") for context in unretrieved] == []


async def test_a_hold_block_whose_invocation_was_cancelled_lets_the_thread_go_at_its_end(
    placed: tuple[World, dict[str, str]],
) -> None:
    """A session holds its thread for a block (``hold``) and invokes the graph in it again and
    again; a person cancels one invocation, the session goes on with the next. At the block's
    end the thread is let go, so another process may run it, not held by this saver until it
    closes."""
    world, _ = placed
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    ask = _asker(world, thread_id)

    async with world.saver(holder="graph-a") as saver:
        async with saver.hold(thread_id):
            with pytest.raises(RunCancelledError):
                await steps_graph("a", saver, inside=ask).ainvoke({"steps": []}, config(thread_id))
            out = await steps_graph("a", saver).ainvoke({"steps": []}, config(thread_id))
            assert out["steps"] == ["a"]
        assert not saver.holds(thread_id)
        async with world.saver(holder="graph-b") as other:
            out = await steps_graph("b", other).ainvoke({"steps": []}, config(thread_id))
    assert out["steps"] == ["a", "b"]


async def test_a_thread_whose_graph_run_was_cancelled_is_pruned_and_deleted_by_the_same_saver(
    placed: tuple[World, dict[str, str]],
) -> None:
    """An operator cancels a runaway graph run, then prunes and deletes its thread through the
    same saver: neither is a write of the ended run, so neither is refused as one
    (`RunCancelledError` "while this graph run wrote it")."""
    world, _ = placed
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    ask = _asker(world, thread_id)

    async with world.saver(holder="graph-a") as saver:
        await steps_graph("a", saver).ainvoke({"steps": []}, config(thread_id))
        with pytest.raises(RunCancelledError):
            await steps_graph("a", saver, inside=ask).ainvoke({"steps": []}, config(thread_id))

        await saver.aprune([thread_id], strategy="keep_latest")
        await saver.adelete_thread(thread_id)

        assert not saver.holds(thread_id)
        assert await saver.aget_tuple(config(thread_id)) is None


async def test_a_session_after_one_whose_invocation_was_cancelled_holds_the_thread_again(
    placed: tuple[World, dict[str, str]],
) -> None:
    """A worker task runs session after session of a thread, each in a ``hold`` block; a person
    cancelled the last session's invocation. The next session's ``hold`` takes the thread
    again (it is no write of the ended invocation) and its invocation runs."""
    world, _ = placed
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    ask = _asker(world, thread_id)

    async with world.saver(holder="graph-a") as saver:
        async with saver.hold(thread_id):
            with pytest.raises(RunCancelledError):
                await steps_graph("a", saver, inside=ask).ainvoke({"steps": []}, config(thread_id))
        async with saver.hold(thread_id):
            out = await steps_graph("b", saver).ainvoke({"steps": []}, config(thread_id))
    assert out["steps"] == ["b"]


async def test_a_cancel_heard_at_an_interrupt_beside_a_running_branch_ends_the_run_once(
    placed: tuple[World, dict[str, str]],
) -> None:
    """Two branches run in parallel: one stops at an interrupt, the other is in a slow node. A
    long-lived saver's renewal hears a cancel and ends the invocation at the interrupt; the
    slow branch's write then stops the graph run (`RunCancelledError`) without claiming the
    thread again: the run ends once, and nothing is written after its end."""
    world, _ = placed
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    go_on = asyncio.Event()

    async with world.saver(holder="graph-a", ttl_s=3, renew_within_s=2.7) as saver:
        graph = _beside_a_slow_branch(saver, go_on)
        running = asyncio.create_task(graph.ainvoke({"steps": []}, config(thread_id)))

        async def at_the_interrupt() -> bool:
            return (await saver.aread_thread(thread_id)).waiting_on is not None

        await until(at_the_interrupt, "the interrupt saved")
        assert await world.leases.ask_to_cancel(thread_id, tenant=TENANT, by="ops")

        async def let_go() -> bool:
            return not saver.holds(thread_id)

        await until(let_go, "the saver answering the ask its renewal heard")
        go_on.set()
        with pytest.raises(RunCancelledError, match="cancelled by ops"):
            await asyncio.wait_for(running, 30)
        assert not saver.holds(thread_id)
    events = [stored.event for stored in await world.log.read_run(thread_id)]
    assert ends_in(events) == [("cancelled", "cancelled by ops")]
    assert isinstance(events[-1], RunFinished)


class AskedAsTheInterruptLands(WrappedEventLog):
    """Asks to cancel the thread as its interrupt's append lands: the write's confirmation of
    its lease hears the ask, and no renewal of the holding has heard it before."""

    def __init__(self, inner: EventLog, leases: LeaseStore) -> None:
        super().__init__(inner)
        self.leases = leases

    async def append(self, events: Sequence[Event]) -> list[Position]:
        positions = await super().append(events)
        for event in events:
            if isinstance(event, ApprovalRequested):
                assert await self.leases.ask_to_cancel(event.run_id, tenant=TENANT, by="ops")
        return positions


@pytest.mark.parametrize("answer", ["read", "release"])
async def test_a_cancel_answered_at_an_interrupt_beside_a_running_branch_ends_the_run_once(
    placed: tuple[World, dict[str, str]], answer: str
) -> None:
    """Two branches run in parallel: one stops at an interrupt, the other is in a slow node. A
    cancel is asked as the interrupt is saved (the write hears it, no renewal has yet), and a
    UI reads the thread (``aget_state``), or the saver lets it go (``arelease``): either ends
    the invocation at the interrupt. The slow branch's write then stops the graph run
    (`RunCancelledError`) without claiming the thread again: the run ends once, and nothing is
    written after its end."""
    world, _ = placed
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    go_on = asyncio.Event()

    saver = OnwardSaver(
        AskedAsTheInterruptLands(world.log, world.leases),
        world.leases,
        tenant=TENANT,
        frontiers=world.frontiers,
        checkpoint_inline=world.embedded,
        holder="graph-a",
    )
    async with saver:
        graph = _beside_a_slow_branch(saver, go_on)
        running = asyncio.create_task(
            graph.ainvoke({"steps": []}, config(thread_id), durability="sync")
        )
        await until_heard(saver, thread_id)

        if answer == "read":
            await graph.aget_state(config(thread_id))
        else:
            await saver.arelease(thread_id)

        assert not saver.holds(thread_id)
        go_on.set()
        with pytest.raises(RunCancelledError, match="cancelled by ops"):
            await asyncio.wait_for(running, 30)
        assert not saver.holds(thread_id)
    events = [stored.event for stored in await world.log.read_run(thread_id)]
    assert ends_in(events) == [("cancelled", "cancelled by ops")]
    assert isinstance(events[-1], RunFinished)


def _asker(world: World, thread_id: str) -> Callable[[], Awaitable[None]]:
    """What a graph node calls to have ops ask the thread's holder to cancel it."""

    async def ask() -> None:
        assert await world.leases.ask_to_cancel(thread_id, tenant=TENANT, by="ops")

    return ask


def _beside_a_slow_branch(saver: OnwardSaver, go_on: asyncio.Event) -> CompiledStateGraph[Any]:
    """A graph of two branches run in parallel: one stops at an interrupt, the other waits in
    a slow node until ``go_on`` is set."""

    def ask(state: Slow) -> dict[str, list[str]]:
        return {"steps": [interrupt("go on?")]}

    async def slow(state: Slow) -> dict[str, list[str]]:
        await go_on.wait()
        return {"steps": ["slow"]}

    builder = StateGraph(Slow)
    builder.add_node("ask", ask)
    builder.add_node("slow", slow)
    builder.add_edge(START, "ask")
    builder.add_edge(START, "slow")
    builder.add_edge("ask", END)
    builder.add_edge("slow", END)
    return builder.compile(checkpointer=saver)


async def test_a_thread_whose_holding_heard_a_cancel_is_deleted_and_pruned_by_the_same_saver(
    placed: tuple[World, dict[str, str]],
) -> None:
    """A long-lived saver keeps a thread between invocations and its renewal hears a cancel
    ask; an operator then deletes the thread (or prunes it) through that saver. The deletion
    is not a write of a graph run: it is done, not refused with `RunCancelledError` while the
    thread is ended ``cancelled`` in its place."""
    world, _ = placed
    for remove in ("delete", "prune"):
        async with a_held_thread_that_heard_a_cancel(world, by="ops") as (saver, _, thread_id):
            if remove == "delete":
                await saver.adelete_thread(thread_id)
                assert await saver.aget_tuple(config(thread_id)) is None
            else:
                await saver.aprune([thread_id], strategy="keep_latest")
                assert len([t async for t in saver.alist(config(thread_id))]) == 1
        events = [stored.event for stored in await world.log.read_run(thread_id)]
        assert ends_in(events) == [], remove
