"""`GarbageCollector`: removes what finished runs left behind, once they are old enough.

Three ttls, each counted from when a run finished (the ``at`` of its last event, which its
frontier row keeps as ``updated_at``):

* ``checkpoint_ttl_days`` (30): the run's frontier row, transcript, `tool_calls` rows, lease
  row and compaction rows (truncation point, retained tagged events) go; its Redis keys too.
* ``redis_key_ttl_hours`` (48): its Redis keys go: lease hash, fence counter, MCP schema cache.
* ``task_result_ttl_days`` (7): its `tool_calls` rows go.

Only runs whose frontier row says they finished (completed, failed, cancelled, continued) are
looked at, and the stores check that again in the statement that deletes, so a running or
waiting run never loses a row or a key. A run carried into another run (`RunContinued`) keeps
its frontier row and transcript for as long as the run it was carried into keeps its own: the
successor's conversation starts from the predecessor's transcript.

Once a run's frontier row and lease state are gone only its tombstone says its id was used,
while its events stay in the log until compaction cuts them: until then a start under the id
is refused (`Resumer.refuse_collected`, where the runner has the compaction store holding
tombstones; a runner built without one, on a log other than SQLite, cannot tell).
What a projector meets of them later brings no row back unless it starts the run: a late event
(a tag racing the collection) or the tail of a run whose first events compaction cut is
skipped for the run's tombstone (`FrontierProjection`); the whole run folded again (a rebuild
from the archive) comes back finished, and the next pass removes it again.

Built without stores (``GarbageCollector()``), it collects from the stores the deployment's
`Settings` name, as ``onward gc`` does, opening them for each pass and closing them after.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import KW_ONLY, dataclass

from onward.errors import ConfigurationError
from onward.runtime.settings import Settings, load_settings

from .base import KINDS, FinishedRun, GcReport, KeySweeper, Kind, RecordSweeper, SweepPlan
from .configured import check_collectable, key_sweeper, record_sweeper

_DAY_S = 86_400.0
_HOUR_S = 3_600.0


@dataclass
class GarbageCollector:
    """Counts (`dry_run`) or deletes (`run`) the rows and keys of runs finished long enough ago.

    Attributes:
        records: The database of frontier, transcript, `tool_calls`, compaction and lease rows,
            opened by the caller. ``None``: the one ``settings`` name, opened for each pass
            (read-only for a dry run on SQLite), with its Redis when ``REDIS_URL`` is set.
        keys: The Redis of leases, fences and the MCP schema cache, if the deployment has one.
        checkpoint_ttl_days: After this, a finished run's frontier row, transcript, `tool_calls`,
            truncation point, retained events and lease row (and Redis keys) go.
        redis_key_ttl_hours: After this, a finished run's Redis keys go.
        task_result_ttl_days: After this, a finished run's `tool_calls` rows go.
        clock: Seconds since the epoch now; tests pass one to move time without waiting.
        batch: Runs per transaction (and per Redis pipeline).
        settings: Where the stores are when ``records`` is not given; read from the
            environment (`load_settings`) when not given either.

    Raises:
        ConfigurationError: A ttl that is not positive, or a batch under 1; without
            ``records``, settings that are unusable or name the memory backend.
    """

    records: RecordSweeper | None = None
    keys: KeySweeper | None = None
    _: KW_ONLY
    checkpoint_ttl_days: float = 30
    redis_key_ttl_hours: float = 48
    task_result_ttl_days: float = 7
    clock: Callable[[], float] = time.time
    batch: int = 500
    settings: Settings | None = None

    def __post_init__(self) -> None:
        ttls = {
            "checkpoint_ttl_days": self.checkpoint_ttl_days,
            "redis_key_ttl_hours": self.redis_key_ttl_hours,
            "task_result_ttl_days": self.task_result_ttl_days,
        }
        bad = [f"{name}={value}" for name, value in ttls.items() if not value > 0]
        if bad:
            raise ConfigurationError(f"garbage collection ttls must be positive: {', '.join(bad)}")
        if self.batch < 1:
            raise ConfigurationError(
                f"garbage collection batch must be at least 1, got {self.batch}"
            )
        if self.records is None:
            self.settings = self.settings or load_settings()
            check_collectable(self.settings)

    @asynccontextmanager
    async def _sweepers(
        self, *, delete: bool
    ) -> AsyncIterator[tuple[RecordSweeper, KeySweeper | None]]:
        """The sweepers given, or those ``settings`` name, open for the block."""
        if self.records is not None:
            yield self.records, self.keys
            return
        assert self.settings is not None  # set in __post_init__
        records = record_sweeper(self.settings, readonly=not delete)
        keys = key_sweeper(self.settings)
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(records)
            if keys is not None:
                await stack.enter_async_context(keys)
            yield records, keys

    async def plan(self) -> tuple[SweepPlan, tuple[str, ...]]:
        """Which runs lose what now, and which expired runs are kept for their successors."""
        async with self._sweepers(delete=False) as (records, _):
            return await self._plan(records)

    async def _plan(self, records: RecordSweeper) -> tuple[SweepPlan, tuple[str, ...]]:
        now_s = self.clock()

        def before(ttl_s: float) -> int:
            # A ttl past the epoch (``inf`` among them) expires nothing; never below 0.
            return int(max(now_s - ttl_s, 0.0) * 1_000_000)

        checkpoints = before(self.checkpoint_ttl_days * _DAY_S)
        redis_keys = before(self.redis_key_ttl_hours * _HOUR_S)
        task_results = before(self.task_result_ttl_days * _DAY_S)
        listed = max(checkpoints, redis_keys, task_results)
        finished = await records.finished(before=listed)
        expired, kept = _expired(finished, checkpoints)
        gone = set(expired)

        def also(cutoff: int) -> tuple[str, ...]:
            # The expired runs first, in the same order: each batch then holds an expired
            # run's tool_calls rows together with its frontier row, which the sweep deletes
            # last and looks the run up in.
            return expired + tuple(
                r.run_id for r in finished if r.finished_at < cutoff and r.run_id not in gone
            )

        plan = SweepPlan(
            expired=expired, calls=also(task_results), keys=also(redis_keys), before=listed
        )
        return plan, kept

    async def dry_run(self) -> GcReport:
        """What `run` would delete now, per kind. Deletes nothing."""
        return await self._collect(delete=False)

    async def run(self) -> GcReport:
        """Delete what finished runs left past their ttls; the report counts what went."""
        return await self._collect(delete=True)

    async def _collect(self, *, delete: bool) -> GcReport:
        async with self._sweepers(delete=delete) as (records, keys):
            plan, kept = await self._plan(records)
            counts: dict[Kind, int] = dict.fromkeys(KINDS, 0)
            for part in _batches(plan, self.batch):
                # Keys first: a run's rows are what lists it as finished, so rows gone before
                # a Redis failure would leave its keys with nothing to name them, for good.
                if keys is not None and part.keys:
                    for kind, n in (await keys.sweep(part.keys, delete=delete)).items():
                        counts[kind] += n
                for kind, n in (await records.sweep(part, delete=delete)).items():
                    counts[kind] += n
        return GcReport(dry_run=not delete, counts=counts, expired=plan.expired, kept=kept)


def _expired(
    finished: Sequence[FinishedRun], before: int
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The runs past the checkpoint ttl whose rows can go, and those kept for a successor.

    A continued run goes only with the run it was carried into (which goes only with its own
    successor, and so on); one whose row does not name its successor stays. The runs that go
    come each before the run it was carried into, never in id order (``r~c10`` sorts before
    ``r~c2``): a pass cut short between two batches then leaves no run carried into a run
    already gone, which every later pass would keep for good.
    """
    candidates = {r.run_id: r for r in finished if r.finished_at < before}
    kept = _kept(candidates)
    successors = {
        r.run_id: r.successor for r in candidates.values() if r.continued and r.run_id not in kept
    }
    carried = set(successors.values())
    order: dict[str, None] = {}
    for run_id in [r for r in candidates if r not in carried] + list(candidates):
        link: str | None = run_id
        while link is not None and link not in order and link not in kept:
            order[link] = None
            link = successors.get(link)
    return tuple(order), tuple(sorted(kept))


def _kept(candidates: Mapping[str, FinishedRun]) -> set[str]:
    """The continued runs among ``candidates`` kept for a successor: one not naming it, one
    carried into a run not among them, or into one kept. Each chain is walked once, its
    verdict shared by every run on it: settled run by run (as one pass after another), a
    chain of many continued runs took a pass over every candidate per run of the chain."""
    verdicts: dict[str, bool] = {}
    for run_id in candidates:
        path: dict[str, None] = {}
        link = run_id
        while True:
            if link in verdicts:
                kept = verdicts[link]
                break
            run = candidates[link]
            if not run.continued or link in path:
                kept = False  # a run that ended, or a loop of runs carried into each other
                break
            path[link] = None
            if run.successor is None or run.successor not in candidates:
                kept = True
                break
            link = run.successor
        verdicts.update(dict.fromkeys(path, kept))
    return {run_id for run_id, kept in verdicts.items() if kept}


def _batches(plan: SweepPlan, size: int) -> list[SweepPlan]:
    """The plan cut into parts of at most ``size`` runs per list."""

    def chunks(ids: tuple[str, ...]) -> list[tuple[str, ...]]:
        return [ids[i : i + size] for i in range(0, len(ids), size)]

    return [
        SweepPlan(expired=e or (), calls=c or (), keys=k or (), before=plan.before)
        for e, c, k in itertools.zip_longest(
            chunks(plan.expired), chunks(plan.calls), chunks(plan.keys)
        )
    ]


__all__ = ["GarbageCollector"]
