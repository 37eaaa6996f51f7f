"""Releasing a thread while one of its writes is on its way to the log.

``arelease`` (and ``hold``'s end, ``aclose``) hands the lease back. A write of the thread that
already passed its lease check must finish under the lease first: released under it, the
write lands with the lease gone, its confirmation is refused, and the graph run is told
`FencedError` for a write every reader counts (and the saver marks the thread lost).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from onward.eventlog import Event, GraphWritesSaved, Position

from .worlds import World


def _config(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": "c1"}}


async def test_release_waits_for_a_write_in_progress(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread_id = "release-during-write"
    async with world.saver() as saver:
        await saver.aput_writes(_config(thread_id), [("steps", ["first"])], "task-1")
        assert saver.holds(thread_id)

        appending = asyncio.Event()
        go_on = asyncio.Event()
        append = world.log.append

        async def gated(events: Sequence[Event]) -> list[Position]:
            appending.set()
            await go_on.wait()
            return await append(events)

        monkeypatch.setattr(world.log, "append", gated)
        write = asyncio.create_task(
            saver.aput_writes(_config(thread_id), [("steps", ["second"])], "task-2")
        )
        await asyncio.wait_for(appending.wait(), 10)
        release = asyncio.create_task(saver.arelease(thread_id))
        await asyncio.sleep(0.2)
        go_on.set()
        monkeypatch.setattr(world.log, "append", append)

        await asyncio.wait_for(write, 10)  # the write counts, and its caller is told so
        await asyncio.wait_for(release, 10)
        assert not saver.holds(thread_id)

        state = await saver.aread_thread(thread_id)
        assert not state.refused
        tasks = [
            e.event.task_id
            for e in await world.log.read_run(thread_id)
            if isinstance(e.event, GraphWritesSaved)
        ]
        assert tasks == ["task-1", "task-2"]
        # The thread was released, not lost: the next write takes it again.
        await saver.aput_writes(_config(thread_id), [("steps", ["third"])], "task-3")
        assert saver.holds(thread_id)
