"""A fork after the summary, and a lease lost between invocations: reads and writes go on right."""

from __future__ import annotations

import asyncio
import operator
import os
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from support.appapi import until

import onward.integrations.langgraph.saver as saver_module
from onward.errors import BackendUnavailableError, FencedError
from onward.eventlog import Event, EventLog, Position, RunClaimed
from onward.integrations.langgraph import OnwardSaver
from onward.integrations.langgraph.summary import decode
from onward.runtime.leases import LeasePolicy
from onward.testing.eventlog import WrappedEventLog
from onward.testing.leases import GatedRenewals, until_lapsed

from .graphs import Steps, config, steps_graph
from .test_fencing import TTL_S
from .test_many_threads import lose_a_thread_to_worker_b
from .test_summary import summaries_of, whole_saver
from .worlds import TENANT, World


class Forked(TypedDict):
    steps: Annotated[list[str], operator.add]
    note: str


def forked_graph(saver: OnwardSaver) -> Any:
    def step(state: Forked) -> dict[str, Any]:
        # A large item, so the thread's summary is larger than one small checkpoint after it.
        return {"steps": [os.urandom(4_000).hex()]}

    builder = StateGraph(Forked)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    return builder.compile(checkpointer=saver)


async def test_a_fork_from_an_older_checkpoint_after_the_summary_reads_whole(
    world: World,
) -> None:
    """Time travel: ``update_state`` on an older checkpoint saves a checkpoint that refers to
    that checkpoint's (older) version of ``steps``; a fresh reader folding on from the summary
    must return the same values as a reader folding the whole thread."""
    async with world.saver(holder="writer") as writer:
        graph = forked_graph(writer)
        for _ in range(3):
            await graph.ainvoke({"steps": []}, config("t"))
        history = [t async for t in writer.alist(config("t"))]
        older = next(t for t in history if len(t.checkpoint["channel_values"]["steps"]) == 1)
        forked = await graph.aupdate_state(older.config, {"note": "forked"})
        written = await writer.aget_tuple(config("t"))
    assert written is not None
    assert written.config == forked
    assert len(written.checkpoint["channel_values"]["steps"]) == 1
    async with world.saver(holder="fresh") as fresh, whole_saver(world) as whole:
        # The summary was taken before the fork: a fresh reader folds on from it.
        summary = decode(await summaries_of(world).get("t") or b"")
        assert summary is not None
        assert summary.last_seq < (await whole.aread_thread("t")).last_seq
        got = await fresh.aget_tuple(config("t"))
        expected = await whole.aget_tuple(config("t"))
        assert expected is not None
        assert expected.checkpoint["channel_values"] == written.checkpoint["channel_values"]
        assert got is not None
        assert got.checkpoint["channel_values"] == written.checkpoint["channel_values"]


async def test_a_new_invocation_after_the_renewal_heard_the_lease_lost_writes(
    world: World,
) -> None:
    """A saver holds a thread between invocations; its process is paused past the ttl, another
    takes the thread over, writes and lets it go. The paused saver's renewal then hears its
    lease is lost. Its next invocation reads the thread afresh (as the README says a new
    invocation does), so it may write again: it must not fail with `FencedError`."""
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    thawed = asyncio.Event()
    thawed.set()
    saver_a = OnwardSaver(
        world.log,
        GatedRenewals(world.leases, thawed),
        tenant=TENANT,
        holder="worker-a",
        policy=LeasePolicy(ttl=timedelta(seconds=TTL_S)),
    )
    async with saver_a:
        graph_a = steps_graph("A", saver_a)
        await graph_a.ainvoke({"steps": []}, config(thread_id))
        assert saver_a.holds(thread_id)  # held between invocations
        thawed.clear()  # paused: renewals cannot reach the store
        await until_lapsed(world.leases, thread_id, ttl_s=TTL_S)  # by the store's clock
        async with world.saver(holder="worker-b", ttl_s=30) as saver_b:
            await steps_graph("B", saver_b).ainvoke({"steps": []}, config(thread_id))
        thawed.set()  # thawed: the next renewal hears the lease is gone
        for _ in range(100):
            if not saver_a.holds(thread_id):
                break
            await asyncio.sleep(0.05)
        assert not saver_a.holds(thread_id)
        # A new invocation: reads the thread first, then writes on from B's state.
        out = await graph_a.ainvoke({"steps": []}, config(thread_id))
        assert out["steps"] == ["A", "B", "A"]


def gated_saver(world: World, thawed: asyncio.Event) -> OnwardSaver:
    """Worker A's saver, whose renewals wait while ``thawed`` is clear (its process paused)."""
    return OnwardSaver(
        world.log,
        GatedRenewals(world.leases, thawed),
        tenant=TENANT,
        holder="worker-a",
        policy=LeasePolicy(ttl=timedelta(seconds=TTL_S)),
    )


async def lose_the_thread_to_b_while_a_node_runs(
    world: World,
    saver_a: OnwardSaver,
    thawed: asyncio.Event,
    thread_id: str,
    in_node: threading.Event,
) -> None:
    """With a graph run of ``saver_a`` in its node (``in_node`` set): A is paused past the ttl,
    worker B takes the thread over, writes its step and lets it go, and A's renewal then hears
    the lease is lost."""
    assert await asyncio.to_thread(in_node.wait, 30), "the graph run never reached its node"
    thawed.clear()
    await until_lapsed(world.leases, thread_id, ttl_s=TTL_S)  # by the store's clock
    async with world.saver(holder="worker-b", ttl_s=30) as saver_b:
        await steps_graph("B", saver_b).ainvoke({"steps": []}, config(thread_id))
    thawed.set()
    for _ in range(100):
        if not saver_a.holds(thread_id):
            break
        await asyncio.sleep(0.05)
    assert not saver_a.holds(thread_id)


@dataclass(frozen=True, slots=True)
class LostRun:
    """A graph run of worker A's saver, slow in its node, whose thread worker B took over and
    wrote on meanwhile (A's renewal has heard the lease is lost)."""

    saver_a: OnwardSaver
    thread_id: str
    slow: Any
    running: asyncio.Future[Any]
    let_the_node_go_on: Callable[[], None]

    async def stops_at_its_next_write(self) -> None:
        """Lets the node go on: the run must fail with `FencedError`, leaving B's state latest."""
        self.let_the_node_go_on()
        with pytest.raises(FencedError):
            await self.running
        latest = await self.saver_a.aget_tuple(config(self.thread_id))
        assert latest is not None
        assert latest.checkpoint["channel_values"]["steps"] == ["A", "B"]


def sync_slow_graph(
    saver_a: OnwardSaver, node_goes_on: threading.Event, in_node: threading.Event
) -> Any:
    """A graph whose sync node sets ``in_node``, then blocks its worker thread until
    ``node_goes_on`` is set."""

    def stale(state: Steps) -> dict[str, list[str]]:
        in_node.set()
        node_goes_on.wait(30)
        return {"steps": ["stale"]}

    builder = StateGraph(Steps)
    builder.add_node("step", stale)
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    return builder.compile(checkpointer=saver_a)


@asynccontextmanager
async def a_run_that_lost_the_thread(world: World, *, sync: bool) -> AsyncIterator[LostRun]:
    """Worker A writes a thread, starts a slow graph run on it (LangGraph's sync ``invoke`` in
    a worker thread when ``sync``, as the saver asks, else ``ainvoke``), and loses the thread
    to worker B while the run is in its node."""
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    thawed = asyncio.Event()
    thawed.set()
    saver_a = gated_saver(world, thawed)
    async with saver_a:
        await steps_graph("A", saver_a).ainvoke({"steps": []}, config(thread_id))
        running: asyncio.Future[Any]
        in_node = threading.Event()
        if sync:
            node_goes_on_in_thread = threading.Event()
            let_go_on = node_goes_on_in_thread.set
            slow = sync_slow_graph(saver_a, node_goes_on_in_thread, in_node)
            # In a thread of its own context (not a copy of this task's, which read the thread).
            running = asyncio.get_running_loop().run_in_executor(
                None, lambda: slow.invoke({"steps": []}, config(thread_id))
            )
        else:
            node_goes_on = asyncio.Event()
            let_go_on = node_goes_on.set

            async def inside() -> None:
                in_node.set()
                await node_goes_on.wait()

            slow = steps_graph("stale", saver_a, inside=inside)
            running = asyncio.create_task(slow.ainvoke({"steps": []}, config(thread_id)))
        await lose_the_thread_to_b_while_a_node_runs(world, saver_a, thawed, thread_id, in_node)
        yield LostRun(saver_a, thread_id, slow, running, let_go_on)


async def test_a_read_by_anyone_else_does_not_let_a_graph_run_that_lost_the_thread_write_on(
    world: World,
) -> None:
    """A graph run's node is slow; meanwhile its process is paused past the ttl, another takes
    the thread over, writes and lets it go, and the renewal hears the lease is lost. A reader
    on the same saver (a UI's ``aget_state``) reads the thread then. The graph run must still
    stop at its next write: carrying on would save its step over the other writer's."""
    async with a_run_that_lost_the_thread(world, sync=False) as run:
        read = await run.slow.aget_state(config(run.thread_id))  # another task reads the thread
        assert read.values["steps"] == ["A", "B"]
        await run.stops_at_its_next_write()
        # A new invocation reads the thread first, and writes on from B's state.
        out = await steps_graph("A", run.saver_a).ainvoke({"steps": []}, config(run.thread_id))
        assert out["steps"] == ["A", "B", "A"]


async def test_a_read_by_anyone_else_does_not_let_a_sync_graph_run_that_lost_the_thread_write_on(
    world: World,
) -> None:
    """The same with LangGraph's sync ``invoke``, run in a worker thread as the saver asks."""
    async with a_run_that_lost_the_thread(world, sync=True) as run:
        read = await run.slow.aget_state(config(run.thread_id))  # another task reads the thread
        assert read.values["steps"] == ["A", "B"]
        await run.stops_at_its_next_write()


async def test_a_graph_run_that_lost_the_thread_stops_after_the_saver_lost_many_more(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graph run's node is slow; meanwhile the saver loses its thread to another writer, a
    reader reads the thread (the holding lost is let go), and the saver loses more threads than
    it keeps records of (a lease store outage). The graph run must still stop at its next
    write: the saver forgetting that loss must not let it claim the thread again and save its
    step over the other writer's."""
    monkeypatch.setattr(saver_module, "FOLLOWED_THREADS", 2)
    async with a_run_that_lost_the_thread(world, sync=False) as run:
        await run.slow.aget_state(config(run.thread_id))  # another task reads the thread
        await lose_more_threads_than_kept(world, run.saver_a, run.thread_id)
        await run.stops_at_its_next_write()


async def test_a_sync_graph_run_that_lost_the_thread_stops_after_the_saver_lost_many_more(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same with LangGraph's sync ``invoke``, run in a worker thread as the saver asks."""
    monkeypatch.setattr(saver_module, "FOLLOWED_THREADS", 2)
    async with a_run_that_lost_the_thread(world, sync=True) as run:
        await run.slow.aget_state(config(run.thread_id))  # another task reads the thread
        await lose_more_threads_than_kept(world, run.saver_a, run.thread_id)
        await run.stops_at_its_next_write()


async def lose_more_threads_than_kept(world: World, saver_a: OnwardSaver, thread_id: str) -> None:
    """``saver_a`` writes, and loses to worker B, three more threads than the two it keeps
    records of (``FOLLOWED_THREADS`` patched): its record of losing ``thread_id`` is gone."""
    graph = steps_graph("A", saver_a)
    for n in range(3):
        await lose_a_thread_to_worker_b(world, saver_a, graph, f"{thread_id}-{n}")


async def test_a_thread_lost_then_pruned_or_deleted_by_the_same_saver_is_let_go_after(
    world: World,
) -> None:
    """A long-lived saver keeping a thread between invocations loses it to another writer
    (its renewal hears it), then prunes it or deletes it: either takes the thread again for
    its own write, and lets it go after, as for a thread it did not hold. Kept, the saver would
    renew the lease until it closed, and every other writer would be refused the thread."""
    for remove in ("prune", "delete"):
        thread_id = f"thread-{uuid.uuid4().hex[:8]}"
        async with world.saver(holder="worker-a", ttl_s=3, renew_within_s=2.7) as saver_a:
            await steps_graph("A", saver_a).ainvoke({"steps": []}, config(thread_id))
            lease = saver_a.lease(thread_id)
            assert lease is not None
            await world.leases.release(lease)  # taken from under it
            async with world.saver(holder="worker-b") as saver_b:
                await steps_graph("B", saver_b).ainvoke({"steps": []}, config(thread_id))

            async def heard_lost() -> bool:
                return not saver_a.holds(thread_id)  # noqa: B023

            await until(heard_lost, "worker A's renewal hearing the thread lost")
            if remove == "prune":
                await saver_a.aprune([thread_id], strategy="keep_latest")
            else:
                await saver_a.adelete_thread(thread_id)

            assert not saver_a.holds(thread_id), remove
            async with world.saver(holder="worker-b") as saver_b:
                out = await steps_graph("B", saver_b).ainvoke({"steps": []}, config(thread_id))
            assert out["steps"][-1] == "B"


class DownForOneThread(WrappedEventLog):
    """A log whose store is down for every append to ``run_id`` but a claim's: a thread is
    taken, and the write it was taken for fails."""

    def __init__(self, inner: EventLog, run_id: str) -> None:
        super().__init__(inner)
        self.run_id = run_id

    async def append(self, events: Sequence[Event]) -> list[Position]:
        if any(e.run_id == self.run_id and not isinstance(e, RunClaimed) for e in events):
            raise BackendUnavailableError(f"log down for run {self.run_id!r}")
        return await super().append(events)


async def test_a_copy_prune_or_delete_that_fails_lets_go_of_the_thread_it_took(
    world: World,
) -> None:
    """A saver copies into, prunes or deletes a thread it did not hold, and the write it took
    the thread for fails (the log is down). It must let the thread go all the same, as it does
    when the write lands: kept, it would renew the lease until the saver closed, and every
    other process would be refused the thread."""
    for operation in ("copy", "prune", "delete"):
        source = f"thread-{uuid.uuid4().hex[:8]}"
        thread_id = f"thread-{uuid.uuid4().hex[:8]}"
        async with world.saver(holder="worker-b") as saver_b:
            for written in (source, thread_id):
                for _ in range(2):
                    await steps_graph("B", saver_b).ainvoke({"steps": []}, config(written))
        target = f"{thread_id}-copy" if operation == "copy" else thread_id
        saver_a = OnwardSaver(
            DownForOneThread(world.log, target),
            world.leases,
            tenant=TENANT,
            holder="worker-a",
            summaries=world.summaries,
        )
        async with saver_a:
            if operation == "copy":
                failing = saver_a.acopy_thread(source, target)
            elif operation == "prune":
                failing = saver_a.aprune([target], strategy="keep_latest")
            else:
                failing = saver_a.adelete_thread(target)
            with pytest.raises(BackendUnavailableError, match="log down"):
                await failing
            assert not saver_a.holds(target), operation
            async with world.saver(holder="worker-b") as saver_b:
                out = await steps_graph("B", saver_b).ainvoke({"steps": []}, config(target))
            assert out["steps"][-1] == "B", operation
