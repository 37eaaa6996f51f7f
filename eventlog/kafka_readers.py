"""The consumers a `KafkaEventLog` reads with: a few, so concurrent reads do not queue.

One consumer reads one partition range at a time (it is assigned the partition and sought to
the range's start). With a single consumer, every read of a process (each resume's tail, each
recovery pass's look at a run, each start checking that a run id is new) waited for the one
before it, and a read that had to move the consumer to another partition could wait out a fetch
still polling the last one. `KafkaReaders` keeps up to ``size`` consumers, starting the next one
only when every started one is busy, and hands a read the idle consumer already positioned where
it starts, so a projector or a rebuild walking a partition keeps reusing what was fetched.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from onward._storage import DRIVER_ERRORS
from onward._storage.kafka import drop_connections, start_unbroken
from onward._storage.waits import outlast
from onward.errors import BackendUnavailableError, InvalidInputError

from .base import LogRecord, PartitionBounds

DEFAULT_READERS = 4


class _Reader:
    """One consumer and where its last read stopped."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self.consumer = consumer
        self.cursor: tuple[int, int] | None = None


async def _stop_started(consumer: AIOKafkaConsumer) -> None:
    """Stop a consumer whose start failed or was given up on (its sockets, if it opened any)."""
    # aiokafka's stop awaits a task its start created; stopped before that task first ran,
    # the stop raises CancelledError half-way and leaves its sockets open.
    await asyncio.sleep(0)
    with contextlib.suppress(Exception):
        await consumer.stop()


class KafkaReaders:
    """Up to ``size`` started consumers, each lent to one read at a time.

    Args:
        new_consumer: Builds a consumer (not started) as the log configures them.
        size: Most consumers started at once.
        read_timeout_s: How long a read may go without getting any further before it fails
            (a read of a long stretch of a partition may take longer as a whole).
    """

    def __init__(
        self, new_consumer: Callable[[], AIOKafkaConsumer], *, size: int, read_timeout_s: float
    ) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self._new_consumer = new_consumer
        self._size = size
        self._read_timeout_s = read_timeout_s
        self._started: list[_Reader] = []
        self._idle: list[_Reader] = []
        self._starting = 0
        self._forgotten = False
        self._returned = asyncio.Condition()

    @property
    def consumers(self) -> list[AIOKafkaConsumer]:
        """Every started consumer (to stop them)."""
        return [reader.consumer for reader in self._started]

    async def start(self) -> None:
        """Start the first consumer, so a broker that does not answer is found at once."""
        self._idle.append(await self._start_one())

    def forget(self) -> None:
        """Drop every consumer (the log is stopping them) and refuse to start or lend more.

        A consumer whose start is still under way is not among those being stopped: its start
        stops it again when it ends, so nothing is left with sockets open.
        """
        self._forgotten = True
        self._started = []
        self._idle = []

    def _check_open(self) -> None:
        if self._forgotten:
            raise self._closed_error()

    @staticmethod
    def _closed_error() -> InvalidInputError:
        return InvalidInputError("the Kafka event log was closed during this read")

    async def _start_one(self) -> _Reader:
        self._check_open()
        consumer = self._new_consumer()
        try:
            await start_unbroken(consumer, self._read_timeout_s)
            self._check_open()
        except BaseException:
            # In a task of its own, waited for however often this one is cancelled meanwhile:
            # a stop cut short leaves the consumer's sockets open for good.
            stopping = asyncio.ensure_future(_stop_started(consumer))
            try:
                await outlast(stopping, self._read_timeout_s)
            finally:
                if not stopping.done():
                    stopping.cancel()
                    drop_connections(consumer)
            raise
        reader = _Reader(consumer)
        self._started.append(reader)
        return reader

    @contextlib.asynccontextmanager
    async def lent(self, near: tuple[int, int] | None = None) -> AsyncIterator[_Reader]:
        """An idle consumer, preferring one positioned at ``near`` (partition, offset); a new
        one if every started one is busy and there is room; else the next one returned."""
        reader = await self._take(near)
        try:
            yield reader
        except BaseException as exc:
            reader.cursor = None
            if self._forgotten and isinstance(exc, (*DRIVER_ERRORS, BackendUnavailableError)):
                # The log stopped this consumer under the read: said as a read that starts
                # after the close is, not as an outage a caller would retry.
                raise self._closed_error() from exc
            raise
        finally:
            async with self._returned:
                if not self._forgotten:
                    self._idle.append(reader)
                self._returned.notify()

    async def _take(self, near: tuple[int, int] | None) -> _Reader:
        async with self._returned:
            while True:
                if self._forgotten:
                    # Each consumer coming back after the close wakes one waiting read: that
                    # one wakes the next, or every read past the first would wait for ever.
                    self._returned.notify()
                    raise self._closed_error()
                if self._idle:
                    for reader in self._idle:
                        if near is not None and reader.cursor == near:
                            self._idle.remove(reader)
                            return reader
                    return self._idle.pop()
                if len(self._started) + self._starting < self._size:
                    self._starting += 1
                    break
                try:
                    await self._returned.wait()
                except asyncio.CancelledError:
                    # Notified, then cancelled before it woke, this read took the notification
                    # with it (Python 3.11): passed on, or the next waiting read would wait
                    # with a consumer idle until some other one came back, or for ever.
                    self._returned.notify()
                    raise
        try:
            return await self._start_one()
        except BaseException:
            # A read waiting for room may start a consumer in this one's place.
            async with self._returned:
                self._returned.notify()
            raise
        finally:
            self._starting -= 1

    async def bounds(self, reader: _Reader, tp: TopicPartition) -> PartitionBounds:
        """The partition's first offset and the offset after its last record, asked together
        (two requests in flight, one round trip's wait)."""
        starts, ends = await asyncio.gather(
            reader.consumer.beginning_offsets([tp]), reader.consumer.end_offsets([tp])
        )
        return PartitionBounds(int(starts[tp]), int(ends[tp]))

    async def ends(self, reader: _Reader, tps: Sequence[TopicPartition]) -> dict[int, int]:
        """The offset after the last record of each of ``tps``, in one request."""
        ends = await reader.consumer.end_offsets(list(tps))
        return {tp.partition: int(ends[tp]) for tp in tps}

    async def read(
        self,
        reader: _Reader,
        tp: TopicPartition,
        low: int,
        high: int,
        *,
        key: bytes | None,
        limit: int | None,
        record_of: Callable[[int, object], LogRecord],
        run_id: str | None,
    ) -> list[LogRecord]:
        """Records ``low`` up to ``high`` of one partition, only those keyed ``key`` if set."""
        out: list[LogRecord] = []
        batches = self._batches(reader, tp, low, high, run_id=run_id)
        async with contextlib.aclosing(batches):
            async for records in batches:
                for record in records:
                    if key is not None and record.key != key:
                        continue
                    out.append(record_of(tp.partition, record))
                    if limit is not None and len(out) >= limit:
                        return out
        return out

    async def keys(self, reader: _Reader, tp: TopicPartition, low: int, high: int) -> set[bytes]:
        """The keys (run ids) of records ``low`` up to ``high`` of one partition, their values
        left undecoded."""
        found: set[bytes] = set()
        batches = self._batches(reader, tp, low, high, run_id=None)
        async with contextlib.aclosing(batches):
            async for records in batches:
                found.update(record.key for record in records if record.key is not None)
        return found

    async def _batches(
        self, reader: _Reader, tp: TopicPartition, low: int, high: int, *, run_id: str | None
    ) -> AsyncGenerator[Sequence[Any], None]:
        """The records ``low`` up to ``high`` of one partition as fetched, batch by batch."""
        consumer = reader.consumer
        if consumer.assignment() != {tp}:
            consumer.assign([tp])
            reader.cursor = None
        # A read that starts where this consumer's last one stopped (a projector or a rebuild
        # walking a partition) reuses what it already fetched instead of seeking back.
        if reader.cursor != (tp.partition, low):
            consumer.seek(tp, low)
        position = low
        # The bound is on a broker that stops answering, not on the read's length: a read of
        # millions of other runs' records (a resume far past its frontier) is many fetches,
        # and failing it as a whole would fail it again on every retry.
        deadline = time.monotonic() + self._read_timeout_s
        while position < high:
            if time.monotonic() > deadline:
                raise BackendUnavailableError(
                    f"partition {tp.partition}: reading offsets {low}..{high} got no further "
                    f"than {position} for {self._read_timeout_s:g}s",
                    run_id=run_id,
                )
            batches = await consumer.getmany(tp, timeout_ms=200, max_records=high - position)
            records = batches.get(tp, ())
            # Offsets are not dense (a transaction's markers, aborted or compacted records take
            # offsets no reader is given): the consumer's own position is past those, and a
            # fetch of ``high - position`` records may reach past ``high``.
            fetched = await consumer.position(tp)
            if fetched > position:
                position = fetched
                deadline = time.monotonic() + self._read_timeout_s
            reader.cursor = (tp.partition, position)
            if records and records[-1].offset >= high:
                records = [record for record in records if record.offset < high]
            if records:
                yield records
