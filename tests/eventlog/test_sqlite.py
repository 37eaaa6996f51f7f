"""What only the SQLite backend has: a file other processes share, and its settings."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from onward._storage import SqliteStore
from onward.errors import BackendError, ConfigurationError, InvalidInputError
from onward.eventlog import SqliteEventLog, codec
from onward.eventlog.base import TRUNCATION_STEP, PartitionBounds, partition_for
from onward.projections.compaction import SqliteCompactionStore
from onward.projections.migrations import migrations
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.blobs import SqliteBlobStore
from onward.runtime.leases import SqliteLeaseStore
from onward.testing.eventlog import new_run_id, runs_in_partition, seqs, step_events

READ_IN_CHILD = """
import asyncio, sys
from onward.eventlog import SqliteEventLog

async def main():
    async with SqliteEventLog(sys.argv[1], partitions=4) as log:
        stored = await log.read_run(sys.argv[2])
        print(",".join(str(s.event.seq) for s in stored))

asyncio.run(main())
"""


async def test_another_process_reads_what_this_one_appended(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    run_id = new_run_id()
    async with SqliteEventLog(path, partitions=4) as log:
        await log.append(step_events(run_id, 5))
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", READ_IN_CHILD, str(path), run_id],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == "1,2,3,4,5"


async def test_reopening_with_another_partition_count_is_refused_and_data_kept(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.db"
    run_id = new_run_id()
    async with SqliteEventLog(path, partitions=4) as log:
        await log.append(step_events(run_id, 3))
    with pytest.raises(ConfigurationError, match="created with 4 partitions"):
        await SqliteEventLog.open(path, partitions=8)
    async with SqliteEventLog(path, partitions=4) as log:
        assert seqs(await log.read_run(run_id)) == [1, 2, 3]


async def test_the_file_is_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    async with SqliteEventLog(path):
        pass
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        conn.close()


async def test_every_store_of_the_file_commits_with_synchronous_full(tmp_path: Path) -> None:
    """Each store's own connection (the one its writes go through) syncs every commit to disk
    (``PRAGMA synchronous`` 2 is FULL): a weaker setting could lose a committed dispatch on
    power loss, which no client-kill test would notice."""
    path = tmp_path / "onward.db"
    async with (
        SqliteEventLog(path) as log,
        SqliteFrontierStore(path) as frontiers,
        SqliteLeaseStore(path) as leases,
        SqliteBlobStore(path) as blobs,
        SqliteCompactionStore(path, sharing=log) as compaction,
    ):
        stores: list[SqliteStore] = [log, frontiers, leases, blobs, compaction]
        for store in stores:
            conn = store._db.connection()
            assert conn.execute("PRAGMA synchronous").fetchone() == (2,), type(store).__name__
            assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",), type(store).__name__


async def test_using_a_log_that_was_never_opened_is_a_clear_error(tmp_path: Path) -> None:
    log = SqliteEventLog(tmp_path / "events.db")
    with pytest.raises(InvalidInputError, match="not open"):
        await log.append(step_events(new_run_id(), 1))


async def test_a_file_that_is_not_a_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    content = b"these are somebody's notes, not an event log\n" * 200
    path.write_bytes(content)
    with pytest.raises(BackendError, match=r"notes\.txt"):
        await SqliteEventLog.open(path)
    assert path.read_bytes() == content


# The event log's tables as versions before 0004_eventlog.sql created them, outside the ledger.
_OLD_LOG_DDL = """
CREATE TABLE onward_log_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE onward_log_partition (
    partition INTEGER PRIMARY KEY, start_offset INTEGER NOT NULL, next_offset INTEGER NOT NULL
);
CREATE TABLE onward_log (
    partition INTEGER NOT NULL, offset INTEGER NOT NULL, run_id TEXT NOT NULL,
    record BLOB NOT NULL, PRIMARY KEY (partition, offset)
) WITHOUT ROWID;
CREATE INDEX onward_log_by_run ON onward_log (run_id, partition, offset);
"""


@pytest.mark.parametrize("ledger", [False, True], ids=["log-only", "ledger-at-3"])
async def test_a_file_written_before_the_log_joined_the_ledger_opens_and_migrates(
    tmp_path: Path, ledger: bool
) -> None:
    path = tmp_path / "old.db"
    run_id = new_run_id()
    events = step_events(run_id, 3)
    partition = partition_for(run_id, 4)
    with closing(sqlite3.connect(path)) as conn:
        conn.executescript(_OLD_LOG_DDL)
        if ledger:
            # What the frontier, blob and lease stores left in a shared file: versions 1 to 3.
            for migration in migrations("sqlite")[:3]:
                conn.executescript(migration.sql)
            conn.execute(
                "CREATE TABLE onward_schema_migrations (version integer PRIMARY KEY, "
                "name text NOT NULL, applied_at text NOT NULL DEFAULT CURRENT_TIMESTAMP)"
            )
            conn.executemany(
                "INSERT INTO onward_schema_migrations (version, name) VALUES (?, ?)",
                [(m.version, m.name) for m in migrations("sqlite")[:3]],
            )
        conn.executemany(
            "INSERT INTO onward_log_meta VALUES (?, ?)",
            [("schema_version", "1"), ("partitions", "4")],
        )
        conn.executemany(
            "INSERT INTO onward_log_partition VALUES (?, 0, ?)",
            [(p, 2 if p == partition else 0) for p in range(4)],
        )
        conn.executemany(
            "INSERT INTO onward_log VALUES (?, ?, ?, ?)",
            [(partition, i, run_id, codec.encode(e)) for i, e in enumerate(events[:2])],
        )
        conn.commit()
    async with SqliteEventLog(path, partitions=4) as log:
        await log.append(events[2:])
        assert seqs(await log.read_run(run_id)) == [1, 2, 3]
    async with SqliteFrontierStore(path, migrate=False) as store:
        await store.verify()
    with closing(sqlite3.connect(path)) as conn:
        versions = [v for (v,) in conn.execute("SELECT version FROM onward_schema_migrations")]
    assert sorted(versions) == [m.version for m in migrations("sqlite")]


async def test_a_long_cut_moves_the_start_in_steps_appends_can_commit_between(
    tmp_path: Path,
) -> None:
    """A cut of a long backlog in one transaction held every append of the file for all of
    it. A trigger notes, for each record deleted, where the partition's start stood then: the
    later steps see the start the earlier ones committed."""
    path = tmp_path / "events.db"
    backlog = 2 * TRUNCATION_STEP + 123
    async with SqliteEventLog(path, partitions=2) as log:
        await log.append(step_events(new_run_id(), 1))
    with closing(sqlite3.connect(path)) as conn, conn:
        (record,) = conn.execute("SELECT record FROM onward_log LIMIT 1").fetchone()
        conn.execute("DELETE FROM onward_log")
        conn.executemany(
            "INSERT INTO onward_log (partition, offset, run_id, record) VALUES (0, ?, ?, ?)",
            ((offset, f"r{offset}", record) for offset in range(backlog)),
        )
        conn.execute(
            "UPDATE onward_log_partition SET start_offset = 0, "
            "next_offset = CASE partition WHEN 0 THEN ? ELSE 0 END",
            (backlog,),
        )
        conn.executescript(
            "CREATE TABLE cut_seen (start_offset INTEGER);"
            "CREATE TRIGGER cut_seen AFTER DELETE ON onward_log BEGIN "
            "INSERT INTO cut_seen SELECT start_offset FROM onward_log_partition "
            "WHERE partition = OLD.partition; END;"
        )
    async with SqliteEventLog(path, partitions=2) as log:
        await log.truncate_before(0, backlog - 3)
        assert await log.bounds(0) == PartitionBounds(backlog - 3, backlog)
        assert len(await log.read_records(0, backlog - 3)) == 3
    with closing(sqlite3.connect(path)) as conn:
        seen = conn.execute(
            "SELECT start_offset, count(*) FROM cut_seen GROUP BY start_offset ORDER BY 1"
        ).fetchall()
    assert seen == [
        (0, TRUNCATION_STEP),
        (TRUNCATION_STEP, TRUNCATION_STEP),
        (2 * TRUNCATION_STEP, 120),
    ]


class _CutWhileLooking(SqliteEventLog):
    """A log whose partition is cut before ``cut_at`` (compaction, in another task) right after
    its ``looks``-th look at the partition's bounds, before the read that follows it."""

    cut_at: int | None = None
    looks = 0

    async def bounds(self, partition: int) -> PartitionBounds:
        found = await super().bounds(partition)
        self.looks -= 1
        if self.cut_at is not None and self.looks == 0:
            offset, self.cut_at = self.cut_at, None
            await self.truncate_before(partition, offset)
        return found


async def test_runs_appended_across_a_cut_made_meanwhile_says_the_runs_are_unknown(
    tmp_path: Path,
) -> None:
    """A watcher asking which runs a partition gained while compaction cuts it learns that the
    runs are unknown (every stream looks), as on Kafka, not that the log failed."""
    async with _CutWhileLooking(tmp_path / "events.db", partitions=1) as log:
        run_id = new_run_id()
        await log.append(step_events(run_id, 4))
        log.cut_at, log.looks = 3, 2  # its end, then its start, is looked at
        moved = await log.runs_appended({0: 1})
        assert moved[0].end == 4
        assert moved[0].runs in (None, frozenset({run_id}))


async def test_a_file_missing_a_partition_row_is_refused_by_name(tmp_path: Path) -> None:
    """A file whose partition row was deleted by hand: every call on that partition says so
    (as the PostgreSQL log does), rather than failing with a bare TypeError."""
    path = tmp_path / "events.db"
    run_id = new_run_id()
    partition = partition_for(run_id, 4)
    async with SqliteEventLog(path, partitions=4):
        pass
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("DELETE FROM onward_log_partition WHERE partition = ?", (partition,))
        conn.commit()
    missing = f"no row for partition {partition}"
    async with SqliteEventLog(path, partitions=4) as log:
        with pytest.raises(ConfigurationError, match=missing):
            await log.append(step_events(run_id, 1))
        with pytest.raises(ConfigurationError, match=missing):
            await log.read_run(run_id)
        with pytest.raises(ConfigurationError, match=missing):
            await log.bounds(partition)
        with pytest.raises(ConfigurationError, match=missing):
            await log.truncate_before(partition, 0)


async def test_a_read_only_log_opened_on_a_quiet_file_sees_later_appends(tmp_path: Path) -> None:
    """Opened while no process had the file open (no ``-wal`` file), a read-only log (what
    `ExecutionManager()` keeps open) still sees what a writer appends afterwards, while the
    writer is open and once it closed, instead of the file as it was when it was opened."""
    path = tmp_path / "events.db"
    first, later, last = new_run_id(), new_run_id(), new_run_id()
    async with SqliteEventLog(path, partitions=4) as log:
        await log.append(step_events(first, 2))
    assert not Path(f"{path}-wal").exists()  # noqa: ASYNC240
    async with SqliteEventLog(path, partitions=4, readonly=True) as reader:
        assert seqs(await reader.read_run(first)) == [1, 2]
        async with SqliteEventLog(path, partitions=4) as log:
            await log.append(step_events(later, 3))
            assert seqs(await reader.read_run(later)) == [1, 2, 3]
        async with SqliteEventLog(path, partitions=4) as log:
            await log.append(step_events(last, 2))
        assert seqs(await reader.read_run(last)) == [1, 2]
        partition = partition_for(last, 4)
        assert (await reader.bounds(partition)).end >= 2


async def test_a_read_only_log_opened_before_any_append_sees_the_first_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.db"
    async with SqliteFrontierStore(path):
        pass  # migrated, but no log was opened on it yet
    run_id = new_run_id()
    async with SqliteEventLog(path, partitions=4, readonly=True) as reader:
        assert await reader.read_run(run_id) == []
        async with SqliteEventLog(path, partitions=4) as log:
            await log.append(step_events(run_id, 2))
        assert seqs(await reader.read_run(run_id)) == [1, 2]


async def test_a_read_only_log_opened_before_any_append_beside_a_writer_sees_the_first_one(
    tmp_path: Path,
) -> None:
    """Opened while another store had the migrated file open (a ``-wal`` file, so not read
    ``immutable`` and never reopened) and before any log was created on it, a read-only log
    sees the runs a log created afterwards appends, instead of an empty log for good."""
    path = tmp_path / "events.db"
    run_id = new_run_id()
    async with SqliteFrontierStore(path):
        assert Path(f"{path}-wal").exists()  # noqa: ASYNC240
        async with SqliteEventLog(path, partitions=4, readonly=True) as reader:
            assert await reader.read_run(run_id) == []
            async with SqliteEventLog(path, partitions=4) as log:
                await log.append(step_events(run_id, 2))
                assert seqs(await reader.read_run(run_id)) == [1, 2]
                assert (await reader.bounds(partition_for(run_id, 4))).end >= 2


async def test_a_read_only_log_beside_a_writer_refuses_a_log_created_with_other_partitions(
    tmp_path: Path,
) -> None:
    """Opened beside a writer on a migrated file with no log yet, a read-only log configured
    with 4 partitions finds a log another process created with 8: every read refuses it by
    name, not the first alone, the next reading it as 4 partitions (runs in 4 to 7 missed)."""
    path = tmp_path / "events.db"
    run_id = new_run_id()
    async with (
        SqliteFrontierStore(path),
        SqliteEventLog(path, partitions=4, readonly=True) as reader,
    ):
        assert await reader.read_run(run_id) == []
        async with SqliteEventLog(path, partitions=8) as log:
            await log.append(step_events(run_id, 2))
            for _ in range(2):
                with pytest.raises(ConfigurationError, match="created with 8 partitions"):
                    await reader.read_run(run_id)
            with pytest.raises(ConfigurationError, match="created with 8 partitions"):
                await reader.bounds(0)


async def test_another_programs_sqlite_file_is_refused_untouched(tmp_path: Path) -> None:
    """``ONWARD_SQLITE_PATH`` pointed at another program's database (as `onward worker` and
    `onward.open` open it): refused by name, its journal mode and tables left as they were."""
    path = tmp_path / "app.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE recipes (name text)")
        conn.execute("INSERT INTO recipes VALUES ('soup')")
        conn.commit()
    content = path.read_bytes()
    with pytest.raises(ConfigurationError, match=r"app\.db: not an Onward database"):
        await SqliteEventLog.open(path)
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]  # noqa: ASYNC240


async def test_a_read_only_log_keeps_one_connection_however_often_writers_come_and_go(
    tmp_path: Path,
) -> None:
    """A long-lived reader (`ExecutionManager()`) on a file that writers open and close again
    and again (each `onward` command) reopens its connection as the file changes, and closes
    the ones it replaced: kept open, each change held one more open file till it ran out."""
    path = tmp_path / "events.db"
    async with SqliteEventLog(path, partitions=4) as log:
        await log.append(step_events(new_run_id(), 1))

    def open_files() -> int:
        """How many descriptors this process holds open on the file."""
        named = []
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed since
                named.append(os.readlink(f"/proc/self/fd/{fd}"))
        return named.count(str(path.resolve()))

    async with SqliteEventLog(path, partitions=4, readonly=True) as reader:
        await reader.read_run(new_run_id())
        held = open_files()
        for _ in range(5):
            run_id = new_run_id()
            async with SqliteEventLog(path, partitions=4) as log:
                await log.append(step_events(run_id, 1))
            assert seqs(await reader.read_run(run_id)) == [1]
        assert open_files() <= held + 1  # at most the one replaced last, which a call may hold


async def test_records_another_program_stored_as_text_or_numbers_do_not_stop_reads(
    tmp_path: Path,
) -> None:
    """The file is open to other programs, and SQLite keeps whatever type they bind: an event
    stored as JSON text reads as that event, a number as an unreadable record in its place,
    and neither stops a read of the partition (a projector's, an audit's)."""
    path = tmp_path / "events.db"
    texted, numbered, appended = runs_in_partition(0, 3, 4)
    async with SqliteEventLog(path, partitions=4) as log:
        (event,) = step_events(texted, 1)
        with closing(sqlite3.connect(path)) as conn, conn:
            conn.execute(
                "INSERT INTO onward_log VALUES (0, 0, ?, ?), (0, 1, ?, 42)",
                (texted, codec.encode(event).decode(), numbered),
            )
            conn.execute("UPDATE onward_log_partition SET next_offset = 2 WHERE partition = 0")
        await log.append(step_events(appended, 1))
        records = await log.read_records(0)
        assert [type(r).__name__ for r in records] == [
            "StoredEvent",
            "UnreadableRecord",
            "StoredEvent",
        ]
        assert [s.event for s in await log.read_run(texted)] == [event]
        assert seqs(await log.read_run(appended)) == [1]


async def test_a_record_another_program_stored_as_text_not_utf8_does_not_stop_reads(
    tmp_path: Path,
) -> None:
    """SQLite keeps text that is not UTF-8 as it was bound, and Python's sqlite3 raises as it
    fetches such a column: the record reads as an unreadable one in its place, and the rest
    of its partition (a projector's read, an audit's) is read as before."""
    path = tmp_path / "events.db"
    garbled, appended = runs_in_partition(0, 2, 4)
    async with SqliteEventLog(path, partitions=4) as log:
        with closing(sqlite3.connect(path)) as conn, conn:
            conn.execute(
                "INSERT INTO onward_log VALUES (0, 0, ?, CAST(X'ff7b22' AS TEXT))", (garbled,)
            )
            conn.execute("UPDATE onward_log_partition SET next_offset = 1 WHERE partition = 0")
        await log.append(step_events(appended, 1))
        records = await log.read_records(0)
        assert [type(r).__name__ for r in records] == ["UnreadableRecord", "StoredEvent"]
        assert seqs(await log.read_run(appended)) == [1]
