"""`FileLock`: one holder at a time across descriptors (so across processes), and a waiter that
is cancelled holds nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

from onward._storage import FileLock


async def test_a_second_holder_waits_until_the_first_lets_go(tmp_path: Path) -> None:
    path = tmp_path / "db.fold.lock"
    order: list[str] = []
    first = FileLock(path)
    await first.__aenter__()

    async def second() -> None:
        async with FileLock(path):
            order.append("second")

    waiting = asyncio.create_task(second())
    await asyncio.sleep(0.1)
    assert order == []  # blocked by the first holder's descriptor
    order.append("first lets go")
    await first.__aexit__(None, None, None)
    await asyncio.wait_for(waiting, 5)
    assert order == ["first lets go", "second"]


async def test_a_cancelled_waiter_leaves_the_lock_free(tmp_path: Path) -> None:
    path = tmp_path / "db.fold.lock"
    async with FileLock(path):
        waiter = asyncio.create_task(FileLock(path).__aenter__())
        await asyncio.sleep(0.05)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
    async with asyncio.timeout(5), FileLock(path):
        pass  # taken at once: neither the cancelled waiter nor the first holder keeps it
