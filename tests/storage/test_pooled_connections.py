"""Pooled PostgreSQL connections go back to their pool without a statement, and a session lock
held on one is let go on its way back, whether its holder finished or was cancelled."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from onward._storage import PostgresStore


async def _held(database_url: str, schema: str, name: str = "fold") -> int:
    """How many sessions hold the store's lock ``name`` (other tests hold locks of their own)."""
    conn = await asyncpg.connect(database_url)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) "
                "= hashtextextended($1, 0)",
                f"onward:{schema}:{name}",
            )
        )
    finally:
        await conn.close()


async def test_a_connection_goes_back_to_the_pool_without_a_statement(
    database_url: str, pg_schema: str
) -> None:
    sent: list[str] = []

    def logged(record: Any) -> None:
        sent.append(record.query)

    async with PostgresStore(database_url, schema=pg_schema, min_size=1, max_size=1) as store:
        async with store._connection("first") as conn:
            conn.add_query_logger(logged)
            await conn.execute("SELECT 1")
        async with store._connection("second") as conn:
            await conn.execute("SELECT 2")
            conn.remove_query_logger(logged)
    assert sent == ["SELECT 1", "SELECT 2"]


async def test_a_lock_let_go_leaves_no_advisory_lock_on_its_connection(
    database_url: str, pg_schema: str
) -> None:
    async with PostgresStore(database_url, schema=pg_schema, min_size=1, max_size=1) as store:
        async with store.exclusive("fold"):
            assert await _held(database_url, pg_schema) == 1
        assert await _held(database_url, pg_schema) == 0
        async with store._connection("after the lock") as conn:  # the same connection
            mine = await conn.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                "AND pid = pg_backend_pid()"
            )
            assert mine == 0


async def test_a_holder_cancelled_while_waiting_leaves_the_lock_free(
    database_url: str, pg_schema: str
) -> None:
    async with (
        PostgresStore(database_url, schema=pg_schema) as first,
        PostgresStore(database_url, schema=pg_schema, max_size=1, timeout_s=5) as second,
    ):
        async with first.exclusive("fold"):
            waiting = asyncio.create_task(_take(second))
            await asyncio.sleep(0.3)
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
        assert await _held(database_url, pg_schema) == 0
        await asyncio.wait_for(_take(second), 5)
        await asyncio.wait_for(_take(first), 5)


async def _take(store: PostgresStore) -> None:
    async with store.exclusive("fold"):
        pass


async def test_a_connection_marked_for_a_reset_gets_asyncpg_s_whole_reset(
    database_url: str, pg_schema: str
) -> None:
    async with PostgresStore(database_url, schema=pg_schema, min_size=1, max_size=1) as store:
        async with store._connection("handed to code that is not Onward's") as conn:
            conn.reset_session()
            await conn.execute("SET application_name = 'changed by a user projection'")
        async with store._connection("the same connection, next") as conn:
            name = await conn.fetchval("SHOW application_name")
            assert name == f"onward:{pg_schema}"
