"""A saver that writes many threads, each for a block (``hold``), keeps nothing per thread once
each is let go: a long-lived process serving many conversations does not grow with them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import interrupt

import onward.integrations.langgraph.saver as saver_module
from onward.errors import FencedError, RunCancelledError
from onward.eventlog import RunFinished
from onward.integrations.langgraph import OnwardSaver

from .graphs import Steps, config, steps_graph
from .worlds import TENANT, World

THREADS = 60


async def test_nothing_is_kept_of_a_thread_let_go(world: World) -> None:
    async with world.saver() as saver:
        graph = steps_graph("w", saver)

        async def converse(n: int) -> None:
            async with saver.hold(f"thread-{n}"):
                await graph.ainvoke({"steps": []}, config(f"thread-{n}"))

        # Two at once per thread: one claims it while the other waits for it.
        await asyncio.gather(*(converse(n) for n in range(THREADS) for _ in range(2)))
        assert not saver._held
        assert not saver._taking


async def test_a_loop_of_invocations_in_one_context_keeps_no_more_than_the_latest_threads(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's loop invoking one thread after another from one task (one context): neither
    the saver nor that context keeps something of each thread it ever started, which would
    grow with every conversation served (and be copied at each invocation's start)."""
    monkeypatch.setattr(saver_module, "FOLLOWED_THREADS", 8)
    async with world.saver() as saver:
        graph = steps_graph("w", saver)
        for n in range(30):
            async with saver.hold(f"thread-{n}"):
                await graph.ainvoke({"steps": []}, config(f"thread-{n}"))
        kept = {
            name: len(value)
            for name, value in vars(saver).items()
            if isinstance(value, dict | set) and len(value) > 8
        }
        assert kept == {}
        assert len(saver._read_at.get() or {}) <= 8
        # The latest thread is still an invocation's to write on.
        out = await graph.ainvoke({"steps": []}, config("thread-29"))
        assert out["steps"] == ["w", "w"]


def kept_of_each_thread(saver: OnwardSaver) -> dict[str, int]:
    """The saver's maps and sets that hold more than the latest 8 threads' entries."""
    return {
        name: len(value)
        for name, value in vars(saver).items()
        if isinstance(value, dict | set) and len(value) > 8
    }


async def test_a_saver_serving_cancelled_threads_keeps_no_more_than_the_latest_threads(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long-lived saver serving conversation after conversation, some of which a person
    cancels (while the graph run writes, or while it waits at an interrupt): what it keeps of
    a cancel (the ask, the end, each loss) does not grow with every thread ever cancelled."""
    monkeypatch.setattr(saver_module, "FOLLOWED_THREADS", 8)
    async with world.saver() as saver:
        for n in range(30):
            thread_id = f"thread-{n}"

            async def ask() -> None:
                assert await world.leases.ask_to_cancel(thread_id, tenant=TENANT, by="ops")  # noqa: B023

            cancelled = steps_graph("w", saver, inside=ask)
            async with saver.hold(thread_id):
                with pytest.raises(RunCancelledError):
                    await cancelled.ainvoke({"steps": []}, config(thread_id))
            waiting = interrupting_graph(saver)
            async with saver.hold(f"{thread_id}-asks"):
                out = await waiting.ainvoke({"steps": []}, config(f"{thread_id}-asks"))
                assert "__interrupt__" in out
                assert await world.leases.ask_to_cancel(
                    f"{thread_id}-asks", tenant=TENANT, by="ops"
                )
        assert kept_of_each_thread(saver) == {}
        # The latest threads still end as they were cancelled, and live on.
        events = [stored.event for stored in await world.log.read_run("thread-29-asks")]
        assert [e.status for e in events if isinstance(e, RunFinished)] == ["cancelled"]
        out = await steps_graph("w", saver).ainvoke({"steps": []}, config("thread-29"))
        assert out["steps"] == ["w"]


def interrupting_graph(checkpointer: OnwardSaver) -> CompiledStateGraph[Any]:
    """A graph whose one node asks a person before adding a step."""

    def ask(state: Steps) -> dict[str, list[str]]:
        return {"steps": [interrupt("go on?")]}

    builder = StateGraph(Steps)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    return builder.compile(checkpointer=checkpointer)


async def lose_a_thread_to_worker_b(
    world: World, saver: OnwardSaver, graph: Any, thread_id: str
) -> None:
    """``graph`` (on ``saver``) writes ``thread_id``; its lease is let go under it and worker B
    writes on, so ``graph``'s next write there fails with `FencedError`."""
    await graph.ainvoke({"steps": []}, config(thread_id))
    lease = saver.lease(thread_id)
    assert lease is not None
    await world.leases.release(lease)  # taken from under it
    async with world.saver(holder="worker-b") as other:
        await steps_graph("B", other).ainvoke({"steps": []}, config(thread_id))
    with pytest.raises(FencedError):
        await graph.ainvoke({"steps": []}, config(thread_id))


async def test_a_saver_losing_thread_after_thread_keeps_no_more_than_the_latest_threads(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long-lived saver that keeps each thread between invocations loses thread after thread
    to another writer (its lease let go under it): what it keeps of each loss does not grow
    with every thread it ever lost."""
    monkeypatch.setattr(saver_module, "FOLLOWED_THREADS", 8)
    async with world.saver(holder="worker-a") as saver:
        graph = steps_graph("A", saver)
        for n in range(30):
            await lose_a_thread_to_worker_b(world, saver, graph, f"thread-{n}")
        assert kept_of_each_thread(saver) == {}
        # The latest thread lost is a new invocation's to write on.
        out = await graph.ainvoke({"steps": []}, config("thread-29"))
        assert out["steps"] == ["A", "B", "A"]
