"""`PostgresEventLog`: the event log in PostgreSQL, for a deployment with PostgreSQL and no Kafka.

The same partitions, placement and offset semantics as the other logs. An append is one
statement: it raises its partition's ``next_offset`` (taking that row's lock until it commits)
and inserts the batch's rows at the offsets it allocated. Appenders of one partition, in any
number of processes, therefore commit one after another in offset order: offsets stay dense, a
batch's rows are contiguous, and a reader that sees a partition's end sees every row below it.
A batch is one transaction, so a process killed mid-append leaves it whole or absent, and a
returned append has reached PostgreSQL's WAL on disk (``synchronous_commit`` as the server has
it; ``on`` by default).

Records are stored packed, as in the SQLite file (`onward._storage.packing`: deflated against a
dictionary of the JSON they repeat), on a log whose ``onward_log_meta`` says ``records = packed``:
every log created by this version, and an older one once `PostgresEventLog.pack_records` (``onward
db pack-records``) has been run, which is safe once no process of an earlier version reads it (one
would take a packed record for an unreadable one). Every process reads both kinds of row, so a
log written plain before, or by a foreign writer, reads as it was stored.

The tables come from ``onward db migrate`` (``schemas/sql/0013_eventlog.sql``); the first log
opened on a schema records its partition count there, and every later one must agree.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from onward._storage import BACKEND_TIMEOUT_S, PostgresStore, pack, unpack
from onward.errors import ConfigurationError, InvalidInputError, LogTruncatedError

from .base import (
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_PARTITIONS,
    MOST_RECORDS_LOOKED_THROUGH,
    TRUNCATION_STEP,
    Appended,
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

if TYPE_CHECKING:
    import asyncpg

SCHEMA_VERSION = 1
"""The layout of the log's own rows, kept in ``onward_log_meta``."""

PACKED_RECORDS = ("records", "packed")
"""The ``onward_log_meta`` row of a log whose records are written packed."""

_APPEND = """
WITH allocated AS (
    UPDATE onward_log_partition SET next_offset = next_offset + cardinality($3::bytea[])
    WHERE partition = $1
    RETURNING next_offset - cardinality($3::bytea[]) AS first
), stored AS (
    INSERT INTO onward_log (partition, log_offset, run_id, record)
    SELECT $1, allocated.first + batch.ordinality - 1, $2, batch.record
    FROM allocated, unnest($3::bytea[]) WITH ORDINALITY AS batch (record, ordinality)
)
SELECT first FROM allocated
"""
"""One statement, so one transaction and one round trip: the partition row's lock, taken by the
UPDATE, is held until the rows are committed, so the next appender of the partition allocates
after them."""


def _read_query(run_id: bool, end: bool, limit: bool) -> str:
    """The read of one partition's rows beside its start offset, in one statement (one snapshot).

    Parameters: $1 partition, $2 first offset (``NULL``: the partition's start), then the run id,
    the end and the limit when asked for. One text per combination, so each is planned with the
    index that fits it (by run, or by offset).
    """
    filters = ["partition = p.partition", "log_offset >= coalesce($2::bigint, p.start_offset)"]
    tail = ""
    number = 3
    if run_id:
        filters.append(f"run_id = ${number}")
        number += 1
    if end:
        filters.append(f"log_offset < ${number}")
        number += 1
    if limit:
        tail = f" LIMIT ${number}"
    return (
        "SELECT p.start_offset, r.log_offset, r.run_id, r.record "
        "FROM onward_log_partition p LEFT JOIN LATERAL ("
        "SELECT log_offset, run_id, record FROM onward_log "
        f"WHERE {' AND '.join(filters)} ORDER BY log_offset{tail}"
        ") r ON true WHERE p.partition = $1 ORDER BY r.log_offset"
    )


_READS = {
    (run_id, end, limit): _read_query(run_id, end, limit)
    for run_id in (False, True)
    for end in (False, True)
    for limit in (False, True)
}


async def mark_records_packed(conn: asyncpg.Connection) -> bool | None:
    """Mark the log on ``conn``'s schema as one whose records are written packed: True if
    marked now, False if it was already, ``None`` if no log was opened on the schema yet (the
    first one opened marks it)."""
    async with conn.transaction():
        if not await conn.fetchval("SELECT 1 FROM onward_log_meta WHERE key = 'schema_version'"):
            return None
        added = await conn.fetchval(
            "INSERT INTO onward_log_meta (key, value) VALUES ($1, $2) "
            "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value "
            "WHERE onward_log_meta.value IS DISTINCT FROM EXCLUDED.value RETURNING true",
            *PACKED_RECORDS,
        )
    return bool(added)


class PostgresEventLog(PostgresStore, EventLogBackend):
    """An `EventLog` in PostgreSQL tables.

    Args:
        dsn: ``postgresql://user:password@host:port/database``.
        schema: The PostgreSQL schema holding Onward's tables; ``None`` for the search path.
            The tables come from ``onward db migrate``.
        partitions: Partition count. Fixed when the first log is opened on the schema; opening
            it with a different count is a `ConfigurationError`.
        max_batch_bytes: Largest encoded batch accepted.
        min_size: Smallest connection pool.
        max_size: Largest connection pool: how many appends and reads run at once.
        timeout_s: The longest a connection attempt, a wait for a pooled connection or one
            statement may take before it fails with `BackendUnavailableError`.
    """

    dense = True

    what = "PostgreSQL event log"

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        partitions: int = DEFAULT_PARTITIONS,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        min_size: int = 1,
        max_size: int = 10,
        timeout_s: float | None = BACKEND_TIMEOUT_S,
    ) -> None:
        EventLogBackend.__init__(self, partitions=partitions, max_batch_bytes=max_batch_bytes)
        PostgresStore.__init__(
            self, dsn, schema=schema, min_size=min_size, max_size=max_size, timeout_s=timeout_s
        )
        self.packs_records = False
        """Whether this log writes records packed: its meta said so when it was opened (or
        `pack_records` was called on it)."""

    async def _started(self) -> None:
        """Record the partition count on a schema no log was opened on yet, or check it."""
        async with self._connection("opening the event log", transaction=True) as conn:
            meta = await self._meta(conn)
            if not meta:
                # One creator at a time: a second one waits here, then finds the first's rows.
                await conn.execute("LOCK TABLE onward_log_meta IN SHARE ROW EXCLUSIVE MODE")
                meta = await self._meta(conn)
            if not meta:
                await conn.executemany(
                    "INSERT INTO onward_log_meta (key, value) VALUES ($1, $2)",
                    [
                        ("schema_version", str(SCHEMA_VERSION)),
                        ("partitions", str(self.partitions)),
                        PACKED_RECORDS,
                    ],
                )
                await conn.execute(
                    "INSERT INTO onward_log_partition (partition, start_offset, next_offset) "
                    "SELECT p, 0, 0 FROM generate_series(0, $1 - 1) AS p",
                    self.partitions,
                )
                self.packs_records = True
                return
        self.packs_records = meta.get(PACKED_RECORDS[0]) == PACKED_RECORDS[1]
        where = f"schema {self._schema!r}" if self._schema else "the database"
        if int(meta["schema_version"]) != SCHEMA_VERSION:
            raise ConfigurationError(
                f"{where}: event log schema version {meta['schema_version']}, this code reads "
                f"{SCHEMA_VERSION}"
            )
        if int(meta["partitions"]) != self.partitions:
            raise ConfigurationError(
                f"{where}: the event log was created with {meta['partitions']} partitions, the "
                f"configuration says {self.partitions}; changing it would move runs between "
                "partitions, so configure the original count"
            )

    async def pack_records(self) -> bool:
        """Write records packed from now on, in this log and in every one opened on its schema
        after this; whether that is new (False: the log packed them already). Rows stored
        before stay as they are. Call it once no process of a version that cannot read packed
        records reads this log: processes opened before it keep writing plain records until
        they are opened again, and every reader reads both."""
        async with self._connection("packing the event log's records") as conn:
            added = await mark_records_packed(conn)
        self.packs_records = True
        return bool(added)

    @staticmethod
    async def _meta(conn: asyncpg.Connection) -> dict[str, str]:
        rows = await conn.fetch("SELECT key, value FROM onward_log_meta")
        return {row["key"]: row["value"] for row in rows}

    async def append(self, events: Sequence[Event]) -> list[Position]:
        run_id, partition, encoded = self._prepare(events)
        rows = [pack(record) for record in encoded] if self.packs_records else encoded
        async with self._connection(f"appending to partition {partition}", run_id) as conn:
            first = await conn.fetchval(_APPEND, partition, run_id, rows)
        if first is None:
            raise self._missing(partition)
        return [Position(partition, first + i) for i in range(len(encoded))]

    def _missing(self, partition: int) -> ConfigurationError:
        return ConfigurationError(
            f"the {self.what} has no row for partition {partition}: its tables were changed "
            "outside Onward"
        )

    async def _read_records(self, request: LogRead) -> list[LogRecord]:
        partition, start, end, run_id, limit = request
        args: list[object] = [partition, start]
        args.extend(value for value in (run_id, end, limit) if value is not None)
        query = _READS[(run_id is not None, end is not None, limit is not None)]
        async with self._connection(f"reading partition {partition}", run_id) as conn:
            rows = await conn.fetch(query, *args)
        if not rows:
            raise self._missing(partition)
        first = rows[0]["start_offset"]
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
            decode_record(
                Position(partition, row["log_offset"]),
                unpack(row["record"]),
                run_hint=row["run_id"],
            )
            for row in rows
            if row["log_offset"] is not None  # a partition with nothing in range: no row joined
        ]

    async def bounds(self, partition: int) -> PartitionBounds:
        check_partition(partition, self.partitions)
        async with self._connection(f"reading the bounds of partition {partition}") as conn:
            row = await conn.fetchrow(
                "SELECT start_offset, next_offset FROM onward_log_partition WHERE partition = $1",
                partition,
            )
        if row is None:
            raise self._missing(partition)
        return PartitionBounds(row["start_offset"], row["next_offset"])

    async def ends(self, partitions: Collection[int]) -> dict[int, int]:
        wanted = self._checked_partitions(partitions)
        async with self._connection("reading the ends of partitions") as conn:
            rows = await conn.fetch(
                "SELECT partition, next_offset FROM onward_log_partition "
                "WHERE partition = ANY($1::int[])",
                wanted,
            )
        found = {int(row["partition"]): int(row["next_offset"]) for row in rows}
        for partition in wanted:
            if partition not in found:
                raise self._missing(partition)
        return found

    async def runs_appended(
        self, since: Mapping[int, int], *, most: int = MOST_RECORDS_LOOKED_THROUGH
    ) -> dict[int, Appended]:
        wanted = self._checked_partitions(since)
        async with self._connection("reading the runs appended to partitions") as conn:
            rows = await conn.fetch(
                "SELECT p.partition, p.next_offset, CASE WHEN p.next_offset - s.since > $3 "
                "THEN NULL ELSE ARRAY(SELECT DISTINCT l.run_id FROM onward_log l "
                "WHERE l.partition = p.partition AND l.log_offset >= s.since "
                "AND l.log_offset < p.next_offset) END AS runs "
                "FROM unnest($1::int[], $2::bigint[]) AS s(partition, since) "
                "JOIN onward_log_partition p ON p.partition = s.partition",
                wanted,
                [since[p] for p in wanted],
                most,
            )
        found = {
            int(row["partition"]): Appended(
                int(row["next_offset"]), None if row["runs"] is None else frozenset(row["runs"])
            )
            for row in rows
        }
        for partition in wanted:
            if partition not in found:
                raise self._missing(partition)
        return found

    async def truncate_before(self, partition: int, offset: int) -> None:
        check_partition(partition, self.partitions)
        check_offset(partition, offset)
        context = f"truncating partition {partition}"
        while not await self._truncation_step(partition, offset, context):
            pass

    async def _truncation_step(self, partition: int, offset: int, context: str) -> bool:
        """Delete at most `TRUNCATION_STEP` records below ``offset`` and move the start past
        them, in one transaction; whether the start has reached ``offset``."""
        async with self._connection(context, transaction=True) as conn:
            row = await conn.fetchrow(
                "SELECT start_offset, next_offset FROM onward_log_partition "
                "WHERE partition = $1 FOR UPDATE",
                partition,
            )
            if row is None:
                raise self._missing(partition)
            check_truncation(partition, offset, row["next_offset"])
            start = int(row["start_offset"])
            if offset <= start:
                return True
            start = min(offset, start + TRUNCATION_STEP)
            await conn.execute(
                "DELETE FROM onward_log WHERE partition = $1 AND log_offset < $2",
                partition,
                start,
            )
            await conn.execute(
                "UPDATE onward_log_partition SET start_offset = $2 WHERE partition = $1",
                partition,
                start,
            )
            return start == offset

    async def write_raw(self, run_id: str, record: bytes) -> Position:
        """Store a record as a foreign writer would, unchecked. For tests of bad input."""
        if not run_id:
            raise InvalidInputError("a raw record needs a run id to place it")
        partition = partition_for(run_id, self.partitions)
        async with self._connection("writing a raw record", run_id) as conn:
            first = await conn.fetchval(_APPEND, partition, run_id, [record])
        if first is None:
            raise self._missing(partition)
        return Position(partition, first)
