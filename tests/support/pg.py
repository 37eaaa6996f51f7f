"""A throwaway PostgreSQL schema per test, so tests never see each other's rows."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Protocol

import asyncpg
import pytest

from onward.errors import BackendUnavailableError
from onward.projections.postgres import migrate
from onward.testing import storage
from onward.testing.storage import drop_schema


def new_schema_name() -> str:
    """A schema name no other test uses."""
    return f"t_{uuid.uuid4().hex[:12]}"


async def create_schema(database_url: str, *, migrated: bool = True) -> str:
    """Create a schema no other test uses, migrated unless ``migrated`` is false; return its
    name."""
    schema = new_schema_name()
    await storage.create_schema(database_url, schema, migrated=migrated)
    return schema


@asynccontextmanager
async def fresh_schema(database_url: str, *, migrated: bool = True) -> AsyncIterator[str]:
    """Create a schema, migrate it (unless ``migrated`` is false), yield its name, drop it."""
    schema = await create_schema(database_url, migrated=migrated)
    try:
        yield schema
    finally:
        await drop_schema(database_url, schema)


class SchemaFactory(Protocol):
    """Each time it is awaited, one more fresh schema, migrated unless ``migrated`` is false."""

    async def __call__(self, *, migrated: bool = True) -> str: ...


@asynccontextmanager
async def schema_factory(database_url: str) -> AsyncIterator[SchemaFactory]:
    """Yield a maker of fresh schemas; drop every schema it made afterwards."""
    async with AsyncExitStack() as stack:

        async def new(*, migrated: bool = True) -> str:
            return await stack.enter_async_context(fresh_schema(database_url, migrated=migrated))

        yield new


async def migrates_again(
    database_url: str, schema: str, migration: str, undo: Sequence[str], column: str
) -> None:
    """Take a migrated schema back to before ``migration`` (``NNNN_name``: the ``undo``
    statements, then its ledger row), migrate it again, and check that it was applied and
    that ``column`` is back on the frontier build and its view."""
    conn = await asyncpg.connect(database_url, server_settings={"search_path": schema})
    try:
        for statement in undo:
            await conn.execute(statement)
        version = int(migration.split("_", 1)[0])
        await conn.execute("DELETE FROM onward_schema_migrations WHERE version = $1", version)
        assert await migrate(conn) == [migration]
        rows = await conn.fetch(
            "SELECT table_name FROM information_schema.columns WHERE table_schema = $1 "
            "AND column_name = $2 ORDER BY table_name",
            schema,
            column,
        )
        assert [r["table_name"] for r in rows] == ["onward_frontiers", "onward_frontiers_1"]
    finally:
        await conn.close()


async def blocked_on_a_lock(
    holder: asyncpg.Connection, count: int, calls: list[asyncio.Task[Any]], *, wait_s: float = 10.0
) -> None:
    """Wait until ``count`` connections of the stores on the holder's schema (named for it) wait
    for a lock, so the calls are inside their transactions; fail the test if a call ends first
    (a row it takes was locked) or none gets there within ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        for call in calls:
            if call.done():
                await call
                pytest.fail("a call finished although a row it takes was locked")
        waiting = await holder.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND application_name = 'onward:' || current_schema()"
        )
        if waiting >= count:
            return
        await asyncio.sleep(0.02)
    pytest.fail("the calls never reached the locked row")


async def waited_for_by_another(
    observer: asyncpg.Connection, holder: int, call: asyncio.Task[Any], *, wait_s: float = 10.0
) -> None:
    """Wait until a session waits for a lock the backend ``holder`` holds, as ``observer`` (out
    of a transaction, which would keep showing one snapshot of the activity) sees; fail the
    test if ``call`` ends first or no session waits within ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if call.done():
            await call
            pytest.fail("the call finished without waiting for the held lock")
        waiting = await observer.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", holder
        )
        if waiting:
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"no session waited for a lock backend pid {holder} holds")


async def build_registry_held_by_a_write(
    database_url: str,
    schema: str,
    projection: str,
    start: Callable[[], Coroutine[Any, Any, object]],
) -> None:
    """Holds ``projection``'s active build in the build registry as a write of it does (a slow
    batch, a person's ``BEGIN``) while ``start()`` runs: it must fail saying who holds the
    registry, not that the server did not answer, while another write's read of the registry
    meanwhile waits no longer than a step of its wait (2 s at the most)."""
    # What every write of a projection reads first (`active_build_for_write`).
    read_to_write = (
        "SELECT build FROM onward_projection_builds "
        f"WHERE projection = '{projection}' AND status = 'active' FOR SHARE"
    )
    writer = await asyncpg.connect(database_url, server_settings={"search_path": schema})
    other = await asyncpg.connect(database_url, server_settings={"search_path": schema})
    try:
        async with writer.transaction():
            await writer.fetch(read_to_write)
            starting = asyncio.create_task(start())
            await waited_for_by_another(other, writer.get_server_pid(), starting)
            async with other.transaction():
                await asyncio.wait_for(other.fetch(read_to_write), 2)
            with pytest.raises(BackendUnavailableError) as failed:
                await asyncio.wait_for(starting, 30)
            backend = writer.get_server_pid()
    finally:
        await writer.close()
        await other.close()
    message = str(failed.value)
    assert "did not answer" not in message, message
    assert "onward_projection_builds" in message, message
    assert f"backend pid {backend}" in message, message
