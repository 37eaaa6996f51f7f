"""Group commit in the SQLite log: the appends of many runs share one transaction and one fsync,
and each batch still lands whole, at contiguous offsets, or fails alone.

Every event names its batch (``call_id`` is ``RUN-BATCH-SIZE``), so reading the log back shows
whether a batch was split, cut short or interleaved with another, and whether any offset of a
partition is missing.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest
from support.group_append_child import BATCHES, DONE, append_run, batch_events
from support.processes import reaped, spawn_support

from onward.errors import BackendError, PayloadTooLargeError
from onward.eventlog import SqliteEventLog, ToolCompleted
from onward.eventlog.base import Position, StoredEvent
from onward.testing.leases import until

PARTITIONS = 3
"""Few partitions, so many runs append to each at once."""


async def read_everything(log: SqliteEventLog) -> list[list[StoredEvent]]:
    """Every stored event, partition by partition, checking each partition's offsets are dense."""
    partitions: list[list[StoredEvent]] = []
    for partition in range(PARTITIONS):
        bounds = await log.bounds(partition)
        stored = await log.read_partition(partition, bounds.start)
        offsets = [s.position.offset for s in stored]
        assert offsets == list(range(bounds.start, bounds.end)), f"partition {partition}"
        partitions.append(stored)
    return partitions


def check_batches_whole(partitions: list[list[StoredEvent]]) -> dict[str, list[int]]:
    """Assert every batch is whole and contiguous and every run's seqs go 1, 2, 3...; return
    each run's seqs."""
    batches: dict[str, list[Position]] = defaultdict(list)
    runs: dict[str, list[int]] = defaultdict(list)
    for stored in partitions:
        for one in stored:
            event = one.event
            assert isinstance(event, ToolCompleted)
            batches[event.call_id].append(one.position)
            runs[event.run_id].append(event.seq)
    for batch, positions in batches.items():
        size = int(batch.rsplit("-", 1)[1])
        offsets = [p.offset for p in positions]
        assert len(positions) == size, f"batch {batch}: {len(positions)} of {size} events"
        assert offsets == list(range(offsets[0], offsets[0] + size)), f"batch {batch} split"
    for run_id, seqs in runs.items():
        assert seqs == list(range(1, len(seqs) + 1)), f"run {run_id}: {seqs}"
    return dict(runs)


@contextmanager
def write_lock_held(path: Path) -> Iterator[sqlite3.Connection]:
    """Another connection holds the file's write lock until the block's ``ROLLBACK``, so the log's
    next commit waits while more appends queue behind it."""
    with closing(sqlite3.connect(path, isolation_level=None)) as holder:
        holder.execute("BEGIN IMMEDIATE")
        try:
            yield holder
        finally:
            if holder.in_transaction:
                holder.execute("ROLLBACK")


async def until_taken_by_a_commit(log: SqliteEventLog, commits_before: int) -> None:
    """Wait until a commit started after ``commits_before`` has taken every queued write (it
    then waits for the write lock the test holds)."""
    await until(
        lambda: log._db.commits > commits_before and not log._db._writes,
        within_s=5,
        what="a commit taking the queued writes",
    )


async def until_queued(log: SqliteEventLog, appends: Sequence[asyncio.Task[Any]]) -> None:
    """Wait until each of ``appends`` has queued its write for the next commit, or been
    answered without one (a batch refused before it is written)."""
    await until(
        lambda: len(log._db._writes) + sum(a.done() for a in appends) == len(appends),
        within_s=5,
        what=f"{len(appends)} appends queued",
    )


async def test_concurrent_runs_share_commits_and_every_batch_lands_whole(tmp_path: Path) -> None:
    runs = 200
    rng = random.Random(23)
    async with SqliteEventLog(tmp_path / "events.db", partitions=PARTITIONS) as log:
        await asyncio.gather(*(append_run(log, "run", run, rng) for run in range(runs)))
        appends = runs * BATCHES
        assert log._db.commits < appends / 4, f"{log._db.commits} commits for {appends} appends"
        stored_runs = check_batches_whole(await read_everything(log))
    assert len(stored_runs) == runs


async def test_positions_returned_are_where_each_batch_landed(tmp_path: Path) -> None:
    async with SqliteEventLog(tmp_path / "events.db", partitions=PARTITIONS) as log:
        batches = [batch_events("run", run, 0, 1, 1 + run % 5) for run in range(100)]
        returned = await asyncio.gather(*(log.append(batch) for batch in batches))
        for batch, positions in zip(batches, returned, strict=True):
            stored = await log.read_run(batch[0].run_id)
            assert [s.position for s in stored] == positions
            assert [s.event for s in stored] == batch


async def test_a_batch_refused_inside_the_shared_transaction_fails_alone(tmp_path: Path) -> None:
    """A batch SQLite refuses halfway (a trigger aborts its second insert) is rolled back to its
    savepoint: none of its events stay, and the batches committed with it are whole and dense.
    A batch refused before it is queued (too large) fails alone too."""
    path = tmp_path / "events.db"
    bad = batch_events("bad", 0, 0, 1, 3)
    bad_run = bad[0].run_id
    async with SqliteEventLog(path, partitions=PARTITIONS, max_batch_bytes=20_000) as log:
        with closing(sqlite3.connect(path, isolation_level=None)) as conn:
            conn.execute(
                f"CREATE TRIGGER refuse_second BEFORE INSERT ON onward_log WHEN NEW.run_id = "
                f"'{bad_run}' AND EXISTS (SELECT 1 FROM onward_log WHERE run_id = '{bad_run}') "
                "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
            )
        oversized = [
            ToolCompleted(
                run_id="big", tenant="t", seq=1, fence=1, call_id="big-0-1", result="x" * 30_000
            )
        ]
        good = [batch_events("good", run, 0, 1, 1 + run % 5) for run in range(40)]
        with write_lock_held(path) as holder:
            # The first append's commit waits for the lock; everything after queues behind it.
            commits = log._db.commits
            first = asyncio.create_task(log.append(batch_events("first", 0, 0, 1, 2)))
            await until_taken_by_a_commit(log, commits)
            commits = log._db.commits
            rest = [
                asyncio.create_task(log.append(batch))
                for batch in [*good[:20], bad, oversized, *good[20:]]
            ]
            await until_queued(log, rest)
            holder.execute("ROLLBACK")
            outcomes = await asyncio.gather(first, *rest, return_exceptions=True)
        assert log._db.commits == commits + 1, "the queued appends did not share one commit"
        failed = {i: o for i, o in enumerate(outcomes) if isinstance(o, BaseException)}
        assert sorted(failed) == [21, 22]
        assert isinstance(failed[21], BackendError)
        assert "refused by the test" in str(failed[21])
        assert isinstance(failed[22], PayloadTooLargeError)
        assert await log.read_run(bad_run) == []
        stored_runs = check_batches_whole(await read_everything(log))
    assert sorted(stored_runs) == sorted(["first-0", *(batch[0].run_id for batch in good)])


async def test_appends_after_a_refused_group_still_commit(tmp_path: Path) -> None:
    """A group whose every batch fails leaves the log as it was, and the next group commits."""
    path = tmp_path / "events.db"
    async with SqliteEventLog(path, partitions=PARTITIONS) as log:
        with closing(sqlite3.connect(path, isolation_level=None)) as conn:
            conn.execute(
                "CREATE TRIGGER refuse_all BEFORE INSERT ON onward_log WHEN NEW.run_id LIKE "
                "'doomed-%' BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
            )
        doomed = await asyncio.gather(
            *(log.append(batch_events("doomed", run, 0, 1, 2)) for run in range(10)),
            return_exceptions=True,
        )
        assert all(isinstance(o, BackendError) for o in doomed)
        assert [(await log.bounds(p)).end for p in range(PARTITIONS)] == [0] * PARTITIONS
        await asyncio.gather(*(log.append(batch_events("fine", run, 0, 1, 2)) for run in range(10)))
        assert len(check_batches_whole(await read_everything(log))) == 10


@pytest.mark.timeout(120)
async def test_two_processes_group_committing_into_one_file_keep_batches_whole(
    tmp_path: Path,
) -> None:
    """Each process takes the file's write lock for its group (``BEGIN IMMEDIATE``), so the two
    interleave groups, never batches, and no offset is given twice or skipped."""
    path = tmp_path / "events.db"
    runs = 60
    async with SqliteEventLog(path, partitions=PARTITIONS) as log, reaped() as children:
        child = await spawn_support(
            "group_append_child",
            str(path),
            str(PARTITIONS),
            "child",
            str(runs),
            stdout=asyncio.subprocess.PIPE,
        )
        children.append(child)
        rng = random.Random(7)
        await asyncio.gather(*(append_run(log, "parent", run, rng) for run in range(runs)))
        out, _ = await asyncio.wait_for(child.communicate(), 90)
        assert child.returncode == 0
        assert out.decode().split() == [DONE]
        stored_runs = check_batches_whole(await read_everything(log))
    assert sum(1 for r in stored_runs if r.startswith("child-")) == runs
    assert sum(1 for r in stored_runs if r.startswith("parent-")) == runs


async def test_an_append_cancelled_while_queued_never_lands(tmp_path: Path) -> None:
    """A caller that gives up before a commit took its batch leaves nothing behind; one whose
    batch a commit already took is the same as before group commit: it may have landed."""
    path = tmp_path / "events.db"
    async with SqliteEventLog(path, partitions=PARTITIONS) as log:
        with write_lock_held(path) as holder:
            commits = log._db.commits
            first = asyncio.create_task(log.append(batch_events("first", 0, 0, 1, 2)))
            await until_taken_by_a_commit(log, commits)  # which waits for the lock
            queued = asyncio.create_task(log.append(batch_events("queued", 0, 0, 1, 3)))
            kept = asyncio.create_task(log.append(batch_events("kept", 0, 0, 1, 1)))
            await until_queued(log, [queued, kept])
            queued.cancel()
            holder.execute("ROLLBACK")
            await first
            await kept
        with pytest.raises(asyncio.CancelledError):
            await queued
        stored_runs = check_batches_whole(await read_everything(log))
    assert sorted(stored_runs) == ["first-0", "kept-0"]
