"""How many reads a catch-up makes: each one an inline fold's round trip on PostgreSQL.

A catch-up whose news fit one batch per partition reads the positions, each partition and the
released runs once, never the partitions' ends and not once more to find nothing left; one whose
batches were cut short reads on until every partition is folded.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Collection

from support.histories import append_all, assert_stored_is_the_direct_fold, run_ids_of, workload

from onward.eventlog import MemoryEventLog, PartitionBounds
from onward.eventlog.base import LogRead, LogRecord
from onward.projections.base import QuarantineEntry, QuarantineState
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.log_projector import LogProjector
from onward.projections.memory import MemoryFrontierStore

PARTITIONS = 4


class CountedLog(MemoryEventLog):
    """A memory log that counts the reads of each partition's records and of its ends."""

    def __init__(self, partitions: int) -> None:
        super().__init__(partitions=partitions)
        self.bounds_read: Counter[int] = Counter()
        self.records_read: Counter[int] = Counter()

    async def bounds(self, partition: int) -> PartitionBounds:
        self.bounds_read[partition] += 1
        return await super().bounds(partition)

    async def _read_records(self, request: LogRead) -> list[LogRecord]:
        self.records_read[request.partition] += 1
        return await super()._read_records(request)

    def clear(self) -> None:
        self.bounds_read.clear()
        self.records_read.clear()


class CountedStore(MemoryFrontierStore):
    """A memory store that counts the reads of positions and of quarantined records."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: Counter[str] = Counter()

    async def positions(self, consumer: str) -> dict[int, int]:
        self.reads["positions"] += 1
        return await super().positions(consumer)

    async def quarantined(
        self,
        consumer: str,
        *,
        run_id: str | None = None,
        states: Collection[QuarantineState] | None = None,
    ) -> list[QuarantineEntry]:
        self.reads["quarantined"] += 1
        return await super().quarantined(consumer, run_id=run_id, states=states)


async def filled(runs: int, rng: random.Random) -> tuple[CountedLog, list[str]]:
    log = CountedLog(PARTITIONS)
    steps = workload(rng, runs)
    await append_all(log, steps, concurrency=8)
    log.clear()
    return log, run_ids_of(steps)


async def test_a_catch_up_whose_news_fit_one_batch_reads_everything_once(
    rng: random.Random,
) -> None:
    log, run_ids = await filled(10, rng)
    async with CountedStore() as store:
        projection = FrontierProjection(store, log, release_poll=0.0, every_partition=True)
        projector = LogProjector(log, projection)
        folded = await projector.catch_up()
        assert log.records_read == dict.fromkeys(range(PARTITIONS), 1)
        assert not log.bounds_read
        assert store.reads == {"positions": 1, "quarantined": 1}
        assert folded == sum([(await log.bounds(p)).end for p in range(PARTITIONS)])
        await assert_stored_is_the_direct_fold(store, log, run_ids)

        log.clear()
        store.reads.clear()
        await projector.catch_up()  # no news: the look for released runs is the flush's
        assert log.records_read == dict.fromkeys(range(PARTITIONS), 1)
        assert not log.bounds_read
        assert store.reads == {"positions": 1, "quarantined": 1}


async def test_a_catch_up_cut_into_batches_reads_on_until_every_partition_is_folded(
    rng: random.Random,
) -> None:
    log, run_ids = await filled(30, rng)
    async with CountedStore() as store:
        projection = FrontierProjection(store, log, release_poll=0.0, every_partition=True)
        projector = LogProjector(log, projection, batch_size=10)
        await projector.catch_up()
        assert max(log.records_read.values()) > 2  # several passes
        assert sum((await projector.lag()).values()) == 0
        await assert_stored_is_the_direct_fold(store, log, run_ids)


class GappedLog(CountedLog):
    """A log whose partitions end past their last record, as a Kafka partition does after a
    control record: it says it is not dense."""

    dense = False
    gap = 3

    async def bounds(self, partition: int) -> PartitionBounds:
        bounds = await super().bounds(partition)
        return PartitionBounds(bounds.start, bounds.end + self.gap)


async def test_a_log_with_gaps_is_folded_through_the_end_it_says(rng: random.Random) -> None:
    log = GappedLog(PARTITIONS)
    steps = workload(rng, 10)
    await append_all(log, steps, concurrency=8)
    async with CountedStore() as store:
        projection = FrontierProjection(store, log, release_poll=0.0, every_partition=True)
        projector = LogProjector(log, projection, batch_size=7)
        await projector.catch_up()
        ends = {p: (await log.bounds(p)).end for p in range(PARTITIONS)}
        assert await store.positions(projection.consumer) == ends
        assert sum((await projector.backlog()).values()) == 0
        await assert_stored_is_the_direct_fold(store, log, run_ids_of(steps))
