"""`SqliteCompactionStore`: compaction's rows in the embedded SQLite file.

It shares the file (and, given ``sharing``, the connection and thread) of the event log and the
frontier store, so a truncation point and the retained events land in one ``BEGIN IMMEDIATE``
transaction, and the projectors' positions are read from the frontier store's own table.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Collection, Sequence
from typing import Any

from onward._storage import SqliteStore, select_in, transaction
from onward.eventlog.base import EventLog
from onward.eventlog.sqlite import SqliteEventLog
from onward.projections.base import decode_payload, encode_frontier
from onward.projections.frontier import Frontier

from .base import (
    LogCut,
    RetainedEvent,
    RunTruncation,
    TagPin,
    UnretainedPinsError,
    refuse_compacted,
)

_TRUNCATE = (
    "INSERT INTO onward_run_truncation "
    "(run_id, tenant, partition, before_seq, before_offset, compacted_at, whole, fence) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(run_id) DO UPDATE SET "
    "before_seq = excluded.before_seq, before_offset = excluded.before_offset, "
    "compacted_at = excluded.compacted_at, whole = excluded.whole, fence = excluded.fence "
    "WHERE onward_run_truncation.before_seq < excluded.before_seq"
)
_RETAIN = (
    "INSERT INTO onward_retained_events "
    "(run_id, seq, tenant, partition, log_offset, record, kept_as) "
    "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(run_id, seq) DO UPDATE SET "
    "kept_as = excluded.kept_as WHERE onward_retained_events.kept_as = 'checkpoint'"
)
# The pins below a run's new point (the run id and its new point bound twice each, per run).
_UNRETAINED_PINS = (
    "SELECT p.run_id, p.seq FROM onward_tag_pins p WHERE p.run_id = ? AND p.seq < ? "
    "AND NOT EXISTS (SELECT 1 FROM onward_retained_events r "
    "WHERE r.run_id = p.run_id AND r.seq = p.seq)"
)
_COLLECTED_SINCE = "SELECT 1 FROM onward_run_tombstones WHERE run_id = ? AND collected_at >= ?"
"""Whether garbage collection removed the run since a pass planned its point (the point's
``at``): the pass must then write nothing of it, or its rows would outlive the run, and a run
given its id later would start from the collected run's point."""
_SNAPSHOT = (
    "INSERT INTO onward_run_snapshots (run_id, tenant, through_offset, payload) "
    "VALUES (?, ?, ?, ?) ON CONFLICT(run_id) DO UPDATE SET "
    "through_offset = excluded.through_offset, payload = excluded.payload "
    "WHERE onward_run_snapshots.through_offset < excluded.through_offset"
)
_PRUNE_CHECKPOINTS = (
    "DELETE FROM onward_retained_events WHERE run_id = ? AND kept_as = 'checkpoint' AND seq < "
    "COALESCE((SELECT min(seq) FROM (SELECT seq FROM onward_retained_events "
    "WHERE run_id = ? AND kept_as = 'checkpoint' ORDER BY seq DESC LIMIT ?)), 0)"
)
_CUT = (
    "INSERT INTO onward_log_cuts (partition, start_offset, end_offset, events, archive, cut_at) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(partition, start_offset) DO UPDATE SET "
    "end_offset = excluded.end_offset, events = excluded.events, archive = excluded.archive, "
    "cut_at = excluded.cut_at WHERE onward_log_cuts.end_offset < excluded.end_offset"
)


class SqliteCompactionStore(SqliteStore):
    """A `CompactionStore` in one SQLite file (see `SqliteStore` for the arguments)."""

    what = "compaction store"

    async def _chunked(self, query: str, run_ids: Collection[str], context: str) -> list[Any]:
        """Rows of ``query`` (which ends in ``run_id IN``) for every run id, in one snapshot."""
        ids = list(dict.fromkeys(run_ids))
        if not ids:
            return []
        return await self._db.read(lambda conn: select_in(conn, query, ids), context)

    async def truncations(self, run_ids: Collection[str]) -> dict[str, RunTruncation]:
        rows = await self._chunked(
            "SELECT tenant, run_id, partition, before_seq, before_offset, compacted_at, whole, "
            "fence FROM onward_run_truncation WHERE run_id IN",
            run_ids,
            "reading truncation points",
        )
        return {row[1]: _truncation(row) for row in rows}

    async def truncate(
        self,
        truncations: Sequence[RunTruncation],
        retained: Sequence[RetainedEvent],
        *,
        checkpoints: int | None = None,
    ) -> list[TagPin]:
        points = [
            (
                t.run_id,
                t.tenant,
                t.partition,
                t.before_seq,
                t.before_offset,
                t.at,
                int(t.whole),
                t.fence,
            )
            for t in truncations
        ]
        kept = [
            (e.run_id, e.seq, e.tenant, e.partition, e.offset, e.record, e.kept_as)
            for e in retained
        ]
        if not points and not kept:
            return []
        conn = self._db.connection()

        def write() -> list[TagPin]:
            # BEGIN IMMEDIATE takes the file's write lock: a `pin` is wholly before or after.
            try:
                with transaction(conn, "BEGIN IMMEDIATE"):
                    gone = {
                        t.run_id
                        for t in truncations
                        if conn.execute(_COLLECTED_SINCE, (t.run_id, t.at)).fetchone()
                    }
                    conn.executemany(_RETAIN, [k for k in kept if k[0] not in gone])
                    moved = [t for t in truncations if t.run_id not in gone]
                    missing = [
                        TagPin(run_id, seq)
                        for t in moved
                        for run_id, seq in conn.execute(
                            _UNRETAINED_PINS, (t.run_id, t.before_seq)
                        ).fetchall()
                    ]
                    if missing:
                        raise UnretainedPinsError(missing)  # noqa: TRY301 - rolls it back
                    conn.executemany(_TRUNCATE, [p for p in points if p[0] not in gone])
                    if checkpoints is not None:
                        conn.executemany(
                            _PRUNE_CHECKPOINTS,
                            [(t.run_id, t.run_id, checkpoints) for t in moved],
                        )
            except UnretainedPinsError as rolled_back:
                return rolled_back.pins
            return []

        return await self._db.call(
            write, f"storing {len(points)} truncation points and {len(kept)} retained events"
        )

    async def pin(self, run_id: str, tenant: str, seq: int) -> None:
        conn = self._db.connection()

        def write() -> None:
            with transaction(conn, "BEGIN IMMEDIATE"):
                row = conn.execute(
                    "SELECT tenant, run_id, partition, before_seq, before_offset, compacted_at, "
                    "whole, fence FROM onward_run_truncation WHERE run_id = ?",
                    (run_id,),
                ).fetchone()
                held = conn.execute(
                    "SELECT 1 FROM onward_retained_events WHERE run_id = ? AND seq = ?",
                    (run_id, seq),
                ).fetchall()
                refuse_compacted(run_id, seq, _truncation(row) if row else None, [seq] * len(held))
                conn.execute(
                    "INSERT INTO onward_tag_pins (run_id, seq, tenant, pinned_at) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT(run_id, seq) DO NOTHING",
                    (run_id, seq, tenant, time.time_ns() // 1_000),
                )
                conn.execute(
                    "UPDATE onward_retained_events SET kept_as = 'tag' "
                    "WHERE run_id = ? AND seq = ? AND kept_as = 'checkpoint'",
                    (run_id, seq),
                )

        await self._db.call(write, f"pinning seq {seq} for a tag", run_id)

    async def pins(self, run_ids: Collection[str]) -> dict[str, set[int]]:
        rows = await self._chunked(
            "SELECT run_id, seq FROM onward_tag_pins WHERE run_id IN", run_ids, "reading tag pins"
        )
        found: dict[str, set[int]] = {}
        for run_id, seq in rows:
            found.setdefault(run_id, set()).add(int(seq))
        return found

    async def put_snapshots(self, frontiers: Sequence[Frontier]) -> None:
        rows = [(f.run_id, f.tenant, f.through_offset, encode_frontier(f)) for f in frontiers]
        if not rows:
            return
        conn = self._db.connection()

        def write() -> None:
            with transaction(conn, "BEGIN IMMEDIATE"):
                conn.executemany(_SNAPSHOT, rows)

        await self._db.call(write, f"storing {len(rows)} frontiers over the row's cap")

    async def snapshots(self, run_ids: Collection[str]) -> dict[str, Frontier]:
        rows = await self._chunked(
            "SELECT run_id, payload FROM onward_run_snapshots WHERE run_id IN",
            run_ids,
            "reading frontiers over the row's cap",
        )
        return {row[0]: decode_payload(bytes(row[1]), run_id=row[0]) for row in rows}

    async def tombstones(self, run_ids: Collection[str]) -> set[str]:
        rows = await self._chunked(
            "SELECT run_id FROM onward_run_tombstones WHERE run_id IN",
            run_ids,
            "reading tombstones",
        )
        return {row[0] for row in rows}

    async def retained(self, run_id: str) -> list[RetainedEvent]:
        def read(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(
                "SELECT tenant, run_id, seq, partition, log_offset, record, kept_as "
                "FROM onward_retained_events WHERE run_id = ? ORDER BY seq",
                (run_id,),
            ).fetchall()

        rows = await self._db.read(read, "reading retained events", run_id)
        return [
            RetainedEvent(
                tenant=r[0],
                run_id=r[1],
                seq=r[2],
                partition=r[3],
                offset=r[4],
                record=bytes(r[5]),
                kept_as=r[6],
            )
            for r in rows
        ]

    async def retained_seqs(self, run_ids: Collection[str]) -> dict[str, set[int]]:
        rows = await self._chunked(
            "SELECT run_id, seq FROM onward_retained_events WHERE run_id IN",
            run_ids,
            "reading retained seqs",
        )
        found: dict[str, set[int]] = {}
        for run_id, seq in rows:
            found.setdefault(run_id, set()).add(int(seq))
        return found

    async def positions(self) -> dict[str, dict[int, int]]:
        def read(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(
                "SELECT consumer, partition, next_offset FROM onward_projector_positions"
            ).fetchall()

        found: dict[str, dict[int, int]] = {}
        for consumer, partition, offset in await self._db.read(read, "reading positions"):
            found.setdefault(consumer, {})[int(partition)] = int(offset)
        return found

    async def record_cut(self, cut: LogCut) -> None:
        conn = self._db.connection()

        def write() -> None:
            with transaction(conn, "BEGIN IMMEDIATE"):
                conn.execute(
                    _CUT, (cut.partition, cut.start, cut.end, cut.events, cut.archive, cut.at)
                )

        await self._db.call(write, f"recording a cut of partition {cut.partition}")

    async def cuts(self, partition: int | None = None) -> list[LogCut]:
        def read(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(
                "SELECT partition, start_offset, end_offset, events, archive, cut_at "
                "FROM onward_log_cuts WHERE ? IS NULL OR partition = ? "
                "ORDER BY partition, start_offset",
                (partition, partition),
            ).fetchall()

        rows = await self._db.read(read, "reading recorded cuts")
        return [
            LogCut(partition=r[0], start=r[1], end=r[2], events=r[3], archive=r[4], at=r[5])
            for r in rows
        ]


def _truncation(row: Sequence[Any]) -> RunTruncation:
    return RunTruncation(
        tenant=row[0],
        run_id=row[1],
        partition=row[2],
        before_seq=row[3],
        before_offset=row[4],
        at=row[5],
        whole=bool(row[6]),
        fence=row[7],
    )


def embedded_compaction(log: EventLog) -> SqliteCompactionStore | None:
    """The compaction store of an embedded SQLite log: in its file, on its connection (open
    and closed with it). ``None`` for any other log, whose compaction store must be named."""
    if isinstance(log, SqliteEventLog):
        return SqliteCompactionStore(log.path, sharing=log)
    return None
