"""A PostgreSQL sweep takes its row locks in the order a frontier store's write does.

A write locks a run's frontier row, then its `tool_calls` rows (`projections.postgres`); a
sweep deletes the run's `tool_calls` rows before its frontier row. A projector storing a
finished run again while the sweep collects it (a batch delivered again after a rebalance, a
replay from older positions) would hold the row the sweep waits for while waiting for a row the
sweep holds: PostgreSQL fails one of them as deadlocked.

The test keeps the run's frontier row locked from a connection of its own until the store and
then the sweep wait for it, then lets it go: the store gets it first.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest_asyncio
from support.pg import blocked_on_a_lock

from onward.projections.base import Snapshot
from onward.projections.postgres import PostgresFrontierStore
from onward.runtime.gc import PostgresRecordSweeper, SweepPlan
from onward.testing.frontiers import CONSUMER, call_row, frontier, said

RUN = "run-01"

Stores = tuple[PostgresFrontierStore, PostgresRecordSweeper, asyncpg.Connection]


@pytest_asyncio.fixture
async def stores(database_url: str, pg_schema: str) -> AsyncIterator[Stores]:
    """A frontier store (the projector), a sweeper, and a connection to keep a row locked."""
    async with (
        PostgresFrontierStore(database_url, schema=pg_schema) as store,
        PostgresRecordSweeper(database_url, schema=pg_schema) as sweeper,
    ):
        holder = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
        try:
            yield store, sweeper, holder
        finally:
            await holder.close()


async def _store(store: PostgresFrontierStore, through: int) -> None:
    """Store the finished run: its frontier row, its call row, its first message."""
    await store.write(
        CONSUMER,
        {1: through + 1},
        [Snapshot.of(frontier(RUN, through=through, status="completed"))],
        [call_row(RUN, "c1", through=through, outcome="completed")],
        messages=[said(RUN, 1, "hello")],
    )


async def test_a_sweep_beside_a_store_of_the_same_run_never_deadlocks(stores: Stores) -> None:
    store, sweeper, holder = stores
    await _store(store, 5)
    held = holder.transaction()
    await held.start()
    try:
        await holder.execute("SELECT FROM onward_frontiers_1 WHERE run_id = $1 FOR UPDATE", RUN)
        # The same batch delivered again: it locks the rows it would upsert, changing none.
        again = asyncio.ensure_future(_store(store, 5))
        await blocked_on_a_lock(holder, 1, [again])
        sweep = asyncio.ensure_future(
            sweeper.sweep(SweepPlan(expired=(RUN,), calls=(RUN,)), delete=True)
        )
        await blocked_on_a_lock(holder, 2, [again, sweep])
    finally:
        await held.rollback()
    results = await asyncio.gather(again, sweep, return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    assert not failed, f"a concurrent call failed: {failed[0]!r}"
    counts = results[1]
    assert isinstance(counts, dict)
    assert (counts["frontiers"], counts["tool_calls"], counts["transcript"]) == (1, 1, 1)
    assert await store.get(RUN) is None
    assert await store.tool_calls(RUN) == []
