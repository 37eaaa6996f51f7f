"""`PostgresCompactionStore`: compaction's rows in PostgreSQL, beside the frontier builds.

The truncation points and retained events are not per build: a rebuild of the frontiers
projection folds the same runs, and their compacted prefixes stay compacted. A projector's
position counts while its build is live; a retired build's positions are never read again.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from onward._storage import PostgresStore
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

if TYPE_CHECKING:
    import asyncpg

# Each table's columns with their types, as `_insert` takes them.
_RETAINED = (
    "run_id text, seq bigint, tenant text, partition int, log_offset bigint, record bytea, "
    "kept_as text"
)
_TRUNCATION = (
    "run_id text, tenant text, partition int, before_seq bigint, before_offset bigint, "
    "compacted_at bigint, whole boolean, fence bigint"
)
_KEEP_RETAINED = (
    "ON CONFLICT (run_id, seq) DO UPDATE SET kept_as = excluded.kept_as "
    "WHERE onward_retained_events.kept_as = 'checkpoint'"
)
_MOVE_FORWARD = (
    "ON CONFLICT (run_id) DO UPDATE SET before_seq = excluded.before_seq, "
    "before_offset = excluded.before_offset, compacted_at = excluded.compacted_at, "
    "whole = excluded.whole, fence = excluded.fence "
    "WHERE onward_run_truncation.before_seq < excluded.before_seq"
)
# The pins below each run's new point whose event no copy holds ($1 run ids, $2 new points).
_UNRETAINED_PINS = (
    "SELECT p.run_id, p.seq FROM onward_tag_pins p "
    "JOIN unnest($1::text[], $2::bigint[]) AS t(run_id, before_seq) USING (run_id) "
    "WHERE p.seq < t.before_seq AND NOT EXISTS (SELECT 1 FROM onward_retained_events r "
    "WHERE r.run_id = p.run_id AND r.seq = p.seq) ORDER BY p.run_id, p.seq"
)
# A run's `checkpoint` copies beyond its latest $2 ($1: the runs).
_PRUNE_CHECKPOINTS = (
    "DELETE FROM onward_retained_events r USING (SELECT run_id, seq, row_number() OVER "
    "(PARTITION BY run_id ORDER BY seq DESC) AS n FROM onward_retained_events "
    "WHERE run_id = ANY($1::text[]) AND kept_as = 'checkpoint') AS old "
    "WHERE r.run_id = old.run_id AND r.seq = old.seq AND old.n > $2"
)
# The runs of $1 garbage collection removed at or after their point's $2 (``at``).
_COLLECTED_SINCE = (
    "SELECT t.run_id FROM onward_run_tombstones t "
    "JOIN unnest($1::text[], $2::bigint[]) AS p(run_id, at) USING (run_id) "
    "WHERE t.collected_at >= p.at"
)
_TRUNCATION_COLUMNS = (
    "tenant, run_id, partition, before_seq, before_offset, compacted_at AS at, whole, fence"
)


async def _insert(
    conn: asyncpg.Connection,
    table: str,
    columns: str,
    rows: Sequence[tuple[Any, ...]],
    conflict: str,
) -> None:
    """Insert many rows in one statement: one array per column, unnested. ``columns`` names
    each column with its type (``"run_id text, seq bigint"``)."""
    named = [column.split() for column in columns.split(", ")]
    arrays = ", ".join(f"${n}::{kind}[]" for n, (_, kind) in enumerate(named, 1))
    names = ", ".join(name for name, _ in named)
    await conn.execute(
        f"INSERT INTO {table} ({names}) SELECT * FROM unnest({arrays}) {conflict}",
        *(list(column) for column in zip(*rows, strict=True)),
    )


class PostgresCompactionStore(PostgresStore):
    """A `CompactionStore` in PostgreSQL (see `PostgresStore` for the arguments)."""

    what = "PostgreSQL compaction store"

    async def truncations(self, run_ids: Collection[str]) -> dict[str, RunTruncation]:
        async with self._connection("reading truncation points") as conn:
            rows = await conn.fetch(
                f"SELECT {_TRUNCATION_COLUMNS} FROM onward_run_truncation "
                "WHERE run_id = ANY($1::text[])",
                list(run_ids),
            )
        return {r["run_id"]: RunTruncation(**dict(r)) for r in rows}

    async def truncate(
        self,
        truncations: Sequence[RunTruncation],
        retained: Sequence[RetainedEvent],
        *,
        checkpoints: int | None = None,
    ) -> list[TagPin]:
        if not truncations and not retained:
            return []
        retained_rows = [
            (e.run_id, e.seq, e.tenant, e.partition, e.offset, e.record, e.kept_as)
            for e in retained
        ]
        points = [
            (
                t.run_id,
                t.tenant,
                t.partition,
                t.before_seq,
                t.before_offset,
                t.at,
                t.whole,
                t.fence,
            )
            for t in truncations
        ]
        context = f"storing {len(truncations)} truncation points"
        try:
            async with self._connection(context, transaction=True) as conn:
                # A `pin` inserts first and then reads the point: SHARE mode waits for pins in
                # flight to commit and holds new ones back until this transaction ends, so
                # every tag either is seen here or sees the new point.
                await conn.execute("LOCK TABLE onward_tag_pins IN SHARE MODE")
                # A run garbage collection removed since the pass planned its point (which
                # waits for this lock too, `PostgresRecordSweeper`) keeps nothing: its rows
                # would outlive it, and a run given its id later would start from its point.
                gone = {
                    r["run_id"]
                    for r in await conn.fetch(
                        _COLLECTED_SINCE,
                        [t.run_id for t in truncations],
                        [t.at for t in truncations],
                    )
                }
                if gone:
                    truncations = [t for t in truncations if t.run_id not in gone]
                    points = [p for p in points if p[0] not in gone]
                    retained_rows = [r for r in retained_rows if r[0] not in gone]
                # Retained events first: a point never moves past a tagged event not copied.
                if retained_rows:
                    await _insert(
                        conn, "onward_retained_events", _RETAINED, retained_rows, _KEEP_RETAINED
                    )
                missing = await conn.fetch(
                    _UNRETAINED_PINS,
                    [t.run_id for t in truncations],
                    [t.before_seq for t in truncations],
                )
                if missing:
                    pins = [TagPin(r["run_id"], int(r["seq"])) for r in missing]
                    raise UnretainedPinsError(pins)  # noqa: TRY301 - rolls the transaction back
                if points:
                    await _insert(conn, "onward_run_truncation", _TRUNCATION, points, _MOVE_FORWARD)
                if checkpoints is not None and truncations:
                    await conn.execute(
                        _PRUNE_CHECKPOINTS, [t.run_id for t in truncations], checkpoints
                    )
        except UnretainedPinsError as rolled_back:
            return rolled_back.pins
        return []

    async def pin(self, run_id: str, tenant: str, seq: int) -> None:
        async with self._connection(
            f"pinning seq {seq} for a tag", run_id, transaction=True
        ) as conn:
            # The insert first: it waits for a truncation in progress (`truncate`), so the
            # point read next is the one that truncation left.
            await conn.execute(
                "INSERT INTO onward_tag_pins (run_id, seq, tenant, pinned_at) "
                "VALUES ($1, $2, $3, $4) ON CONFLICT (run_id, seq) DO NOTHING",
                run_id,
                seq,
                tenant,
                time.time_ns() // 1_000,
            )
            row = await conn.fetchrow(
                f"SELECT {_TRUNCATION_COLUMNS} FROM onward_run_truncation WHERE run_id = $1",
                run_id,
            )
            kept = await conn.fetch(
                "UPDATE onward_retained_events SET kept_as = CASE kept_as WHEN 'checkpoint' "
                "THEN 'tag' ELSE kept_as END WHERE run_id = $1 AND seq = $2 RETURNING seq",
                run_id,
                seq,
            )
            point = RunTruncation(**dict(row)) if row is not None else None
            refuse_compacted(run_id, seq, point, [r["seq"] for r in kept])

    async def pins(self, run_ids: Collection[str]) -> dict[str, set[int]]:
        async with self._connection("reading tag pins") as conn:
            rows = await conn.fetch(
                "SELECT run_id, seq FROM onward_tag_pins WHERE run_id = ANY($1::text[])",
                list(run_ids),
            )
        found: dict[str, set[int]] = {}
        for r in rows:
            found.setdefault(r["run_id"], set()).add(int(r["seq"]))
        return found

    async def put_snapshots(self, frontiers: Sequence[Frontier]) -> None:
        rows = [(f.run_id, f.tenant, f.through_offset, encode_frontier(f)) for f in frontiers]
        if not rows:
            return
        async with self._connection(f"storing {len(rows)} frontiers over the row's cap") as conn:
            await _insert(
                conn,
                "onward_run_snapshots",
                "run_id text, tenant text, through_offset bigint, payload bytea",
                rows,
                "ON CONFLICT (run_id) DO UPDATE SET through_offset = excluded.through_offset, "
                "payload = excluded.payload "
                "WHERE onward_run_snapshots.through_offset < excluded.through_offset",
            )

    async def snapshots(self, run_ids: Collection[str]) -> dict[str, Frontier]:
        async with self._connection("reading frontiers over the row's cap") as conn:
            rows = await conn.fetch(
                "SELECT run_id, payload FROM onward_run_snapshots WHERE run_id = ANY($1::text[])",
                list(run_ids),
            )
        return {r["run_id"]: decode_payload(bytes(r["payload"]), run_id=r["run_id"]) for r in rows}

    async def tombstones(self, run_ids: Collection[str]) -> set[str]:
        async with self._connection("reading tombstones") as conn:
            rows = await conn.fetch(
                "SELECT run_id FROM onward_run_tombstones WHERE run_id = ANY($1::text[])",
                list(run_ids),
            )
        return {r["run_id"] for r in rows}

    async def retained(self, run_id: str) -> list[RetainedEvent]:
        async with self._connection("reading retained events", run_id) as conn:
            rows = await conn.fetch(
                "SELECT tenant, run_id, seq, partition, log_offset, record, kept_as "
                "FROM onward_retained_events WHERE run_id = $1 ORDER BY seq",
                run_id,
            )
        return [
            RetainedEvent(
                tenant=r["tenant"],
                run_id=r["run_id"],
                seq=r["seq"],
                partition=r["partition"],
                offset=r["log_offset"],
                record=bytes(r["record"]),
                kept_as=r["kept_as"],
            )
            for r in rows
        ]

    async def retained_seqs(self, run_ids: Collection[str]) -> dict[str, set[int]]:
        async with self._connection("reading retained seqs") as conn:
            rows = await conn.fetch(
                "SELECT run_id, seq FROM onward_retained_events WHERE run_id = ANY($1::text[])",
                list(run_ids),
            )
        found: dict[str, set[int]] = {}
        for r in rows:
            found.setdefault(r["run_id"], set()).add(int(r["seq"]))
        return found

    async def positions(self) -> dict[str, dict[int, int]]:
        """As the protocol says; a live build that has stored no position yet (a projection
        that joined, or whose first batch failed) is there too, with none: it starts from
        each partition's start, so it holds every partition."""
        async with self._connection("reading projector positions") as conn:
            rows = await conn.fetch(
                "SELECT consumer, partition, next_offset FROM onward_projector_positions p "
                "WHERE NOT EXISTS (SELECT 1 FROM onward_projection_builds b "
                "WHERE b.status = 'retired' AND p.consumer = b.projection || '@' || b.build)"
            )
            unstarted = await conn.fetch(
                "SELECT b.projection || '@' || b.build AS consumer "
                "FROM onward_projection_builds b WHERE b.status <> 'retired' "
                "AND NOT EXISTS (SELECT 1 FROM onward_projector_positions p "
                "WHERE p.consumer = b.projection || '@' || b.build)"
            )
        found: dict[str, dict[int, int]] = {r["consumer"]: {} for r in unstarted}
        for r in rows:
            found.setdefault(r["consumer"], {})[int(r["partition"])] = int(r["next_offset"])
        return found

    async def record_cut(self, cut: LogCut) -> None:
        async with self._connection(f"recording a cut of partition {cut.partition}") as conn:
            await conn.execute(
                "INSERT INTO onward_log_cuts "
                "(partition, start_offset, end_offset, events, archive, cut_at) "
                "VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (partition, start_offset) DO UPDATE "
                "SET end_offset = excluded.end_offset, events = excluded.events, "
                "archive = excluded.archive, cut_at = excluded.cut_at "
                "WHERE onward_log_cuts.end_offset < excluded.end_offset",
                cut.partition,
                cut.start,
                cut.end,
                cut.events,
                cut.archive,
                cut.at,
            )

    async def cuts(self, partition: int | None = None) -> list[LogCut]:
        async with self._connection("reading recorded cuts") as conn:
            rows = await conn.fetch(
                'SELECT partition, start_offset AS start, end_offset AS "end", events, archive, '
                "cut_at AS at FROM onward_log_cuts WHERE $1::int IS NULL OR partition = $1 "
                "ORDER BY partition, start_offset",
                partition,
            )
        return [LogCut(**dict(r)) for r in rows]
