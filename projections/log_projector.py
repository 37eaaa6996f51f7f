"""`LogProjector`: the catch-up fold that reads partitions of any `EventLog`.

It drives a `ProjectionSink` (usually a `FrontierProjection`) by reading the log itself: the
embedded mode (SQLite, memory) folds right after each append, and rebuilds read any log,
Kafka included, from its start. The Kafka consumer-group projector is
:mod:`onward.projections.kafka`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence

from onward.errors import LogTruncatedError
from onward.eventlog.base import EventLog, LogRecord, PartitionBounds

from .base import BuildSwitched, ProjectionSink


class LogProjector:
    """Projects every partition of any `EventLog` by reading it, for embedded mode and rebuilds.

    Args:
        log: The log to read.
        projection: What to fold into.
        batch_size: Most records read per partition per pass; bounds memory.
        from_log_start: Fold a partition the projection holds no position for from wherever
            the log starts now, even past 0 (a rebuild that checked what was cut is archived,
            or reads the archive with the log). Otherwise such a partition is refused: see
            :meth:`_refuse_cut`.
    """

    def __init__(
        self,
        log: EventLog,
        projection: ProjectionSink,
        *,
        batch_size: int = 5_000,
        from_log_start: bool = False,
    ) -> None:
        self.log = log
        self.projection = projection
        self.batch_size = batch_size
        self.from_log_start = from_log_start
        self._folded: dict[int, int] = {}
        self._stored_by_me: dict[int, int] = {}
        # Whether the last step stopped short of a partition's end (its batch was full).
        self._cut_short = False
        # One catch-up at a time: a process's runs append (and so catch up) concurrently, and
        # one that began while another was half done could not tell that one's unstored folds
        # from a position another process moved.
        self._catching_up = asyncio.Lock()
        self._dense = bool(getattr(log, "dense", False))

    def _next(self, partition: int, stored: Mapping[int, int]) -> int | None:
        """Where to read the partition from: past what was stored or folded; ``None``, its
        start, when neither is known."""
        known = [o for o in (stored.get(partition), self._folded.get(partition)) if o is not None]
        return max(known) if known else None

    async def _start(
        self, partition: int, stored: Mapping[int, int]
    ) -> tuple[int, PartitionBounds]:
        bounds = await self.log.bounds(partition)
        start = max(stored.get(partition, bounds.start), self._folded.get(partition, 0))
        return start, bounds

    def _refuse_cut(self, partition: int, start: int) -> None:
        """Refuse to fold a partition from ``start``, its first record, past 0 when nothing of
        it was stored or folded: as `KafkaProjector` does.

        Compaction cuts only below every live projector's stored position, so a store with
        none here lost its positions (a frontier file deleted or replaced) or is not the one
        compaction read. From the start, runs whose first events were cut would be folded
        from the middle of their history: refused events, a finished run never started.
        """
        if start <= 0 or self.from_log_start:
            return
        raise LogTruncatedError(
            f"partition {partition}: the projection's store holds no position for it while "
            f"the partition starts at {start}; records it never folded were deleted, and runs "
            "begun below the start would be folded from the middle of their history. Restore "
            "the store's positions with its rows (embedded: the frontier file from its "
            "backup); with a Kafka or PostgreSQL log, rebuild the projection with what was "
            "cut read back from the archive compaction wrote (`onward projections rebuild "
            "--archive DIR`)",
            partition=partition,
            start=start,
        )

    async def _read_on(
        self, partition: int, stored: Mapping[int, int]
    ) -> tuple[list[LogRecord], int, bool] | None:
        """A batch of a dense log, read on to whatever end it has without asking for the end
        first (on PostgreSQL, a round trip fewer for every partition an inline fold reads):
        the records, the offset after the last, and whether the batch was cut short; ``None``
        when there is no news."""
        start = self._next(partition, stored)
        batch = await self.log.read_records(partition, start, limit=self.batch_size)
        if not batch:
            return None
        if start is None:
            # Read from the start: offsets are dense from 0, so a first one past 0 is a cut.
            self._refuse_cut(partition, batch[0].position.offset)
        return batch, batch[-1].position.offset + 1, len(batch) >= self.batch_size

    async def _read_to_end(
        self, partition: int, stored: Mapping[int, int]
    ) -> tuple[list[LogRecord], int, bool] | None:
        """A batch of a log with gaps, read up to the end it had: the end is where the next
        batch starts, even when no record lies between the last one read and it."""
        start, bounds = await self._start(partition, stored)
        if start >= bounds.end:
            return None
        if partition not in stored and partition not in self._folded:
            self._refuse_cut(partition, bounds.start)
        end = min(bounds.end, start + self.batch_size)
        return await self.log.read_records(partition, start, end), end, end < bounds.end

    async def step(self, partitions: Sequence[int] | None = None) -> int:
        """Fold one batch from each partition that has news; return how many events it read.

        The projection may keep what it folded unstored (see `FrontierProjection`); the next
        step reads on from what was folded, and :meth:`flush` stores it.
        """
        try:
            return await self._step(partitions)
        except BuildSwitched:
            self._folded.clear()
            return await self._step(partitions)  # positions are re-read: the new build's
        except BaseException:
            self._folded.clear()  # what was folded and not stored is gone with the error
            raise

    async def _step(self, partitions: Sequence[int] | None) -> int:
        stored = await self.projection.positions()
        wanted = partitions if partitions is not None else range(self.log.partitions)
        # What this projector cached about a partition's runs is current only while the stored
        # position is the one it last stored itself. Another process folding the same file
        # (embedded mode) moves it; and a catch-up cancelled while its store was under way
        # left a position this projector never recorded as its own, beside the frontiers it
        # folded, which then lack whatever another process folds on from that position.
        moved = [
            p
            for p in {*self._stored_by_me, *wanted}
            if stored.get(p) != self._stored_by_me.get(p) and p not in self._folded
        ]
        if moved:
            self.projection.forget(moved)
            # Read again: forgetting a partition also forgets how far it is folded, which a
            # projection learns from its positions (and needs to fold released runs again).
            stored = await self.projection.positions()
            for partition in moved:
                # Nothing of it is cached now, so nothing cached can be stale against the
                # position stored: a later move is what the next step looks for.
                if partition in stored:
                    self._stored_by_me[partition] = stored[partition]
                else:
                    self._stored_by_me.pop(partition, None)
        records: dict[int, list[LogRecord]] = {}
        next_offsets: dict[int, int] = {}
        self._cut_short = False
        for partition in wanted:
            read = await (self._read_on if self._dense else self._read_to_end)(partition, stored)
            if read is not None:
                batch, end, cut_short = read
                records[partition] = batch
                next_offsets[partition] = end
                self._cut_short = self._cut_short or cut_short
        if not next_offsets:
            return 0
        await self.projection.apply(records, next_offsets)
        self._folded.update(next_offsets)
        return sum(len(e) for e in records.values())

    async def flush(self) -> None:
        """Store whatever the projection folded and has not stored yet."""
        try:
            await self.projection.flush()
            self._stored_by_me.update(self._folded)
        finally:
            self._folded.clear()

    async def catch_up(self, partitions: Sequence[int] | None = None) -> int:
        """Fold and store until every partition's position reaches its end as of now.

        A step that read every partition to the end it found is the last: those ends were read
        after the catch-up began, so a pass more would only read the positions and ends again.
        """
        async with self._catching_up:
            total = 0
            while read := await self.step(partitions):
                total += read
                if not self._cut_short:
                    break
            await self.flush()
            return total

    async def backlog(self) -> dict[int, int]:
        """Records not yet folded, per partition (folded ones may not be stored yet)."""
        stored = await self.projection.positions()
        backlog: dict[int, int] = {}
        for partition in range(self.log.partitions):
            start, bounds = await self._start(partition, stored)
            backlog[partition] = max(0, bounds.end - start)
        return backlog

    async def lag(self) -> dict[int, int]:
        """Records not yet stored, per partition."""
        stored = await self.projection.positions()
        lags: dict[int, int] = {}
        for partition in range(self.log.partitions):
            bounds = await self.log.bounds(partition)
            lags[partition] = max(0, bounds.end - stored.get(partition, bounds.start))
        return lags

    async def run(self, stop: asyncio.Event, *, poll_interval: float = 0.2) -> None:
        """Fold continuously until ``stop`` is set; what was folded is stored before it returns."""
        try:
            while not stop.is_set():
                if not await self.step():
                    await self.flush()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), poll_interval)
        finally:
            await self.flush()
