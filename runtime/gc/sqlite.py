"""`SqliteRecordSweeper`: what finished runs left in the embedded SQLite file, counted or
deleted in one transaction."""

from __future__ import annotations

import json
import time
from functools import partial
from typing import Any

from onward._storage import SqliteStore, transaction
from onward.runtime.leases.sqlite import SQLITE_NOW

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

_SQL = SweepSql(ids="SELECT value FROM json_each(?)", now=SQLITE_NOW)
_COLLECTED = (
    "SELECT run_id FROM onward_run_tombstones WHERE run_id IN (SELECT value FROM json_each(?))"
)
"""Which of the given runs garbage collection removed (`carried_on`)."""


class SqliteRecordSweeper(SqliteStore):
    """A `RecordSweeper` in one SQLite file: frontier, transcript, `tool_calls`, compaction
    and lease rows.

    Args:
        path: The database file.
        migrate: Apply the SQLite migrations when opened (`SqliteStore`).
        readonly: Open the file read-only, for a dry run: counting changes nothing in it.
    """

    what = "record sweeper"

    async def finished(self, *, before: int) -> list[FinishedRun]:
        query = FINISHED_PAGE_SQL.format(before="?1", after="?2", limit="?3")
        runs: list[FinishedRun] = []

        def page(after: str) -> list[Any]:
            conn = self._db.connection()  # asked on the thread: the one a change reopened
            return conn.execute(query, (before, after, FINISHED_AT_ONCE)).fetchall()

        after = ""
        while True:
            rows = await self._db.call(partial(page, after), "listing finished runs")
            runs += [finished_run(*row) for row in rows]
            if len(rows) < FINISHED_AT_ONCE:
                break
            after = rows[-1][0]
        successors = json.dumps(sorted({r.successor for r in runs if r.successor is not None}))
        collected = await self._db.call(
            lambda: self._db.connection().execute(_COLLECTED, (successors,)).fetchall(),
            "reading tombstones",
        )
        return carried_on(runs, {run_id for (run_id,) in collected})

    async def sweep(self, plan: SweepPlan, *, delete: bool) -> dict[Kind, int]:
        statements = _SQL.statements(plan, delete=delete)
        bookkeeping = _SQL.bookkeeping(time.time_ns() // 1_000, plan.before) if delete else []

        def sweep() -> dict[Kind, int]:
            conn = self._db.connection()  # asked on the thread: the one a change reopened
            counts: dict[Kind, int] = {}
            # A delete takes the write lock first; counts share one read snapshot.
            with transaction(conn, "BEGIN IMMEDIATE" if delete else "BEGIN"):
                for statement in bookkeeping:
                    conn.execute(statement, (json.dumps(plan.expired),))
                for kind, statement, ids in statements:
                    cursor = conn.execute(statement, (json.dumps(ids),))
                    counts[kind] = cursor.rowcount if delete else int(cursor.fetchone()[0])
            return counts

        context = "deleting the rows of finished runs" if delete else "counting them"
        return await self._db.call(sweep, context)


__all__ = ["SqliteRecordSweeper"]
