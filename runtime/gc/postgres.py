"""`PostgresRecordSweeper`: what finished runs left in PostgreSQL, counted or deleted.

It works on the views of the active frontiers build (``onward_frontiers``,
``onward_tool_calls``; PostgreSQL deletes through them), the transcript, compaction's
truncation points and retained events (not per build), and the lease table. A rebuild in
progress folds the log into its own build and gets those rows back until it is switched in; the
next collection removes them again.
"""

from __future__ import annotations

import time

from onward._storage import PostgresStore

from .base import (
    FINISHED_AT_ONCE,
    FINISHED_PAGE_SQL,
    FinishedRun,
    Kind,
    SweepPlan,
    SweepSql,
    carried_on,
    finished_run,
)

_SQL = SweepSql(ids="SELECT unnest($1::text[])", now="now()")
_COLLECTED = "SELECT run_id FROM onward_run_tombstones WHERE run_id = ANY($1::text[])"
"""Which of the given runs garbage collection removed (`carried_on`)."""
_LOCK_FRONTIERS = (
    "SELECT FROM onward_frontiers WHERE run_id = ANY($1::text[]) "
    'ORDER BY run_id COLLATE "C" FOR UPDATE'
)
"""Lock the plan's frontier rows first, in key order, as a frontier store's write does (its
frontier rows, then their `tool_calls` rows; `projections.postgres._in_key_order`): a projector
storing one of these runs meanwhile would otherwise hold its frontier row while waiting for a
`tool_calls` row the sweep deleted, the sweep waiting for that frontier row, and PostgreSQL
would fail one of them as deadlocked."""

_LOCK_PINS = "LOCK TABLE onward_tag_pins IN SHARE ROW EXCLUSIVE MODE"
"""Hold tags back while the sweep decides: a run tagged since its row was folded is kept
(`base._ENDED_RUN`), so a pin must be wholly before the sweep (and seen by every statement of
it) or after it (and then find the run gone, `AgentRunner.tag`)."""


class PostgresRecordSweeper(PostgresStore):
    """A `RecordSweeper` in PostgreSQL: frontier, transcript, `tool_calls`, compaction and lease
    rows.

    Args:
        dsn: ``postgresql://user:password@host:port/database``.
        schema: The PostgreSQL schema (search path) holding Onward's tables.
        timeout_s: The longest one call may wait for PostgreSQL (`PostgresStore`).
    """

    what = "PostgreSQL record sweeper"

    async def finished(self, *, before: int) -> list[FinishedRun]:
        query = FINISHED_PAGE_SQL.format(before="$1", after="$2", limit="$3")
        runs: list[FinishedRun] = []
        async with self._connection("listing finished runs") as conn:
            after = ""
            while True:
                rows = await conn.fetch(query, before, after, FINISHED_AT_ONCE)
                runs += [finished_run(*row) for row in rows]
                if len(rows) < FINISHED_AT_ONCE:
                    break
                after = rows[-1]["run_id"]
            successors = sorted({r.successor for r in runs if r.successor is not None})
            collected = await conn.fetch(_COLLECTED, successors) if successors else []
        return carried_on(runs, {r["run_id"] for r in collected})

    async def sweep(self, plan: SweepPlan, *, delete: bool) -> dict[Kind, int]:
        counts: dict[Kind, int] = {}
        context = "deleting the rows of finished runs" if delete else "counting them"
        async with self._connection(context, transaction=True) as conn:
            if not delete:
                # Every count sees the same snapshot, as the deletes of one transaction do.
                await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            if delete:
                await conn.execute(_LOCK_FRONTIERS, sorted({*plan.expired, *plan.calls}))
                await conn.execute(_LOCK_PINS)
                for statement in _SQL.bookkeeping(time.time_ns() // 1_000, plan.before):
                    await conn.execute(statement, list(plan.expired))
            for kind, statement, ids in _SQL.statements(plan, delete=delete):
                if delete:
                    status = await conn.execute(statement, list(ids))
                    counts[kind] = int(status.split()[-1])
                else:
                    counts[kind] = int(await conn.fetchval(statement, list(ids)))
        return counts


__all__ = ["PostgresRecordSweeper"]
