"""Concurrent writers of one PostgreSQL frontier store take their row locks in one order.

Two writers touch the same rows for a while: two projectors of a group while a partition moves
(the one it moved away from stores late), a rebuild beside the live projector (the transcript is
one table for every build), a person's release beside the projector holding the run. Each write
is one transaction, and a row it upserts stays locked until it commits: writers that lock the
same rows in different orders deadlock, and PostgreSQL fails one of them (a rebuild then stops
for good; a release fails for the person who asked for it).

Each test keeps one of the rows locked from a connection of its own until both writers wait
inside their transactions, each holding the rows it reached first, then lets it go.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from support.pg import blocked_on_a_lock

from onward.projections.base import FrontierWrite, Snapshot, released_mark
from onward.projections.postgres import PostgresFrontierStore
from onward.testing.frontiers import CONSUMER, call_row, frontier, poison, said, write_batch

RUNS = [f"run-{n:02}" for n in range(40)]
"""More runs than a write upserts by one statement each (`_FEW_ROWS`): staged by COPY."""
FEW = RUNS[:9]
"""Few enough runs to be upserted by one prepared statement each."""

Stores = tuple[PostgresFrontierStore, PostgresFrontierStore, asyncpg.Connection]


@pytest_asyncio.fixture
async def stores(database_url: str, pg_schema: str) -> AsyncIterator[Stores]:
    """Two stores of one schema (two projectors), and a connection to keep a row locked."""
    async with (
        PostgresFrontierStore(database_url, schema=pg_schema) as first,
        PostgresFrontierStore(database_url, schema=pg_schema) as second,
    ):
        holder = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
        try:
            yield first, second, holder
        finally:
            await holder.close()


async def _with_one_row_locked(
    holder: asyncpg.Connection, lock: str, calls: list[Awaitable[Any]]
) -> list[Any]:
    """Run the calls while ``lock`` (a statement) keeps one of their rows locked, then roll it
    back; every call must succeed."""
    held = holder.transaction()
    await held.start()
    try:
        await holder.execute(lock)
        tasks = [asyncio.ensure_future(call) for call in calls]
        await blocked_on_a_lock(holder, len(tasks), tasks)
    finally:
        await held.rollback()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    assert not failed, f"a concurrent write failed: {failed[0]!r}"
    return results


def _frontiers(runs: list[str], through: int) -> FrontierWrite:
    return FrontierWrite(
        CONSUMER, {}, [Snapshot.of(frontier(r, through=through)) for r in runs], []
    )


def _calls(runs: list[str], through: int) -> FrontierWrite:
    calls = [call_row(r, "c1", through=through, outcome="completed") for r in runs]
    return FrontierWrite(CONSUMER, {}, [], calls)


def _positions(runs: list[str], through: int) -> FrontierWrite:
    return FrontierWrite(CONSUMER, {RUNS.index(r): through for r in runs}, [], [])


def _held(runs: list[str], through: int) -> FrontierWrite:
    """Records that name no run, set aside by both projectors (``through``: when)."""
    entries = [
        dataclasses.replace(poison(None, offset=RUNS.index(r)), quarantined_at=through)
        for r in runs
    ]
    return FrontierWrite(CONSUMER, {}, [], [], quarantine=entries)


@pytest.mark.parametrize(
    ("batch", "runs", "lock"),
    [
        (_frontiers, RUNS, "SELECT FROM onward_frontiers_1 WHERE run_id = 'run-20' FOR UPDATE"),
        (_frontiers, FEW, "SELECT FROM onward_frontiers_1 WHERE run_id = 'run-04' FOR UPDATE"),
        (_calls, RUNS, "SELECT FROM onward_tool_calls_1 WHERE run_id = 'run-20' FOR UPDATE"),
        (
            _positions,
            FEW,
            "SELECT FROM onward_projector_positions WHERE consumer = 'frontiers@1' "
            "AND partition = 4 FOR UPDATE",
        ),
        (
            _held,
            FEW,
            "SELECT FROM onward_quarantine WHERE consumer = 'frontiers@1' AND log_offset = 4 "
            "FOR UPDATE",
        ),
    ],
    ids=["frontier-rows", "few-frontier-rows", "call-rows", "positions", "quarantine-entries"],
)
async def test_two_writers_of_the_same_rows_never_deadlock(
    stores: Stores, batch: Any, runs: list[str], lock: str
) -> None:
    first, second, holder = stores
    await write_batch(first, batch(runs, 1))
    await _with_one_row_locked(
        holder,
        lock,
        [
            write_batch(first, batch(runs, 5)),
            write_batch(second, batch(list(reversed(runs)), 6)),
        ],
    )
    # The later fold wins wherever it landed, whichever write committed first.
    rows = await first.load(runs)
    assert {row.summary.through_offset for row in rows.values()} <= {6}
    calls = [call for run_id in runs for call in await first.tool_calls(run_id)]
    assert {call.through_offset for call in calls} <= {6}
    assert set((await first.positions(CONSUMER)).values()) <= {6}
    assert {e.quarantined_at for e in await first.quarantined(CONSUMER)} <= {5, 6}


async def test_two_writers_of_the_same_transcript_rows_never_deadlock(stores: Stores) -> None:
    """A rebuild and the live projector append the same messages; the row held is one neither
    has stored yet (an insert not committed)."""
    first, second, holder = stores
    messages = [said(run_id, 1, f"hello {run_id}") for run_id in RUNS]
    await _with_one_row_locked(
        holder,
        "INSERT INTO onward_transcript (tenant, run_id, seq, message) "
        "VALUES ('acme', 'run-20', 1, '\\x00')",
        [
            first.write(CONSUMER, {}, [], [], messages=messages),
            second.write(CONSUMER, {}, [], [], messages=list(reversed(messages))),
        ],
    )
    for run_id in RUNS:
        (stored,) = await first.transcript(run_id, tenant="acme", through=1)
        assert stored.message.content == f"hello {run_id}"


async def test_a_release_beside_a_store_of_the_held_run_never_deadlocks(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A projector stores the held run (its frontier row, then its entry) while a person
    releases it (its entry, then its row): both succeed, and the release stands."""
    live, ops, holder = stores
    run_id = RUNS[0]
    held = [Snapshot.of(frontier(run_id, through=7))]
    await live.write(CONSUMER, {1: 9}, held, [], quarantine=[poison(run_id, offset=8)])

    # The projector's next store pauses once it has upserted the run's row.
    upserted, go_on = asyncio.Event(), asyncio.Event()
    quarantine = PostgresFrontierStore._quarantine

    async def paused(*args: Any) -> None:
        upserted.set()
        await go_on.wait()
        await quarantine(*args)

    monkeypatch.setattr(PostgresFrontierStore, "_quarantine", staticmethod(paused))
    store = asyncio.ensure_future(
        live.write(CONSUMER, {1: 9}, held, [], quarantine=[poison(run_id, offset=8)])
    )
    await upserted.wait()
    release = asyncio.ensure_future(ops.release(CONSUMER, run_id, by="ops", at=5_000))
    await blocked_on_a_lock(holder, 1, [release])
    go_on.set()
    results = await asyncio.gather(store, release, return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    assert not failed, f"a concurrent write failed: {failed[0]!r}"
    assert results[1] == 1
    (entry,) = await ops.quarantined(CONSUMER, run_id=run_id)
    assert (entry.state, entry.released_by) == ("released", "ops")
    row = await ops.get(run_id)
    assert row is not None
    assert row.quarantined == released_mark("ops")
