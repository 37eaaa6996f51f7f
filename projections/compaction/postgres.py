"""`PostgresCompactionStore`: compaction's rows in PostgreSQL, beside the frontier builds.

The truncation points and retained events are not per build: a rebuild of the frontiers
projection folds the same runs, and their compacted prefixes stay compacted. A projector's
position counts while its build is live; a retired build's positions are never read again.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import asyncpg

from onward._storage import PostgresStore

from .base import LogCut, RetainedEvent, RunTruncation

# Each table's columns with their types, as `_insert` takes them.
_RETAINED = "run_id text, seq bigint, tenant text, partition int, log_offset bigint, record bytea"
_TRUNCATION = (
    "run_id text, tenant text, partition int, before_seq bigint, before_offset bigint, "
    "compacted_at bigint"
)
_KEEP_RETAINED = "ON CONFLICT (run_id, seq) DO NOTHING"
_MOVE_FORWARD = (
    "ON CONFLICT (run_id) DO UPDATE SET before_seq = excluded.before_seq, "
    "before_offset = excluded.before_offset, compacted_at = excluded.compacted_at "
    "WHERE onward_run_truncation.before_seq < excluded.before_seq"
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
                "SELECT tenant, run_id, partition, before_seq, before_offset, compacted_at AS at "
                "FROM onward_run_truncation WHERE run_id = ANY($1::text[])",
                list(run_ids),
            )
        return {r["run_id"]: RunTruncation(**dict(r)) for r in rows}

    async def truncate(
        self, truncations: Sequence[RunTruncation], retained: Sequence[RetainedEvent]
    ) -> None:
        if not truncations and not retained:
            return
        retained_rows = [
            (e.run_id, e.seq, e.tenant, e.partition, e.offset, e.record) for e in retained
        ]
        points = [
            (t.run_id, t.tenant, t.partition, t.before_seq, t.before_offset, t.at)
            for t in truncations
        ]
        context = f"storing {len(truncations)} truncation points"
        async with self._connection(context, transaction=True) as conn:
            # Retained events first: a point never moves past a tagged event not yet copied.
            for table, columns, rows, conflict in (
                ("onward_retained_events", _RETAINED, retained_rows, _KEEP_RETAINED),
                ("onward_run_truncation", _TRUNCATION, points, _MOVE_FORWARD),
            ):
                if rows:
                    await _insert(conn, table, columns, rows, conflict)

    async def retained(self, run_id: str) -> list[RetainedEvent]:
        async with self._connection("reading retained events", run_id) as conn:
            rows = await conn.fetch(
                "SELECT tenant, run_id, seq, partition, log_offset, record "
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
        async with self._connection("reading projector positions") as conn:
            rows = await conn.fetch(
                "SELECT consumer, partition, next_offset FROM onward_projector_positions p "
                "WHERE NOT EXISTS (SELECT 1 FROM onward_projection_builds b "
                "WHERE b.status = 'retired' AND p.consumer = b.projection || '@' || b.build)"
            )
        found: dict[str, dict[int, int]] = {}
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
