"""Closing a PostgreSQL store while one of its connections is still in use ends in bounded
time: a task that hangs holding a pooled connection does not keep the store's close (and so a
worker's shutdown) waiting for ever."""

from __future__ import annotations

import asyncio
import logging
import time

import asyncpg
import pytest

from onward._storage import PostgresStore
from onward.errors import InvalidInputError

BOUND_S = 1.0


async def test_close_with_a_connection_held_by_a_hung_task_ends_within_the_bound(
    database_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = await PostgresStore.open(database_url, schema=pg_schema, timeout_s=BOUND_S)
    held: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def hangs() -> None:
        async with store._connection("a call that hangs") as conn:
            held.set_result(conn.get_server_pid())
            await asyncio.Event().wait()  # never set: the task hangs holding the connection

    task = asyncio.create_task(hangs())
    pid = await asyncio.wait_for(held, 5)
    began = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING, logger="onward.storage"):
            await asyncio.wait_for(store.close(), 10 * BOUND_S)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert time.monotonic() - began < 5 * BOUND_S
    assert not store.is_open
    assert await _backend_gone(database_url, pid)
    assert "of 1 connection(s) still in use when the close began" in caplog.text, caplog.text


async def test_close_waits_for_a_call_that_ends_within_the_bound(
    database_url: str, pg_schema: str
) -> None:
    store = await PostgresStore.open(database_url, schema=pg_schema, timeout_s=5)
    started = asyncio.Event()

    async def short_call() -> int:
        async with store._connection("a short call") as conn:
            started.set()
            return int(await conn.fetchval("SELECT 1 FROM pg_sleep(0.3)"))

    call = asyncio.create_task(short_call())
    await started.wait()
    await store.close()
    assert await call == 1
    with pytest.raises(InvalidInputError, match="not open"):
        await store.verify()


async def _backend_gone(database_url: str, pid: int) -> bool:
    """Whether the server's session ``pid`` ends within a few seconds."""
    conn = await asyncpg.connect(database_url)
    try:
        for _ in range(50):
            if not await conn.fetchval("SELECT 1 FROM pg_stat_activity WHERE pid = $1", pid):
                return True
            await asyncio.sleep(0.1)
        return False
    finally:
        await conn.close()
