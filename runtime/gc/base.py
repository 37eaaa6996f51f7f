"""What garbage collection removes, and the protocols of the stores it removes it from.

A run that finished long ago still has rows and keys: its frontier row and transcript, its
`tool_calls` rows, its compaction rows (truncation point, retained tagged events), its lease row
(PostgreSQL, SQLite) or lease hash and fence counter (Redis), and its MCP schema cache entry.
`GarbageCollector` decides which runs are past which ttl; the stores below count or delete what
those runs left, each in its own backend module:

* `RecordSweeper`: the rows of one database (frontiers, transcript, `tool_calls`, compaction's
  truncation points and retained events, leases):
  `PostgresRecordSweeper`, `SqliteRecordSweeper`.
* `KeySweeper`: the Redis keys of runs: `RedisKeySweeper`.

Counting and deleting run the same predicate, so a dry run's report is what a run deletes. The
predicates re-check, in the statement that deletes, that the run's frontier row says it
finished and is not held in quarantine: a running or waiting run is never touched, whatever the
plan handed in.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol, runtime_checkable

from onward._storage import AsyncResource
from onward.projections.base import decode_payload
from onward.projections.frontier import TERMINAL_STATUSES

Kind = Literal[
    "frontiers",
    "transcript",
    "tool_calls",
    "retained_events",
    "truncations",
    "lease_rows",
    "redis_leases",
    "redis_fences",
    "schema_cache",
]
"""What one count of a report counts."""

RECORD_KINDS: tuple[Kind, ...] = (
    "transcript",
    "tool_calls",
    "retained_events",
    "truncations",
    "lease_rows",
    "frontiers",
)
"""The rows a `RecordSweeper` removes, in the order it removes them (frontier rows last: the
other predicates look the run up in them)."""
KEY_KINDS: tuple[Kind, ...] = ("redis_leases", "redis_fences", "schema_cache")
"""The keys a `KeySweeper` removes."""
KINDS: tuple[Kind, ...] = (*RECORD_KINDS, *KEY_KINDS)

_TERMINAL = ", ".join(repr(status) for status in sorted(TERMINAL_STATUSES))


@dataclass(frozen=True, slots=True)
class FinishedRun:
    """A run whose frontier row says it finished, and when.

    Attributes:
        finished_at: The ``at`` of the run's last event, microseconds since the epoch.
        continued: The run was carried into another run (status ``continued``) that
            garbage collection has not removed yet (`carried_on`).
        successor: The run it was carried into, when the stored row says.
    """

    run_id: str
    tenant: str
    status: str
    finished_at: int
    continued: bool = False
    successor: str | None = None


def finished_run(
    run_id: str, tenant: str, status: str, updated_at: int, payload: bytes | None
) -> FinishedRun:
    """A finished run from its frontier row; ``payload`` only matters for a continued run."""
    continued = status == "continued"
    successor = None
    if continued and payload is not None:
        successor = decode_payload(payload, run_id=run_id).continued_to
    return FinishedRun(run_id, tenant, status, updated_at, continued, successor)


def carried_on(runs: list[FinishedRun], collected: Collection[str]) -> list[FinishedRun]:
    """``runs``, those carried into a run garbage collection removed (``collected``: their
    successors with a tombstone) no longer said to be continued: nothing is left to keep them
    for (the successor went first, this run's row having been touched since, by a late tag or
    a quarantine), and kept for it they would be kept for good."""
    return [
        replace(run, continued=False) if run.continued and run.successor in collected else run
        for run in runs
    ]


PIN_WAIT_US = 60 * 86_400 * 1_000_000
"""How long before a cutoff a pin was made for it to hold its run no longer (`_ENDED_RUN`)."""


def _ended(before: str | None) -> str:
    """`_ENDED_RUN`; with ``before`` (an SQL expression), a pin made `PIN_WAIT_US` before it
    holds the run no longer."""
    stale = "" if before is None else f" AND tagging.pinned_at >= {before} - {PIN_WAIT_US}"
    return (
        f"status IN ({_TERMINAL}) AND agent <> '' AND quarantined IS NULL "
        "AND NOT EXISTS (SELECT 1 FROM onward_tag_pins tagging "
        "WHERE tagging.run_id = onward_frontiers.run_id "
        f"AND tagging.pinned_at > onward_frontiers.updated_at{stale})"
    )


_ENDED_RUN = _ended(None)
"""A frontier row of a run that ended. A LangGraph thread (no agent) never does: a cancel ends
one invocation of it, and the next opens it again (`projections.frontier`). Nor is a run held
in quarantine known to have ended: its row stops short of a record that could not be read, and
it stays for the person who releases it (its held entry names it, and a release folds it
again from its rows). Nor is a run tagged since its row was folded: its `Tagged` event is on
its way to the row (a tag is pinned first), and deleting the row and pin now would lose it.
Asked about runs finished before a cutoff, a pin made `PIN_WAIT_US` (60 days) before that
cutoff holds the run no longer: a tag whose event was not folded in all that time never will
be (its append failed), and its pin would otherwise keep the run for good."""

FINISHED_SQL = (
    "SELECT run_id, tenant, status, updated_at, "
    "CASE WHEN status = 'continued' THEN payload END AS payload FROM onward_frontiers "
    f"WHERE {_ended('{before}')} AND updated_at < {{before}} ORDER BY run_id"
)
"""The finished runs of a frontier table, with ``{before}`` left for the dialect's parameter."""

FINISHED_PAGE_SQL = (
    "SELECT run_id, tenant, status, updated_at, "
    "CASE WHEN status = 'continued' THEN payload END AS payload FROM onward_frontiers "
    f"WHERE {_ended('{before}')} AND updated_at < {{before}} AND run_id > {{after}} "
    "ORDER BY run_id LIMIT {limit}"
)
"""A page of `FINISHED_SQL`, by run id after ``{after}`` (a keyset cursor: none skipped or
listed twice while runs finish meanwhile), at most ``{limit}``: the rows carry the whole
payload of each continued run, which a pass over very many would otherwise hold at once."""

FINISHED_AT_ONCE = 1024
"""How many finished runs a record sweeper reads at once."""


@dataclass(frozen=True, slots=True)
class SweepPlan:
    """Which runs lose what.

    Attributes:
        expired: Runs past the checkpoint ttl: frontier row, transcript, `tool_calls` rows,
            truncation point, retained events and lease row all go.
        calls: Runs whose `tool_calls` rows go (past the task-result ttl; ``expired`` too).
        keys: Runs whose Redis keys go (past the Redis key ttl; ``expired`` too).
        before: The plan was made from runs whose row was last touched before this
            (microseconds); one touched since (a tag folded into it meanwhile) keeps everything.
            ``None``: no such check.
    """

    expired: tuple[str, ...] = ()
    calls: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    before: int | None = None


@dataclass(frozen=True, slots=True)
class GcReport:
    """What a collection counted (dry run) or deleted, per kind.

    Attributes:
        dry_run: Nothing was deleted; the counts are what a run would delete now.
        counts: One count per kind of `KINDS`.
        expired: The runs whose frontier rows are past the checkpoint ttl.
        kept: Runs past the ttl kept because a run they were carried into is still kept.
    """

    dry_run: bool
    counts: Mapping[Kind, int] = field(default_factory=dict)
    expired: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()

    def count(self, kind: Kind) -> int:
        """How many of one kind."""
        return self.counts.get(kind, 0)

    @property
    def total(self) -> int:
        """How many rows and keys in all."""
        return sum(self.counts.values())


@runtime_checkable
class RecordSweeper(AsyncResource, Protocol):
    """The rows finished runs leave in one database: frontiers, transcript, `tool_calls`,
    compaction's truncation points and retained events, leases."""

    async def finished(self, *, before: int) -> list[FinishedRun]:
        """Runs whose frontier row says they finished before ``before`` (microseconds), by id."""
        ...

    async def sweep(self, plan: SweepPlan, *, delete: bool) -> dict[Kind, int]:
        """Count (``delete=False``) or delete the rows ``plan`` names, per kind of
        `RECORD_KINDS`; only of runs whose frontier row says they finished, and no lease row a
        holder has now."""
        ...


@runtime_checkable
class KeySweeper(AsyncResource, Protocol):
    """The keys finished runs leave in a key-value store: lease, fence, MCP schema cache."""

    async def sweep(self, run_ids: Collection[str], *, delete: bool) -> dict[Kind, int]:
        """Count or delete the keys of ``run_ids``, per kind of `KEY_KINDS`; a lease somebody
        holds now, and its fence, are kept."""
        ...


@dataclass(frozen=True, slots=True)
class SweepSql:
    """The statements of a SQL `RecordSweeper`, written once for every dialect.

    Each statement takes one parameter, a list of run ids: the plan's ``expired`` runs, or its
    ``calls`` runs for `tool_calls` rows.

    Args:
        ids: How the dialect reads that list in a statement: a subquery yielding the ids.
        now: The server's clock in the unit of ``onward_leases.expires_at``.
    """

    ids: str
    now: str

    def predicates(self, before: int | None = None) -> dict[Kind, tuple[str, str]]:
        """Per kind of `RECORD_KINDS`, in deletion order: the table and the rows to remove;
        with ``before``, only of runs whose row was last touched before it (`SweepPlan`)."""
        finished = _ended_before(before)
        done = f"FROM onward_frontiers WHERE run_id IN ({self.ids}) AND {finished}"
        return {
            "transcript": (
                "onward_transcript",
                f"(tenant, run_id) IN (SELECT tenant, run_id {done})",
            ),
            "tool_calls": ("onward_tool_calls", f"run_id IN (SELECT run_id {done})"),
            "retained_events": ("onward_retained_events", f"run_id IN (SELECT run_id {done})"),
            "truncations": ("onward_run_truncation", f"run_id IN (SELECT run_id {done})"),
            "lease_rows": (
                "onward_leases",
                f"run_id IN (SELECT run_id {done}) "
                f"AND (holder IS NULL OR expires_at <= {self.now})",
            ),
            "frontiers": ("onward_frontiers", f"run_id IN ({self.ids}) AND {finished}"),
        }

    def bookkeeping(self, at: int, before: int | None = None) -> list[str]:
        """What a delete also does first, each statement bound to the plan's expired runs:
        a tombstone for every run it removes (so compaction knows their events finished, and
        keeps nothing of them), and their tags' pins and uncapped frontiers dropped. A run
        collected again (its row folded back) moves its tombstone to now: a compaction pass
        planned since the first collection must see this one."""
        done = f"FROM onward_frontiers WHERE run_id IN ({self.ids}) AND {_ended_before(before)}"
        return [
            "INSERT INTO onward_run_tombstones (run_id, tenant, collected_at) "
            f"SELECT run_id, tenant, {int(at)} {done} "
            "ON CONFLICT (run_id) DO UPDATE SET collected_at = excluded.collected_at",
            f"DELETE FROM onward_tag_pins WHERE run_id IN (SELECT run_id {done})",
            f"DELETE FROM onward_run_snapshots WHERE run_id IN (SELECT run_id {done})",
        ]

    def statements(
        self, plan: SweepPlan, *, delete: bool
    ) -> list[tuple[Kind, str, tuple[str, ...]]]:
        """Per kind, in deletion order: the statement that counts or deletes it, and the run
        ids to bind to it."""
        verb = "DELETE FROM {table}" if delete else "SELECT count(*) FROM {table}"
        return [
            (
                kind,
                f"{verb.format(table=table)} WHERE {predicate}",
                plan.calls if kind == "tool_calls" else plan.expired,
            )
            for kind, (table, predicate) in self.predicates(plan.before).items()
        ]


def _ended_before(before: int | None) -> str:
    """`_ENDED_RUN`, and with ``before`` of a row last touched before it."""
    if before is None:
        return _ENDED_RUN
    return f"{_ended(str(int(before)))} AND updated_at < {int(before)}"


__all__ = [
    "FINISHED_AT_ONCE",
    "FINISHED_PAGE_SQL",
    "FINISHED_SQL",
    "KEY_KINDS",
    "KINDS",
    "RECORD_KINDS",
    "FinishedRun",
    "GcReport",
    "KeySweeper",
    "Kind",
    "RecordSweeper",
    "SweepPlan",
    "SweepSql",
    "finished_run",
]
