"""Compaction, garbage collection and archives where they break most easily (SQLite, PostgreSQL)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from pathlib import Path

import asyncpg
import pytest
from support.compaction_world import TENANT, Script, sqlite_world
from support.kinds import KindCounts
from support.pg import fresh_schema

from onward.errors import InvalidInputError
from onward.eventlog import MemoryEventLog, SqliteEventLog, TurnSettled, codec
from onward.eventlog import archive as archive_module
from onward.eventlog.archive import MANIFEST, DirectoryArchive
from onward.eventlog.base import partition_for
from onward.eventlog.postgres import PostgresEventLog
from onward.projections.compaction import MemoryCompactionStore, PostgresCompactionStore
from onward.projections.compaction.history import read_whole_run
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.log_projector import LogProjector
from onward.projections.memory import MemoryFrontierStore
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.postgres_sql import SqlProjectionSink
from onward.runtime.compaction import CheckpointCompactor
from onward.runtime.gc import GarbageCollector, SqliteRecordSweeper
from onward.testing.archive import records
from onward.testing.eventlog import step_events

DAY_S = 86_400.0


async def test_a_run_id_used_again_after_gc_is_not_taken_for_the_collected_run(
    tmp_path: Path,
) -> None:
    """GC collects run X (a tombstone), compaction cuts all of X's events; X's id is then used
    by a new run. That new run's tagged event must survive the next compaction like any other
    run's: the tombstone was the old run's, not the new one's."""
    async with sqlite_world(tmp_path) as world:
        await world.finished_run("x", turns=2)
        await world.fold()
        async with SqliteRecordSweeper(tmp_path / "onward.db") as records:
            report = await GarbageCollector(records, clock=lambda: time.time() + 40 * DAY_S).run()
        assert report.expired == ("x",)
        compactor = CheckpointCompactor(
            world.log, world.frontiers, world.store, no_archive=True, max_checkpoints=1
        )
        await world.fold()
        await compactor.compact()
        assert await world.log.read_run("x") == []  # the old run is gone everywhere

        # A new run under the same id: it waits on its next model call, one event tagged.
        await world.live_run("x", turns=8, done=5)
        settled = [
            s.event.seq for s in await world.log.read_run("x") if isinstance(s.event, TurnSettled)
        ]
        tagged = await world.runner(Script(0)).tag("x", "first", tenant=TENANT, seq=settled[0])
        await world.fold()
        await compactor.compact()

        point = (await world.store.truncations(["x"])).get("x")
        kept = {r.seq: r.kept_as for r in await world.store.retained("x")}
        assert point is not None, "the new run's events were cut without a truncation point"
        assert kept.get(tagged) == "tag", f"tagged seq {tagged} lost; retained: {kept}"


async def test_two_writers_of_one_archive_directory_lose_no_manifest_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two compaction passes (two operators, two cron jobs; each its own `DirectoryArchive` on
    the same directory) archive ranges at the same time. Every range a `write` returned must be
    in the manifest afterwards: the pass that wrote it goes on to cut the log below it.

    The two manifest writes are held until both writers are ready to write theirs (or for a
    second, when one waits for the other), then made one after the other, to make the
    interleaving certain."""
    barrier = threading.Barrier(2, timeout=1.0)
    real = archive_module._durable_write

    def held(path: Path, data: bytes) -> None:
        if path.name == MANIFEST:
            with contextlib.suppress(threading.BrokenBarrierError):
                if barrier.wait() == 0:
                    time.sleep(0.3)  # one manifest written after the other, not together
        real(path, data)

    monkeypatch.setattr(archive_module, "_durable_write", held)
    folder = tmp_path / "archive"
    first, second = DirectoryArchive(folder), DirectoryArchive(folder)
    written = await asyncio.gather(
        first.write(0, 0, 10, records(0, range(10))),
        second.write(1, 0, 10, records(1, range(10))),
    )
    listed = await DirectoryArchive(folder).ranges()
    assert sorted((r.partition, r.start, r.end) for r in listed) == sorted(
        (r.partition, r.start, r.end) for r in written
    ), "a range whose write returned is missing from the manifest"


async def test_a_projector_with_no_position_in_a_partition_holds_it(database_url: str) -> None:
    """Two projectors fold a PostgreSQL log of two partitions: the frontiers and a user SQL
    projection. The user projection folded partition 0 when partition 1 was still empty, so it
    stored no position for partition 1. Events then land in partition 1 and only the
    frontiers fold them. Compaction must not cut partition 1 below what the user projection
    has folded (nothing of it): once it catches up, it must have counted every event."""
    async with fresh_schema(database_url) as schema, contextlib.AsyncExitStack() as stack:
        log = await stack.enter_async_context(
            PostgresEventLog(database_url, schema=schema, partitions=2)
        )
        frontiers = await stack.enter_async_context(
            PostgresFrontierStore(database_url, schema=schema)
        )
        store = await stack.enter_async_context(
            PostgresCompactionStore(database_url, schema=schema)
        )
        sink = await stack.enter_async_context(
            SqlProjectionSink(database_url, KindCounts(), schema=schema)
        )
        first = next(r for r in (f"a-{n}" for n in range(100)) if partition_for(r, 2) == 0)
        second = next(r for r in (f"b-{n}" for n in range(100)) if partition_for(r, 2) == 1)
        fold = LogProjector(log, FrontierProjection(frontiers, log, compaction=store))
        user = LogProjector(log, sink)

        await log.append(step_events(first, 4))
        await fold.catch_up()
        await user.catch_up()
        assert set(await sink.positions()) == {0}  # partition 1 held nothing yet

        await log.append(step_events(second, 4))
        await fold.catch_up()  # the frontiers fold it; the user projection not yet
        report = await CheckpointCompactor(log, frontiers, store, no_archive=True).compact()
        await user.catch_up()

        conn = await asyncpg.connect(database_url, server_settings={"search_path": schema})
        try:
            counted = await conn.fetchval("SELECT sum(events) FROM kinds")
        finally:
            await conn.close()
        cut = {p.partition: p.events_cut for p in report.partitions}
        assert counted == 8, f"the user projection counted {counted} of 8 events; cut {cut}"


@pytest.mark.parametrize(
    "bound",
    [
        {"retention_mins": float("nan")},
        {"compaction_interval_mins": float("nan")},
        {"max_checkpoints": float("nan")},
    ],
)
def test_a_bound_that_is_not_a_number_is_refused(bound: dict[str, float]) -> None:
    """NaN passes every ``<`` check: taken, it crashed the compactor's construction with a
    ValueError (retention), or made its schedule's wait meaningless (interval)."""
    frontiers = MemoryFrontierStore()
    with pytest.raises(InvalidInputError, match="must be"):
        CheckpointCompactor(
            MemoryEventLog(),
            frontiers,
            MemoryCompactionStore(frontiers),
            **bound,  # type: ignore[arg-type]
        )


def _misfiled(db: Path, partition: int, run_id: str, record: bytes) -> None:
    """Store ``record`` of ``run_id`` in ``partition``, not the run's own: what a producer that
    partitions keys otherwise, or a mirror, leaves."""
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        (offset,) = conn.execute(
            "SELECT next_offset FROM onward_log_partition WHERE partition = ?", (partition,)
        ).fetchone()
        conn.execute(
            "INSERT INTO onward_log VALUES (?, ?, ?, ?)", (partition, offset, run_id, record)
        )
        conn.execute(
            "UPDATE onward_log_partition SET next_offset = ? WHERE partition = ?",
            (offset + 1, partition),
        )


async def test_a_copy_of_a_run_s_event_in_another_partition_cuts_nothing_of_the_run(
    tmp_path: Path,
) -> None:
    """A copy of a live run's first event sits in another partition than the run's own. A
    pass that cuts that partition must not take the copy for the run's history: it moved the
    run's truncation point past its first event, though its own partition, never cut, holds
    every event of it, and the run's history then read as compacted and its first event could
    not be tagged."""
    async with sqlite_world(tmp_path, partitions=2) as world:
        home = partition_for("a", 2)
        other = next(r for r in (f"b{i}" for i in range(100)) if partition_for(r, 2) != home)
        # An unreadable record at the start of the run's partition: no pass cuts it.
        junk = next(r for r in (f"j{i}" for i in range(100)) if partition_for(r, 2) == home)
        assert isinstance(world.log, SqliteEventLog)
        world.log.write_raw(junk, b"not an event")
        await world.live_run("a", turns=8, done=3)
        await world.finished_run(other, turns=2)
        (first, *_) = await world.log.read_run("a")
        _misfiled(tmp_path / "onward.db", 1 - home, "a", codec.encode(first.event))
        await world.fold()
        before = await world.log.read_run("a")
        compactor = CheckpointCompactor(
            world.log, world.frontiers, world.store, no_archive=True, max_checkpoints=1
        )
        await compactor.compact()

        assert (await world.log.bounds(1 - home)).start > 0  # the copy's partition was cut
        assert (await world.log.bounds(home)).start == 0  # nothing of the run's own was
        assert await read_whole_run(world.log, world.store, "a") == before
        assert (await world.store.truncations(["a"])).get("a") is None
        await world.runner(Script(0)).tag("a", "first", tenant=TENANT, seq=1)
