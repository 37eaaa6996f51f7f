"""A projection's memory follows a byte budget (``cache_bytes``), not the number of runs.

The frontiers kept between batches are dropped, least recently folded first, once they are
counted as more than the budget; a run dropped is loaded again from the store when it comes
back, and what is stored is still exactly the fold of the log. ``cache_runs`` keeps its old
meaning, a bound on the number of runs kept, beside it.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from typing import Any

import pytest
from support.histories import assert_stored_is_the_direct_fold, run_ids_of, workload

from onward.errors import InvalidInputError
from onward.eventlog import Event, MemoryEventLog, StoredEvent
from onward.projections.base import StoredFrontier
from onward.projections.frontier_projection import DEFAULT_CACHE_BYTES, FrontierProjection
from onward.projections.memory import MemoryFrontierStore

PARTITIONS = 2


class CountingStore(MemoryFrontierStore):
    """A memory store counting the stored runs it is asked for again, and its writes."""

    def __init__(self) -> None:
        super().__init__()
        self.reloaded = 0
        self.writes = 0

    async def load(self, run_ids: Collection[str]) -> dict[str, StoredFrontier]:
        found = await super().load(run_ids)
        self.reloaded += len(found)
        return found

    async def write(self, *args: Any, **options: Any) -> None:  # passed on as they are
        self.writes += 1
        await super().write(*args, **options)


async def _log_and_batches(
    rng: random.Random, runs: int, size: int
) -> tuple[MemoryEventLog, list[str], list[dict[int, list[StoredEvent]]]]:
    log = MemoryEventLog(partitions=PARTITIONS)
    steps = workload(rng, runs)
    by_run: dict[str, list[list[Event]]] = {}
    for step in steps:
        by_run.setdefault(step[0].run_id, []).append(step)
    for turn in range(max(map(len, by_run.values()))):  # every run's steps interleaved
        for run_steps in by_run.values():
            if turn < len(run_steps):
                await log.append(run_steps[turn])
    batches: list[dict[int, list[StoredEvent]]] = []
    for partition in range(PARTITIONS):
        end = (await log.bounds(partition)).end
        for start in range(0, end, size):
            events = await log.read_partition(partition, start, min(end, start + size))
            batches.append({partition: events})
    return log, run_ids_of(steps), batches


async def _fold_all(
    projection: FrontierProjection, batches: list[dict[int, list[StoredEvent]]]
) -> None:
    for batch in batches:
        await projection.apply(batch, {p: e[-1].position.offset + 1 for p, e in batch.items()})
    await projection.flush()


async def test_a_small_byte_budget_drops_frontiers_and_folds_them_on_from_the_store(
    rng: random.Random,
) -> None:
    log, run_ids, batches = await _log_and_batches(rng, 24, 10)
    store = CountingStore()
    projection = FrontierProjection(store, log, cache_bytes=3_000)  # two or three runs
    await _fold_all(projection, batches)
    assert store.reloaded > 0, "no frontier was dropped and loaded again"
    await assert_stored_is_the_direct_fold(store, log, run_ids)
    roomy = FrontierProjection(CountingStore(), log)
    await _fold_all(roomy, batches)
    assert projection.stats.refused_events == roomy.stats.refused_events


async def test_a_budget_that_holds_every_run_loads_none_again(rng: random.Random) -> None:
    log, run_ids, batches = await _log_and_batches(rng, 24, 10)
    store = CountingStore()
    await _fold_all(FrontierProjection(store, log), batches)
    assert store.reloaded == 0
    await assert_stored_is_the_direct_fold(store, log, run_ids)


async def test_runs_folded_and_not_stored_that_fill_the_budget_make_a_store_due(
    rng: random.Random,
) -> None:
    log, run_ids, batches = await _log_and_batches(rng, 24, 10)
    store = CountingStore()
    projection = FrontierProjection(
        store, log, cache_bytes=8_000, flush_events=1_000_000, flush_interval=3600
    )
    for batch in batches:
        await projection.apply(batch, {p: e[-1].position.offset + 1 for p, e in batch.items()})
    assert store.writes > 0, "nothing came due although the unstored runs filled the budget"
    await projection.flush()
    await assert_stored_is_the_direct_fold(store, log, run_ids)
    roomy = CountingStore()
    projection = FrontierProjection(
        roomy, log, cache_bytes=DEFAULT_CACHE_BYTES, flush_events=1_000_000, flush_interval=3600
    )
    for batch in batches:
        await projection.apply(batch, {p: e[-1].position.offset + 1 for p, e in batch.items()})
    assert roomy.writes == 0


async def test_cache_runs_still_bounds_the_number_of_runs_kept(rng: random.Random) -> None:
    log, run_ids, batches = await _log_and_batches(rng, 24, 10)
    store = CountingStore()
    await _fold_all(FrontierProjection(store, log, cache_runs=2), batches)
    assert store.reloaded > 0, "a two-run cache kept every run"
    await assert_stored_is_the_direct_fold(store, log, run_ids)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"cache_bytes": 0}, "cache_bytes"),
        ({"cache_bytes": -1}, "cache_bytes"),
        ({"cache_bytes": "64MB"}, "cache_bytes"),
        ({"cache_bytes": 1.5}, "cache_bytes"),
        ({"cache_bytes": True}, "cache_bytes"),
        ({"cache_runs": 0}, "cache_runs"),
        ({"cache_runs": "many"}, "cache_runs"),
    ],
)
def test_a_bad_budget_is_refused_by_name(options: dict[str, object], named: str) -> None:
    with pytest.raises(InvalidInputError, match=named):
        FrontierProjection(MemoryFrontierStore(), MemoryEventLog(), **options)  # type: ignore[arg-type]
