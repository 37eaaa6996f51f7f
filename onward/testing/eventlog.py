"""`EventLogConformance`: the behaviour every `EventLog` backend must show.

Subclass it once per backend and implement :meth:`EventLogConformance.open_log` and
:meth:`EventLogConformance.write_raw`; persistent backends also implement
:meth:`PersistentEventLogConformance.reopen`. A new backend is done when its subclass passes
unchanged. Needs pytest and pytest-asyncio (``asyncio_mode = "auto"``).

`WrappedEventLog` is a log to subclass when a test or a benchmark needs to count, time or hold
up some calls to a log and leave the rest alone.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, TypedDict

import msgspec
import pytest
import pytest_asyncio

from onward._storage import Resource
from onward.errors import (
    CheckpointFormatError,
    EventDecodeError,
    InvalidInputError,
    LogTruncatedError,
    PayloadTooLargeError,
)
from onward.eventlog import codec
from onward.eventlog.base import (
    DEFAULT_MAX_BATCH_BYTES,
    Appended,
    EventLog,
    EventLogBackend,
    LogRecord,
    PartitionBounds,
    Position,
    Refusal,
    SequenceGuard,
    StoredEvent,
    UnreadableRecord,
    partition_ends,
    partition_for,
    partition_runs_appended,
)
from onward.eventlog.events import (
    EVENT_FORMAT,
    Event,
    Message,
    ModelAnswered,
    RunClaimed,
    RunFinished,
    RunStarted,
    ToolCall,
    ToolCompleted,
    ToolDispatched,
    TurnSettled,
    Usage,
)

PARTITIONS = 4
TENANT = "acme"


def new_run_id(prefix: str = "run") -> str:
    """A run id no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def runs_in_partition(partition: int, count: int, partitions: int = PARTITIONS) -> list[str]:
    """``count`` fresh run ids that all land in ``partition``."""
    found: list[str] = []
    while len(found) < count:
        run_id = new_run_id()
        if partition_for(run_id, partitions) == partition:
            found.append(run_id)
    return found


class Envelope(TypedDict):
    """The envelope fields, for building events with ``**envelope``."""

    run_id: str
    tenant: str
    seq: int
    fence: int
    at: int


def step_events(
    run_id: str, count: int, *, first_seq: int = 1, fence: int = 1, body: str = ""
) -> list[Event]:
    """``count`` events of a plausible run, seqs from ``first_seq``, in several kinds' shapes."""
    events: list[Event] = []
    for seq in range(first_seq, first_seq + count):
        env = Envelope(run_id=run_id, tenant=TENANT, seq=seq, fence=fence, at=seq * 1000)
        shape = seq % 5
        if seq == 1:
            events.append(RunStarted(**env, agent="booker", revision="rev-1", input={"q": body}))
        elif shape == 0:
            events.append(
                ModelAnswered(
                    **env,
                    message=Message(role="assistant", content=f"thinking {seq} {body}"),
                    tool_calls=[ToolCall(call_id=f"c{seq}", tool="search", args={"q": "x"})],
                    usage=Usage(input_tokens=seq, output_tokens=2),
                )
            )
        elif shape == 1:
            events.append(
                ToolDispatched(**env, call_id=f"c{seq}", tool="search", idempotency_key=f"k{seq}")
            )
        elif shape == 2:
            events.append(ToolCompleted(**env, call_id=f"c{seq}", result={"body": body}))
        elif shape == 3:
            events.append(TurnSettled(**env, iteration=seq, call_ids=[f"c{seq}"]))
        else:
            events.append(RunClaimed(**env, worker=f"w{seq}"))
    return events


def seqs(stored: Sequence[object]) -> list[int]:
    """The seqs of stored events, in order."""
    return [s.event.seq for s in stored]  # type: ignore[attr-defined]


class WrappedEventLog(Resource):
    """An `EventLog` that hands every call to ``inner``.

    Subclass it to count, time or hold up one call and leave the rest alone; the reads of a
    partition take the arguments `EventLog` documents and pass them on unchanged. Closing it
    leaves ``inner`` open: the wrapped log belongs to whoever made it.
    """

    def __init__(self, inner: EventLog) -> None:
        self.inner = inner

    @property
    def partitions(self) -> int:
        return self.inner.partitions

    @property
    def embedded(self) -> bool:
        """Whether ``inner`` folds runs itself (the runner then needs no frontier store)."""
        return bool(getattr(self.inner, "embedded", False))

    async def append(self, events: Sequence[Event]) -> list[Position]:
        return await self.inner.append(events)

    async def read_run(
        self, run_id: str, *, start: int | None = None, end: int | None = None
    ) -> list[StoredEvent]:
        return await self.inner.read_run(run_id, start=start, end=end)

    async def read_partition(self, *args: Any, **options: Any) -> list[StoredEvent]:
        return await self.inner.read_partition(*args, **options)

    async def read_records(self, *args: Any, **options: Any) -> list[LogRecord]:
        return await self.inner.read_records(*args, **options)

    async def bounds(self, partition: int) -> PartitionBounds:
        return await self.inner.bounds(partition)

    async def truncate_before(self, partition: int, offset: int) -> None:
        await self.inner.truncate_before(partition, offset)

    async def close(self) -> None:
        """The wrapped log is not this one's to close."""


class EventLogConformance:
    """The contract of `EventLog`. Subclass per backend; every test must pass unchanged."""

    partitions = PARTITIONS

    async def open_log(self) -> EventLog:
        """A fresh, empty, started log with :attr:`partitions` partitions."""
        raise NotImplementedError

    async def write_raw(self, log: EventLog, run_id: str, record: bytes) -> Position:
        """Store ``record`` under ``run_id`` as a foreign writer would, bypassing every check."""
        raise NotImplementedError

    @pytest_asyncio.fixture
    async def log(self) -> AsyncIterator[EventLog]:
        log = await self.open_log()
        try:
            yield log
        finally:
            await log.close()

    # -- appending -------------------------------------------------------------------------

    async def test_append_returns_one_position_per_event(self, log: EventLog) -> None:
        run_id = new_run_id()
        positions = await log.append(step_events(run_id, 5))
        assert len(positions) == 5
        assert [p.offset for p in positions] == list(
            range(positions[0].offset, positions[0].offset + 5)
        )

    async def test_positions_are_in_the_runs_partition(self, log: EventLog) -> None:
        run_id = new_run_id()
        positions = await log.append(step_events(run_id, 3))
        assert {p.partition for p in positions} == {partition_for(run_id, log.partitions)}

    async def test_partition_count_is_what_was_configured(self, log: EventLog) -> None:
        assert log.partitions == self.partitions

    async def test_read_run_returns_events_exactly_as_appended(self, log: EventLog) -> None:
        run_id = new_run_id()
        events = step_events(run_id, 12, body="ünïcødé ✓ \u0000 end")
        await log.append(events)
        stored = await log.read_run(run_id)
        assert [s.event for s in stored] == events

    async def test_appends_over_several_batches_keep_gap_free_seq(self, log: EventLog) -> None:
        run_id = new_run_id()
        await log.append(step_events(run_id, 3))
        await log.append(step_events(run_id, 4, first_seq=4))
        await log.append(step_events(run_id, 1, first_seq=8))
        stored = await log.read_run(run_id)
        assert seqs(stored) == list(range(1, 9))
        guard = SequenceGuard()
        assert len(guard.admit_all(stored)) == 8
        assert guard.refused == []

    async def test_offsets_increase_across_appends(self, log: EventLog) -> None:
        run_id = new_run_id()
        first = await log.append(step_events(run_id, 2))
        second = await log.append(step_events(run_id, 2, first_seq=3))
        assert second[0].offset == first[-1].offset + 1

    async def test_unknown_run_reads_empty(self, log: EventLog) -> None:
        assert await log.read_run(new_run_id("never-written")) == []

    async def test_a_run_id_no_store_can_hold_is_refused_on_read(self, log: EventLog) -> None:
        """A lone surrogate (a command-line byte that is not UTF-8) names no run: reading it is
        bad input, named as such, not a driver's encoding error."""
        run_id = "run-\udcff"
        with pytest.raises(InvalidInputError, match="lone surrogate"):
            await log.read_run(run_id)
        with pytest.raises(InvalidInputError, match="lone surrogate"):
            await log.read_records(0, run_id=run_id)

    async def test_one_run_is_read_out_of_many_interleaved(self, log: EventLog) -> None:
        runs = runs_in_partition(1, 3, log.partitions)
        for seq in range(1, 7):
            for run_id in runs:
                await log.append(step_events(run_id, 1, first_seq=seq))
        for run_id in runs:
            stored = await log.read_run(run_id)
            assert {s.event.run_id for s in stored} == {run_id}
            assert seqs(stored) == list(range(1, 7))
            offsets = [s.position.offset for s in stored]
            assert offsets == sorted(offsets)

    async def test_concurrent_appends_to_many_runs_keep_each_runs_order(
        self, log: EventLog
    ) -> None:
        runs = [new_run_id() for _ in range(8)]

        async def write(run_id: str) -> None:
            for seq in range(1, 11, 2):
                await log.append(step_events(run_id, 2, first_seq=seq))

        await asyncio.gather(*(write(r) for r in runs))
        for run_id in runs:
            assert seqs(await log.read_run(run_id)) == list(range(1, 11))

    async def test_read_run_from_a_start_offset(self, log: EventLog) -> None:
        run_id = new_run_id()
        positions = await log.append(step_events(run_id, 6))
        stored = await log.read_run(run_id, start=positions[3].offset)
        assert seqs(stored) == [4, 5, 6]

    async def test_read_run_up_to_an_end_offset(self, log: EventLog) -> None:
        run_id = new_run_id()
        positions = await log.append(step_events(run_id, 6))
        stored = await log.read_run(run_id, end=positions[2].offset)
        assert seqs(stored) == [1, 2]

    async def test_read_run_with_an_empty_range(self, log: EventLog) -> None:
        run_id = new_run_id()
        positions = await log.append(step_events(run_id, 3))
        offset = positions[1].offset
        assert await log.read_run(run_id, start=offset, end=offset) == []

    # -- bad input on append ---------------------------------------------------------------

    async def test_empty_batch_is_refused(self, log: EventLog) -> None:
        with pytest.raises(InvalidInputError, match="empty batch"):
            await log.append([])

    async def test_batch_mixing_runs_is_refused_and_nothing_written(self, log: EventLog) -> None:
        a, b = new_run_id(), new_run_id()
        with pytest.raises(InvalidInputError, match="one batch holds one run"):
            await log.append([*step_events(a, 2), *step_events(b, 1, first_seq=3)])
        assert await log.read_run(a) == []
        assert await log.read_run(b) == []

    async def test_non_consecutive_seqs_in_a_batch_are_refused(self, log: EventLog) -> None:
        run_id = new_run_id()
        events = step_events(run_id, 4)
        with pytest.raises(InvalidInputError, match="consecutive"):
            await log.append([events[0], events[2]])
        assert await log.read_run(run_id) == []

    async def test_seq_below_one_is_refused(self, log: EventLog) -> None:
        run_id = new_run_id()
        event = RunClaimed(run_id=run_id, tenant=TENANT, seq=0, fence=1, worker="w")
        with pytest.raises(InvalidInputError, match="seq starts at 1"):
            await log.append([event])

    async def test_an_integer_no_store_keeps_is_refused_and_nothing_is_written(
        self, log: EventLog
    ) -> None:
        run_id = new_run_id()
        events = step_events(run_id, 2)
        late = msgspec.structs.replace(events[1], at=2**64)
        with pytest.raises(InvalidInputError, match=r"seq 2: .* <= 9223372036854775807"):
            await log.append([events[0], late])
        assert await log.read_run(run_id) == []

    async def test_writing_a_newer_format_is_refused(self, log: EventLog) -> None:
        run_id = new_run_id()
        event = RunClaimed(
            run_id=run_id, tenant=TENANT, seq=1, fence=1, worker="w", format=EVENT_FORMAT + 1
        )
        with pytest.raises(InvalidInputError, match="format"):
            await log.append([event])

    async def test_something_that_is_not_an_event_is_refused(self, log: EventLog) -> None:
        with pytest.raises(InvalidInputError, match=r"not an event|takes events"):
            await log.append([{"kind": "run.started"}])  # type: ignore[list-item]

    async def test_oversized_batch_is_refused_whole(self, log: EventLog) -> None:
        run_id = new_run_id()
        await log.append(step_events(run_id, 2))
        big = [
            ToolCompleted(
                run_id=run_id, tenant=TENANT, seq=seq, fence=1, call_id="c", result="x" * 400_000
            )
            for seq in (3, 4, 5)
        ]
        with pytest.raises(PayloadTooLargeError, match=run_id):
            await log.append(big)
        assert seqs(await log.read_run(run_id)) == [1, 2]

    async def test_a_batch_is_measured_with_its_keys_and_headers_on_every_backend(
        self, log: EventLog
    ) -> None:
        """Each record of a batch counts with its key and headers, not its value alone: Kafka
        stores them in the one record batch the limit guards, so a batch of many small events
        whose values alone fit is refused alike on every backend (not accepted embedded and
        then refused in production), and one that fits with them lands whole everywhere."""
        run_id = new_run_id()
        events = [
            ToolCompleted(
                run_id=run_id, tenant=TENANT, seq=seq, fence=1, call_id=f"c{seq}", result="x" * 60
            )
            for seq in range(1, 4_601)
        ]
        assert sum(len(codec.encode(e)) for e in events) < DEFAULT_MAX_BATCH_BYTES
        with pytest.raises(PayloadTooLargeError, match=run_id) as caught:
            await log.append(events)
        assert caught.value.limit == DEFAULT_MAX_BATCH_BYTES
        assert await log.read_run(run_id) == []
        positions = await log.append(events[:2_500])
        assert len(positions) == 2_500
        assert seqs(await log.read_run(run_id)) == list(range(1, 2_501))

    # -- what readers refuse ---------------------------------------------------------------

    async def test_duplicate_seq_is_detected_on_read_and_not_admitted(self, log: EventLog) -> None:
        run_id = new_run_id()
        await log.append(step_events(run_id, 3))
        await log.append(step_events(run_id, 1, first_seq=2))
        stored = await log.read_run(run_id)
        guard = SequenceGuard()
        admitted = guard.admit_all(stored)
        assert seqs(admitted) == [1, 2, 3]
        assert [(r.reason, r.stored.event.seq) for r in guard.refused] == [
            (Refusal.DUPLICATE_SEQ, 2)
        ]

    async def test_out_of_order_seq_is_detected_on_read_and_not_admitted(
        self, log: EventLog
    ) -> None:
        run_id = new_run_id()
        await log.append(step_events(run_id, 2))
        await log.append(step_events(run_id, 1, first_seq=5))
        await log.append(step_events(run_id, 1, first_seq=3))
        guard = SequenceGuard()
        admitted = guard.admit_all(await log.read_run(run_id))
        assert seqs(admitted) == [1, 2, 3]
        assert [(r.reason, r.stored.event.seq) for r in guard.refused] == [(Refusal.SEQ_GAP, 5)]

    async def test_superseded_fence_after_a_higher_claim_is_refused(self, log: EventLog) -> None:
        run_id = new_run_id()
        await log.append(step_events(run_id, 3, fence=1))
        claim = RunClaimed(run_id=run_id, tenant=TENANT, seq=4, fence=2, worker="b")
        await log.append([claim])
        await log.append(step_events(run_id, 1, first_seq=5, fence=1))  # the zombie
        await log.append(step_events(run_id, 1, first_seq=5, fence=2))
        guard = SequenceGuard()
        admitted = guard.admit_all(await log.read_run(run_id))
        assert [(e.event.seq, e.event.fence) for e in admitted] == [
            (1, 1),
            (2, 1),
            (3, 1),
            (4, 2),
            (5, 2),
        ]
        assert [(r.reason, r.stored.event.fence) for r in guard.refused] == [
            (Refusal.SUPERSEDED_FENCE, 1)
        ]

    async def test_a_claim_is_admitted_after_a_zombie_slipped_in(self, log: EventLog) -> None:
        run_id = new_run_id()
        await log.append(step_events(run_id, 2, fence=1))
        # The zombie writes seq 3 after the claimant read seq 2 but before its claim lands.
        await log.append(step_events(run_id, 1, first_seq=3, fence=1))
        await log.append([RunClaimed(run_id=run_id, tenant=TENANT, seq=3, fence=2, worker="b")])
        await log.append(step_events(run_id, 1, first_seq=4, fence=1))  # refused: after the claim
        guard = SequenceGuard()
        admitted = guard.admit_all(await log.read_run(run_id))
        assert [type(s.event).__name__ for s in admitted][-1] == "RunClaimed"
        assert guard.last_seq == 4
        assert guard.fence == 2
        assert [r.reason for r in guard.refused] == [Refusal.SUPERSEDED_FENCE]

    async def test_newer_format_on_read_raises_checkpoint_format_error(self, log: EventLog) -> None:
        run_id = new_run_id()
        await log.append(step_events(run_id, 1))
        newer = msgspec.json.encode(
            {
                "kind": "run.claimed",
                "run_id": run_id,
                "tenant": TENANT,
                "seq": 2,
                "fence": 1,
                "format": EVENT_FORMAT + 1,
                "worker": "w",
                "field_from_the_future": [1, 2],
            }
        )
        await self.write_raw(log, run_id, newer)
        with pytest.raises(CheckpointFormatError) as caught:
            await log.read_run(run_id)
        assert caught.value.run_id == run_id
        assert caught.value.seq == 2

    async def test_unknown_kind_is_a_clear_error_and_earlier_events_survive(
        self, log: EventLog
    ) -> None:
        run_id = new_run_id()
        positions = await log.append(step_events(run_id, 2))
        record = msgspec.json.encode(
            {"kind": "run.exploded", "run_id": run_id, "tenant": TENANT, "seq": 3, "fence": 1}
        )
        await self.write_raw(log, run_id, record)
        with pytest.raises(EventDecodeError) as caught:
            await log.read_run(run_id)
        assert (caught.value.run_id, caught.value.seq, caught.value.field) == (run_id, 3, "$.kind")
        assert "run.exploded" in str(caught.value)
        before = await log.read_run(run_id, end=positions[-1].offset + 1)
        assert seqs(before) == [1, 2]

    async def test_truncated_record_is_a_clear_error(self, log: EventLog) -> None:
        run_id = new_run_id()
        await log.append(step_events(run_id, 1))
        whole = codec.encode(step_events(run_id, 2)[1])
        await self.write_raw(log, run_id, whole[: len(whole) // 2])
        with pytest.raises(EventDecodeError, match="truncated") as caught:
            await log.read_run(run_id)
        assert caught.value.run_id == run_id

    async def test_wrong_type_names_the_field(self, log: EventLog) -> None:
        run_id = new_run_id()
        await log.append(step_events(run_id, 1))
        record = msgspec.json.encode(
            {"kind": "run.claimed", "run_id": run_id, "tenant": TENANT, "seq": 2, "fence": "one"}
        )
        await self.write_raw(log, run_id, record)
        with pytest.raises(EventDecodeError, match=r"\$\.fence") as caught:
            await log.read_run(run_id)
        assert (caught.value.run_id, caught.value.seq, caught.value.field) == (run_id, 2, "$.fence")

    async def test_a_record_filed_under_another_run_is_refused_not_read_as_its_event(
        self, log: EventLog
    ) -> None:
        """A foreign writer (or a bug) files an event of run B under run A: a read of A must
        not return B's event as A's, and a read of the partition must not fold it into B."""
        filed_under, named = runs_in_partition(0, 2, log.partitions)
        await log.append(step_events(filed_under, 1))
        await log.append(step_events(named, 1))
        stray = codec.encode(step_events(named, 2)[1])
        position = await self.write_raw(log, filed_under, stray)
        with pytest.raises(EventDecodeError, match=repr(named)) as caught:
            await log.read_run(filed_under)
        assert (caught.value.run_id, caught.value.field) == (filed_under, "$.run_id")
        assert seqs(await log.read_run(named)) == [1]
        (record,) = await log.read_records(0, position.offset, position.offset + 1)
        assert isinstance(record, UnreadableRecord)
        assert record.run_id == filed_under

    async def test_unknown_fields_of_a_known_kind_are_ignored(self, log: EventLog) -> None:
        run_id = new_run_id()
        record = msgspec.json.encode(
            {
                "kind": "run.claimed",
                "run_id": run_id,
                "tenant": TENANT,
                "seq": 1,
                "fence": 3,
                "format": EVENT_FORMAT,
                "worker": "w",
                "added_in_a_minor_release": {"x": 1},
            }
        )
        await self.write_raw(log, run_id, record)
        (stored,) = await log.read_run(run_id)
        assert stored.event == RunClaimed(
            run_id=run_id, tenant=TENANT, seq=1, fence=3, worker="w", at=0
        )

    # -- partitions ------------------------------------------------------------------------

    async def test_empty_partition_bounds(self, log: EventLog) -> None:
        bounds = await log.bounds(2)
        assert (bounds.start, bounds.end) == (0, 0)

    async def test_bounds_end_is_the_next_offset(self, log: EventLog) -> None:
        (run_id,) = runs_in_partition(2, 1, log.partitions)
        positions = await log.append(step_events(run_id, 4))
        bounds = await log.bounds(2)
        assert bounds.start == 0
        assert bounds.end == positions[-1].offset + 1

    async def test_ends_of_many_partitions_are_each_ones_bounds_end(self, log: EventLog) -> None:
        (first,) = runs_in_partition(1, 1, log.partitions)
        (second,) = runs_in_partition(3, 1, log.partitions)
        await log.append(step_events(first, 2))
        await log.append(step_events(second, 5))
        ends = await partition_ends(log, [3, 1, 0, 3])
        assert ends == {0: 0, 1: (await log.bounds(1)).end, 3: (await log.bounds(3)).end}
        assert ends[1] >= 2
        assert ends[3] >= 5
        with pytest.raises(InvalidInputError, match=f"partition {log.partitions} does not exist"):
            await partition_ends(log, [0, log.partitions])

    async def test_runs_appended_are_the_runs_with_records_past_each_offset(
        self, log: EventLog
    ) -> None:
        first, second = runs_in_partition(1, 2, log.partitions)
        (third,) = runs_in_partition(3, 1, log.partitions)
        await log.append(step_events(first, 2))
        since = await partition_ends(log, [1, 3])
        await log.append(step_events(second, 1))
        await log.append(step_events(third, 3))
        ends = await partition_ends(log, [1, 3])
        moved = await partition_runs_appended(log, since)
        if not isinstance(log, EventLogBackend):  # a log of another make: its runs unknown
            assert moved == {1: Appended(ends[1], None), 3: Appended(ends[3], None)}
            return
        assert moved == {
            1: Appended(ends[1], frozenset({second})),
            3: Appended(ends[3], frozenset({third})),
        }
        assert await log.runs_appended(ends) == {
            1: Appended(ends[1], frozenset()),
            3: Appended(ends[3], frozenset()),
        }
        # More appended than it would look through: which runs is not known.
        assert (await log.runs_appended(since, most=2))[3] == Appended(ends[3], None)
        # Truncated past the offset asked from: what was appended there is gone or unknown.
        await log.truncate_before(1, ends[1])
        assert (await log.runs_appended({1: 0}))[1] in (
            Appended(ends[1], frozenset()),
            Appended(ends[1], None),
        )
        with pytest.raises(InvalidInputError, match=f"partition {log.partitions} does not exist"):
            await log.runs_appended({log.partitions: 0})

    async def test_read_partition_returns_every_run_in_offset_order(self, log: EventLog) -> None:
        runs = runs_in_partition(3, 2, log.partitions)
        for seq in range(1, 4):
            for run_id in runs:
                await log.append(step_events(run_id, 1, first_seq=seq))
        stored = await log.read_partition(3, 0)
        assert [s.position.offset for s in stored] == list(range(6))
        assert [s.event.run_id for s in stored] == runs * 3

    async def test_read_partition_range_and_limit(self, log: EventLog) -> None:
        (run_id,) = runs_in_partition(0, 1, log.partitions)
        await log.append(step_events(run_id, 10))
        assert seqs(await log.read_partition(0, 2, 5)) == [3, 4, 5]
        assert seqs(await log.read_partition(0, 2, limit=4)) == [3, 4, 5, 6]
        assert await log.read_partition(0, 10) == []

    async def test_a_limit_of_zero_reads_nothing_and_a_negative_one_is_refused(
        self, log: EventLog
    ) -> None:
        (run_id,) = runs_in_partition(0, 1, log.partitions)
        await log.append(step_events(run_id, 3))
        assert await log.read_partition(0, 0, limit=0) == []
        assert await log.read_records(0, run_id=run_id, limit=0) == []
        with pytest.raises(InvalidInputError, match="limit"):
            await log.read_partition(0, 0, limit=-1)
        with pytest.raises(InvalidInputError, match="limit"):
            await log.read_records(0, limit=-1)

    async def test_an_offset_past_any_record_reads_nothing_however_large(
        self, log: EventLog
    ) -> None:
        (run_id,) = runs_in_partition(0, 1, log.partitions)
        await log.append(step_events(run_id, 3))
        for far in (2**63 - 1, 2**63, 2**64 + 5):
            assert await log.read_run(run_id, start=far) == []
            assert await log.read_partition(0, far) == []
            assert await log.read_records(0, far, run_id=run_id) == []
            assert seqs(await log.read_run(run_id, end=far)) == [1, 2, 3]
            assert seqs(await log.read_partition(0, 0, far)) == [1, 2, 3]
            assert seqs(await log.read_partition(0, 0, limit=far)) == [1, 2, 3]
            assert await log.read_run(run_id, end=-far) == []
            assert await log.read_partition(0, 0, -far) == []
            with pytest.raises(InvalidInputError, match="past its end"):
                await log.truncate_before(0, far)
        assert seqs(await log.read_run(run_id)) == [1, 2, 3]

    async def test_a_negative_offset_is_refused_naming_it(self, log: EventLog) -> None:
        """A negative offset is a caller's mistake, not a truncated one: said as such, and a
        cut before it is refused rather than done as nothing."""
        (run_id,) = runs_in_partition(0, 1, log.partitions)
        await log.append(step_events(run_id, 3))
        for negative in (-1, -(2**64)):
            with pytest.raises(InvalidInputError, match=f"got {negative}"):
                await log.read_run(run_id, start=negative)
            with pytest.raises(InvalidInputError, match=f"got {negative}"):
                await log.read_partition(0, negative)
            with pytest.raises(InvalidInputError, match=f"got {negative}"):
                await log.read_records(0, negative, run_id=run_id)
            with pytest.raises(InvalidInputError, match=f"got {negative}"):
                await log.truncate_before(0, negative)
            assert await log.read_partition(0, 0, negative) == []  # an end: nothing before it
            assert await log.read_run(run_id, end=negative) == []
        assert (await log.bounds(0)).start == 0
        assert seqs(await log.read_run(run_id)) == [1, 2, 3]

    async def test_partition_outside_the_log_is_refused(self, log: EventLog) -> None:
        with pytest.raises(InvalidInputError, match="does not exist"):
            await log.bounds(log.partitions)
        with pytest.raises(InvalidInputError, match="does not exist"):
            await log.read_partition(-1, 0)

    # -- truncation ------------------------------------------------------------------------

    async def test_truncate_before_moves_the_start(self, log: EventLog) -> None:
        (run_id,) = runs_in_partition(1, 1, log.partitions)
        await log.append(step_events(run_id, 6))
        await log.truncate_before(1, 4)
        bounds = await log.bounds(1)
        assert (bounds.start, bounds.end) == (4, 6)
        assert seqs(await log.read_partition(1, 4)) == [5, 6]
        assert seqs(await log.read_run(run_id)) == [5, 6]

    async def test_reading_below_the_start_raises_log_truncated(self, log: EventLog) -> None:
        (run_id,) = runs_in_partition(1, 1, log.partitions)
        await log.append(step_events(run_id, 6))
        await log.truncate_before(1, 3)
        with pytest.raises(LogTruncatedError, match="starts at 3"):
            await log.read_partition(1, 0)
        with pytest.raises(LogTruncatedError):
            await log.read_run(run_id, start=2)

    async def test_truncation_never_moves_the_start_back(self, log: EventLog) -> None:
        (run_id,) = runs_in_partition(1, 1, log.partitions)
        await log.append(step_events(run_id, 6))
        await log.truncate_before(1, 4)
        await log.truncate_before(1, 2)
        assert (await log.bounds(1)).start == 4

    async def test_truncation_past_the_end_is_refused(self, log: EventLog) -> None:
        (run_id,) = runs_in_partition(1, 1, log.partitions)
        await log.append(step_events(run_id, 3))
        with pytest.raises(InvalidInputError, match="past its end"):
            await log.truncate_before(1, 4)
        assert seqs(await log.read_run(run_id)) == [1, 2, 3]

    async def test_truncation_leaves_other_partitions_alone(self, log: EventLog) -> None:
        (in_one,) = runs_in_partition(1, 1, log.partitions)
        (in_two,) = runs_in_partition(2, 1, log.partitions)
        await log.append(step_events(in_one, 3))
        await log.append(step_events(in_two, 3))
        await log.truncate_before(1, 3)
        assert seqs(await log.read_run(in_two)) == [1, 2, 3]
        assert (await log.bounds(2)).start == 0

    async def test_appends_after_truncation_continue_the_offsets(self, log: EventLog) -> None:
        (run_id,) = runs_in_partition(1, 1, log.partitions)
        await log.append(step_events(run_id, 3))
        await log.truncate_before(1, 3)
        positions = await log.append(step_events(run_id, 2, first_seq=4))
        assert [p.offset for p in positions] == [3, 4]
        assert seqs(await log.read_run(run_id)) == [4, 5]


class PersistentEventLogConformance(EventLogConformance):
    """What a durable backend adds: what was appended survives closing and reopening."""

    async def reopen(self, log: EventLog) -> EventLog:
        """A new, started handle (a new client) on the same storage as ``log``."""
        raise NotImplementedError

    async def test_appended_events_survive_close_and_reopen(self, log: EventLog) -> None:
        run_id = new_run_id()
        events = step_events(run_id, 7, body="durable")
        await log.append(events)
        again = await self.reopen(log)
        await log.close()
        try:
            assert [s.event for s in await again.read_run(run_id)] == events
        finally:
            await again.close()

    async def test_truncation_survives_close_and_reopen(self, log: EventLog) -> None:
        (run_id,) = runs_in_partition(2, 1, log.partitions)
        await log.append(step_events(run_id, 5))
        await log.truncate_before(2, 3)
        again = await self.reopen(log)
        await log.close()
        try:
            assert (await again.bounds(2)).start == 3
            assert seqs(await again.read_run(run_id)) == [4, 5]
        finally:
            await again.close()

    async def test_a_second_client_sees_appends_of_the_first(self, log: EventLog) -> None:
        other = await self.reopen(log)
        try:
            run_id = new_run_id()
            for seq in (1, 2, 3):
                await other.append(step_events(run_id, 1, first_seq=seq))
            finished = RunFinished(run_id=run_id, tenant=TENANT, seq=4, fence=1, status="completed")
            await log.append([finished])
            assert seqs(await log.read_run(run_id)) == [1, 2, 3, 4]
            assert seqs(await other.read_run(run_id)) == [1, 2, 3, 4]
        finally:
            await other.close()
