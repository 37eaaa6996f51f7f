"""Folding batches of the log into a `FrontierStore`, from any `EventLog`.

:class:`FrontierProjection` is the core every projector shares: given a batch of stored events
per partition, it loads the touched runs' frontiers once, folds in memory, and writes each
touched run once, together with the partitions' next offsets, in one store transaction.

:class:`LogProjector` drives it by reading partitions of any `EventLog` (SQLite, memory, or
Kafka for rebuilds); :class:`ProjectingEventLog` is the embedded mode, folding right after each
append. The Kafka consumer-group projector lives in :mod:`onward.projections.kafka`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, Self

from onward.eventlog.base import EventLog, PartitionBounds, Position, StoredEvent, partition_for
from onward.eventlog.events import Event

from .base import DEFAULT_MAX_BYTES, BuildSwitched, FrontierStore, Snapshot
from .frontier import Frontier, ToolCallRow, fold_all, fold_run

log = logging.getLogger("onward.projector")

DEFAULT_CONSUMER = "frontiers"


@dataclass(slots=True)
class ProjectorStats:
    """Counters a projector exposes."""

    batches: int = 0
    events: int = 0
    rows_written: int = 0
    refused_events: int = 0
    snapshots_refused: int = 0
    refolded_from_log: int = 0


class ProjectionSink(Protocol):
    """What a projector folds into: stored positions, and an atomic fold-and-advance."""

    async def positions(self) -> dict[int, int]:
        """The next offset per partition folded so far."""
        ...

    async def apply(
        self,
        records: Mapping[int, Sequence[StoredEvent]],
        next_offsets: Mapping[int, int],
    ) -> None:
        """Fold a batch and store the partitions' next offsets with it, atomically.

        Raises:
            BuildSwitched: The sink's active build changed; nothing was written.
        """
        ...

    def forget(self, partitions: Collection[int]) -> None:
        """Drop anything cached about runs of these partitions (they were revoked)."""
        ...


class FrontierProjection:
    """Folds batches into a store: one load and one write per batch, whatever its size.

    Args:
        store: Where frontiers, call rows and positions go.
        log: Read only to refold a run whose last snapshot was refused for size.
        consumer: The name positions are stored under.
        max_bytes: The snapshot cap.
        cache_runs: How many runs' frontiers to keep in memory between batches, so a run
            touched again is not loaded again. Correct while this projection is the only writer
            of its partitions: a rebalance drops the revoked partitions' entries (`forget`).
    """

    def __init__(
        self,
        store: FrontierStore,
        log: EventLog,
        *,
        consumer: str = DEFAULT_CONSUMER,
        max_bytes: int = DEFAULT_MAX_BYTES,
        cache_runs: int = 20_000,
    ) -> None:
        self.store = store
        self.log = log
        self.consumer = consumer
        self.max_bytes = max_bytes
        self.stats = ProjectorStats()
        self._cache: OrderedDict[str, Frontier] = OrderedDict()
        self._cache_runs = cache_runs

    async def positions(self) -> dict[int, int]:
        """The next offset per partition this projection has folded through."""
        return await self.store.positions(self.consumer)

    async def apply(
        self,
        records: Mapping[int, Sequence[StoredEvent]],
        next_offsets: Mapping[int, int],
    ) -> None:
        """Fold one batch and store it with the partitions' next offsets, atomically."""
        by_run: dict[str, list[StoredEvent]] = {}
        for events in records.values():
            for stored in events:
                by_run.setdefault(stored.event.run_id, []).append(stored)
        cache = self._cache
        current = await self.store.load([r for r in by_run if r not in cache])
        snapshots: list[Snapshot] = []
        calls: dict[tuple[str, str], ToolCallRow] = {}
        folded: dict[str, Frontier] = {}
        for run_id, events in by_run.items():
            cached = cache.get(run_id)
            row = current.get(run_id)
            if cached is not None:
                frontier = cached
            elif row is None:
                frontier = Frontier.empty(run_id, events[0].event.tenant)
            elif row.frontier is None:
                frontier = await self._refold(run_id, events[0].event, events[0].position)
            else:
                frontier = row.frontier
            refused_before = frontier.refused
            through_before = frontier.through_offset
            frontier = fold_run(frontier, events, calls)
            folded[run_id] = frontier
            if frontier.through_offset == through_before:
                continue  # everything in the batch was folded before
            self.stats.refused_events += frontier.refused - refused_before
            snapshot = Snapshot.of(frontier, max_bytes=self.max_bytes)
            if snapshot.payload is None:
                self.stats.snapshots_refused += 1
                log.warning("run %r: snapshot refused: %s", run_id, snapshot.error)
            snapshots.append(snapshot)
        try:
            await self.store.write(self.consumer, next_offsets, snapshots, list(calls.values()))
        except BaseException:
            cache.clear()  # what is stored is unknown now; read it again
            raise
        for run_id, frontier in folded.items():
            cache[run_id] = frontier
            cache.move_to_end(run_id)
        while len(cache) > self._cache_runs:
            cache.popitem(last=False)
        self.stats.batches += 1
        self.stats.events += sum(len(e) for e in records.values())
        self.stats.rows_written += len(snapshots)

    def forget(self, partitions: Collection[int]) -> None:
        """Drop cached frontiers of runs in these partitions; another projector owns them now."""
        gone = set(partitions)
        for run_id in [r for r, f in self._cache.items() if f.partition in gone]:
            del self._cache[run_id]

    async def _refold(self, run_id: str, first: Event, position: Position) -> Frontier:
        """A run whose snapshot was refused: fold its history from the log up to ``position``."""
        self.stats.refolded_from_log += 1
        history = await self.log.read_run(run_id, end=position.offset)
        return fold_all(Frontier.empty(run_id, first.tenant), history)


class LogProjector:
    """Projects every partition of any `EventLog` by reading it, for embedded mode and rebuilds.

    Args:
        log: The log to read.
        projection: What to fold into.
        batch_size: Most records read per partition per pass; bounds memory.
    """

    def __init__(
        self, log: EventLog, projection: ProjectionSink, *, batch_size: int = 5_000
    ) -> None:
        self.log = log
        self.projection = projection
        self.batch_size = batch_size

    async def _start(
        self, partition: int, stored: Mapping[int, int]
    ) -> tuple[int, PartitionBounds]:
        bounds = await self.log.bounds(partition)
        return stored.get(partition, bounds.start), bounds

    async def step(self, partitions: Sequence[int] | None = None) -> int:
        """Fold one batch from each partition that has news; return how many events it read."""
        try:
            return await self._step(partitions)
        except BuildSwitched:
            return await self._step(partitions)  # positions are re-read: the new build's

    async def _step(self, partitions: Sequence[int] | None) -> int:
        stored = await self.projection.positions()
        records: dict[int, list[StoredEvent]] = {}
        next_offsets: dict[int, int] = {}
        for partition in partitions if partitions is not None else range(self.log.partitions):
            start, bounds = await self._start(partition, stored)
            if start >= bounds.end:
                continue
            end = min(bounds.end, start + self.batch_size)
            events = await self.log.read_partition(partition, start, end)
            records[partition] = events
            next_offsets[partition] = end
        if not next_offsets:
            return 0
        await self.projection.apply(records, next_offsets)
        return sum(len(e) for e in records.values())

    async def catch_up(self, partitions: Sequence[int] | None = None) -> int:
        """Fold until every partition's stored position reaches its end as of now."""
        total = 0
        while read := await self.step(partitions):
            total += read
        return total

    async def lag(self) -> dict[int, int]:
        """Records not yet folded, per partition."""
        stored = await self.projection.positions()
        lags: dict[int, int] = {}
        for partition in range(self.log.partitions):
            start, bounds = await self._start(partition, stored)
            lags[partition] = max(0, bounds.end - start)
        return lags

    async def run(self, stop: asyncio.Event, *, poll_interval: float = 0.2) -> None:
        """Fold continuously until ``stop`` is set; the batch in progress is finished first."""
        while not stop.is_set():
            if not await self.step():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), poll_interval)


class ProjectingEventLog:
    """Embedded mode: an `EventLog` whose appends are folded into the frontier store at once.

    The append is durable first; the fold follows. If the process dies in between, the next
    append (or :meth:`catch_up`) folds what was missed, from the stored position.
    """

    def __init__(self, log: EventLog, projection: FrontierProjection) -> None:
        self.inner = log
        self.projector = LogProjector(log, projection)

    @property
    def partitions(self) -> int:
        return self.inner.partitions

    async def append(self, events: Sequence[Event]) -> list[Position]:
        positions = await self.inner.append(events)
        await self.projector.catch_up([positions[0].partition])
        return positions

    async def catch_up(self) -> int:
        """Fold whatever other processes appended, in every partition."""
        return await self.projector.catch_up()

    async def read_run(
        self, run_id: str, *, start: int | None = None, end: int | None = None
    ) -> list[StoredEvent]:
        return await self.inner.read_run(run_id, start=start, end=end)

    async def read_partition(
        self, partition: int, start: int, end: int | None = None, *, limit: int | None = None
    ) -> list[StoredEvent]:
        return await self.inner.read_partition(partition, start, end, limit=limit)

    async def bounds(self, partition: int) -> PartitionBounds:
        return await self.inner.bounds(partition)

    async def truncate_before(self, partition: int, offset: int) -> None:
        await self.inner.truncate_before(partition, offset)

    def partition_of(self, run_id: str) -> int:
        """The partition a run's events go to."""
        return partition_for(run_id, self.inner.partitions)

    async def close(self) -> None:
        await self.inner.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
