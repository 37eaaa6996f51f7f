"""A saver that writes many threads, each for a block (``hold``), keeps nothing per thread once
each is let go: a long-lived process serving many conversations does not grow with them."""

from __future__ import annotations

import asyncio

import pytest

import onward.integrations.langgraph.saver as saver_module

from .graphs import config, steps_graph
from .worlds import World

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
