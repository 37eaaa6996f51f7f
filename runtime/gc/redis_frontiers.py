"""`RedisFrontierSweeper`: what finished runs left in a deployment whose frontiers are in Redis.

With ``ONWARD_FRONTIER_STORE=redis``, `RedisFrontierStore` keeps each run's frontier hash,
transcript and call rows in Redis, while PostgreSQL (``DATABASE_URL``) keeps what compaction
wrote of it (truncation point, retained tagged events, tag pins, uncapped snapshots) and,
once it is collected, its tombstone. Nothing else reaps those keys, so without this a Redis
holding frontiers grows with every run ever made.

Finished runs are listed from Redis. Each sweep then reads the runs' summaries and goes on
with those that say the run finished (a finished run never becomes unfinished again; a
LangGraph thread, which a cancel does not end, is never taken for one, nor a run held in
quarantine, whose row stops short of a record that could not be read), and in one
PostgreSQL transaction that holds tags back (`postgres._LOCK_PINS`) leaves out the runs tagged
since their row was folded, counts or deletes their PostgreSQL rows, and last counts or
deletes their Redis keys with a script that checks the status (and that the row was not
touched since the cutoff) again in the step that deletes (`RedisFrontierStore.sweep_finished`),
before it commits; a run that script keeps keeps its PostgreSQL rows too (a savepoint rolled
back, and the rows of the others deleted again). A tag is then pinned wholly before
the decision (and the run kept) or after the run's keys are gone (and its tagger finds the run
gone, `AgentRunner.tag`); a pass Redis fails rolls back the rows of the runs whose keys are
still there, and the next pass lists them again and finishes them, while a run whose keys went
though Redis's answer was lost (a timeout) loses its rows in that pass (which keys are left
is asked again a few times while Redis cannot answer that either). (A commit lost after
the keys went would leave the run's PostgreSQL rows behind without a tombstone, and compaction
keeping its events: rarer than a tag in the window it closes, and no tag lost.) Holding tags
back also holds compaction's `truncate` back, which then sees the runs' tombstones.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import asyncpg

from onward._storage import BACKEND_TIMEOUT_S, PostgresStore, Resource
from onward.errors import BackendError, BackendUnavailableError
from onward.projections.base import RunSummary, runs_in_pages
from onward.projections.frontier import TERMINAL_STATUSES
from onward.projections.redis import RedisFrontierStore

from .base import (
    FINISHED_AT_ONCE,
    PIN_WAIT_US,
    RECORD_KINDS,
    FinishedRun,
    Kind,
    SweepPlan,
    carried_on,
)

LEFT_TRIES = 3
"""How often a sweep that Redis failed asks which runs' keys are left before it gives up
(rolling back every run's rows), Redis failing each ask."""

LEFT_PAUSE_S = 0.5
"""The pause before the second ask of which keys are left (twice that before the third)."""

_RUNS_SHOWN = 10
"""How many runs an error names before it counts the rest."""

_IDS = "SELECT unnest($1::text[])"

_ROWS: dict[Kind, tuple[str, str]] = {
    "retained_events": ("onward_retained_events", f"run_id IN ({_IDS})"),
    "truncations": ("onward_run_truncation", f"run_id IN ({_IDS})"),
    "lease_rows": (
        "onward_leases",
        f"run_id IN ({_IDS}) AND (holder IS NULL OR expires_at <= now())",
    ),
}
"""The PostgreSQL rows of runs already known to have finished: the table, and which rows."""

_BOOKKEEPING = (
    "INSERT INTO onward_run_tombstones (run_id, tenant, collected_at) "
    "SELECT run_id, tenant, $3 FROM unnest($1::text[], $2::text[]) AS r (run_id, tenant) "
    "ON CONFLICT (run_id) DO UPDATE SET collected_at = excluded.collected_at",
    f"DELETE FROM onward_tag_pins WHERE run_id IN ({_IDS})",
    f"DELETE FROM onward_run_snapshots WHERE run_id IN ({_IDS})",
)
"""What a delete also does first: a tombstone for every run removed, moved to now if it has one
(compaction then keeps nothing of it, even a pass planned since an earlier collection), and its
tags' pins and uncapped frontiers dropped."""

_LOCK_PINS = "LOCK TABLE onward_tag_pins IN SHARE ROW EXCLUSIVE MODE"
"""Hold tags back while a delete decides, and until the runs' Redis keys are gone too: a tag
pinned between the look for tags and the deletes would otherwise find the run still there,
write its `Tagged` event, and have it lost with the run (`postgres._LOCK_PINS`)."""


class _CompactionRows(PostgresStore):
    """The PostgreSQL rows of runs whose frontiers are kept elsewhere."""

    what = "PostgreSQL compaction rows"

    @asynccontextmanager
    async def deciding(self, *, delete: bool) -> AsyncIterator[asyncpg.Connection]:
        """One transaction to decide and count or delete in; a delete's holds tags back."""
        context = "deleting the rows of finished runs" if delete else "counting them"
        async with self._connection(context, transaction=True) as conn:
            if delete:
                await conn.execute(_LOCK_PINS)
            else:
                await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield conn

    async def sweep(
        self, conn: asyncpg.Connection, runs: Sequence[tuple[str, str]], *, delete: bool
    ) -> dict[Kind, int]:
        """Count or delete the rows of ``runs`` (``(run_id, tenant)``, each known finished)
        in the transaction of :meth:`deciding`."""
        counts: dict[Kind, int] = dict.fromkeys(_ROWS, 0)
        if not runs:
            return counts
        ids = [run_id for run_id, _ in runs]
        if delete:
            await self._bookkeep(conn, runs)
        for kind, (table, predicate) in _ROWS.items():
            if delete:
                status = await conn.execute(f"DELETE FROM {table} WHERE {predicate}", ids)
                counts[kind] = int(status.split()[-1])
            else:
                counts[kind] = int(
                    await conn.fetchval(f"SELECT count(*) FROM {table} WHERE {predicate}", ids)
                )
        return counts

    async def tagged_since(
        self,
        runs: Sequence[RunSummary],
        *,
        before: int | None,
        conn: asyncpg.Connection | None = None,
    ) -> set[str]:
        """Which of ``runs`` were tagged since their row was folded (a pin newer than the
        row): their `Tagged` event is on its way to the row, and collecting them now would
        lose it. With ``before``, a pin made `PIN_WAIT_US` before it counts no longer
        (`base._ENDED_RUN`). Read on ``conn`` when given (a transaction of :meth:`deciding`)."""
        if not runs:
            return set()
        if conn is not None:
            return await self._tagged(conn, runs, before)
        async with self._connection("reading tag pins") as own:
            return await self._tagged(own, runs, before)

    @staticmethod
    async def _tagged(
        conn: asyncpg.Connection, runs: Sequence[RunSummary], before: int | None
    ) -> set[str]:
        rows = await conn.fetch(
            "SELECT DISTINCT p.run_id FROM onward_tag_pins p "
            "JOIN unnest($1::text[], $2::bigint[]) AS r (run_id, updated_at) USING (run_id) "
            "WHERE p.pinned_at > r.updated_at AND ($3::bigint IS NULL OR p.pinned_at >= $3)",
            [s.run_id for s in runs],
            [s.updated_at for s in runs],
            None if before is None else before - PIN_WAIT_US,
        )
        return {r["run_id"] for r in rows}

    async def collected(self, run_ids: Sequence[str]) -> set[str]:
        """Which of ``run_ids`` garbage collection removed (a tombstone)."""
        if not run_ids:
            return set()
        async with self._connection("reading tombstones") as conn:
            rows = await conn.fetch(
                "SELECT run_id FROM onward_run_tombstones WHERE run_id = ANY($1::text[])",
                list(run_ids),
            )
        return {r["run_id"] for r in rows}

    @staticmethod
    async def _bookkeep(conn: asyncpg.Connection, runs: Sequence[tuple[str, str]]) -> None:
        ids, tenants = [r for r, _ in runs], [t for _, t in runs]
        tombstones, *drops = _BOOKKEEPING
        await conn.execute(tombstones, ids, tenants, time.time_ns() // 1_000)
        for statement in drops:
            await conn.execute(statement, ids)


class RedisFrontierSweeper(Resource):
    """A `RecordSweeper` for frontiers in Redis: frontier, transcript and call keys there, and
    compaction, tombstone and lease rows in PostgreSQL.

    Args:
        redis_url: ``redis://host:port/db`` of the frontier store.
        dsn: ``postgresql://user:password@host:port/database`` of the compaction store.
        prefix: The frontier store's key prefix (``ONWARD_REDIS_PREFIX``).
        schema: The PostgreSQL schema holding Onward's tables.
        timeout_s: The longest one call may wait for either server.
    """

    what = "Redis frontier sweeper"

    def __init__(
        self,
        redis_url: str,
        dsn: str,
        *,
        prefix: str = "onward:",
        schema: str | None = None,
        timeout_s: float | None = BACKEND_TIMEOUT_S,
    ) -> None:
        self.frontiers = RedisFrontierStore(
            redis_url, prefix=prefix, max_connections=2, timeout_s=timeout_s
        )
        self._rows = _CompactionRows(dsn, schema=schema, max_size=1, timeout_s=timeout_s)

    @property
    def is_open(self) -> bool:
        return self.frontiers.is_open and self._rows.is_open

    async def _connect(self) -> None:
        await self.frontiers.start()
        await self._rows.start()

    async def close(self) -> None:
        """Close both connections, the second even if closing the first fails. Idempotent."""
        try:
            await self._rows.close()
        finally:
            await self.frontiers.close()

    async def finished(self, *, before: int) -> list[FinishedRun]:
        """Runs whose stored summary says they finished before ``before``, by id.

        Read a page of runs at a time, by run id (a keyset cursor: none skipped or listed
        twice while runs finish meanwhile): with very many finished runs a pass holds one
        page of their summaries and continued frontiers, and no pipeline or query of it grows
        with the store.
        """
        out: list[FinishedRun] = []
        pages = runs_in_pages(
            self.frontiers,
            size=FINISHED_AT_ONCE,
            statuses=TERMINAL_STATUSES,
            updated_before=before,
        )
        async for page in pages:
            out += await self._finished_of(page, before=before)
        successors = sorted({r.successor for r in out if r.successor is not None})
        return carried_on(out, await self._rows.collected(successors))

    async def _finished_of(self, summaries: list[RunSummary], *, before: int) -> list[FinishedRun]:
        """The runs of one page that ended, are not set aside and were not tagged since."""
        held = await self.frontiers.set_aside([s.run_id for s in summaries])
        summaries = [s for s in summaries if _ended(s) and s.run_id not in held]
        tagged = await self._rows.tagged_since(summaries, before=before)
        summaries = [s for s in summaries if s.run_id not in tagged]
        continued = [s.run_id for s in summaries if s.status == "continued"]
        rows = await self.frontiers.load(continued)
        out: list[FinishedRun] = []
        for summary in summaries:
            row = rows.get(summary.run_id)
            successor = row.frontier.continued_to if row and row.frontier else None
            out.append(
                FinishedRun(
                    summary.run_id,
                    summary.tenant,
                    summary.status,
                    summary.updated_at,
                    continued=summary.status == "continued",
                    successor=successor,
                )
            )
        return out

    async def sweep(self, plan: SweepPlan, *, delete: bool) -> dict[Kind, int]:
        """Count or delete what ``plan`` names, of runs whose summary says they finished, whose
        row is not set aside in quarantine, and that nobody tagged since (module docstring)."""
        summaries = await self.frontiers.summaries({*plan.expired, *plan.calls})
        held = await self.frontiers.set_aside(summaries)
        counts: dict[Kind, int] = dict.fromkeys(RECORD_KINDS, 0)
        async with self._rows.deciding(delete=delete) as conn:
            tagged = await self._rows.tagged_since(
                list(summaries.values()), before=plan.before, conn=conn
            )
            tenants = {
                r: s.tenant
                for r, s in summaries.items()
                if _ended(s)
                and r not in held
                and r not in tagged
                and (plan.before is None or s.updated_at < plan.before)
            }
            expired = [(r, tenants[r]) for r in dict.fromkeys(plan.expired) if r in tenants]
            gone = {run_id for run_id, _ in expired}
            calls = [(r, tenants[r]) for r in dict.fromkeys(plan.calls) if r in tenants]
            calls = [run for run in calls if run[0] not in gone]
            swept: set[str] = set()
            first = conn.transaction()
            await first.start()
            counts |= await self._rows.sweep(conn, expired, delete=delete)
            lost: BackendError | None = None
            try:
                frontiers, said, call_rows = await self.frontiers.sweep_finished(
                    expired, calls, delete=delete, before=plan.before, swept=swept
                )
            except BackendError as error:
                if not delete:
                    raise
                # Redis may have deleted keys all the same (a timeout, a dropped connection):
                # a run whose frontier is gone would never be listed again, so it loses its
                # rows now too; the pass still fails.
                lost, frontiers, said, call_rows = error, 0, 0, 0
                left = await self._left([run_id for run_id, _ in expired], error)
                swept = {run_id for run_id, _ in expired if run_id not in left}
            if all(run_id in swept for run_id, _ in expired):
                await first.commit()
            else:
                # An event reached a run since its summary was read: it keeps its rows too.
                await first.rollback()
                kept = [run for run in expired if run[0] in swept]
                counts |= await self._rows.sweep(conn, kept, delete=delete)
        if lost is not None:
            raise lost
        counts |= {"frontiers": frontiers, "transcript": said, "tool_calls": call_rows}
        return counts

    async def _left(self, run_ids: list[str], swept: BackendError) -> dict[str, RunSummary]:
        """The summaries of those of ``run_ids`` still in Redis, read after Redis failed the
        sweep (``swept``), and asked again (`LEFT_TRIES` times in all) while Redis cannot
        answer: rolled back, a run whose keys went would keep its rows for good, as no pass
        lists it again.

        Raises:
            BackendUnavailableError: Every ask failed: the pass rolls back, and the error names
                the runs that may now be in that state, for the operator to check.
        """
        for attempt in range(1, LEFT_TRIES):
            with contextlib.suppress(BackendUnavailableError):
                return await self.frontiers.summaries(run_ids)
            await asyncio.sleep(LEFT_PAUSE_S * attempt)
        try:
            return await self.frontiers.summaries(run_ids)
        except BackendUnavailableError as exc:
            shown = ", ".join(map(repr, run_ids[:_RUNS_SHOWN]))
            more = len(run_ids) - _RUNS_SHOWN
            raise BackendUnavailableError(
                f"sweeping the Redis keys of {len(run_ids)} finished runs failed ({swept}), and "
                f"which keys went could not be read in {LEFT_TRIES} asks ({exc}): every run's "
                "PostgreSQL rows were rolled back. A run whose keys Redis deleted keeps its "
                "compaction, lease and retained-event rows with no tombstone, and no later "
                f"pass lists it again; those that may be so: {shown}"
                + (f" and {more} more" if more > 0 else "")
            ) from exc


def _ended(summary: RunSummary) -> bool:
    """Whether the run ended. A LangGraph thread (no agent) never does: a cancel ends one
    invocation of it, and the next opens it again (`projections.frontier`)."""
    return summary.status in TERMINAL_STATUSES and bool(summary.agent)


__all__ = ["RedisFrontierSweeper"]
