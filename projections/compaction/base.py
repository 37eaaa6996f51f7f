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
from typing import Literal, Protocol, runtime_checkable

import msgspec

from onward._storage import AsyncResource
from onward.errors import InvalidInputError
from onward.eventlog import codec
from onward.eventlog.base import Position, StoredEvent, record_bytes
from onward.projections.frontier import Frontier


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
        whole: Every counted event of the run below ``before_seq`` is retained (kept as
            ``history``): a reader that folds the run from its first event reads the retained
            events, then the log. Only ever true from the run's first truncation on.
        fence: The highest fence admitted among the run's counted events below ``before_seq``:
            the fence rule goes on from it at the point, so a superseded writer's refused
            events a cut left first in the log are not taken as counted. 0 when unknown (a
            point stored before it was kept).
    """

    tenant: str
    run_id: str
    partition: int
    before_seq: int
    before_offset: int
    at: int
    whole: bool = False
    fence: int = 0


KeptAs = Literal["tag", "checkpoint", "history"]
"""Why an event is retained: a tag points at it; it is one of a live run's last resume points
(older ones are dropped as newer ones are kept); or its run is read from its first event."""


class RetainedEvent(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A tagged event copied out of the log before compaction could cut it.

    Attributes:
        record: The event's record as the log held it when read so (`keeping_records`), else
            as the codec encodes it (msgspec JSON): it decodes exactly as the record read from
            the log does, fields a newer writer added included.
        kept_as: Why it is kept (`KeptAs`); a copy kept as ``checkpoint`` becomes ``tag`` when
            a tag points at it, and only ``checkpoint`` copies are ever dropped.
    """

    tenant: str
    run_id: str
    seq: int
    partition: int
    offset: int
    record: bytes
    kept_as: KeptAs = "tag"

    @classmethod
    def of(cls, stored: StoredEvent, kept_as: KeptAs = "tag") -> RetainedEvent:
        """The retained copy of an event read from the log."""
        event = stored.event
        return cls(
            tenant=event.tenant,
            run_id=event.run_id,
            seq=event.seq,
            partition=stored.position.partition,
            offset=stored.position.offset,
            record=record_bytes(stored),
            kept_as=kept_as,
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
        self,
        truncations: Sequence[RunTruncation],
        retained: Sequence[RetainedEvent],
        *,
        checkpoints: int | None = None,
    ) -> list[TagPin]:
        """In one transaction, serialised with :meth:`pin`: store the retained events (one
        already stored under its run and seq keeps its record; a ``checkpoint`` copy takes the
        new ``kept_as``), move the runs' truncation points forward (never back), and with
        ``checkpoints`` drop the ``checkpoint`` copies of those runs beyond their latest
        ``checkpoints``.

        Returns:
            The pins (tags) below a new point whose event is neither retained already nor in
            ``retained``. When there are any, nothing was written: the caller copies those
            events from the log and calls again, so a tag is never left without its event.
        """
        ...

    async def pin(self, run_id: str, tenant: str, seq: int) -> None:
        """Record that a tag will point at event ``seq`` of the run, serialised with
        :meth:`truncate`: once pinned, a pass retains the event before it can be cut.

        Raises:
            InvalidInputError: The event lies below the run's truncation point and was not
                retained (compaction removed it; a tag on it could never be retained).
        """
        ...

    async def pins(self, run_ids: Collection[str]) -> dict[str, set[int]]:
        """The pinned (tagged) seqs per run, for the given runs (runs with none are absent)."""
        ...

    async def tombstones(self, run_ids: Collection[str]) -> set[str]:
        """Which of the given runs garbage collection removed (their events are finished)."""
        ...

    async def put_snapshots(self, frontiers: Sequence[Frontier]) -> None:
        """Store the frontiers of runs whose snapshot the frontier store refused for size,
        uncapped; one already stored is replaced by a later one (a larger ``through_offset``)."""
        ...

    async def snapshots(self, run_ids: Collection[str]) -> dict[str, Frontier]:
        """The stored frontiers of the given runs (runs with none are absent)."""
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


class TagPin(msgspec.Struct, frozen=True, gc=False):
    """A tag's target: event ``seq`` of run ``run_id``."""

    run_id: str
    seq: int


class UnretainedPinsError(Exception):
    """Inside a store's `CompactionStore.truncate` only: rolls its transaction back, as these
    pins' events must be copied first. Never leaves the store."""

    def __init__(self, pins: list[TagPin]) -> None:
        super().__init__(f"{len(pins)} pinned events not retained")
        self.pins = pins


def refuse_compacted(
    run_id: str, seq: int, point: RunTruncation | None, retained: Collection[int]
) -> None:
    """Refuse to tag event ``seq`` of a run when compaction removed it (it lies below the run's
    truncation point and was not retained): a tag there could never be retained, so it would
    point at nothing. A retained event may take more tags. What every store's
    :meth:`CompactionStore.pin` checks, under its lock.

    Raises:
        InvalidInputError: Naming the run, the seq and the truncation point.
    """
    if point is None or seq >= point.before_seq or seq in retained:
        return
    raise InvalidInputError(
        f"run {run_id!r}: event {seq} is below its truncation point {point.before_seq} "
        f"(compaction removed the events before seq {point.before_seq}), so a tag on it could "
        f"never be retained; tag seq {point.before_seq} or later",
        run_id=run_id,
    )
