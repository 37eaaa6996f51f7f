"""`FileLock`: one holder at a time across descriptors (so across processes), a waiter that is
cancelled holds nothing, and one that waits says so."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from pathlib import Path

import pytest

from onward._storage import FileLock
from onward._storage.locks import SAY_AFTER_S
from onward.testing.leases import until


def _descriptors_on(path: Path) -> int:
    """How many of this process's descriptors are open on ``path``: a waiter opens its own
    before its first try, with no await between, so a second one means it is waiting."""
    named = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            named.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue  # closed since it was listed
    return named.count(str(path))


async def test_a_second_holder_waits_until_the_first_lets_go(tmp_path: Path) -> None:
    path = tmp_path / "db.fold.lock"
    order: list[str] = []
    first = FileLock(path)
    await first.__aenter__()

    async def second() -> None:
        async with FileLock(path):
            order.append("second")

    waiting = asyncio.create_task(second())
    await until(lambda: _descriptors_on(path) == 2, within_s=5, what="the second waiting")
    await asyncio.sleep(0.1)  # several of its tries, every 20 ms at most
    assert order == []  # blocked by the first holder's descriptor
    order.append("first lets go")
    await first.__aexit__(None, None, None)
    await asyncio.wait_for(waiting, 5)
    assert order == ["first lets go", "second"]


async def test_a_cancelled_waiter_leaves_the_lock_free(tmp_path: Path) -> None:
    path = tmp_path / "db.fold.lock"
    async with FileLock(path):
        waiter = asyncio.create_task(FileLock(path).__aenter__())
        await until(lambda: _descriptors_on(path) == 2, within_s=5, what="the waiter waiting")
        assert not waiter.done()
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert _descriptors_on(path) == 1, "the cancelled waiter left its descriptor open"
    async with asyncio.timeout(5), FileLock(path):
        pass  # taken at once: neither the cancelled waiter nor the first holder keeps it


async def test_a_waiter_without_a_timeout_says_so_and_gets_the_lock_once_free(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "db.fold.lock"
    first = FileLock(path)
    await first.__aenter__()
    with caplog.at_level(logging.WARNING, logger="onward.locks"):
        second = FileLock(path, what="the test lock", timeout_s=None)
        waiter = asyncio.create_task(second.__aenter__())
        await until(
            lambda: any(r.name == "onward.locks" for r in caplog.records),
            within_s=SAY_AFTER_S + 5,
            what="the wait said in the log",
        )
        assert not waiter.done()
        [said] = [r.getMessage() for r in caplog.records if r.name == "onward.locks"]
        assert said == (
            f"waiting for the test lock, held by pid {os.getpid()} on {socket.gethostname()} "
            f"since {said.split(' since ')[1][:12]}, until it is free (no timeout set)"
        )
        await first.__aexit__(None, None, None)
        await asyncio.wait_for(waiter, 5)
        await second.__aexit__(None, None, None)
