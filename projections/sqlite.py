"""`SqliteFrontierStore`: frontier rows, call rows and projector positions in one SQLite file.

The embedded backend of `FrontierStore`. It may share its file with `SqliteEventLog`, so a
single-machine deployment keeps the log and its projections in one file; the table names do not
collide. As in the log, all access goes through one connection on one dedicated thread, so the
event loop never blocks on disk and sqlite3 objects never cross threads.

A write lands in one ``BEGIN IMMEDIATE`` transaction with the projector's positions, which is
what lets a projector resume exactly once after a crash; it is group-committed with the other
writes of its connection (the log's appends, when the store shares the log's connection).
Every upsert is guarded by ``through_offset`` (positions by ``next_offset``), so a batch folded
twice changes nothing and a slow writer never moves a row or a position back.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Collection, Sequence
from typing import Any

import msgspec

from onward._storage import IN_CHUNK, SqliteStore, pack, select_in, transaction, unpack

from .base import (
    FrontierStoreBackend,
    FrontierWrite,
    QuarantineEntry,
    QuarantineState,
    RunSummary,
    Snapshot,
    StoredFrontier,
    check_runs_limit,
    decode_payload,
    released_mark,
)
from .frontier import RunStatus, ToolCallRow
from .transcript import TranscriptRow, decode_message

LOAD_CHUNK = IN_CHUNK
"""Run ids per ``IN (...)`` list: well under SQLite's bound-variable limit on any build."""

# The scalar columns carry the names of the fields they hold, so rows map to and from the
# dataclass and the struct by name; a field without a column fails loudly on first use.
_SUMMARY_COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RunSummary))
_FRONTIER_COLUMNS = (*_SUMMARY_COLUMNS, "payload", "snapshot_error")
_CALL_COLUMNS: tuple[str, ...] = tuple(f.name for f in msgspec.structs.fields(ToolCallRow))

_SELECT_FRONTIERS = f"SELECT {', '.join(_FRONTIER_COLUMNS)}, quarantined FROM onward_frontiers"
_SELECT_SUMMARIES = f"SELECT {', '.join(_SUMMARY_COLUMNS)} FROM onward_frontiers"
_SELECT_CALLS = (
    f"SELECT {', '.join(_CALL_COLUMNS)} FROM onward_tool_calls WHERE run_id = ? "
    "ORDER BY dispatched_at IS NULL, dispatched_at, call_id"
)
_UPSERT_POSITION = (
    "INSERT INTO onward_projector_positions (consumer, partition, next_offset) VALUES (?, ?, ?) "
    "ON CONFLICT(consumer, partition) DO UPDATE SET next_offset = excluded.next_offset "
    "WHERE onward_projector_positions.next_offset < excluded.next_offset"
)


def _guarded_upsert(table: str, columns: Sequence[str], key: Sequence[str]) -> str:
    """An insert that replaces an existing row only when it was folded through a later offset.

    The guard lives in the statement rather than in a read-then-write, so concurrent writers
    from other processes cannot interleave between the check and the update.
    """
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key)
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)}) "
        f"ON CONFLICT({', '.join(key)}) DO UPDATE SET {updates} "
        f"WHERE {table}.through_offset < excluded.through_offset"
    )


_UPSERT_FRONTIER = _guarded_upsert("onward_frontiers", _FRONTIER_COLUMNS, ("run_id",))

_QUARANTINE_COLUMNS: tuple[str, ...] = (
    "run_id",
    "tenant",
    "partition",
    "log_offset",
    "kind",
    "reason",
    "state",
    "quarantined_at",
    "released_by",
    "released_at",
)
_HOLD = (
    f"INSERT INTO onward_quarantine (consumer, {', '.join(_QUARANTINE_COLUMNS)}) "
    f"VALUES (?, {', '.join('?' for _ in _QUARANTINE_COLUMNS)}) "
    "ON CONFLICT(consumer, partition, log_offset) DO UPDATE SET run_id = excluded.run_id, "
    "tenant = excluded.tenant, kind = excluded.kind, reason = excluded.reason, state = 'held', "
    "quarantined_at = excluded.quarantined_at"
)
_HOLD_IF_HELD = f"{_HOLD} WHERE onward_quarantine.state = 'held'"
"""For an entry whose run the write does not fold again: one already stored is held again only
while held, so a projector that folded the record before a release and stores after it leaves
the released or cleared entry as it is."""
_MARK = (
    "UPDATE onward_frontiers SET quarantined = ? WHERE run_id = ? AND EXISTS (SELECT 1 FROM "
    "onward_quarantine WHERE consumer = ? AND partition = ? AND log_offset = ? AND state = 'held')"
)
_CLEAR = (
    "UPDATE onward_quarantine SET state = 'cleared' "
    "WHERE consumer = ? AND run_id = ? AND state = 'released'"
)
_UNMARK = "UPDATE onward_frontiers SET quarantined = NULL WHERE run_id = ?"


def _entry_params(consumer: str, entry: QuarantineEntry) -> tuple[Any, ...]:
    """The bound values of one quarantine row (the column ``log_offset`` holds ``offset``)."""
    return (
        consumer,
        *(getattr(entry, "offset" if c == "log_offset" else c) for c in _QUARANTINE_COLUMNS),
    )


def _entry(row: Sequence[Any]) -> QuarantineEntry:
    values = dict(zip(_QUARANTINE_COLUMNS, row, strict=True))
    values["offset"] = values.pop("log_offset")
    return QuarantineEntry(**values)


_UPSERT_CALL = _guarded_upsert("onward_tool_calls", _CALL_COLUMNS, ("run_id", "call_id"))
# Append-only: a row already stored under its key came from the same counted event.
_APPEND_MESSAGE = (
    "INSERT INTO onward_transcript (tenant, run_id, seq, message) VALUES (?, ?, ?, ?) "
    "ON CONFLICT(tenant, run_id, seq) DO NOTHING"
)
# A run begun again under a collected run's id: the old run's rows a fold stored go.
_DELETE_CALLS = "DELETE FROM onward_tool_calls WHERE run_id = ?"
_DELETE_TRANSCRIPT = "DELETE FROM onward_transcript WHERE tenant = ? AND run_id = ? AND seq <= ?"
_SELECT_TRANSCRIPT = (
    "SELECT seq, message FROM onward_transcript WHERE tenant = ? AND run_id = ? AND seq <= ? "
    "ORDER BY seq"
)


def _summary(row: Sequence[Any]) -> RunSummary:
    """A summary from the leading scalar columns of a row."""
    return RunSummary(**dict(zip(_SUMMARY_COLUMNS, row[: len(_SUMMARY_COLUMNS)], strict=True)))


def _stored(row: Sequence[Any]) -> StoredFrontier:
    """A stored frontier from a row of ``_SELECT_FRONTIERS``, decoding its payload if kept."""
    summary = _summary(row)
    payload, error, quarantined = row[len(_SUMMARY_COLUMNS) :]
    frontier = decode_payload(payload, run_id=summary.run_id) if payload is not None else None
    return StoredFrontier.of(summary, frontier, error, quarantined)


def _frontier_params(snapshot: Snapshot) -> tuple[Any, ...]:
    """The bound values of one frontier row, in ``_FRONTIER_COLUMNS`` order."""
    summary = RunSummary.of(snapshot.frontier)
    scalars = tuple(getattr(summary, column) for column in _SUMMARY_COLUMNS)
    return (*scalars, snapshot.payload, snapshot.error)


def _call_row(row: Sequence[Any]) -> ToolCallRow:
    """A call row from a row of ``_SELECT_CALLS``."""
    return ToolCallRow(**dict(zip(_CALL_COLUMNS, row, strict=True)))


class SqliteFrontierStore(SqliteStore, FrontierStoreBackend):
    """A `FrontierStore` in one SQLite file, possibly the event log's own.

    Args:
        path: The database file; created if missing.
        migrate: Apply the SQLite migrations on :meth:`start`, so embedded mode needs no setup.
            With ``False`` the file must already be migrated (``onward db migrate``), and a file
            that is not is refused rather than changed.
        lock_timeout_s: The longest the inline fold waits for another process's fold
            (`SqliteStore`).
    """

    what = "frontier store"

    async def load(self, run_ids: Collection[str]) -> dict[str, StoredFrontier]:
        """The stored rows of the given runs, read in one query per ``LOAD_CHUNK`` ids.

        A projector loads a whole batch's runs at once; a round trip per run is what this
        avoids.
        """
        ids = list(dict.fromkeys(run_ids))
        if not ids:
            return {}

        def read(conn: sqlite3.Connection) -> list[Any]:
            return select_in(conn, f"{_SELECT_FRONTIERS} WHERE run_id IN", ids)

        rows = await self._db.read(read, f"loading the frontiers of {len(ids)} runs")
        return {stored.summary.run_id: stored for stored in map(_stored, rows)}

    async def get(self, run_id: str) -> StoredFrontier | None:
        """The stored row of one run, or ``None`` if it has none."""

        def read(conn: sqlite3.Connection) -> Any:
            return conn.execute(f"{_SELECT_FRONTIERS} WHERE run_id = ?", (run_id,)).fetchone()

        row = await self._db.read(read, "reading a frontier", run_id)
        return None if row is None else _stored(row)

    async def _write(self, batch: FrontierWrite) -> None:
        """Upsert rows and move ``consumer``'s positions forward, all in one transaction.

        A frontier or call row replaces the stored one only if its ``through_offset`` is later,
        and a position only moves forward, so replaying a batch is harmless.

        Raises:
            BackendError: The write failed; nothing of it was stored.
        """
        consumer, positions, snapshots, calls = batch[:4]
        frontier_rows = [_frontier_params(snapshot) for snapshot in snapshots]
        call_rows = [msgspec.structs.astuple(call) for call in calls]
        position_rows = [(consumer, partition, offset) for partition, offset in positions.items()]
        clear_rows = [(consumer, run_id) for run_id in batch.cleared]
        refolded = set(batch.cleared)
        hold_rows = [
            (_HOLD if entry.run_id in refolded else _HOLD_IF_HELD, _entry_params(consumer, entry))
            for entry in batch.quarantine
        ]
        mark_rows = [
            (e.mark, e.run_id, consumer, e.partition, e.offset)
            for e in batch.quarantine
            if e.run_id is not None
        ]
        message_rows = [(m.tenant, m.run_id, m.seq, pack(m.encoded())) for m in batch.messages]
        restarted = list(batch.restarted)
        if not (
            frontier_rows
            or call_rows
            or position_rows
            or clear_rows
            or hold_rows
            or message_rows
            or restarted
        ):
            return
        conn = self._db.connection()

        def write() -> None:
            if restarted:
                conn.executemany(_DELETE_CALLS, sorted({(run_id,) for _, run_id, _ in restarted}))
                conn.executemany(_DELETE_TRANSCRIPT, restarted)
            if frontier_rows:
                conn.executemany(_UPSERT_FRONTIER, frontier_rows)
            if call_rows:
                conn.executemany(_UPSERT_CALL, call_rows)
            if clear_rows:
                conn.executemany(_CLEAR, clear_rows)
                conn.executemany(_UNMARK, [(run_id,) for _, run_id in clear_rows])
            if hold_rows:
                for statement, params in hold_rows:
                    conn.execute(statement, params)
                conn.executemany(_MARK, mark_rows)
            if position_rows:
                conn.executemany(_UPSERT_POSITION, position_rows)
            if message_rows:
                conn.executemany(_APPEND_MESSAGE, message_rows)

        await self._db.write(
            write,
            f"writing {len(frontier_rows)} frontiers, {len(call_rows)} call rows and "
            f"{len(position_rows)} positions of consumer {consumer!r}",
        )

    async def quarantined(
        self,
        consumer: str,
        *,
        run_id: str | None = None,
        states: Collection[QuarantineState] | None = None,
    ) -> list[QuarantineEntry]:
        """A consumer's quarantine entries, optionally of one run and some states, by position."""
        query = f"SELECT {', '.join(_QUARANTINE_COLUMNS)} FROM onward_quarantine WHERE consumer = ?"
        args: list[Any] = [consumer]
        if run_id is not None:
            query += " AND run_id = ?"
            args.append(run_id)
        if states is not None:
            wanted = list(dict.fromkeys(states))
            if not wanted:
                return []
            query += f" AND state IN ({', '.join('?' for _ in wanted)})"
            args.extend(wanted)
        query += " ORDER BY partition, log_offset"

        def read(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(query, args).fetchall()

        rows = await self._db.read(read, "listing quarantined records", run_id)
        return [_entry(row) for row in rows]

    async def release(self, consumer: str, run_id: str, *, by: str, at: int) -> int:
        """Release a run's held entries and clear its row's mark, in one transaction."""
        conn = self._db.connection()

        def write() -> int:
            with transaction(conn, "BEGIN IMMEDIATE"):
                released = conn.execute(
                    "UPDATE onward_quarantine SET state = 'released', released_by = ?, "
                    "released_at = ? WHERE consumer = ? AND run_id = ? AND state = 'held'",
                    (by, at, consumer, run_id),
                ).rowcount
                if released:
                    conn.execute(
                        "UPDATE onward_frontiers SET quarantined = ? WHERE run_id = ?",
                        (released_mark(by), run_id),
                    )
            return int(released)

        return await self._db.call(write, "releasing a quarantined run", run_id)

    async def dismiss(self, consumer: str, partition: int, offset: int, *, by: str, at: int) -> int:
        """Mark the held entry at the position that names no run cleared, by ``by``."""
        conn = self._db.connection()

        def write() -> int:
            with transaction(conn, "BEGIN IMMEDIATE"):
                return int(
                    conn.execute(
                        "UPDATE onward_quarantine SET state = 'cleared', released_by = ?, "
                        "released_at = ? WHERE consumer = ? AND partition = ? AND log_offset = ? "
                        "AND run_id IS NULL AND state = 'held'",
                        (by, at, consumer, partition, offset),
                    ).rowcount
                )

        return await self._db.call(write, "dismissing a quarantined record")

    async def transcript(self, run_id: str, *, tenant: str, through: int) -> list[TranscriptRow]:
        """The transcript rows of one run with seq at most ``through``, by seq."""

        def read(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(_SELECT_TRANSCRIPT, (tenant, run_id, through)).fetchall()

        rows = await self._db.read(read, "reading the transcript", run_id)
        return [
            TranscriptRow(
                tenant=tenant, run_id=run_id, seq=seq, message=decode_message(unpack(body))
            )
            for seq, body in rows
        ]

    async def positions(self, consumer: str) -> dict[int, int]:
        """The next offset per partition stored for a consumer."""

        def read(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(
                "SELECT partition, next_offset FROM onward_projector_positions WHERE consumer = ?",
                (consumer,),
            ).fetchall()

        rows = await self._db.read(read, f"reading the positions of consumer {consumer!r}")
        return {int(partition): int(offset) for partition, offset in rows}

    async def tool_calls(self, run_id: str) -> list[ToolCallRow]:
        """The audit rows of one run's calls: dispatched ones by time, then the rest, by id."""

        def read(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(_SELECT_CALLS, (run_id,)).fetchall()

        rows = await self._db.read(read, "reading tool call rows", run_id)
        return [_call_row(row) for row in rows]

    async def runs(
        self,
        *,
        tenant: str | None = None,
        statuses: Collection[RunStatus] | None = None,
        user: str | None = None,
        agent: str | None = None,
        updated_before: int | None = None,
        after: str | None = None,
        limit: int | None = None,
    ) -> list[RunSummary]:
        """Summaries of runs, filtered and a page at a time (`FrontierStore.runs`), by run id."""
        check_runs_limit(limit)
        conditions: list[str] = []
        args: list[str | int] = []
        for condition, value in (
            ("tenant = ?", tenant),
            ("user_id = ?", user),
            ("agent = ?", agent),
            ("updated_at < ?", updated_before),
            ("run_id > ?", after),
        ):
            if value is not None:
                conditions.append(condition)
                args.append(value)
        if statuses is not None:
            wanted = list(dict.fromkeys(statuses))
            if not wanted:
                return []
            conditions.append(f"status IN ({', '.join('?' for _ in wanted)})")
            args.extend(wanted)
        query = _SELECT_SUMMARIES
        if conditions:
            query += " WHERE " + " AND ".join(conditions)
        query += " ORDER BY run_id"
        if limit is not None:
            query += " LIMIT ?"
            args.append(limit)

        def read(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(query, args).fetchall()

        rows = await self._db.read(read, "listing runs")
        return [_summary(row) for row in rows]
