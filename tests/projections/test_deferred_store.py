"""A projection that folds several batches before storing them, as a projector with a backlog.

Nothing folded may be lost or stored twice: rows and positions are stored together or not at
all, a failed store drops everything unstored (the next fold starts again from what is stored),
and whatever is stored equals the fold computed directly from the log.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from support.histories import append_all, assert_stored_is_the_direct_fold, run_ids_of, workload

from onward.errors import BackendUnavailableError, InvalidInputError
from onward.eventlog import Event, MemoryEventLog, RunStarted, StoredEvent
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.log_projector import LogProjector
from onward.projections.memory import MemoryFrontierStore

PARTITIONS = 4


class ScriptedStore(MemoryFrontierStore):
    """A memory store whose writes can be made to fail, writing nothing (``failures``), to wait
    until ``gate`` opens (``gated``), or to take a few turns of the event loop first, as a
    database's round trips do (``turns``)."""

    def __init__(self, *, gated: bool = False, turns: int = 0) -> None:
        super().__init__()
        self.failures = 0
        self.writes = 0
        self.started = 0
        self.turns = turns
        self.gate = asyncio.Event()
        if not gated:
            self.gate.set()

    async def write(self, *args: Any, **options: Any) -> None:  # passed on as they are
        self.started += 1
        for _ in range(self.turns):
            await asyncio.sleep(0)
        await self.gate.wait()
        if self.failures:
            self.failures -= 1
            raise BackendUnavailableError("the store went away")
        self.writes += 1
        await super().write(*args, **options)


async def filled_log(
    runs: int, rng: random.Random, partitions: int = PARTITIONS
) -> tuple[MemoryEventLog, list[str]]:
    log = MemoryEventLog(partitions=partitions)
    steps = workload(rng, runs)
    await append_all(log, steps, concurrency=8)
    return log, run_ids_of(steps)


async def read_batches(log: MemoryEventLog, size: int) -> list[dict[int, list[StoredEvent]]]:
    """The whole log as batches of at most ``size`` records per partition, in order."""
    batches: list[dict[int, list[StoredEvent]]] = []
    for partition in range(log.partitions):
        end = (await log.bounds(partition)).end
        for start in range(0, end, size):
            events = await log.read_partition(partition, start, min(end, start + size))
            batches.append({partition: events})
    return batches


def next_offsets(batch: Mapping[int, Sequence[StoredEvent]]) -> dict[int, int]:
    return {p: events[-1].position.offset + 1 for p, events in batch.items()}


async def assert_everything_stored_is_the_direct_fold(
    store: MemoryFrontierStore, log: MemoryEventLog, run_ids: list[str]
) -> None:
    """Every run and call row the log folds to is stored, and every partition's end."""
    await assert_stored_is_the_direct_fold(store, log, run_ids)
    ends = {p: (await log.bounds(p)).end for p in range(log.partitions)}
    assert await store.positions("frontiers") == {p: e for p, e in ends.items() if e}


async def test_batches_are_folded_and_stored_together_once_enough_events_are_pending(
    rng: random.Random,
) -> None:
    log, run_ids = await filled_log(30, rng)
    batches = await read_batches(log, 40)
    store = ScriptedStore()
    projection = FrontierProjection(store, log, flush_events=150, flush_interval=3600)
    pending = 0
    for batch in batches:
        await projection.apply(batch, next_offsets(batch))
        pending += sum(len(e) for e in batch.values())
        if pending >= 150:
            assert projection.pending_events == 0, "a due store did not happen"
            pending = 0
        else:
            assert projection.pending_events == pending
    await projection.flush()
    assert projection.pending_events == 0
    assert store.writes < len(batches) / 2, "batches were not stored together"
    await assert_everything_stored_is_the_direct_fold(store, log, run_ids)


async def test_nothing_folded_is_visible_in_the_store_before_it_is_stored(
    rng: random.Random,
) -> None:
    log, run_ids = await filled_log(10, rng)
    [first, *_] = await read_batches(log, 25)
    store = ScriptedStore()
    projection = FrontierProjection(store, log, flush_events=10_000, flush_interval=3600)
    await projection.apply(first, next_offsets(first))
    assert projection.pending_events == sum(len(e) for e in first.values())
    assert await store.positions("frontiers") == {}
    assert await store.load(run_ids) == {}
    await projection.flush()
    assert await store.positions("frontiers") == next_offsets(first)
    assert store.writes == 1
    await projection.flush()
    assert store.writes == 1, "a flush with nothing pending wrote"


async def test_a_store_is_due_after_the_flush_interval(rng: random.Random) -> None:
    log, _ = await filled_log(10, rng)
    first, second, *_ = await read_batches(log, 10)
    store = ScriptedStore()
    projection = FrontierProjection(store, log, flush_events=10_000, flush_interval=0.05)
    await projection.apply(first, next_offsets(first))
    assert store.writes == 0
    await asyncio.sleep(0.1)
    await projection.apply(second, next_offsets(second))
    assert store.writes == 1
    assert projection.pending_events == 0


async def test_a_failed_store_drops_what_was_unstored_and_folding_restarts_from_the_store(
    rng: random.Random,
) -> None:
    log, run_ids = await filled_log(30, rng)
    store = ScriptedStore()
    projection = FrontierProjection(store, log, flush_events=10_000, flush_interval=3600)
    projector = LogProjector(log, projection, batch_size=30)
    for _ in range(3):
        await projector.step()
    await projector.flush()
    stored_before = await store.positions("frontiers")
    assert stored_before
    for _ in range(3):
        await projector.step()
    assert projection.pending_events
    store.failures = 1
    with pytest.raises(BackendUnavailableError):
        await projector.flush()
    assert projection.pending_events == 0
    assert await store.positions("frontiers") == stored_before
    await projector.catch_up()
    await assert_everything_stored_is_the_direct_fold(store, log, run_ids)


async def test_log_projector_catch_up_stores_everything_it_folded(rng: random.Random) -> None:
    log, run_ids = await filled_log(40, rng)
    store = ScriptedStore()
    projection = FrontierProjection(store, log, flush_events=10_000, flush_interval=3600)
    projector = LogProjector(log, projection, batch_size=20)
    folded = await projector.catch_up()
    assert folded == sum([(await log.bounds(p)).end for p in range(PARTITIONS)])
    assert projection.pending_events == 0
    assert sum((await projector.lag()).values()) == 0
    assert sum((await projector.backlog()).values()) == 0
    await assert_everything_stored_is_the_direct_fold(store, log, run_ids)


async def test_refolding_a_batch_already_stored_changes_nothing(rng: random.Random) -> None:
    log, run_ids = await filled_log(20, rng)
    batches = await read_batches(log, 50)
    store = ScriptedStore()
    projection = FrontierProjection(store, log, flush_events=10_000, flush_interval=3600)
    for batch in batches:
        await projection.apply(batch, next_offsets(batch))
    await projection.flush()
    again = FrontierProjection(store, log, flush_events=10_000, flush_interval=3600)
    for batch in batches:  # as after a crash that lost the positions but not the rows
        await again.apply(batch, next_offsets(batch))
    await again.flush()
    assert again.stats.rows_written == 0
    await assert_everything_stored_is_the_direct_fold(store, log, run_ids)


async def test_write_behind_folds_the_next_batches_while_a_store_is_written(
    rng: random.Random,
) -> None:
    log, run_ids = await filled_log(30, rng, partitions=1)  # every batch but the last full
    batches = await read_batches(log, 40)
    store = ScriptedStore(gated=True)
    projection = FrontierProjection(
        store, log, flush_events=60, flush_interval=3600, write_behind=True
    )
    for batch in batches[:2]:  # 80 events: a store comes due, and waits at the gate
        await projection.apply(batch, next_offsets(batch))
    await asyncio.sleep(0)
    assert (store.started, store.writes) == (1, 0), "the due store did not start"
    third, fourth, *rest = batches[2:]
    await projection.apply(third, next_offsets(third))  # folded while the store is written
    assert projection.pending_events == sum(len(e) for b in batches[:3] for e in b.values())
    assert await store.positions("frontiers") == {}
    blocked = asyncio.ensure_future(projection.apply(fourth, next_offsets(fourth)))
    await asyncio.sleep(0.05)
    assert not blocked.done(), "a second store started before the first one landed"
    assert store.started == 1
    store.gate.set()
    await blocked
    for batch in rest:
        await projection.apply(batch, next_offsets(batch))
    await projection.flush()
    assert projection.pending_events == 0
    await assert_everything_stored_is_the_direct_fold(store, log, run_ids)


async def test_a_failed_write_behind_is_raised_next_and_drops_everything_unstored(
    rng: random.Random,
) -> None:
    log, run_ids = await filled_log(30, rng)
    store = ScriptedStore()
    projection = FrontierProjection(
        store, log, flush_events=150, flush_interval=3600, write_behind=True
    )
    projector = LogProjector(log, projection, batch_size=30)  # at most 120 events a step
    await projector.step()
    await projector.flush()
    stored_before = await store.positions("frontiers")
    store.failures = 1
    await projector.step()
    await projector.step()  # 150 events are pending: the store comes due, and fails behind
    await asyncio.sleep(0)
    assert store.failures == 0, "the due store was not attempted"
    with pytest.raises(BackendUnavailableError):
        await projector.step()
    assert projection.pending_events == 0
    assert await store.positions("frontiers") == stored_before
    await projector.catch_up()
    await assert_everything_stored_is_the_direct_fold(store, log, run_ids)


async def test_a_run_evicted_while_its_store_is_written_is_loaded_only_after_it_lands(
    rng: random.Random,
) -> None:
    # Runs written step by step in turn, so that every run goes on in the next batch.
    log = MemoryEventLog(partitions=1)
    steps = workload(rng, 6, zombies=0)  # a zombie's refused events are not the point here
    by_run: dict[str, list[list[Event]]] = {}
    for step in steps:
        by_run.setdefault(step[0].run_id, []).append(step)
    for turn in range(max(map(len, by_run.values()))):
        for run_steps in by_run.values():
            if turn < len(run_steps):
                await log.append(run_steps[turn])
    first, second, *rest = await read_batches(log, 12)
    store = ScriptedStore(gated=True)
    # The store of the first batch evicts all but one of its runs from a two-run cache. The
    # next batch goes on with them: loading them before that store lands would fold on from
    # nothing, refusing their events as gaps.
    projection = FrontierProjection(
        store, log, cache_runs=2, flush_events=10_000, flush_interval=3600, write_behind=True
    )
    await projection.apply(first, next_offsets(first))
    await asyncio.sleep(0)
    assert store.started == 1, "the first batch's store did not come due"
    going_on = asyncio.ensure_future(projection.apply(second, next_offsets(second)))
    await asyncio.sleep(0.05)
    assert not going_on.done(), "the next store started before the first one landed"
    store.gate.set()
    await going_on
    for batch in rest:
        await projection.apply(batch, next_offsets(batch))
    await projection.flush()
    assert projection.stats.refused_events == 0
    await assert_everything_stored_is_the_direct_fold(store, log, run_ids_of(steps))


async def test_a_store_being_written_makes_progress_while_a_large_batch_is_folded() -> None:
    log = MemoryEventLog(partitions=1)
    for n in range(3_020):
        started = RunStarted(run_id=f"run-{n}", tenant="t", seq=1, fence=1, agent="a", revision="1")
        await log.append([started])
    events = await log.read_partition(0, 0)
    first, due, large = {0: events[:10]}, {0: events[10:20]}, {0: events[20:]}
    store = ScriptedStore(turns=3)
    projection = FrontierProjection(
        store, log, flush_events=100_000, flush_interval=0.5, write_behind=True
    )
    await projection.apply(first, next_offsets(first))
    await asyncio.sleep(0.6)
    await projection.apply(due, next_offsets(due))  # the interval has passed: a store starts
    assert store.writes == 0
    await projection.apply(large, next_offsets(large))  # 3,000 runs, not due by itself
    assert store.writes == 1, "the store in flight waited for the whole batch to be folded"
    await projection.flush()
    assert await store.positions("frontiers") == {0: len(events)}


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"flush_events": -1}, "flush_events"),
        ({"flush_interval": -0.5}, "flush_interval"),
        ({"cache_runs": 0}, "cache_runs"),
    ],
)
def test_bad_flush_settings_are_refused_by_name(options: dict[str, float], named: str) -> None:
    with pytest.raises(InvalidInputError, match=named):
        FrontierProjection(MemoryFrontierStore(), MemoryEventLog(), **options)  # type: ignore[arg-type]
