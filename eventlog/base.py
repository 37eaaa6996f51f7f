"""The `EventLog` protocol, positions, and the rules every backend and every reader share.

A log is a fixed number of partitions, each an ordered sequence of offsets. A run's events all
go to one partition (chosen from the run id the way Kafka's Java client chooses from a key), so
one run is totally ordered. Backends store whatever is appended; deciding which stored events
count (seq and fence rules) is the reader's job, done by :class:`SequenceGuard` so every reader
decides the same way.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple, Protocol, runtime_checkable

import msgspec

from onward._storage import AsyncResource, Resource
from onward.errors import (
    CheckpointFormatError,
    EventDecodeError,
    InvalidInputError,
    LogTruncatedError,
    PayloadTooLargeError,
)

from . import codec
from .events import INT64_MAX, AnyEvent, Event, RunClaimed, format_of

DEFAULT_PARTITIONS = 12
DEFAULT_MAX_BATCH_BYTES = 1_000_000
"""Largest encoded batch a log accepts by default, its records' keys and headers counted
(`codec.framed_size`); just under Kafka's default message.max.bytes."""


class Position(msgspec.Struct, frozen=True, order=True, gc=False):
    """Where a record sits in the log."""

    partition: int
    offset: int


class StoredEvent(msgspec.Struct, frozen=True, gc=False):
    """An event together with the position the log gave it.

    Structs without garbage-collector tracking: a projector makes millions of these, and they
    never take part in reference cycles.
    """

    position: Position
    event: AnyEvent


class KeptRecord(StoredEvent, frozen=True, gc=False):
    """A `StoredEvent` read inside `keeping_records`, with its record's bytes as the log
    holds them: what an archive or a retained copy must keep, since the event re-encoded
    drops every field a newer writer added that this code's events do not know."""

    record: bytes


_keeping: ContextVar[bool] = ContextVar("onward_keeping_records", default=False)


@contextlib.contextmanager
def keeping_records() -> Iterator[None]:
    """Reads made inside (in this task, and tasks it starts) return each event as a
    `KeptRecord`, its bytes kept; elsewhere they are dropped once decoded."""
    token = _keeping.set(True)
    try:
        yield
    finally:
        _keeping.reset(token)


def stored_event(position: Position, event: AnyEvent, data: bytes | memoryview) -> StoredEvent:
    """``event``, decoded from ``data`` at ``position``, as a read returns it: with its bytes
    inside `keeping_records`."""
    if _keeping.get():
        return KeptRecord(position, event, bytes(data))
    return StoredEvent(position, event)


def record_bytes(stored: StoredEvent) -> bytes:
    """The record of ``stored`` as the log held it when it was read inside `keeping_records`,
    else the event as this code encodes it."""
    return stored.record if isinstance(stored, KeptRecord) else codec.encode(stored.event)


@dataclass(frozen=True, slots=True)
class UnreadableRecord:
    """A stored record that is not a readable event, in the place the log holds it.

    What :meth:`EventLog.read_records` returns instead of raising, so a projector can set the
    run aside and fold every other run, and an audit can show the hole where it is. It keeps
    what the record was filed under and why it cannot be read, never the record's bytes (they
    may hold secrets).

    Attributes:
        position: Where the record sits.
        run_id: The run it was filed under (its key, a header, or its own ``run_id`` field);
            ``None`` when nothing names one.
        tenant: The tenant its own ``tenant`` field names, when that much can be read and
            it names the run it was filed under (a misfiled record's is another run's).
        kind: Its kind, from the ``onward.kind`` header or its ``kind`` field, when readable.
        error: What decoding it raised: `CheckpointFormatError` for a newer format, else
            `EventDecodeError` (run, seq and field named).
    """

    position: Position
    run_id: str | None
    tenant: str | None
    kind: str | None
    error: EventDecodeError

    @property
    def reason(self) -> str:
        """Why the record cannot be read, in one line."""
        return str(self.error)

    @property
    def newer_format(self) -> bool:
        """The record was written by a newer Onward: upgrading makes it readable."""
        return isinstance(self.error, CheckpointFormatError)


LogRecord = StoredEvent | UnreadableRecord
"""One record as :meth:`EventLog.read_records` returns it: an event, or why it is not one."""


def decode_record(
    position: Position,
    data: bytes | memoryview | None,
    *,
    run_hint: str | None,
    kind_hint: str | None = None,
) -> LogRecord:
    """Decode one stored record, or describe it as unreadable instead of raising.

    Args:
        position: Where it sits.
        data: Its bytes (``None`` for a record with no value, a Kafka tombstone).
        run_hint: The run it was filed under (key or header).
        kind_hint: The kind a header names, if any.
    """
    try:
        event = codec.decode(data, run_hint=run_hint)
        if run_hint is not None and event.run_id != run_hint:
            raise misfiled(event, run_hint)
        assert data is not None  # a record without a value is refused by the decode
        return stored_event(position, event, data)
    except EventDecodeError as exc:
        envelope = codec.probe(data)
        # A record that names another run than the one it was filed under (misfiled) says
        # nothing of the tenant of that one: its tenant must not claim the run for another.
        named = run_hint is None or envelope.run_id == run_hint
        return UnreadableRecord(
            position=position,
            run_id=run_hint if run_hint is not None else envelope.run_id,
            tenant=envelope.tenant if named else None,
            kind=kind_hint if kind_hint is not None else envelope.kind,
            error=exc,
        )


def misfiled(event: Event, run_hint: str) -> EventDecodeError:
    """The error of an event filed under another run (a foreign writer's, a bug's): read as
    it is, a read of the run it was filed under would return another run's event as its own,
    and a fold would apply it to a run whose partition need not even hold it."""
    return EventDecodeError(
        f"run {run_hint!r} seq {event.seq}: unreadable event record: it was filed under run "
        f"{run_hint!r} but is an event of run {event.run_id!r}",
        run_id=run_hint,
        seq=event.seq,
        field="$.run_id",
    )


def strict(records: Sequence[LogRecord]) -> list[StoredEvent]:
    """The events of ``records``; the first unreadable one raises its decode error."""
    out: list[StoredEvent] = []
    for record in records:
        if isinstance(record, UnreadableRecord):
            raise record.error
        out.append(record)
    return out


@dataclass(frozen=True, slots=True)
class PartitionBounds:
    """The offsets a partition holds: ``start`` is the first readable, ``end`` the next to write."""

    start: int
    end: int


@functools.lru_cache(maxsize=65_536)
def partition_for(run_id: str, partitions: int) -> int:
    """The partition of a run: murmur2 of the run id, as Kafka's Java client partitions a key.

    Using the same function everywhere means positions from any backend, and records written by
    other Kafka clients keyed by run id, agree about where a run lives. Remembered for the most
    recent runs: murmur2 is pure Python, and every append of a run asks again.
    """
    hashed: int = murmur2(utf8_run_id(run_id))
    return (hashed & 0x7FFFFFFF) % partitions


_MURMUR2_SEED = 0x9747B28C
_MURMUR2_M = 0x5BD1E995
_U32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """MurmurHash2 of ``data`` as Kafka's Java client computes it (``Utils.murmur2``), unsigned.

    Written here rather than imported from ``aiokafka.partitioner``: importing that loads all of
    aiokafka (~170 ms), which a process on SQLite or PostgreSQL never uses otherwise.
    """
    length = len(data)
    h = (_MURMUR2_SEED ^ length) & _U32
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _MURMUR2_M) & _U32
        k ^= k >> 24
        k = (k * _MURMUR2_M) & _U32
        h = ((h * _MURMUR2_M) & _U32) ^ k
    tail = data[whole:]
    if tail:
        h ^= int.from_bytes(tail, "little")
        h = (h * _MURMUR2_M) & _U32
    h ^= h >> 13
    h = (h * _MURMUR2_M) & _U32
    h ^= h >> 15
    return h


def utf8_run_id(run_id: str) -> bytes:
    """``run_id`` as the UTF-8 every store keeps it in (a Kafka key, a text column).

    Raises:
        InvalidInputError: It holds a lone surrogate (what Python makes of a command-line byte
            that is not UTF-8): no run has that id, and no store could be asked about it.
    """
    try:
        return run_id.encode()
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"run id {run_id!r} holds {run_id[exc.start]!r} at position {exc.start}, a lone "
            "surrogate that is no text any store can hold (UTF-8)"
        ) from None


@runtime_checkable
class EventLog(AsyncResource, Protocol):
    """An append-only, partitioned log of run events."""

    @property
    def partitions(self) -> int:
        """The fixed number of partitions."""
        ...

    async def append(self, events: Sequence[Event]) -> list[Position]:
        """Append one run's events as one atomic batch and return their positions once durable.

        The batch is stored whole or not at all.

        Raises:
            InvalidInputError: The batch is empty, mixes runs, or its seqs are not consecutive.
            PayloadTooLargeError: The encoded batch exceeds the log's limit.
        """
        ...

    async def read_run(
        self, run_id: str, *, start: int | None = None, end: int | None = None
    ) -> list[StoredEvent]:
        """Every stored event of one run in log order, from offset ``start`` up to ``end``.

        Offsets are in the run's partition. ``start`` defaults to the partition's start and
        ``end`` (exclusive) to its current end. Nothing is filtered: apply :class:`SequenceGuard`
        to learn which events count.

        Raises:
            LogTruncatedError: ``start`` lies below the partition's start.
            EventDecodeError: A record of this run is unreadable.
            InvalidInputError: ``run_id`` is no text a store holds (a lone surrogate).
        """
        ...

    async def read_partition(
        self, partition: int, start: int, end: int | None = None, *, limit: int | None = None
    ) -> list[StoredEvent]:
        """Events of every run in one partition, in offset order, from ``start`` up to ``end``,
        at most ``limit`` of them.

        Raises:
            LogTruncatedError: ``start`` lies below the partition's start.
            InvalidInputError: ``limit`` is negative.
        """
        ...

    async def read_records(
        self,
        partition: int,
        start: int | None = None,
        end: int | None = None,
        *,
        run_id: str | None = None,
        limit: int | None = None,
    ) -> list[LogRecord]:
        """Like :meth:`read_partition` (or :meth:`read_run` with ``run_id``), except that a
        record that cannot be decoded comes back in its place as an `UnreadableRecord`
        instead of raising: what projectors and audits read, so one bad record stops neither.

        Raises:
            LogTruncatedError: ``start`` lies below the partition's start.
            InvalidInputError: ``limit`` is negative, or ``run_id`` is no text a store holds.
        """
        ...

    async def bounds(self, partition: int) -> PartitionBounds:
        """The partition's first readable offset and next offset to be written."""
        ...

    async def truncate_before(self, partition: int, offset: int) -> None:
        """Remove every record of a partition below ``offset``. Never moves the start backwards."""
        ...


MOST_RECORDS_LOOKED_THROUGH = 10_000
"""The most records `EventLogBackend.runs_appended` reads the run ids of, per partition."""


class Appended(NamedTuple):
    """What a partition gained since an offset: its end now, and the runs appended to
    (``None``: unknown, too many records to look through)."""

    end: int
    runs: frozenset[str] | None


async def partition_runs_appended(log: EventLog, since: Mapping[int, int]) -> dict[int, Appended]:
    """`EventLogBackend.runs_appended`, or for another log each partition's end with its runs
    unknown."""
    if isinstance(log, EventLogBackend):
        return await log.runs_appended(since)
    return {p: Appended(end, None) for p, end in (await partition_ends(log, since)).items()}


async def partition_ends(log: EventLog, partitions: Collection[int]) -> dict[int, int]:
    """The next offset to be written of each of ``partitions``: one call to the server for a
    backend that can ask for many at once (`EventLogBackend.ends`), one per partition else.

    Raises:
        InvalidInputError: A partition is out of range.
    """
    if isinstance(log, EventLogBackend):
        return await log.ends(partitions)
    return {p: (await log.bounds(p)).end for p in sorted(set(partitions))}


class LogRead(NamedTuple):
    """One read of a partition, by run or not."""

    partition: int
    start: int | None
    """First offset; ``None`` for the partition's start."""
    end: int | None
    """Offset to stop before; ``None`` for the partition's end."""
    run_id: str | None
    """Only this run's events; ``None`` for every run's."""
    limit: int | None
    """Most events returned; ``None`` for no limit."""


class EventLogBackend(Resource):
    """What the log backends share: the partition count, the batch cap, and reads by run or by
    partition routed to one :meth:`_read_records`.

    Args:
        partitions: Partition count.
        max_batch_bytes: Largest encoded batch accepted, keys and headers counted.
    """

    embedded = False
    """Whether every writer of the log runs on this machine (SQLite, memory): then a runner
    may fold a run from its partition when no frontier store is configured."""

    dense = False
    """Whether every offset from a partition's start to its end holds a record (the SQL and
    memory logs; not Kafka, whose control records and compacted topics leave gaps): a reader
    that reached the last record has reached the end, without asking for it."""

    def __init__(self, *, partitions: int, max_batch_bytes: int) -> None:
        if partitions < 1:
            raise InvalidInputError(f"partitions must be at least 1, got {partitions}")
        self._partitions = partitions
        self._max_batch_bytes = max_batch_bytes

    @property
    def partitions(self) -> int:
        return self._partitions

    async def ends(self, partitions: Collection[int]) -> dict[int, int]:
        """The next offset to be written of each of ``partitions`` (each one's `bounds` end),
        in as few calls to the server as the backend can make: what one watcher of many runs
        asks (`partition_ends`).

        Raises:
            InvalidInputError: A partition is out of range.
        """
        wanted = self._checked_partitions(partitions)
        return {p: (await self.bounds(p)).end for p in wanted}

    async def runs_appended(
        self, since: Mapping[int, int], *, most: int = MOST_RECORDS_LOOKED_THROUGH
    ) -> dict[int, Appended]:
        """For each partition of ``since``: its end now, and the runs with a record from offset
        ``since[partition]`` up to that end, in as few calls as the backend can make: what one
        watcher of many runs asks, to wake the streams of those runs alone
        (`partition_runs_appended`). More than ``most`` records appended: runs unknown.

        Raises:
            InvalidInputError: A partition is out of range.
        """
        out: dict[int, Appended] = {}
        for partition, end in (await self.ends(since)).items():
            start = max(since[partition], (await self.bounds(partition)).start)
            if end - start > most:
                out[partition] = Appended(end, None)
                continue
            try:
                records = await self.read_records(partition, start, end) if start < end else []
            except LogTruncatedError:
                # Cut below ``start`` meanwhile (compaction): what was appended is unknown.
                out[partition] = Appended(end, None)
                continue
            runs = (r.event.run_id if isinstance(r, StoredEvent) else r.run_id for r in records)
            out[partition] = Appended(end, frozenset(run for run in runs if run is not None))
        return out

    def _checked_partitions(self, partitions: Collection[int]) -> list[int]:
        """``partitions`` once each, in order, each checked to be in range."""
        wanted = sorted(set(partitions))
        for partition in wanted:
            check_partition(partition, self._partitions)
        return wanted

    async def bounds(self, partition: int) -> PartitionBounds:
        """The partition's first readable offset and next offset to be written (each
        backend's own)."""
        raise NotImplementedError

    def _prepare(self, events: Sequence[Event]) -> tuple[str, int, list[bytes]]:
        """Check and encode a batch: (run id, partition, encoded records)."""
        return prepare_batch(
            events, partitions=self._partitions, max_batch_bytes=self._max_batch_bytes
        )

    async def read_run(
        self, run_id: str, *, start: int | None = None, end: int | None = None
    ) -> list[StoredEvent]:
        check_start(start)
        partition = partition_for(run_id, self._partitions)
        return strict(await self._read(LogRead(partition, start, end, run_id, None)))

    async def read_partition(
        self, partition: int, start: int, end: int | None = None, *, limit: int | None = None
    ) -> list[StoredEvent]:
        check_partition(partition, self._partitions)
        check_start(start)
        if not check_limit(limit):
            return []
        return strict(await self._read(LogRead(partition, start, end, None, limit)))

    async def read_records(
        self,
        partition: int,
        start: int | None = None,
        end: int | None = None,
        *,
        run_id: str | None = None,
        limit: int | None = None,
    ) -> list[LogRecord]:
        check_partition(partition, self._partitions)
        check_start(start)
        if run_id is not None:
            utf8_run_id(run_id)
        if not check_limit(limit):
            return []
        return await self._read(LogRead(partition, start, end, run_id, limit))

    async def _read(self, request: LogRead) -> list[LogRecord]:
        """`_read_records`, offsets checked first: one past any offset a store holds (2**63
        and up, beyond SQLite's and PostgreSQL's integers) reads nothing as a start, and is no
        bound as an end or a limit, as on every backend; an end below 0 (below -2**63 too)
        reads nothing, as an end of 0 does."""
        partition, start, end, run_id, limit = request
        if start is not None and start > INT64_MAX:
            return []
        if end is not None and end > INT64_MAX:
            end = None
        if end is not None and end < 0:
            end = 0
        if limit is not None and limit > INT64_MAX:
            limit = None
        return await self._read_records(LogRead(partition, start, end, run_id, limit))

    async def _read_records(self, request: LogRead) -> list[LogRecord]:
        """The records ``request`` asks for, in offset order, unreadable ones described.

        Raises:
            LogTruncatedError: ``start`` lies below the partition's start.
        """
        raise NotImplementedError


def prepare_batch(
    events: Sequence[Event], *, partitions: int, max_batch_bytes: int
) -> tuple[str, int, list[bytes]]:
    """Check a batch for one run and encode it. Returns (run id, partition, encoded records).

    Every backend calls this first, so every backend refuses the same bad input the same way
    before anything is written.
    """
    if not events:
        raise InvalidInputError("append needs at least one event; got an empty batch")
    first = events[0]
    if not isinstance(first, Event):
        raise InvalidInputError(f"append takes events, got {type(first).__name__}")
    run_id, tenant = first.run_id, first.tenant
    if not run_id:
        raise InvalidInputError("event has an empty run_id")
    encoded: list[bytes] = []
    total = 0
    for index, event in enumerate(events):
        if not isinstance(event, Event):
            raise InvalidInputError(f"batch item {index} is a {type(event).__name__}, not an event")
        if event.run_id != run_id or event.tenant != tenant:
            raise InvalidInputError(
                f"one batch holds one run: item {index} is run {event.run_id!r} of tenant "
                f"{event.tenant!r}, the batch began with run {run_id!r} of tenant {tenant!r}"
            )
        if event.seq < 1:
            raise InvalidInputError(f"run {run_id!r}: seq starts at 1, got {event.seq}")
        if event.seq != first.seq + index:
            raise InvalidInputError(
                f"run {run_id!r}: seqs in a batch must be consecutive; item {index} has seq "
                f"{event.seq}, expected {first.seq + index}"
            )
        if event.fence < 0:
            raise InvalidInputError(f"run {run_id!r} seq {event.seq}: fence must be >= 0")
        written = format_of(type(event).__struct_config__.tag)
        if event.format != written:
            raise InvalidInputError(
                f"run {run_id!r} seq {event.seq}: this code writes event format {written}, "
                f"the event says {event.format}"
            )
        record = codec.encode(event)
        total += codec.framed_size(event, record)
        encoded.append(record)
    if total > max_batch_bytes:
        raise PayloadTooLargeError(
            f"run {run_id!r}: batch of {len(events)} events encodes to {total} bytes with its "
            f"keys and headers, over the log's limit of {max_batch_bytes}; store large bodies "
            "out of line",
            run_id=run_id,
            size=total,
            limit=max_batch_bytes,
        )
    return run_id, partition_for(run_id, partitions), encoded


def check_partition(partition: int, partitions: int) -> None:
    """Refuse a partition number the log does not have."""
    if not 0 <= partition < partitions:
        raise InvalidInputError(f"partition {partition} does not exist; the log has {partitions}")


def check_start(start: int | None) -> None:
    """Refuse a negative first offset to read from: no log holds one, and every log would
    otherwise say it was truncated, which a caller takes for a cut to read on after."""
    if start is not None and start < 0:
        raise InvalidInputError(f"a read's start is a log offset, 0 or more; got {start}")


def check_offset(partition: int, offset: int) -> None:
    """Refuse a negative offset to truncate before: no log holds one, and the cut would
    otherwise do nothing without a word, as if it had been made."""
    if offset < 0:
        raise InvalidInputError(
            f"partition {partition}: a truncation offset is a log offset, 0 or more; got {offset}"
        )


def check_limit(limit: int | None) -> bool:
    """Refuse a negative read limit (each backend's store would take it its own way); whether
    the limit lets a read return anything (a limit of zero reads nothing)."""
    if limit is None:
        return True
    if limit < 0:
        raise InvalidInputError(f"a read's limit is a number of records, 0 or more; got {limit}")
    return limit > 0


TRUNCATION_STEP = 20_000
"""Most records one transaction of a truncation deletes, in the SQL logs. A cut of a long
backlog in one statement held the partition's appenders for all of it, and on PostgreSQL
outlasted the statement timeout on every try, so compaction never cut that partition at all.
Each step moves the partition's start on its own: a cut stopped part way is a shorter one."""


def check_truncation(partition: int, offset: int, end: int) -> None:
    """Refuse to truncate past a partition's end: that would remove records not yet written."""
    if offset > end:
        raise InvalidInputError(
            f"partition {partition}: cannot truncate before {offset}, past its end {end}"
        )


class Refusal(Enum):
    """Why a reader did not count a stored event."""

    SUPERSEDED_FENCE = "superseded_fence"
    """Written under a lower fence than one already admitted for the run."""
    DUPLICATE_SEQ = "duplicate_seq"
    """Its seq was already admitted."""
    SEQ_GAP = "seq_gap"
    """Its seq skips ahead of the next expected one (out of order or a lost predecessor)."""


@dataclass(frozen=True, slots=True)
class RefusedEvent:
    """A stored event a reader did not count, and why. Kept for audit, never folded."""

    stored: StoredEvent
    reason: Refusal
    detail: str


def judge(last_seq: int, fence: int, event: Event) -> tuple[Refusal, str] | None:
    """Whether ``event`` counts after a history whose last counted seq and fence are given.

    Returns ``None`` when it counts (the history's next seq is then ``last_seq + 1`` and its fence
    ``event.fence``), else the refusal and a detail. The rules:

    * An event whose fence is lower than the highest fence already admitted is refused.
    * A ``RunClaimed`` with a higher fence than any admitted is the new holder's linearization
      point and is admitted even if a superseded writer slipped events in between the
      claimant's read and its claim; it takes the next seq, whatever seq it carries.
    * Any other event must carry exactly the next seq: a lower seq is a duplicate, a higher one
      a gap. Neither is folded.
    """
    expected = last_seq + 1
    if event.fence < fence:
        return (
            Refusal.SUPERSEDED_FENCE,
            f"fence {event.fence} is below fence {fence} already admitted",
        )
    if isinstance(event, RunClaimed) and event.fence > fence and event.seq <= expected:
        return None
    if event.seq < expected:
        return Refusal.DUPLICATE_SEQ, f"seq {event.seq} already admitted (next {expected})"
    if event.seq > expected:
        return Refusal.SEQ_GAP, f"seq {event.seq} skips ahead of {expected}"
    return None


@dataclass(slots=True)
class SequenceGuard:
    """Applies :func:`judge` to a run's stored events in log order, keeping what it refused.

    Start from a frontier's ``last_seq`` and ``fence`` to check a tail, or from zero for a
    whole history.
    """

    last_seq: int = 0
    fence: int = 0
    refused: list[RefusedEvent] = field(default_factory=list)

    def admit(self, stored: StoredEvent) -> bool:
        """Record one event; return whether it counts."""
        event = stored.event
        verdict = judge(self.last_seq, self.fence, event)
        if verdict is not None:
            reason, detail = verdict
            self.refused.append(
                RefusedEvent(stored, reason, f"run {event.run_id!r} seq {event.seq}: {detail}")
            )
            return False
        self.last_seq += 1
        self.fence = event.fence
        return True

    def admit_all(self, stored: Sequence[StoredEvent]) -> list[StoredEvent]:
        """Record events in order; return the ones that count."""
        return [s for s in stored if self.admit(s)]
