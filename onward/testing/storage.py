"""`PostgresConnectionLossConformance`: what every PostgreSQL-backed store does when its server
drops a connection (a restart, a failover, ``pg_terminate_backend``).

The call in progress fails with a retryable `BackendUnavailableError`, never a raw driver error,
and the store recovers by itself: a later call runs on a fresh connection. Mix it into a store's
test class, set :attr:`~PostgresConnectionLossConformance.lock_table` and implement
:meth:`~PostgresConnectionLossConformance.open_connected_store` and
:meth:`~PostgresConnectionLossConformance.use_store`. Each test makes (and drops) its own
migrated schema, on the server of a ``database_url`` fixture the test module provides. Needs
pytest and pytest-asyncio.

A store's connections are told apart from everyone else's on a shared server by their
``application_name``, which Onward sets to ``onward:<schema>``.

`create_schema` and `drop_schema` make and remove a schema of a test's (or a benchmark's) own.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import asyncpg
import pytest

from onward.errors import BackendUnavailableError
from onward.projections.postgres import migrate

_WAIT_S = 15.0


class PostgresConnectionLossConformance:
    """Connection loss, mid-call and while idle. Subclass per PostgreSQL-backed store.

    Attributes:
        lock_table: A table every :meth:`use_store` call reads or writes; the test locks it so
            the call is still in progress when its connection is cut.
    """

    lock_table: ClassVar[str]

    async def open_connected_store(self, database_url: str, schema: str) -> Any:
        """The store, started, on the given server and migrated schema."""
        raise NotImplementedError

    async def use_store(self, store: Any) -> None:
        """One call of the store's public API that touches :attr:`lock_table`."""
        raise NotImplementedError

    @asynccontextmanager
    async def _connected(
        self, database_url: str
    ) -> AsyncIterator[tuple[asyncpg.Connection, str, Any]]:
        """An admin connection, a new migrated schema and the store on it; all gone afterwards."""
        schema = f"loss_{uuid.uuid4().hex[:12]}"
        await create_schema(database_url, schema)
        admin = await asyncpg.connect(database_url)
        try:
            store = await self.open_connected_store(database_url, schema)
            try:
                await self.use_store(store)
                yield admin, schema, store
            finally:
                await store.close()
        finally:
            await admin.close()
            await drop_schema(database_url, schema)

    async def test_a_connection_cut_mid_call_fails_retryably_then_the_store_recovers(
        self, database_url: str
    ) -> None:
        async with self._connected(database_url) as (admin, schema, store):
            lock = admin.transaction()
            await lock.start()
            try:
                await admin.execute(
                    f"LOCK TABLE {schema}.{self.lock_table} IN ACCESS EXCLUSIVE MODE"
                )
                call = asyncio.ensure_future(self.use_store(store))
                await _wait_until_blocked(admin, schema, call)
                terminated = await _terminate(admin, schema)
            finally:
                await lock.rollback()
            assert terminated, "no connection of the store to cut"
            with pytest.raises(BackendUnavailableError) as caught:
                await call
            assert caught.value.retryable
            await self.use_store(store)

    async def test_connections_cut_while_idle_cost_at_most_one_retryable_call(
        self, database_url: str
    ) -> None:
        async with self._connected(database_url) as (admin, schema, store):
            cut = await _terminate(admin, schema)
            assert cut, "no connection of the store to cut"
            await _wait_until_gone(admin, schema, cut)
            # asyncpg notices a connection cut while idle only when the next call uses it; that
            # call may fail, retryably, and the one after it must not.
            try:
                await self.use_store(store)
            except BackendUnavailableError:
                await self.use_store(store)


async def create_schema(database_url: str, schema: str, *, migrated: bool = True) -> None:
    """Create ``schema`` on the server of ``database_url`` and, unless ``migrated`` is false,
    apply Onward's migrations to it. A schema whose migration fails is dropped again."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(f"CREATE SCHEMA {schema}")
        if migrated:
            try:
                await conn.execute(f"SET search_path TO {schema}")
                await migrate(conn)
            except BaseException:
                await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
                raise
    finally:
        await conn.close()


async def drop_schema(database_url: str, schema: str) -> None:
    """Drop ``schema`` and everything in it, if it exists."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    finally:
        await conn.close()


def _application_name(schema: str) -> str:
    return f"onward:{schema}"


async def _terminate(admin: asyncpg.Connection, schema: str) -> list[int]:
    """Cut every connection of the store; return their backend pids."""
    rows = await admin.fetch(
        "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = $1 AND pid <> pg_backend_pid()",
        _application_name(schema),
    )
    return [int(row["pid"]) for row in rows]


async def _activity(admin: asyncpg.Connection, schema: str) -> str:
    """What the store's connections are doing, for a failure message."""
    rows = await admin.fetch(
        "SELECT pid, state, wait_event_type, wait_event, left(query, 80) AS query "
        "FROM pg_stat_activity WHERE application_name = $1",
        _application_name(schema),
    )
    return "; ".join(str(dict(row)) for row in rows) or "no connections"


async def _wait_until_blocked(
    admin: asyncpg.Connection, schema: str, call: asyncio.Future[None]
) -> None:
    """Wait until a connection waits on the admin connection's lock: the call is in flight."""
    deadline = time.monotonic() + _WAIT_S
    while time.monotonic() < deadline:
        if call.done():
            await call  # raises what the call raised
            pytest.fail("the call finished although its table was locked")
        waiting = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))"
        )
        if waiting:
            return
        await asyncio.sleep(0.02)
    call.cancel()
    pytest.fail(
        f"the store's call never reached the locked table: {await _activity(admin, schema)}"
    )


async def _wait_until_gone(admin: asyncpg.Connection, schema: str, pids: list[int]) -> None:
    """Wait until the cut backends have exited."""
    deadline = time.monotonic() + _WAIT_S
    while time.monotonic() < deadline:
        left = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[])", pids
        )
        if not left:
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"cut connections outlived pg_terminate_backend: {await _activity(admin, schema)}")
