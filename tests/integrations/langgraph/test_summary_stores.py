"""Every thread summary store keeps one summary per thread, replaced only by one at a higher
seq (a summary taken earlier, stored late, must not replace a later one), and forgets it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from onward.eventlog import SqliteEventLog
from onward.integrations.langgraph import (
    MemoryThreadSummaries,
    PostgresThreadSummaries,
    SqliteThreadSummaries,
    ThreadSummaryStore,
)


async def check_store(store: ThreadSummaryStore) -> None:
    assert await store.get("t") is None
    await store.put("t", "acme", 5, b"at five")
    assert await store.get("t") == b"at five"
    await store.put("t", "acme", 3, b"at three, stored late")
    assert await store.get("t") == b"at five"
    await store.put("t", "acme", 5, b"at five again")
    assert await store.get("t") == b"at five"
    await store.put("t", "acme", 9, b"at nine")
    assert await store.get("t") == b"at nine"
    await store.put("u", "acme", 1, b"another thread")
    await store.delete("t")
    assert await store.get("t") is None
    assert await store.get("u") == b"another thread"
    await store.put("t", "acme", 2, b"after the delete")
    assert await store.get("t") == b"after the delete"


async def test_memory_store() -> None:
    async with MemoryThreadSummaries() as store:
        await check_store(store)


async def test_sqlite_store_on_the_log_file(tmp_path: Path) -> None:
    path = tmp_path / "onward.db"
    async with SqliteEventLog(path) as log:
        store = SqliteThreadSummaries(path, sharing=log)
        await check_store(store)
    async with SqliteThreadSummaries(path) as reopened:
        assert await reopened.get("t") == b"after the delete"


@asynccontextmanager
async def _postgres(database_url: str, schema: str) -> AsyncIterator[PostgresThreadSummaries]:
    async with PostgresThreadSummaries(database_url, schema=schema) as store:
        yield store


async def test_postgres_store(database_url: str, pg_schema: str) -> None:
    async with _postgres(database_url, pg_schema) as store:
        await check_store(store)
    async with _postgres(database_url, pg_schema) as reopened:
        assert await reopened.get("t") == b"after the delete"
