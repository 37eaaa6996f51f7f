"""`KafkaEventLog`: the production backend, on aiokafka.

Every aiokafka default that would hurt an event log is overridden here, explicitly:

* the producer is idempotent with ``acks="all"``: an append returns only once every in-sync
  replica has the batch, and a retried request cannot store it twice;
* a step's events go out as one record batch for one partition (``create_batch`` +
  ``send_batch``), which the broker stores whole or rejects whole;
* readers never auto-commit and use ``auto_offset_reset="none"``: a read below the partition's
  start is an error (`LogTruncatedError`), never a silent jump to the newest record;
* the topic's partition count is fixed at creation and checked at start, because adding
  partitions later would move runs and break per-run order;
* after a fatal producer error (out-of-order sequence, unknown producer id, fenced epoch) the
  producer is replaced, not reused.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.records_to_delete import RecordsToDelete
from aiokafka.errors import (
    OffsetOutOfRangeError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
    for_code,
)

from onward._storage import (
    DRIVER_ERRORS,
    KafkaConnection,
    checked_topic,
    drop_connections,
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
    OnwardError,
    PayloadTooLargeError,
    ProducerFatalError,
)

from . import codec
from .base import (
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_PARTITIONS,
    MOST_RECORDS_LOOKED_THROUGH,
    Appended,
    EventLogBackend,
    LogRead,
    LogRecord,
    PartitionBounds,
    Position,
    check_offset,
    check_partition,
    check_truncation,
    decode_record,
    stored_event,
)
from .events import Event
from .kafka_readers import DEFAULT_READERS, KafkaReaders

DEFAULT_TOPIC = "onward.events"
_log = logging.getLogger("onward.eventlog.kafka")
_HEADER_RUN = "onward.run_id"
_HEADER_KIND = "onward.kind"
# Kafka's default message.max.bytes is 1048588; the batch also carries keys and headers.
_PRODUCER_MAX_BATCH = 1_048_000
_PRODUCER_MAX_REQUEST = 1_100_000


class KafkaEventLog(EventLogBackend):
    """An `EventLog` on one Kafka topic.

    Args:
        bootstrap_servers: ``host:port[,host:port...]``, or a `KafkaConnection` (TLS, SASL;
            `Settings.kafka_connection` makes one from the environment).
        topic: The events topic.
        partitions: The partition count. Created with it if the topic is missing; if the topic
            exists with another count, `start` raises `ConfigurationError`.
        replication_factor: Used only when creating the topic.
        create_topic: Create the topic when missing (with ``cleanup.policy=delete`` and
            ``retention.ms=-1``: compaction, not time, removes events).
        max_batch_bytes: Largest encoded batch accepted before anything is sent.
        read_timeout_s: How long a read may wait for the broker before it fails; and, after
            an append to its partition failed unacknowledged, for that batch to land or fail
            (read before, it could be reported missing and then land).
        client_id: Shown in broker logs (the connection's by default; ``onward`` for a string).
        request_timeout_s: How long an append, or one request of the reader or the admin
            client, may wait for the broker (unreachable, no leader) before it fails with
            `BackendUnavailableError`: the producer's ``request_timeout_ms``, which also bounds
            how long a batch waits to be delivered. The connection's by default
            (``BACKEND_TIMEOUT_S`` for a string).
        readers: Most consumers reading at once (`KafkaReaders`): concurrent reads (resumes,
            recovery) take another instead of waiting for the one reading.
    """

    def __init__(
        self,
        bootstrap_servers: str | KafkaConnection,
        *,
        topic: str = DEFAULT_TOPIC,
        partitions: int = DEFAULT_PARTITIONS,
        replication_factor: int = 1,
        create_topic: bool = True,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        read_timeout_s: float = 30.0,
        client_id: str | None = None,
        request_timeout_s: float | None = None,
        readers: int = DEFAULT_READERS,
    ) -> None:
        super().__init__(partitions=partitions, max_batch_bytes=max_batch_bytes)
        self._connection = kafka_connection(
            bootstrap_servers, client_id=client_id, request_timeout_s=request_timeout_s
        )
        self._bootstrap = self._connection.bootstrap_servers
        self._topic = checked_topic(topic)
        self._replication_factor = replication_factor
        self._create_topic = create_topic
        self._read_timeout_s = read_timeout_s
        self._request_timeout_ms = self._connection.request_timeout_ms
        self._producer: AIOKafkaProducer | None = None
        self._opened = False
        """Started and not closed since; the producer may be missing while it is replaced."""
        self._readers: KafkaReaders | None = None
        self._reader_count = readers
        self._admin: AIOKafkaAdminClient | None = None
        self._producer_lock = asyncio.Lock()
        self._start_lock = asyncio.Lock()
        self._closes = 0
        """How many times `close` was called: a start it overlapped fails, its clients stopped."""
        self._closes_before_start = 0
        self._queues: dict[int, collections.deque[_Pending]] = {}
        self._flushers: dict[int, asyncio.Task[None]] = {}
        self._undecided: dict[int, set[asyncio.Future[Any]]] = {}
        """Per partition, the deliveries of batches whose appends gave up waiting (unacknowledged
        within the request timeout) and which the producer still holds and may yet land."""
        self.producer_generation = 0
        """How many producers this log has created; grows when a fatal error replaced one."""

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def connection(self) -> KafkaConnection:
        """How this log reaches its brokers (servers, client id, timeout, TLS, SASL)."""
        return self._connection

    @property
    def is_open(self) -> bool:
        return self._opened

    async def start(self) -> None:
        """Connect, once however many start at the same time (each would otherwise make clients
        in the place of the others', left running with nobody to stop them).

        Raises:
            InvalidInputError: `close` was called while the log started: what the start made
                is stopped, and the log stays closed.
        """
        closes = self._closes
        async with self._start_lock:
            self._closes_before_start = closes
            try:
                await super().start()
            except BaseException:
                self._closes -= 1  # its own close, after the failure: a start waiting tries anew
                raise

    def _check_not_closed(self) -> None:
        if self._closes != self._closes_before_start:
            raise InvalidInputError("the Kafka event log was closed while it started")

    async def _connect(self) -> None:
        """Connect, create the topic if allowed and missing, and check its partition count."""
        self._check_not_closed()
        try:
            self._admin = admin = self._connection.admin()
            await self._connection.start(admin)
            self._check_not_closed()
            await self._ensure_topic(admin)
            self._readers = KafkaReaders(
                self._new_reader, size=self._reader_count, read_timeout_s=self._read_timeout_s
            )
            await self._readers.start()
        except DRIVER_ERRORS as exc:
            self._check_not_closed()
            raise translate(exc, context=f"connecting to Kafka at {self._bootstrap}") from exc
        self._check_not_closed()
        await self._new_producer()
        # A close meanwhile found no producer to stop: the failed start's close stops it.
        self._check_not_closed()
        self._opened = True

    def _new_reader(self) -> AIOKafkaConsumer:
        return self._connection.consumer(
            role="reader",
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="none",
            isolation_level="read_committed",
            max_partition_fetch_bytes=8 * 1024 * 1024,
            fetch_max_wait_ms=100,
            request_timeout_ms=max(self._request_timeout_ms, 200),
        )

    async def _ensure_topic(self, admin: AIOKafkaAdminClient) -> None:
        found = await self._partition_count(admin)
        if found is None:
            if not self._create_topic:
                # Said so a person at a terminal can act: no command or setting has create_topic.
                raise ConfigurationError(
                    f"topic {self._topic!r} does not exist on {self._bootstrap}; start "
                    f"`onward projector` first, which creates it, or create it with "
                    f"{self._partitions} partitions (in code: create_topic=True)"
                )
            topic = NewTopic(
                self._topic,
                self._partitions,
                self._replication_factor,
                topic_configs={"cleanup.policy": "delete", "retention.ms": "-1"},
            )
            with contextlib.suppress(TopicAlreadyExistsError):
                self._check_created(await admin.create_topics([topic]))
            for _ in range(100):
                found = await self._partition_count(admin)
                if found:
                    break
                await asyncio.sleep(0.1)
            if found is None:
                raise BackendUnavailableError(
                    f"topic {self._topic!r} on {self._bootstrap} was created but is not listed "
                    "10s later; start again once the cluster answers"
                )
        if found != self._partitions:
            raise ConfigurationError(
                f"topic {self._topic!r} has {found} partitions, the configuration says "
                f"{self._partitions}; runs are placed by partition count, so configure the "
                "topic's count (never add partitions to an existing events topic)"
            )

    def _check_created(self, response: Any) -> None:
        """Raise what the broker said when it refused to create the topic (the admin client
        returns its answer, errors included, without raising).

        Raises:
            ConfigurationError: The broker refused the topic (a replication factor above the
                broker count, a policy, a missing permission).
        """
        refused = topic_refusal(response)
        if refused is not None:
            raise ConfigurationError(
                f"Kafka at {self._bootstrap} refused to create topic {self._topic!r} with "
                f"{self._partitions} partitions and replication factor "
                f"{self._replication_factor}: {refused}; change the setting it "
                "names or create the topic yourself"
            )

    async def _partition_count(self, admin: AIOKafkaAdminClient) -> int | None:
        return await topic_partition_count(admin, self._topic)

    async def _new_producer(self) -> None:
        producer = self._connection.producer(
            enable_idempotence=True,
            acks="all",
            linger_ms=0,
            max_batch_size=_PRODUCER_MAX_BATCH,
            max_request_size=_PRODUCER_MAX_REQUEST,
        )
        try:
            await self._connection.start(producer)  # stopped there if it fails or is cancelled
        except DRIVER_ERRORS as exc:
            raise translate(exc, context=f"starting a producer for {self._bootstrap}") from exc
        self._producer = producer
        self.producer_generation += 1

    async def _replace_producer(self, broken: AIOKafkaProducer | None) -> None:
        """Replace ``broken`` (``None``: start the producer a failed replacement did not)
        unless a concurrent append already did.

        A producer started while the log was being closed is stopped again: `close` took
        the producer before this one was there to take.
        """
        async with self._producer_lock:
            current, self._producer = self._producer, None
            if current is not broken:
                self._producer = current
                return
            if current is not None:
                # The session is already broken; its replacement is what matters.
                await stop_or_drop(current, self._request_timeout_ms / 1000)
                # What it still held is sent by nobody now: nothing to wait for any more.
                self._undecided.clear()
            await self._new_producer()
            if not self._opened:
                started, self._producer = self._producer, None
                await stop_or_drop(started, self._request_timeout_ms / 1000)

    async def _replaced(self) -> None:
        """Wait out a replacement of the producer under way (it holds the lock, with no
        producer meanwhile), so what comes now goes out on its successor; if the last
        replacement failed (Kafka was down), try once more, so the log appends again once Kafka
        answers rather than refusing every append until the process restarts.

        Raises:
            BackendUnavailableError: No producer could be started (nor `ConfigurationError`).
        """
        while self._producer is None and self._producer_lock.locked():
            async with self._producer_lock:
                pass
        if self._producer is None and self._opened:
            await self._replace_producer(None)

    def _live_producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise InvalidInputError(
                "the Kafka event log is not started; use `await KafkaEventLog.open(...)` or "
                "`async with`"
            )
        return self._producer

    async def append(self, events: Sequence[Event]) -> list[Position]:
        run_id, partition, encoded = self._prepare(events)
        await self._replaced()
        self._live_producer()
        pending = _Pending(
            run_id=run_id,
            key=run_id.encode(),
            records=encoded,
            headers=[codec.headers(e) for e in events],
            done=asyncio.get_running_loop().create_future(),
        )
        self._queues.setdefault(partition, collections.deque()).append(pending)
        flusher = self._flushers.get(partition)
        if flusher is None or flusher.done():
            self._flushers[partition] = asyncio.create_task(self._flush(partition))
        # Bounded by the flusher, once per record batch rather than once per append: a batch
        # the broker has not acknowledged within the request timeout fails every append of
        # the partition still waiting (see `_flush`).
        first = await pending.done
        return [Position(partition, first + i) for i in range(len(encoded))]

    def _unacknowledged(self, run_id: str, partition: int) -> BackendUnavailableError:
        return BackendUnavailableError(
            f"run {run_id!r}: appending to partition {partition}: Kafka did not acknowledge "
            f"within {self._request_timeout_ms / 1000:g}s (the batch may still land; the log "
            "decides); resume the run once Kafka is reachable",
            run_id=run_id,
        )

    async def _flush(self, partition: int) -> None:
        """Send what is queued for a partition, many runs' steps per record batch (group commit).

        Each record batch still reaches the broker whole or not at all, so every step in it is
        atomic (together with its neighbours); a run's steps stay in the order they were queued.
        One batch per partition is in flight at a time, which is what aiokafka allows anyway.
        """
        queue = self._queues[partition]
        while queue:
            try:
                await self._replaced()
            except OnwardError as no_producer:
                while queue:
                    _settle(queue.popleft(), error=no_producer)
                return
            if self._producer is None:
                closed = InvalidInputError("the Kafka event log was closed before this append")
                while queue:
                    _settle(queue.popleft(), error=closed)
                return
            producer = self._producer
            taken = [queue.popleft()]
            size = taken[0].size
            while queue and size + queue[0].size <= _GROUP_COMMIT_BYTES:
                size += queue[0].size
                taken.append(queue.popleft())
            taken = [p for p in taken if not p.done.done()]  # appends that gave up waiting
            batch, taken, rest = _build(producer, taken)
            queue.extendleft(reversed(rest))  # what did not fit goes first in the next batch
            if batch is None:
                continue
            await self._send(producer, batch, partition, taken)

    async def _send(
        self, producer: AIOKafkaProducer, batch: Any, partition: int, taken: list[_Pending]
    ) -> None:
        """Send one record batch and settle its appends with their offsets or the error."""
        queue = self._queues[partition]
        delivery: asyncio.Future[Any] | None = None
        try:
            # The idempotent producer retries a batch until the broker takes it, however long
            # that is; the appends wait no longer than the request timeout.
            async with asyncio.timeout(self._request_timeout_ms / 1000):
                delivery = await producer.send_batch(batch, self._topic, partition=partition)
                # Shielded: given up on, it still says when the batch lands or fails.
                metadata = await asyncio.shield(delivery)
        except TimeoutError:
            if delivery is not None:  # its outcome, whenever it comes, is no longer awaited
                delivery.add_done_callback(_outcome_dropped)
                if not delivery.done():
                    # Reads of the partition wait for it (`_outcomes_known`).
                    undecided = self._undecided.setdefault(partition, set())
                    undecided.add(delivery)
                    delivery.add_done_callback(undecided.discard)
            # The batch may still land (the log decides); what is queued behind it is never
            # sent, so a resume once Kafka answers again finds each step written or not.
            waiting = [*taken, *queue]
            queue.clear()
            for pending in waiting:
                _settle(pending, error=self._unacknowledged(pending.run_id, partition))
            return
        except DRIVER_ERRORS as exc:
            errors = [
                translate(exc, context=f"appending to partition {partition}", run_id=p.run_id)
                for p in taken
            ]
            if isinstance(errors[0], ProducerFatalError):
                # Replaced before anyone hears of it, so a retry uses a sound session. If no
                # new producer can be started, the next append tries again.
                try:
                    await self._replace_producer(producer)
                except OnwardError as replace_error:
                    _log.error("could not replace the Kafka producer: %s", replace_error)
            for pending, error in zip(taken, errors, strict=True):
                error.__cause__ = exc
                _settle(pending, error=error)
            return
        except BaseException:
            # The flusher itself was cancelled (a close that gave up waiting): its callers were
            # not, and the batch may still land, so they hear that its outcome is unknown.
            for pending in taken:
                _settle(pending, error=self._unacknowledged(pending.run_id, partition))
            raise
        offset = int(metadata.offset)
        for pending in taken:
            _settle(pending, offset=offset)
            offset += len(pending.records)

    async def _read_records(self, request: LogRead) -> list[LogRecord]:
        partition, run_id = request.partition, request.run_id
        tp = TopicPartition(self._topic, partition)
        readers = self._live_readers()
        await self._outcomes_known(partition, run_id)
        cuts = 0
        while True:
            try:
                return await self._read_lent(readers, request, tp)
            except LogTruncatedError:
                # A read from the partition's start (none named) cut meanwhile: from the new
                # start, as a read begun after the cut would, never said as a truncation.
                cuts += 1
                if request.start is not None or cuts > _CUTS_RIDDEN_OUT:
                    raise
            except DRIVER_ERRORS as exc:  # starting another consumer failed
                raise translate(
                    exc, context=f"reading partition {partition}", run_id=run_id
                ) from exc

    async def _read_lent(
        self, readers: KafkaReaders, request: LogRead, tp: TopicPartition
    ) -> list[LogRecord]:
        partition, start, end, run_id, limit = request
        async with readers.lent(near=(partition, start) if start is not None else None) as reader:
            try:
                bounds = await readers.bounds(reader, tp)
            except DRIVER_ERRORS as exc:
                raise translate(exc, context=f"reading partition {partition}") from exc
            low = bounds.start if start is None else start
            if low < bounds.start:
                raise LogTruncatedError(
                    f"partition {partition}: offset {low} was truncated; the partition starts "
                    f"at {bounds.start}",
                    run_id=run_id,
                    partition=partition,
                    offset=low,
                    start=bounds.start,
                )
            high = bounds.end if end is None else min(end, bounds.end)
            if low >= high:
                return []
            try:
                return await readers.read(
                    reader,
                    tp,
                    low,
                    high,
                    key=run_id.encode() if run_id is not None else None,
                    limit=limit,
                    record_of=record_of,
                    run_id=run_id,
                )
            except DRIVER_ERRORS as exc:
                raise translate(
                    exc, context=f"reading partition {partition}", run_id=run_id
                ) from exc

    async def _outcomes_known(self, partition: int, run_id: str | None) -> None:
        """Wait, at most the read timeout, until every batch of ``partition`` whose append gave
        up unacknowledged has landed or failed.

        The producer still holds such a batch and sends it once Kafka answers. A read made
        before it lands would report it missing, and a writer that reads the log back to decide
        whether to append the batch again (it was told the batch may still land) would then
        write it twice: both land, the same seqs twice in the run's log.

        Raises:
            BackendUnavailableError: Such a batch is still undecided after the read timeout.
        """
        undecided = self._undecided.get(partition)
        if not undecided:
            return
        _, pending = await asyncio.wait(list(undecided), timeout=self._read_timeout_s)
        if pending:
            raise BackendUnavailableError(
                f"reading partition {partition}: an append Kafka has not acknowledged may still "
                f"land there, and did not land or fail within {self._read_timeout_s:g}s; read "
                "again once Kafka is reachable",
                run_id=run_id,
            )

    def _live_readers(self) -> KafkaReaders:
        if self._readers is None:
            raise InvalidInputError("the Kafka event log is not started")
        return self._readers

    async def bounds(self, partition: int) -> PartitionBounds:
        check_partition(partition, self._partitions)
        tp = TopicPartition(self._topic, partition)
        readers = self._live_readers()
        try:
            async with readers.lent() as reader:
                return await readers.bounds(reader, tp)
        except DRIVER_ERRORS as exc:
            raise translate(exc, context=f"reading bounds of partition {partition}") from exc

    async def ends(self, partitions: Collection[int]) -> dict[int, int]:
        tps = [TopicPartition(self._topic, p) for p in self._checked_partitions(partitions)]
        readers = self._live_readers()
        try:
            async with readers.lent() as reader:
                return await readers.ends(reader, tps)
        except DRIVER_ERRORS as exc:
            raise translate(exc, context="reading the ends of partitions") from exc

    async def runs_appended(
        self, since: Mapping[int, int], *, most: int = MOST_RECORDS_LOOKED_THROUGH
    ) -> dict[int, Appended]:
        wanted = self._checked_partitions(since)
        readers = self._live_readers()
        out: dict[int, Appended] = {}
        try:
            async with readers.lent() as reader:
                ends = await readers.ends(reader, [TopicPartition(self._topic, p) for p in wanted])
                for partition in wanted:
                    start, end = since[partition], ends[partition]
                    if end - start > most:
                        out[partition] = Appended(end, None)
                        continue
                    keys: set[bytes] = set()
                    if start < end:
                        tp = TopicPartition(self._topic, partition)
                        keys = await readers.keys(reader, tp, start, end)
                    runs = frozenset(k.decode("utf-8", errors="replace") for k in keys)
                    out[partition] = Appended(end, runs)
        except OffsetOutOfRangeError:
            # Truncated below ``since`` meanwhile (retention, compaction): what was appended
            # is unknown, not an error of the log.
            return {p: Appended(end, None) for p, end in (await self.ends(wanted)).items()}
        except DRIVER_ERRORS as exc:
            raise translate(exc, context="reading the runs appended to partitions") from exc
        return out

    async def truncate_before(self, partition: int, offset: int) -> None:
        check_offset(partition, offset)
        bounds = await self.bounds(partition)
        check_truncation(partition, offset, bounds.end)
        if offset <= bounds.start:
            return
        if self._admin is None:
            raise InvalidInputError("the Kafka event log is not started")
        tp = TopicPartition(self._topic, partition)
        try:
            await self._admin.delete_records({tp: RecordsToDelete(before_offset=offset)})
        except DRIVER_ERRORS as exc:
            raise translate(exc, context=f"truncating partition {partition}") from exc

    async def close(self) -> None:
        """Send what is queued, then close.

        A broker that does not answer delays this by a few request timeouts at most (the
        queued appends, then each client's stop); what it had not acknowledged may have landed.
        A close that is cancelled still ends first (within those bounds), then the cancellation
        goes on: the clients it took from the log are stopped by nobody else, and cut short,
        they would stay connected, never stopped, as long as the event loop lives.
        """
        closing = asyncio.ensure_future(self._close())
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError:
            await asyncio.wait({closing})
            if not closing.cancelled():
                closing.exception()  # superseded by the cancellation
            raise

    async def _close(self) -> None:
        bound = self._request_timeout_ms / 1000
        self._closes += 1
        self._opened = False
        # Appends already queued are sent (or fail) before the producer goes away.
        flushers = list(self._flushers.values())
        if flushers:
            _, stuck = await asyncio.wait(flushers, timeout=bound)
            for flusher in stuck:
                flusher.cancel()
            await asyncio.gather(*flushers, return_exceptions=True)
        producer, self._producer = self._producer, None
        self._undecided.clear()
        # What a cancelled flusher left queued was never sent: refused, not left waiting.
        closed = InvalidInputError("the Kafka event log was closed before this append")
        for queue in self._queues.values():
            while queue:
                _settle(queue.popleft(), error=closed)
        readers, self._readers = self._readers, None
        consumers = readers.consumers if readers is not None else []
        if readers is not None:
            readers.forget()
        admin, self._admin = self._admin, None
        errors: list[BaseException] = []
        for owner, stop in (
            (producer, producer.stop if producer else None),
            *((consumer, consumer.stop) for consumer in consumers),
            (admin, admin.close if admin else None),
        ):
            if stop is None:
                continue
            try:
                async with asyncio.timeout(bound):
                    await stop()
            except TimeoutError:
                _log.warning("closing the Kafka log: %s gave up after %gs", stop.__name__, bound)
                drop_connections(owner)
            except DRIVER_ERRORS as exc:
                errors.append(exc)
        if errors:
            raise translate(errors[0], context="closing the Kafka event log") from errors[0]


def _outcome_dropped(delivery: asyncio.Future[Any]) -> None:
    """Take a given-up batch's outcome, so asyncio does not warn that nobody read it."""
    if not delivery.cancelled():
        delivery.exception()


_CUTS_RIDDEN_OUT = 2
"""How many cuts landing between a read's look at a partition's start and its fetch a read from
that start reads on past; one more, and it fails with `LogTruncatedError`."""

_GROUP_COMMIT_BYTES = 900_000
"""Most bytes of queued appends put in one record batch (under the producer's 1,048,000)."""


@dataclasses.dataclass(slots=True)
class _Pending:
    """One append waiting for its partition's next record batch."""

    run_id: str
    key: bytes
    records: list[bytes]
    headers: list[list[codec.Header]]
    done: asyncio.Future[int]
    size: int = 0

    def __post_init__(self) -> None:
        # Keys, values and headers, plus a generous per-record framing allowance.
        per_record = len(self.key) + 64
        self.size = sum(len(r) for r in self.records) + per_record * len(self.records)
        self.size += sum(len(k) + len(v) for hs in self.headers for k, v in hs)


def _settle(
    pending: _Pending, *, offset: int | None = None, error: BaseException | None = None
) -> None:
    """Tell a waiting append how it went (an append that gave up waiting is left alone)."""
    if pending.done.done():
        return
    if offset is not None:
        pending.done.set_result(offset)
    elif error is not None:
        pending.done.set_exception(error)
    else:
        pending.done.cancel()


def _fill(batch: Any, pending: _Pending) -> bool:
    """Append one step's records to a record batch; False if the batch is full."""
    for record, headers in zip(pending.records, pending.headers, strict=True):
        if batch.append(timestamp=None, key=pending.key, value=record, headers=headers) is None:
            return False
    return True


def _build(producer: Any, taken: list[_Pending]) -> tuple[Any, list[_Pending], list[_Pending]]:
    """A record batch of as many of ``taken`` as fit: (batch or None, sent, left over).

    A builder that filled up holds part of a step, so it is thrown away and rebuilt from the
    steps before that one. A step that does not fit even alone fails with PayloadTooLargeError.
    """
    while taken:
        batch = producer.create_batch()
        for index, pending in enumerate(taken):
            if _fill(batch, pending):
                continue
            if index == 0:
                size = sum(len(record) for record in pending.records)
                too_large = PayloadTooLargeError(
                    f"run {pending.run_id!r}: batch of {len(pending.records)} events "
                    f"({size} bytes) does not fit one Kafka record batch (at most "
                    f"{_PRODUCER_MAX_BATCH} bytes with its headers)",
                    run_id=pending.run_id,
                    size=size,
                    limit=_PRODUCER_MAX_BATCH,
                )
                _settle(pending, error=too_large)
                return None, [], taken[1:]
            return _build(producer, taken[:index])[0], taken[:index], taken[index:]
        return batch, taken, []
    return None, [], []


def topic_refusal(response: Any) -> str | None:
    """What the broker said when it refused to create a topic, from ``create_topics``'s answer
    (the admin client returns the broker's error codes without raising); ``None`` if the topic
    was created, exists already, or is still being created (listing it says when)."""
    for refused in response.topic_errors:
        code = refused[1]
        if code in (0, TopicAlreadyExistsError.errno, RequestTimedOutError.errno):
            continue
        error = for_code(code)
        said = refused[2] if len(refused) > 2 and refused[2] else error.description
        return f"{error.message} ({said})"
    return None


async def topic_partition_count(admin: AIOKafkaAdminClient, topic: str) -> int | None:
    """How many partitions a topic has, or ``None`` if it does not exist (or is not yet
    listed: a topic being created answers a retriable error for a moment).

    Raises:
        ConfigurationError: The broker refused to describe the topic (a name it does not
            allow, a missing permission), saying why rather than that it does not exist.
    """
    (described,) = await admin.describe_topics([topic])
    code = described["error_code"]
    if code != 0 and not for_code(code).retriable:
        error = for_code(code)
        raise ConfigurationError(
            f"Kafka refused to describe topic {topic!r}: {error.message} ({error.description})"
        )
    if code != 0 or not described["partitions"]:
        return None
    return len(described["partitions"])


def record_of(partition: int, record: Any) -> LogRecord:
    """A fetched Kafka record as an event, or, if it cannot be decoded or is keyed by another
    run than its own, as an unreadable record named by its key (or ``onward.run_id`` header)
    and ``onward.kind`` header."""
    try:
        event = codec.decode(record.value)
        # The key's bytes against the run id's: a read of a run filters by key, and an event
        # filed under another run must not be returned as that run's (`decode_record` says so).
        if record.key is None or record.key == event.run_id.encode(errors="replace"):
            return stored_event(Position(partition, record.offset), event, record.value)
    except EventDecodeError:
        pass
    return decode_record(
        Position(partition, record.offset),
        record.value,
        run_hint=_run_of(record),
        kind_hint=_header(record, _HEADER_KIND),
    )


def _header(record: Any, wanted: str) -> str | None:
    for name, value in record.headers or ():
        if name == wanted:
            return bytes(value).decode(errors="replace")
    return None


def _run_of(record: Any) -> str | None:
    if record.key is not None:
        return bytes(record.key).decode(errors="replace")
    return _header(record, _HEADER_RUN)


__all__ = ["DEFAULT_TOPIC", "KafkaEventLog"]
