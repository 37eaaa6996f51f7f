"""`KafkaProjector`: a consumer group over the events topic folding into a `FrontierStore`.

Exactly once without Kafka transactions: the next offset of every partition is stored in the
frontier store in the same transaction as the rows folded from it, and every assignment seeks to
those stored offsets (never to Kafka's committed ones, which this consumer does not write).
``auto_offset_reset="none"``: a partition without a stored offset starts at its first record,
chosen explicitly; a stored offset below the partition's start, or none for a partition
compaction has cut, is an error, not a silent skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import gc
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import (
    KafkaError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
)

from onward._storage import (
    KafkaConnection,
    checked_topic,
    kafka_connection,
    stop_or_drop,
    translate,
)
from onward.errors import (
    BackendUnavailableError,
    ConfigurationError,
    EventDecodeError,
    InvalidInputError,
    LogTruncatedError,
)
from onward.eventlog import codec
from onward.eventlog.base import LogRecord, Position, StoredEvent
from onward.eventlog.kafka import DEFAULT_TOPIC, record_of, topic_partition_count

from .base import BuildSwitched, ProjectionSink
from .frontier_projection import FrontierProjection
from .projector_defaults import CAUGHT_UP_STORE_S, FOCUS_SLICE_S

SinkT = TypeVar("SinkT", bound=ProjectionSink)

log = logging.getLogger("onward.projector")

DEFAULT_GROUP = "onward-projector"

STORE_RETRY_FIRST_S = 0.5
"""A projector that lost a store tries it again after about this long, then twice as long each
time..."""
STORE_RETRY_MAX_S = 10.0
"""...up to this: once the store is back, the projector notices within this long."""

_FETCH_MIN_BYTES = 256 * 1024
_PARTITION_FETCH_BYTES = 4 * 1024 * 1024
_FETCH_CHUNK = 1_000  # records a batch is fetched in, with a turn of the event loop between


def quiet_garbage_collector(young_threshold: int = 50_000) -> None:
    """Make cyclic garbage collection cheap in a process that is mostly a projector.

    A projector allocates a few collector-tracked objects per record (the client's record
    objects, lists) that live for one batch. At Python's default threshold of 700 they survive
    young collections, get promoted, and trigger full collections over everything the process
    has imported: about a fifth of a projector's CPU. Freezing what exists at startup and
    collecting the young generation every ``young_threshold`` allocations removes most of that.
    It changes the whole process, so `onward projector` calls it and the library never does.
    """
    gc.freeze()
    gc.set_threshold(young_threshold, 20, 100)


_M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter for the size from which a block gets a mapping of its own."""


def fixed_mmap_threshold(threshold_bytes: int = 128 * 1024) -> bool:
    """Give large freed buffers back to the system at once; whether the allocator took it.

    glibc raises its mmap threshold to the size of each large block freed, up to 32 MiB: once a
    projector has freed its first fetch response, later responses and decompressed record
    batches come from the heap, whose freed pages the process keeps. A fixed threshold (which
    also stops that raising) keeps every block over it in a mapping of its own, unmapped when
    freed: 20 to 35 MiB less peak RSS for a projector at 100,000 runs. It changes the whole
    process, so `onward projector` calls it and the library never does. Not glibc (macOS,
    musl): nothing changes.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold_bytes))


def _cut_below(partition: int, offset: int, start: int) -> LogTruncatedError:
    """The error of a partition whose start moved past the projector's stored offset."""
    return LogTruncatedError(
        f"partition {partition}: the projector's stored offset {offset} is below the "
        f"partition's start {start}; records it never folded were deleted. Rebuild the "
        "projection (`onward projections rebuild`)",
        partition=partition,
        offset=offset,
        start=start,
    )


class _Seeker(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, projector: KafkaProjector[Any]) -> None:
        self._projector = projector

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        self._projector._rebalances += 1
        self._projector.joined = False
        partitions = sorted(tp.partition for tp in revoked)
        await self._projector._flush_before_rebalance()
        self._projector.projection.forget(partitions)
        log.info("partitions revoked: %s", partitions)

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        self._projector._rebalances += 1
        self._projector.joined = True
        try:
            await self._projector._seek_to_stored(list(assigned))
        except Exception as exc:  # noqa: BLE001 - kept, and raised from the projector's next call
            # Raised here, the client would log it and fetch from nowhere; the projector's
            # next call raises it instead (a store that went away is ridden out there).
            self._projector._failure = exc


class KafkaProjector(Generic[SinkT]):
    """Folds the events topic into a store, as one member of a consumer group.

    Args:
        bootstrap_servers: ``host:port[,...]``, or a `KafkaConnection` (TLS, SASL, client id,
            request timeout; `Settings.kafka_connection` makes one from the environment).
        projection: The fold and the store it writes.
        topic: The events topic.
        partitions: The partition count the topic must have.
        group_id: Consumer group; members share the partitions.
        batch_records: Most records folded per batch; bounds memory.
        session_timeout_ms: How long a dead member keeps its partitions.
        caught_up_store_s: Once caught up, `run` stores at most this often (seconds); 0 stores
            every batch.
        store_loss_limit_s: How long `run` rides out a store (PostgreSQL or Kafka) that stopped
            answering before it gives up and raises `BackendUnavailableError`; ``None`` (the
            default) waits for as long as the outage lasts.
        focus_slice_s: Behind in several partitions (by more than ``batch_records`` each), fold
            one at a time, each for at most this many seconds or until it is drained, the others
            behind paused meanwhile: the runs in play are then one partition's, not the whole
            topic's, so the frontier cache holds them (see `_Turns`). ``None`` folds every
            partition's records as they arrive.
    """

    def __init__(
        self,
        bootstrap_servers: str | KafkaConnection,
        projection: SinkT,
        *,
        topic: str = DEFAULT_TOPIC,
        partitions: int | None = None,
        group_id: str = DEFAULT_GROUP,
        batch_records: int = 5_000,
        session_timeout_ms: int = 10_000,
        caught_up_store_s: float = CAUGHT_UP_STORE_S,
        store_loss_limit_s: float | None = None,
        focus_slice_s: float | None = FOCUS_SLICE_S,
    ) -> None:
        if focus_slice_s is not None and not focus_slice_s > 0:
            raise InvalidInputError(
                f"focus_slice_s must be a positive number of seconds or None, got {focus_slice_s}"
            )
        if caught_up_store_s < 0:
            raise InvalidInputError(
                f"caught_up_store_s must not be negative, got {caught_up_store_s}"
            )
        self.projection = projection
        self.topic = checked_topic(topic)
        self._connection = kafka_connection(bootstrap_servers)
        self._partitions = partitions
        self._group_id = group_id
        self._batch_records = batch_records
        self._session_timeout_ms = session_timeout_ms
        self._caught_up_store_s = caught_up_store_s
        if store_loss_limit_s is not None and store_loss_limit_s < 0:
            raise InvalidInputError(
                f"store_loss_limit_s must not be negative, got {store_loss_limit_s}"
            )
        self._store_loss_limit_s = store_loss_limit_s
        self._consumer: AIOKafkaConsumer | None = None
        self._closes = 0
        """How many times `close` was called: a start it overlapped stops its own consumer."""
        self._failure: BaseException | None = None
        self._rebalances = 0
        """How many times the group revoked or assigned partitions (see `_seek_to_stored`)."""
        self.joined = False
        """In its consumer group with an assignment (possibly empty); not while rebalancing."""
        # A batch is folded, and a rebalance stores, one at a time: a store failing in a
        # rebalance drops what was folded since the stored positions, and a batch fetched
        # before it must then not be folded on top of what is left (see `_apply`).
        self._folding = asyncio.Lock()
        # The assignment's seek and one the fetcher asks for (it found no offset while the
        # assignment was still reading the stored positions) take turns: interleaved, the one
        # ending last moved partitions back under records the other's fetch had handed out.
        self._seeking = asyncio.Lock()
        self._starting = asyncio.Lock()
        self._turns = (
            _Turns(behind_records=batch_records, slice_s=focus_slice_s)
            if focus_slice_s is not None
            else None
        )

    async def start(self) -> None:
        """Join the group; partitions are sought to their stored offsets as they are assigned.

        Starting a started projector does nothing: a consumer made in its place would drop
        the one `close` stops, left connected. Starts at the same time start one after the
        other, for the same reason.
        """
        closes = self._closes
        async with self._starting:
            if self._consumer is None:
                await self._start(closes)

    async def _start(self, closes: int) -> None:
        """Make, start and subscribe the consumer (a `close` since ``closes`` stops it)."""
        consumer = self._connection.consumer(
            role="projector",
            group_id=self._group_id,
            enable_auto_commit=False,
            auto_offset_reset="none",
            isolation_level="read_committed",
            max_poll_records=self._batch_records,
            # Large per-partition fetches fold a partition's runs in long stretches: with many
            # runs, a store then holds fewer of them (2 MiB here wrote a third more rows at
            # 100,000 runs). A response is held about three times while it is parsed; with
            # zstd batches that is less than the frontiers' budget.
            max_partition_fetch_bytes=_PARTITION_FETCH_BYTES,
            # The broker answers a fetch once it has this much, or after the wait: under a
            # steady trickle, one fetch per store instead of one per handful of records. With
            # no store interval, aiokafka's defaults (answer at once, idle polls every 500 ms).
            **(
                {
                    "fetch_min_bytes": _FETCH_MIN_BYTES,
                    "fetch_max_wait_ms": int(self._caught_up_store_s * 1000) or 1,
                }
                if self._caught_up_store_s > 0
                else {}
            ),
            session_timeout_ms=self._session_timeout_ms,
            # A member learns of a rebalance from a heartbeat: beating every second, not every
            # third of the session, lets a joining member start folding seconds sooner.
            heartbeat_interval_ms=min(1_000, max(100, self._session_timeout_ms // 3)),
        )
        admin = self._connection.admin(role="projector-admin")
        try:
            try:
                await self._connection.start(admin)
                self._check_topic(await topic_partition_count(admin, self.topic))
            finally:
                await admin.close()
            await self._connection.start(consumer)
            consumer.subscribe([self.topic], listener=_Seeker(self))
        except BaseException:
            with contextlib.suppress(KafkaError):
                await consumer.stop()
            raise
        if self._closes != closes:
            # `close` found no consumer to stop: this one is stopped here instead.
            with contextlib.suppress(KafkaError):
                await consumer.stop()
            raise InvalidInputError("the projector was closed while it started")
        self._consumer = consumer

    def _check_topic(self, found: int | None) -> None:
        if not found:
            raise ConfigurationError(f"topic {self.topic!r} does not exist")
        if self._partitions is not None and found != self._partitions:
            raise ConfigurationError(
                f"topic {self.topic!r} has {found} partitions, the configuration says "
                f"{self._partitions}"
            )

    async def _seek_to_stored(self, assigned: list[TopicPartition]) -> None:
        # Counted before the wait: a rebalance while another seek holds the turn makes
        # ``assigned`` stale, and the assignment's own seek, queued behind, covers it.
        rebalances = self._rebalances
        async with self._seeking:
            await self._seek_to_stored_alone(assigned, rebalances)

    async def _seek_to_stored_alone(self, assigned: list[TopicPartition], rebalances: int) -> None:
        consumer = self._live()
        if self._rebalances != rebalances:
            return  # rebalanced while this seek waited its turn (see below)
        if self._turns is not None:
            self._turns.drop(consumer, assigned)
        if not assigned:
            return
        # Whatever was cached about these partitions may predate another member's writes.
        await self._flush_before_rebalance()
        self.projection.forget([tp.partition for tp in assigned])
        stored = await self.projection.positions()
        try:
            starts = await consumer.beginning_offsets(assigned)
        except KafkaError as exc:
            # A broker slow to answer after a pause: a retryable outage `run` rides out, never
            # the client's own exception (it would stop the projector a supervisor restarts).
            raise translate(exc, context=f"reading where {self.topic}'s partitions start") from exc
        if self._rebalances != rebalances:
            # The group rebalanced while the positions were read (a recovery, a build switch):
            # some of ``assigned`` may be another member's now, and the assignment listener
            # seeks what this member holds, from positions read after it.
            return
        sought: dict[int, int] = {}
        for tp in assigned:
            start = int(starts[tp])
            if tp.partition not in stored and start > 0:
                # Compaction cuts only below every live projector's stored position: a store
                # with none here lost its positions (Redis restarted without persistence) or is
                # not the one compaction read. From the start, runs whose first events were cut
                # would be folded from the middle of their history.
                raise LogTruncatedError(
                    f"partition {tp.partition}: the projector's store holds no position for it "
                    f"while the partition starts at {start}; records it never folded were "
                    "deleted, and runs begun below the start would be folded from the middle "
                    "of their history. Restore the store's positions with its rows, or rebuild "
                    "the projection (`onward projections rebuild`)",
                    partition=tp.partition,
                    start=start,
                )
            offset = stored.get(tp.partition, start)
            if offset < start:
                raise _cut_below(tp.partition, offset, start)
            consumer.seek(tp, offset)
            sought[tp.partition] = offset
        if isinstance(self.projection, FrontierProjection):
            # Its partitions now, folded up to these offsets: runs released from quarantine
            # in them are folded again on the next pass, even if no record arrives.
            self.projection.assigned(sought)
        log.info("assigned %s", {tp.partition: stored.get(tp.partition) for tp in assigned})
        if self._turns is not None:
            # Behind in several: the first fetch is already of one of them alone.
            await self._turns.look(
                consumer, anew=True, rebalanced=lambda: self._rebalances != rebalances
            )

    async def _flush_before_rebalance(self) -> None:
        """Store what was folded before partitions change hands.

        A failure here happens inside the group's rebalance, where it cannot be raised to the
        caller; it is kept and raised by the next :meth:`step`, :meth:`flush` or :meth:`run`,
        since the consumer has moved past records that are no longer held anywhere.
        """
        async with self._folding:
            try:
                await self.projection.flush()
            except BuildSwitched:
                pass  # nothing unstored is kept; every assigned partition is sought next
            except Exception as exc:  # kept, and raised from the caller's next call
                log.exception("storing folded records before a rebalance failed")
                self._failure = exc

    def _live(self) -> AIOKafkaConsumer:
        if self._failure is not None:
            raise self._failure
        if self._consumer is None:
            raise ConfigurationError("the projector is not started")
        return self._consumer

    async def step(self, *, timeout_ms: int = 500) -> int:
        """Fold one batch of whatever arrived; return how many records it held."""
        fetched = await self._fetch(timeout_ms)
        await self._take_turns(fetched)
        if fetched is None:
            return 0
        return await self._apply(*fetched)

    async def _take_turns(
        self, fetched: tuple[dict[int, list[LogRecord]], dict[int, int]] | None
    ) -> None:
        """After a fetch: hand the turn on, or look whether several partitions are behind."""
        if self._turns is not None:
            full = fetched is not None and sum(map(len, fetched[0].values())) >= self._batch_records
            await self._turns.after_fetch(self._live(), full=full)

    async def _fetch(
        self, timeout_ms: int
    ) -> tuple[dict[int, list[LogRecord]], dict[int, int]] | None:
        """The next batch, decoded, with each partition's next offset; None if nothing came."""
        consumer = self._live()
        fetched: dict[TopicPartition, list[Any]] = {}
        try:
            # In chunks, yielding between them: building the client's record objects is the
            # longest stretch the event loop spends away from a store being written.
            wanted = self._batch_records
            while wanted > 0:
                _hand_over_fetched(consumer)
                ask = min(wanted, _FETCH_CHUNK)
                chunk = await consumer.getmany(timeout_ms=timeout_ms, max_records=ask)
                got = 0
                for tp, batch in chunk.items():
                    fetched.setdefault(tp, []).extend(batch)
                    got += len(batch)
                if got < ask:
                    break
                wanted -= got
                timeout_ms = 0
                await asyncio.sleep(0)
        except NoOffsetForPartitionError:
            # The fetcher looked for a Kafka-committed offset (there never is one) before the
            # assignment listener had sought to the stored offset; seek again and carry on.
            await self._seek_to_stored(list(consumer.assignment()))
            return None
        except OffsetOutOfRangeError as exc:
            # Retention moved a partition's start past where it reads: said as a seek says it.
            cut = await self.cut()
            if cut is not None:
                raise cut from exc
            raise translate(exc, context=f"consuming {self.topic}") from exc
        except KafkaError as exc:
            raise translate(exc, context=f"consuming {self.topic}") from exc
        records: dict[int, list[LogRecord]] = {}
        next_offsets: dict[int, int] = {}
        for tp, batch in fetched.items():
            if not batch:
                continue
            partition = tp.partition
            records[partition] = _stored_events(partition, batch)
            next_offsets[partition] = batch[-1].offset + 1
            await asyncio.sleep(0)  # a store being written takes its turn between partitions
        return (records, next_offsets) if records else None

    async def _apply(
        self,
        records: dict[int, list[LogRecord]],
        next_offsets: dict[int, int],
        *,
        store: bool = False,
    ) -> int:
        """Fold a fetched batch, and store everything folded if ``store``; 0 if the store's
        build switched (then every partition has been sought to the new build's positions and
        the batch is not folded).
        """
        switched: BuildSwitched | None = None
        async with self._folding:
            # A store that failed in a rebalance since this batch was fetched dropped what was
            # folded before it: folded now, the records in between would be skipped. Raised
            # instead, and every partition is sought to its stored position.
            self._live()
            try:
                await self.projection.apply(records, next_offsets)
                if store:
                    await self.projection.flush()
            except BuildSwitched as exc:
                switched = exc
        if switched is not None:
            await self._follow(switched)
            return 0
        return sum(len(b) for b in records.values())

    async def flush(self) -> None:
        """Store whatever the projection folded and has not stored yet."""
        self._live()
        try:
            await self.projection.flush()
        except BuildSwitched as switched:
            await self._follow(switched)

    async def _follow(self, switched: BuildSwitched) -> None:
        """The store's build switched: seek every assigned partition to the new positions."""
        log.info("%s; seeking to the new build's positions", switched)
        await self._seek_to_stored(list(self._live().assignment()))

    async def lag(self, stored: Mapping[int, int] | None = None) -> dict[int, int]:
        """Records not yet stored, per assigned partition; ``stored`` is the store's positions
        when just read (else they are read).

        Raises:
            BackendUnavailableError: Kafka or the store did not answer.
        """
        consumer = self._live()
        assigned = list(consumer.assignment())
        if not assigned:
            return {}
        try:
            ends = await consumer.end_offsets(assigned)
        except KafkaError as exc:
            raise translate(exc, context=f"reading the ends of {self.topic}") from exc
        if stored is None:
            stored = await self.projection.positions()
        return {tp.partition: max(0, ends[tp] - stored.get(tp.partition, 0)) for tp in assigned}

    async def cut(self, stored: Mapping[int, int] | None = None) -> LogTruncatedError | None:
        """Why it cannot fold on, if an assigned partition's start moved past where it reads
        (retention deleted records it never folded, and its next fetch fails); else None.
        ``stored`` is the store's positions when just read (else they are read).

        Raises:
            BackendUnavailableError: Kafka or the store did not answer.
        """
        consumer = self._live()
        assigned = sorted(consumer.assignment(), key=lambda tp: tp.partition)
        if not assigned:
            return None
        try:
            starts = await consumer.beginning_offsets(assigned)
            if stored is None:
                stored = await self.projection.positions()
            for tp in assigned:
                start = int(starts[tp])
                offset = stored.get(tp.partition, 0)
                # Stored below the start but read past it: what lies between was fetched. One
                # revoked, or without a position (assigned anew), is sought next, and its seek
                # says so.
                position = _known_position(consumer, tp)
                if offset < start and position is not None and position < start:
                    return _cut_below(tp.partition, offset, start)
        except KafkaError as exc:
            raise translate(exc, context=f"reading where {self.topic}'s partitions start") from exc
        return None

    async def run(self, stop: asyncio.Event) -> None:
        """Fold until ``stop`` is set; what was folded is stored before it returns.

        Fetching and decoding the next batch overlaps with folding and storing the previous
        one; batches are still folded one at a time, in order. Once a batch reaches the end of
        the log (the projector has caught up), whatever the projection holds unstored is
        stored, at most every ``caught_up_store_s``; when nothing arrives, at once.

        A store that stops answering (`BackendUnavailableError`: PostgreSQL restarted or
        unreachable, Kafka gone) is waited out: the projector tries again with capped,
        jittered exponential backoff and logs one line when the store is lost and one when it
        is back. What was folded and not stored is dropped, and every partition is sought to
        the positions stored with the rows, so nothing is folded twice and nothing is lost.
        ``stop`` set during the outage returns at once (nothing unstored is lost either).

        Raises:
            BackendUnavailableError: The store stayed unavailable longer than
                ``store_loss_limit_s``.
        """
        outage: _Outage | None = None
        while True:
            try:
                if outage is not None:
                    await self._recover()
                    outage.ended()
                    outage = None
                await self._fold_until(stop)
            except BackendUnavailableError as exc:
                if outage is None:
                    outage = _Outage(exc)
                outage.give_up_if_over(self._store_loss_limit_s, exc)
                if await _stopped_within(stop, outage.next_delay(self._store_loss_limit_s)):
                    log.info("stopped while the store was unavailable; nothing unstored is lost")
                    return
            else:
                return

    async def _recover(self) -> None:
        """Resume after a store failure: once the store answers, store whatever is folded
        (consistent with the stored positions: a failed write dropped everything after it)
        and seek every assigned partition to its stored position."""
        failure, self._failure = self._failure, None
        if failure is not None and not isinstance(failure, BackendUnavailableError):
            raise failure
        consumer = self._live()
        await self.projection.positions()  # the store answers before anything is sought
        await self._seek_to_stored(list(consumer.assignment()))

    async def _fold_until(self, stop: asyncio.Event) -> None:
        """The fold of `run`, until ``stop`` or a failure."""
        storing: asyncio.Task[int] | None = None
        stored_at = time.monotonic()
        unstored = False
        try:
            while not stop.is_set():
                behind = self._turns is not None and self._turns.waiting
                wait_s = 0.2
                if unstored and not behind:
                    # A store is owed: wait for more records no longer than it is due.
                    wait_s = max(0.0, self._caught_up_store_s - (time.monotonic() - stored_at))
                fetched = await self._fetch(int(wait_s * 1000))
                await self._take_turns(fetched)
                if storing is not None:
                    stored, storing = await storing, None
                    if stored == 0 and fetched is not None:
                        # The build switched while this batch was fetched: it may predate the
                        # seek. Seek again (idempotent) so nothing is skipped, and drop it.
                        await self._seek_to_stored(list(self._live().assignment()))
                        continue
                if fetched is not None:
                    records, next_offsets = fetched
                    caught_up = self._caught_up(records, next_offsets)
                    due = caught_up and time.monotonic() - stored_at >= self._caught_up_store_s
                    if due:
                        stored_at = time.monotonic()
                    unstored = not due
                    storing = asyncio.create_task(self._apply(records, next_offsets, store=due))
                elif not behind:
                    await self.flush()
                    stored_at, unstored = time.monotonic(), False
        finally:
            if storing is not None:
                await storing
        await self.flush()

    def _caught_up(self, records: dict[int, list[LogRecord]], next_offsets: dict[int, int]) -> bool:
        """Whether a fetched batch reached the end of the log: it is not full, and none of its
        partitions is behind the end its last fetch response saw (by more than the one offset a
        transaction's commit marker takes). A batch that is not full can still be far behind
        when the fetch buffers ran dry for a moment; storing as if caught up then stores every
        few records."""
        if sum(map(len, records.values())) >= self._batch_records:
            return False
        if self._turns is not None and self._turns.waiting:
            return False  # partitions behind wait for their turn
        consumer = self._consumer
        if consumer is None:
            return True
        assigned = consumer.assignment()
        for partition, offset in next_offsets.items():
            tp = TopicPartition(self.topic, partition)
            if tp not in assigned:
                continue  # revoked since it was fetched (the client has no end for it now)
            end = consumer.highwater(tp)
            if end is not None and offset < end - 1:
                return False
        return True

    async def close(self) -> None:
        """Leave the group. Positions are already stored with the rows; nothing is committed.

        A leave that does not end within the request timeout (a broker that does not answer)
        or is cancelled ends the consumer's tasks and connections all the same
        (`stop_or_drop`): aiokafka's cancelled stop left its heartbeat beating, the projector
        counted in its group, holding its partitions, for as long as the process lived."""
        self._closes += 1
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await stop_or_drop(consumer, self._connection.request_timeout_s)


class _Turns:
    """Which partition a projector behind in several folds now, the others behind paused.

    A consumer hands out the records of all its partitions as they arrive. Behind in many (a
    rebuild, a restart after an outage), each batch then touches runs of every partition: more
    runs are in play than the frontier cache holds, so most are loaded again at every batch,
    each store writes more rows, and the client keeps a fetch buffered for every partition.
    Folding one partition at a time, in turn, keeps that partition's runs in play and its fetch
    alone in memory: at 100,000 runs over 12 partitions, a 16 MiB cache folds as fast as a
    40 MiB one did, where without turns it folded at less than half the speed. One partition,
    not two: with two, their fetches alternate and the batches mix their runs again.

    Partitions keeping up are never paused, and once fewer than two are behind (by more than a
    batch), none is. A paused partition's fetched records are dropped by the client and fetched
    again on its turn; its position does not move, so nothing is skipped or folded twice.
    """

    __slots__ = ("_behind_records", "_look_after", "_paused", "_since", "_slice_s", "turn")

    def __init__(self, *, behind_records: int, slice_s: float) -> None:
        self._behind_records = behind_records
        self._slice_s = slice_s
        self.turn: TopicPartition | None = None
        self._paused: set[TopicPartition] = set()
        self._since = 0.0
        self._look_after = 0.0

    @property
    def waiting(self) -> bool:
        """Whether partitions behind wait for their turn (the projector is not caught up)."""
        return bool(self._paused)

    def drop(self, consumer: AIOKafkaConsumer, assigned: Iterable[TopicPartition]) -> None:
        """Partitions are being sought (an assignment, a recovery, a build switch): forget the
        turns, and pause every partition until `look` has decided them anew (resumed, the
        client would fetch all of them while they are sought, only for the look to drop it).
        With nothing assigned, resume what this projector paused and still has."""
        mine = consumer.assignment()
        if any(tp in mine for tp in assigned):
            _pause(consumer, mine)
            self._paused = set(mine)
        else:
            consumer.resume(*(tp for tp in self._paused if tp in mine))
            self._paused.clear()
        self.turn = None
        self._look_after = 0.0

    async def after_fetch(self, consumer: AIOKafkaConsumer, *, full: bool) -> None:
        """Hand the turn on once its partition is drained or its slice is over; while no turn
        is taken, look how far behind each partition is after a full batch (at most once a
        slice)."""
        now = time.monotonic()
        if self.turn is None:
            if not full or now < self._look_after:
                return
        elif now - self._since < self._slice_s and await self._turn_behind(consumer):
            return
        await self.look(consumer)

    def _resume_all(self, consumer: AIOKafkaConsumer) -> None:
        mine = consumer.assignment()
        consumer.resume(*(tp for tp in self._paused if tp in mine))
        self._paused.clear()
        self.turn = None

    async def _turn_behind(self, consumer: AIOKafkaConsumer) -> bool:
        """Whether the partition having the turn is still behind, by the end its last fetch
        saw (a fetch still on its way counts as behind; so does a partition a rebalance is
        taking, whose assignment resets the turns)."""
        tp = self.turn
        if tp is None:
            return False
        if tp not in consumer.assignment():
            return True
        end = consumer.highwater(tp)
        position = _known_position(consumer, tp)
        return end is None or position is None or end - position > self._behind_records

    async def look(
        self,
        consumer: AIOKafkaConsumer,
        *,
        anew: bool = False,
        rebalanced: Callable[[], bool] = lambda: False,
    ) -> None:
        """Pause every partition behind but the next one in turn (``anew``: the first one
        behind, as after partitions were sought); or none, if fewer than two are behind.

        ``rebalanced`` says whether the group rebalanced since the partitions were sought: the
        partitions assigned anew have no position until the assignment's own seek, which waits
        for the caller's to end and looks again, so the look gives up. A look outside a seek
        passes over partitions without a position (it never waits for one; see
        `_known_position`).
        """
        now = time.monotonic()
        assigned = sorted(consumer.assignment(), key=lambda tp: tp.partition)
        if anew:
            # Nothing is fetched until the turns are known (`drop` paused them already, unless
            # a rebalance assigned more meanwhile; pausing drops what was fetched).
            _pause(consumer, assigned)
            self._paused.update(assigned)
        try:
            ends = await consumer.end_offsets(assigned) if len(assigned) > 1 else {}
            if rebalanced():
                self._resume_all(consumer)
                return  # the assignment's seek looks again, once it has sought them
        except KafkaError as exc:
            self._resume_all(consumer)
            raise translate(exc, context="reading how far behind each partition is") from exc
        # A partition without a position is being sought (assigned anew), or was taken by a
        # rebalance: the assignment's seek looks again.
        behind = [
            tp
            for tp in assigned
            if (position := _known_position(consumer, tp)) is not None
            and ends.get(tp, 0) - position > self._behind_records
        ]
        mine = consumer.assignment()
        if len(behind) < 2:
            if self.turn is not None:
                log.info("behind in %d partitions now: folding every partition", len(behind))
            self._resume_all(consumer)
            self._look_after = now + self._slice_s
            return
        after = self.turn.partition if self.turn is not None and not anew else -1
        turn = next((tp for tp in behind if tp.partition > after), behind[0])
        waiting = {tp for tp in behind if tp != turn and tp in mine}
        consumer.resume(*(tp for tp in self._paused - waiting if tp in mine))
        _pause(consumer, waiting)
        if self.turn is None:
            log.info("behind in %d partitions: folding them one at a time", len(behind))
        self._paused, self.turn, self._since = waiting, turn, now
        log.debug("folding partition %d; %d more behind", turn.partition, len(waiting))


class _Outage:
    """A store that stopped answering: since when, and how long to wait before trying again.

    It says so once when it begins and once when it ends, not at every attempt.
    """

    def __init__(self, first: BackendUnavailableError) -> None:
        self.since = time.time()
        self._began = time.monotonic()
        self._attempts = 0
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since))
        log.warning("store unavailable since %s: %s; retrying", when, first)

    def elapsed(self) -> float:
        return time.monotonic() - self._began

    def give_up_if_over(self, limit_s: float | None, last: BackendUnavailableError) -> None:
        """Raise ``last`` once the outage has lasted ``limit_s``."""
        if limit_s is not None and self.elapsed() >= limit_s:
            raise BackendUnavailableError(
                f"the store has been unavailable for {self.elapsed():.0f}s, longer than the "
                f"projector waits ({limit_s:g}s): {last}"
            ) from last

    def next_delay(self, limit_s: float | None) -> float:
        """Seconds until the next attempt: doubling from `STORE_RETRY_FIRST_S` up to
        `STORE_RETRY_MAX_S`, jittered so projectors that lost one server do not come back in
        step, and never past ``limit_s`` (the last attempt is made when it is reached)."""
        ceiling = min(STORE_RETRY_MAX_S, STORE_RETRY_FIRST_S * 2**self._attempts)
        self._attempts += 1
        delay = random.uniform(ceiling / 2, ceiling)  # noqa: S311 - jitter, not a secret
        if limit_s is not None:
            delay = min(delay, max(0.0, limit_s - self.elapsed()))
        return delay

    def ended(self) -> None:
        log.info("store back after %.0fs", self.elapsed())


async def _stopped_within(stop: asyncio.Event, seconds: float) -> bool:
    """Wait ``seconds`` or until ``stop`` is set; whether it was set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


def _hand_over_fetched(consumer: AIOKafkaConsumer) -> None:
    """Have the client hand over the records it has fetched as its own record objects (offset,
    key, value, headers), not as a ``ConsumerRecord`` built of each: a fold reads the offset and
    the value alone, and building and freeing those took a tenth of its time.

    Reaches into aiokafka's fetcher (pinned below 0.15); if its shape ever differs, nothing is
    changed and the records come as ``ConsumerRecord``s, which read the same here."""
    buffered = getattr(getattr(consumer, "_fetcher", None), "_records", None)
    if not isinstance(buffered, dict):
        return
    for result in buffered.values():
        records = getattr(result, "_partition_records", None)
        if records is not None and hasattr(records, "_consumer_record"):
            records._consumer_record = _as_fetched


def _pause(consumer: AIOKafkaConsumer, partitions: Iterable[TopicPartition]) -> None:
    """Pause ``partitions``, and free at once the records the client fetched for them.

    The client drops a paused partition's fetched records at its next ``getmany`` without
    reading them to the end, and its record iterator (a generator holding its own owner) is
    then a reference cycle: the whole fetch response and the batch decompressed from it stay
    in memory until a full garbage collection, which `quiet_garbage_collector` makes rare. A
    projector taking turns drops them every turn: 60 MiB of peak RSS at 100,000 runs. Closing
    the iterator breaks the cycle; if the partition is resumed before the client drops them,
    it reads nothing from it and fetches again from its position, as after a drop.

    Reaches into aiokafka's fetcher (pinned below 0.15), as `_hand_over_fetched` does; if its
    shape ever differs, the partitions are only paused."""
    partitions = list(partitions)
    consumer.pause(*partitions)
    buffered = getattr(getattr(consumer, "_fetcher", None), "_records", None)
    if not isinstance(buffered, dict):
        return
    for tp in partitions:
        records = getattr(buffered.get(tp), "_partition_records", None)
        iterator = getattr(records, "_records_iterator", None)
        if iterator is not None and hasattr(iterator, "close"):
            iterator.close()


def _known_position(consumer: AIOKafkaConsumer, tp: TopicPartition) -> int | None:
    """Where ``tp`` is read from next; None if it is not assigned or has no position yet.

    ``consumer.position`` waits until a partition assigned anew is sought, for as long as that
    takes: if the assignment's seek failed (a store lost in the rebalance), until `run`
    recovers, which it never did while it waited there (it folded nothing, and did not stop).

    Reads aiokafka's subscription state (pinned below 0.15), as `_hand_over_fetched` reads its
    fetcher."""
    subscription = consumer._subscription.subscription
    assignment = None if subscription is None else subscription.assignment
    if assignment is None or tp not in assignment.tps:
        return None
    state = assignment.state_value(tp)
    return int(state.position) if state.has_valid_position else None


def _as_fetched(_partition: object, record: Any) -> Any:
    return record


def _stored_events(partition: int, batch: list[Any]) -> list[LogRecord]:
    """Decode fetched records; only if one fails, or is keyed by another run than its event's,
    is each looked at again, so an unreadable record comes back as an `UnreadableRecord` in its
    place (named by its key and headers), as a read of the log returns it."""
    try:
        events = codec.decode_many([r.value for r in batch])
    except EventDecodeError:
        return [_storable(record_of(partition, r)) for r in batch]
    if any(
        r.key is not None and r.key != e.run_id.encode(errors="replace")
        for r, e in zip(batch, events, strict=True)
    ):
        return [_storable(record_of(partition, r)) for r in batch]
    return [
        StoredEvent(Position(partition, r.offset), e) for r, e in zip(batch, events, strict=True)
    ]


def _storable(record: LogRecord) -> LogRecord:
    """An unreadable record as a store can file it: a run id, tenant or kind read from the
    record's key or headers that holds a NUL (which PostgreSQL refuses in text) is dropped,
    so the record is listed under no run rather than fail every write of its batch."""
    if isinstance(record, StoredEvent):
        return record
    names = (record.run_id, record.tenant, record.kind)
    if not any(name is not None and "\x00" in name for name in names):
        return record
    return dataclasses.replace(
        record,
        run_id=None if record.run_id is None or "\x00" in record.run_id else record.run_id,
        tenant=None if record.tenant is None or "\x00" in record.tenant else record.tenant,
        kind=None if record.kind is None or "\x00" in record.kind else record.kind,
    )
