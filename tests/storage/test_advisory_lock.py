"""`PostgresStore.exclusive`: one holder at a time across processes (stores with pools of their
own stand in for them), and callers in one process never starve the holder of a connection."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest
from support.pg import SchemaFactory

from onward._storage import PostgresStore

_WAITING = """
SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1
  AND classid::bigint = (hashtextextended($1, 0) >> 32) & 4294967295
  AND objid::bigint = hashtextextended($1, 0) & 4294967295
"""


async def _until_waited_for(database_url: str, key: str) -> None:
    """Wait until the server shows a session waiting for the advisory lock ``key``, so a
    waiter is known to wait rather than guessed to after a while."""
    conn = await asyncpg.connect(database_url)
    try:
        deadline = time.monotonic() + 5
        while not await conn.fetchval(_WAITING, key):
            if time.monotonic() > deadline:
                pytest.fail(f"nobody waited for the advisory lock {key!r} within 5 s")
            await asyncio.sleep(0.01)
    finally:
        await conn.close()


async def test_a_second_store_waits_until_the_first_lets_go(
    database_url: str, pg_schema: str
) -> None:
    async with (
        PostgresStore(database_url, schema=pg_schema) as first,
        PostgresStore(database_url, schema=pg_schema) as second,
    ):
        order: list[str] = []
        async with first.exclusive("fold"):
            waiting = asyncio.create_task(_hold(second, "fold", order, "second"))
            await _until_waited_for(database_url, f"onward:{pg_schema}:fold")
            assert order == []
            order.append("first done")
        await asyncio.wait_for(waiting, 5)
        assert order == ["first done", "second"]
        async with first.exclusive("other"), second.exclusive("fold"):
            pass  # another name is another lock


async def test_many_holders_in_one_process_share_a_small_pool(
    database_url: str, pg_schema: str
) -> None:
    async with PostgresStore(database_url, schema=pg_schema, max_size=2, timeout_s=5) as store:
        order: list[str] = []
        await asyncio.wait_for(
            asyncio.gather(*(_hold(store, "fold", order, str(n), work=True) for n in range(8))),
            20,
        )
        assert sorted(order) == [str(n) for n in range(8)]


async def _hold(
    store: PostgresStore, name: str, order: list[str], who: str, *, work: bool = False
) -> None:
    async with store.exclusive(name):
        if work:  # the holder needs a connection of the same pool for its work
            async with store._connection("working under the lock") as conn:
                await conn.execute("SELECT pg_sleep(0.05)")
        order.append(who)


async def test_a_store_reaching_the_schema_through_the_urls_search_path_takes_the_same_lock(
    database_url: str, pg_schema: str
) -> None:
    """One process names the schema, another reaches it through the URL's search path (as
    ONWARD_DATABASE_SCHEMA set on one host and not on another): one schema, so one fold at a
    time, or each stores rows folded onto a row cached before the other's write."""
    joiner = "&" if "?" in database_url else "?"
    async with (
        PostgresStore(database_url, schema=pg_schema) as named,
        PostgresStore(f"{database_url}{joiner}search_path={pg_schema}") as by_path,
    ):
        order: list[str] = []
        async with named.exclusive("fold"):
            waiting = asyncio.create_task(_hold(by_path, "fold", order, "by path"))
            await _until_waited_for(database_url, f"onward:{pg_schema}:fold")
            assert order == []
            order.append("named done")
        await asyncio.wait_for(waiting, 5)
        assert order == ["named done", "by path"]


async def test_a_store_given_no_schema_waits_for_a_holder_of_the_earlier_versions_key(
    database_url: str, pg_schema: str
) -> None:
    """During an upgrade, a process of an earlier version given no schema holds the lock under
    the key it always took (``onward::fold``): an upgraded one on the same schema waits for it."""
    joiner = "&" if "?" in database_url else "?"
    earlier = await asyncpg.connect(database_url)
    try:
        async with PostgresStore(f"{database_url}{joiner}search_path={pg_schema}") as store:
            order: list[str] = []
            await earlier.execute("SELECT pg_advisory_lock(hashtextextended('onward::fold', 0))")
            waiting = asyncio.create_task(_hold(store, "fold", order, "upgraded"))
            await _until_waited_for(database_url, "onward::fold")
            assert order == []
            order.append("earlier done")
            await earlier.execute("SELECT pg_advisory_unlock_all()")
            await asyncio.wait_for(waiting, 5)
            assert order == ["earlier done", "upgraded"]
    finally:
        await earlier.close()


async def test_stores_given_no_schema_on_two_schemas_do_not_wait_for_each_other(
    database_url: str, new_pg_schema: SchemaFactory
) -> None:
    """Two deployments each reach their own schema through the URL's search path: the key
    earlier versions took (``onward::fold``, one for every schema) keeps out a process not yet
    upgraded, but must not make one schema's fold wait for another's."""
    joiner = "&" if "?" in database_url else "?"
    first, second = await new_pg_schema(), await new_pg_schema()
    async with (
        PostgresStore(f"{database_url}{joiner}search_path={first}", timeout_s=2) as one,
        PostgresStore(f"{database_url}{joiner}search_path={second}", timeout_s=2) as other,
    ):
        order: list[str] = []
        async with one.exclusive("fold"):
            await asyncio.wait_for(_hold(other, "fold", order, "other schema"), 1)
        assert order == ["other schema"]
