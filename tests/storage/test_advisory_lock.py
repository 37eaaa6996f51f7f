"""`PostgresStore.exclusive`: one holder at a time across processes (stores with pools of their
own stand in for them), and callers in one process never starve the holder of a connection."""

from __future__ import annotations

import asyncio

from onward._storage import PostgresStore


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
            await asyncio.sleep(0.3)
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
