"""`SqliteEventLog`: the embedded default. One file, WAL, the same partition and offset semantics.

Writes go through one connection on one dedicated thread and reads through a second on another,
so the event loop never blocks on disk and sqlite3 objects never cross threads. Several processes
may open the same file: an append takes SQLite's write lock (``BEGIN IMMEDIATE``) before it
allocates offsets, so offsets stay dense and a batch lands whole or not at all.
``synchronous=FULL`` makes a returned append survive power loss, which write-ahead tool dispatch
relies on.

Records are stored packed (`onward._storage.packing`: deflated against a dictionary of the
JSON they repeat). Appends are group-committed: the batches of many runs that queued while the
previous commit was running share one transaction and one fsync, each in its own savepoint (a
batch that fails is rolled back alone), and each caller hears back once the commit is durable. A
lone append commits at once, so a single run waits no longer than it would for a transaction of
its own.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path

from onward._storage import SqliteStore, connect, pack, transaction, translated, unpack
from onward.errors import ConfigurationError, LogTruncatedError

from .base import (
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_PARTITIONS,
    TRUNCATION_STEP,
    EventLogBackend,
    LogRead,
    LogRecord,
    PartitionBounds,
    Position,
    check_offset,
    check_partition,
    check_truncation,
    decode_record,
    partition_for,
)
from .events import Event

SCHEMA_VERSION = 1
"""The layout of the log's own rows, kept in ``onward_log_meta``; the tables themselves come
from the SQLite migrations (``schemas/sqlite/0004_eventlog.sql``)."""


class SqliteEventLog(SqliteStore, EventLogBackend):
    """An `EventLog` in one SQLite file.

    Args:
        path: The database file; created if missing.
        partitions: Partition count. Fixed when the file is created; opening an existing file
            with a different count is a `ConfigurationError`.
        max_batch_bytes: Largest encoded batch accepted.
        migrate: Apply the SQLite migrations when opened (the default: embedded mode needs no
            setup). With ``False`` the file must already be migrated.
        readonly: Open the file read-only, for commands that only read (``onward inspect``,
            ``onward replay``): nothing is migrated, created or written, a missing file or one
            that is not an Onward database is a `ConfigurationError`, and appends fail.
    """

    dense = True

    embedded = True
    what = "event log"

    def __init__(
        self,
        path: str | Path,
        *,
        partitions: int = DEFAULT_PARTITIONS,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        migrate: bool = True,
        readonly: bool = False,
    ) -> None:
        EventLogBackend.__init__(self, partitions=partitions, max_batch_bytes=max_batch_bytes)
        SqliteStore.__init__(self, path, migrate=migrate, readonly=readonly)
        self._unwritten = False

    @property
    def path(self) -> Path:
        """The database file (other embedded stores, leases among them, may share it)."""
        return self._path

    def _open(self) -> sqlite3.Connection:
        """Open and migrate the file, then record or check the partition count."""
        conn = super()._open()
        try:
            self._create_or_check(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _create_or_check(self, conn: sqlite3.Connection) -> None:
        with transaction(conn, "BEGIN" if self._readonly else "BEGIN IMMEDIATE"):
            meta = dict(conn.execute("SELECT key, value FROM onward_log_meta").fetchall())
            if not meta and not self._readonly:
                conn.executemany(
                    "INSERT INTO onward_log_meta (key, value) VALUES (?, ?)",
                    [
                        ("schema_version", str(SCHEMA_VERSION)),
                        ("partitions", str(self._partitions)),
                    ],
                )
                conn.executemany(
                    "INSERT INTO onward_log_partition VALUES (?, 0, 0)",
                    [(p,) for p in range(self._partitions)],
                )
        if meta and int(meta["schema_version"]) != SCHEMA_VERSION:
            raise ConfigurationError(
                f"{self._path}: event log schema version {meta['schema_version']}, this code "
                f"reads {SCHEMA_VERSION}"
            )
        if meta and int(meta["partitions"]) != self._partitions:
            raise ConfigurationError(
                f"{self._path}: the log was created with {meta['partitions']} partitions, the "
                f"configuration says {self._partitions}; changing it would move runs between "
                "partitions, so configure the original count"
            )
        # Read-only, a migrated file no log was opened on yet holds no run; it is left as it
        # is. Set once the log found is checked: one refused is asked again at each read.
        self._unwritten = self._readonly and not meta

    async def append(self, events: Sequence[Event]) -> list[Position]:
        run_id, partition, encoded = self._prepare(events)
        rows = [pack(record) for record in encoded]
        conn = self._db.connection()

        def write() -> int:
            # Inside a group commit's transaction, which took the write lock first.
            (first,) = self._partition_row(conn, "next_offset", partition)
            conn.executemany(
                "INSERT INTO onward_log (partition, offset, run_id, record) VALUES (?,?,?,?)",
                [(partition, first + i, run_id, row) for i, row in enumerate(rows)],
            )
            conn.execute(
                "UPDATE onward_log_partition SET next_offset = ? WHERE partition = ?",
                (first + len(rows), partition),
            )
            return int(first)

        first = await self._db.write(write, f"appending to partition {partition}", run_id)
        return [Position(partition, first + i) for i in range(len(encoded))]

    async def _read_records(self, request: LogRead) -> list[LogRecord]:
        partition, start, end, run_id, limit = request

        def read(conn: sqlite3.Connection) -> tuple[int, list[tuple[int, str, object]]]:
            if self._still_unwritten(conn):
                return 0, []
            # One read transaction, so the start offset and the rows are one snapshot.
            with transaction(conn, "BEGIN"):
                (first,) = self._partition_row(conn, "start_offset", partition)
                low = first if start is None else start
                if low < first:
                    return first, []
                # As bytes: text another program bound that is not UTF-8 would make sqlite3
                # raise as it fetched the row, failing the read of the whole partition.
                query = (
                    "SELECT offset, run_id, CAST(record AS BLOB) FROM onward_log "
                    "WHERE partition = ?"
                )
                args: list[object] = [partition]
                if run_id is not None:
                    query += " AND run_id = ?"
                    args.append(run_id)
                query += " AND offset >= ?"
                args.append(low)
                if end is not None:
                    query += " AND offset < ?"
                    args.append(end)
                query += " ORDER BY offset"
                if limit is not None:
                    query += " LIMIT ?"
                    args.append(limit)
                return first, conn.execute(query, args).fetchall()

        first, rows = await self._db.read(read, f"reading partition {partition}", run_id)
        if start is not None and start < first:
            raise LogTruncatedError(
                f"partition {partition}: offset {start} was truncated; the partition starts at "
                f"{first}",
                run_id=run_id,
                partition=partition,
                offset=start,
                start=first,
            )
        return [
            decode_record(Position(partition, offset), unpack(_as_bytes(record)), run_hint=key)
            for offset, key, record in rows
        ]

    async def bounds(self, partition: int) -> PartitionBounds:
        check_partition(partition, self._partitions)

        def read(conn: sqlite3.Connection) -> tuple[int, int]:
            if self._still_unwritten(conn):
                return 0, 0
            row = self._partition_row(conn, "start_offset, next_offset", partition)
            return int(row[0]), int(row[1])

        start, end = await self._db.read(read, f"reading the bounds of partition {partition}")
        return PartitionBounds(start, end)

    def _still_unwritten(self, conn: sqlite3.Connection) -> bool:
        """Whether a read-only log opened on a file no log was created on still has none.

        Asked at each read, with the file as it is now: a reader opened while another process
        had the file open is never reopened (`SqliteThread`), so a log created since is found
        (and its partition count checked) here, or the reader would read nothing for good.
        """
        if self._unwritten:
            self._create_or_check(conn)
        return self._unwritten

    def _partition_row(
        self, conn: sqlite3.Connection, columns: str, partition: int
    ) -> tuple[int, ...]:
        """``columns`` of the partition's row; a file whose row was deleted is refused by name
        (as the PostgreSQL log refuses it), not failed on as a missing value."""
        row = conn.execute(
            f"SELECT {columns} FROM onward_log_partition WHERE partition = ?", (partition,)
        ).fetchone()
        if row is None:
            raise ConfigurationError(
                f"{self._path}: the event log has no row for partition {partition}: its tables "
                "were changed outside Onward"
            )
        return tuple(row)

    async def truncate_before(self, partition: int, offset: int) -> None:
        check_partition(partition, self._partitions)
        check_offset(partition, offset)
        conn = self._db.connection()

        def step() -> bool:
            """At most `TRUNCATION_STEP` records deleted and the start moved past them, so
            appends queued meanwhile commit between steps; whether the start reached
            ``offset``."""
            row = self._partition_row(conn, "start_offset, next_offset", partition)
            check_truncation(partition, offset, int(row[1]))
            start = int(row[0])
            if offset <= start:
                return True
            start = min(offset, start + TRUNCATION_STEP)
            conn.execute(
                "DELETE FROM onward_log WHERE partition = ? AND offset < ?", (partition, start)
            )
            conn.execute(
                "UPDATE onward_log_partition SET start_offset = ? WHERE partition = ?",
                (start, partition),
            )
            return start == offset

        while not await self._db.write(step, f"truncating partition {partition}"):
            pass

    def write_raw(self, run_id: str, record: bytes) -> Position:
        """Store a record as a foreign writer would, unchecked. For tests of bad input."""
        partition = partition_for(run_id, self._partitions)
        context = f"{self._path}: writing a raw record"
        with (
            translated(context, run_id=run_id),
            closing(connect(self._path)) as conn,
            transaction(conn),
        ):
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
        return Position(partition, int(offset))


def _as_bytes(record: object) -> bytes:
    """A stored record as bytes: SQLite keeps whatever type another program bound (JSON as
    text, a number), which reads as the event it holds or as an unreadable record, not as a
    crash of every read of its partition."""
    if isinstance(record, bytes):
        return record
    return str(record).encode()
