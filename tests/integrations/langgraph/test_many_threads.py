"""A saver that writes many threads, each for a block (``hold``), keeps nothing per thread once
each is let go: a long-lived process serving many conversations does not grow with them."""

from __future__ import annotations

import asyncio

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
