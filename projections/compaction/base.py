"""The `CompactionStore` protocol and the rows it keeps.

Compaction has two steps (DESIGN §7). Logically, per run: the run gets a truncation point, a
seq below which readers treat its events as gone (its frontier row and transcript hold what
resume needs), and its tagged events below that point are copied out of the log, in the same
transaction, so they outlive the cut. Physically, per partition: a prefix no reader needs any
more is archived, recorded as cut, and cut. This store keeps the first step's rows, the record
of every cut, and tells the compactor how far every projector has folded each partition.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol, runtime_checkable

import msgspec

from onward._storage import AsyncResource
from onward.errors import InvalidInputError
from onward.eventlog import codec
from onward.eventlog.base import Position, StoredEvent


class RunTruncation(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Where a run's history starts, for readers, after logical compaction.

    Attributes:
        tenant: The run's tenant.
        run_id: The run.
        partition: The run's partition.
        before_seq: The run's events with a lower seq are compacted: gone for readers, except
            the retained (tagged) ones. Only ever moves forward.
        before_offset: The log offset of the event with seq ``before_seq``: none of the run's
            events below it is needed by any reader. For a finished run, one past its last.
        at: When it was set, microseconds since the epoch.
    """

    tenant: str
    run_id: str
    partition: int
    before_seq: int
    before_offset: int
    at: int


class RetainedEvent(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A tagged event copied out of the log before compaction could cut it.

    Attributes:
        record: The event as the codec encodes it (msgspec JSON), so it decodes exactly as a
            record read from the log does.
    """

    tenant: str
    run_id: str
    seq: int
    partition: int
    offset: int
    record: bytes

    @classmethod
    def of(cls, stored: StoredEvent) -> RetainedEvent:
        """The retained copy of an event read from the log."""
        event = stored.event
        return cls(
            tenant=event.tenant,
            run_id=event.run_id,
            seq=event.seq,
            partition=stored.position.partition,
            offset=stored.position.offset,
            record=codec.encode(event),
        )

    def stored(self) -> StoredEvent:
        """The event where the log held it, as a log read returns it."""
        event = codec.decode(self.record, run_hint=self.run_id)
        return StoredEvent(Position(self.partition, self.offset), event)


class LogCut(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A prefix of a partition the compactor cut, and where its records were archived.

    Attributes:
        partition: The partition.
        start: The first offset cut (the partition's start before the cut).
        end: The partition's start after the cut.
        events: How many records the range held (and the archive holds).
        archive: Where they were archived (a directory, an object store URL); ``None`` when no
            archive was configured and the records are gone.
        at: When, microseconds since the epoch.
    """

    partition: int
    start: int
    end: int
    events: int
    archive: str | None
    at: int


@runtime_checkable
class CompactionStore(AsyncResource, Protocol):
    """Truncation points, retained events and the record of cuts, next to the frontier rows."""

    async def truncations(self, run_ids: Collection[str]) -> dict[str, RunTruncation]:
        """The truncation points of the given runs (runs never compacted are absent)."""
        ...

    async def truncate(
        self, truncations: Sequence[RunTruncation], retained: Sequence[RetainedEvent]
    ) -> None:
        """In one transaction: store the retained events (one already stored under its run and
        seq is kept as it is) and move the runs' truncation points forward (never back)."""
        ...

    async def retained(self, run_id: str) -> list[RetainedEvent]:
        """The retained events of one run, by seq."""
        ...

    async def retained_seqs(self, run_ids: Collection[str]) -> dict[str, set[int]]:
        """The seqs retained per run, for the given runs (runs with none are absent)."""
        ...

    async def positions(self) -> dict[str, dict[int, int]]:
        """Every live projector's next offset per partition, by consumer name.

        A position of a retired build (PostgreSQL) is not live: nothing reads from it again.
        """
        ...

    async def record_cut(self, cut: LogCut) -> None:
        """Record a cut before it is made. One recorded again from the same start (a rerun
        after a crash) keeps the larger end."""
        ...

    async def cuts(self, partition: int | None = None) -> list[LogCut]:
        """The recorded cuts, of one partition or all, by partition and start."""
        ...


async def refuse_compacted(store: CompactionStore, run_id: str, seq: int) -> None:
    """Refuse to tag event ``seq`` of a run when compaction removed it (it lies below the run's
    truncation point and was not retained): a tag there could never be retained, so it would
    point at nothing. A retained event may take more tags.

    Raises:
        InvalidInputError: Naming the run, the seq and the truncation point.
    """
    point = (await store.truncations([run_id])).get(run_id)
    if point is None or seq >= point.before_seq:
        return
    if seq in (await store.retained_seqs([run_id])).get(run_id, set()):
        return
    raise InvalidInputError(
        f"run {run_id!r}: event {seq} is below its truncation point {point.before_seq} "
        f"(compaction removed the events before seq {point.before_seq}), so a tag on it could "
        f"never be retained; tag seq {point.before_seq} or later",
        run_id=run_id,
    )
