"""What one compaction pass decides for one partition, from what it read. Pure: no I/O.

The compactor scans a partition from its start up to where every projector has folded it
(`PartitionScan`), loads the frontier rows and truncation points of the runs it met, and
`plan_partition` decides:

* per run, its truncation point: a live run keeps its last ``max_checkpoints`` untagged
  boundaries (and every tagged one), so its point is the seq of the oldest boundary kept; a
  finished run keeps nothing (its frontier row, transcript and ``tool_calls`` rows hold it all);
* which tagged events below a new point must be copied out before anything is cut;
* the partition's low watermark: the lowest offset any reader may still need. It is the
  minimum of the projectors' positions, the first kept offset of every live run, the first
  offset of every run that a reader folds from its first event (no stored frontier to fold on
  from: quarantined, or a snapshot over the cap; or a graph thread, which its saver folds from
  the log), the first unreadable record (never cut: it could not be archived as an event), and
  the first event inside the retention window.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from onward.eventlog.base import LogRecord, UnreadableRecord, judge
from onward.eventlog.events import ApprovalRequested, ModelAnswered, TurnSettled
from onward.projections.base import StoredFrontier
from onward.projections.frontier import Frontier

from .base import RunTruncation

BOUNDARIES = (ModelAnswered, TurnSettled, ApprovalRequested)
"""The events that are resume points (checkpoints): what ``max_checkpoints`` counts."""


@dataclass(slots=True)
class RunScan:
    """One run's counted events in the scanned range: their offsets by seq, and its boundaries.

    Attributes:
        first_offset: The lowest offset of any of the run's records in the range.
        first_seq: The seq of the first counted event in the range (above 1 once cut).
        offsets: ``offsets[i]`` is the offset of counted seq ``first_seq + i``.
        boundaries: The seqs of the counted boundary events, in order.
    """

    first_offset: int
    first_seq: int = 0
    last_seq: int = 0
    fence: int = 0
    offsets: array[int] = field(default_factory=lambda: array("q"))
    boundaries: list[int] = field(default_factory=list)

    def offset_of(self, seq: int) -> int | None:
        """Where counted event ``seq`` sits, if it is in the range."""
        index = seq - self.first_seq
        return self.offsets[index] if self.first_seq and 0 <= index < len(self.offsets) else None


@dataclass(slots=True)
class PartitionScan:
    """What a pass read of one partition, from its start up to ``end`` (exclusive).

    Args:
        partition: The partition.
        start: The partition's start when the scan began.
        end: Where the scan stops: the lowest position any projector stored.
        recent_after: Events written at or after this time (microseconds) are inside the
            retention window; ``None`` for no window.
    """

    partition: int
    start: int
    end: int
    recent_after: int | None = None
    runs: dict[str, RunScan] = field(default_factory=dict)
    offsets: array[int] = field(default_factory=lambda: array("q"))
    first_unreadable: int | None = None
    first_recent: int | None = None

    def add(self, records: Sequence[LogRecord]) -> None:
        """Take in the next records of the range, in offset order."""
        for record in records:
            offset = record.position.offset
            self.offsets.append(offset)
            if isinstance(record, UnreadableRecord):
                if self.first_unreadable is None:
                    self.first_unreadable = offset
                if record.run_id is not None and record.run_id not in self.runs:
                    self.runs[record.run_id] = RunScan(first_offset=offset)
                continue
            event = record.event
            if (
                self.first_recent is None
                and self.recent_after is not None
                and event.at >= self.recent_after
            ):
                self.first_recent = offset
            run = self.runs.get(event.run_id)
            if run is None:
                run = self.runs[event.run_id] = RunScan(first_offset=offset)
            if not run.first_seq:
                # The run's first counted event here: its history may have been cut below it.
                run.first_seq, run.last_seq, run.fence = event.seq, event.seq - 1, event.fence
            if judge(run.last_seq, run.fence, event) is not None:
                continue
            run.last_seq += 1
            run.fence = event.fence
            run.offsets.append(offset)
            if isinstance(event, BOUNDARIES):
                run.boundaries.append(run.last_seq)

    def records_below(self, offset: int) -> int:
        """How many records of the range lie below ``offset``."""
        return bisect_left(self.offsets, offset)


@dataclass(frozen=True, slots=True)
class Retain:
    """A tagged event to copy before its run's new truncation point lets it be cut."""

    run_id: str
    seq: int
    offset: int


@dataclass(slots=True)
class PartitionPlan:
    """What a pass does to one partition.

    Attributes:
        truncations: The runs whose truncation point moves forward, with the new point.
        retain: The tagged events to copy in the same transaction.
        watermark: Everything below this offset may be archived and cut.
        held_by: What keeps the watermark where it is, for the report.
    """

    truncations: list[RunTruncation]
    retain: list[Retain]
    watermark: int
    held_by: str


def plan_partition(
    scan: PartitionScan,
    rows: Mapping[str, StoredFrontier],
    current: Mapping[str, RunTruncation],
    retained: Mapping[str, set[int]],
    *,
    max_checkpoints: int,
    now: int,
) -> PartitionPlan:
    """Decide truncation points, retained events and the watermark of one scanned partition.

    Args:
        scan: The partition as read.
        rows: The stored frontier rows of the runs met.
        current: Their truncation points so far.
        retained: Their retained seqs so far.
        max_checkpoints: Untagged boundaries a live run keeps (at least 1).
        now: Microseconds since the epoch, stamped on new points.
    """
    holds: list[tuple[int, str]] = [(scan.end, "the projectors' positions")]
    if scan.first_unreadable is not None:
        holds.append((scan.first_unreadable, "an unreadable record (never cut)"))
    if scan.first_recent is not None:
        holds.append((scan.first_recent, "the retention window"))
    truncations: list[RunTruncation] = []
    retain: list[Retain] = []
    for run_id, run in scan.runs.items():
        row = rows.get(run_id)
        frontier = row.frontier if row is not None else None
        if frontier is None or not frontier.agent:
            why = "is folded from its first event" if frontier else "has no frontier to resume from"
            holds.append((run.first_offset, f"run {run_id!r} {why}"))
            continue
        was = current.get(run_id)
        point = _point(run, frontier, max_checkpoints)
        if was is not None and (point is None or point[0] <= was.before_seq):
            point = was.before_seq, was.before_offset
        if not frontier.finished:
            kept_from = point[1] if point is not None else run.first_offset
            holds.append((max(kept_from, run.first_offset), f"live run {run_id!r}"))
        if point is None:
            continue
        before_seq, before_offset = point
        if was is None or was.before_seq < before_seq:
            truncations.append(
                RunTruncation(
                    tenant=frontier.tenant,
                    run_id=run_id,
                    partition=scan.partition,
                    before_seq=before_seq,
                    before_offset=before_offset,
                    at=now,
                )
            )
        done = retained.get(run_id, set())
        for seq in sorted({s for t in frontier.tags for s in (t.seq, t.tagged_seq)}):
            offset = run.offset_of(seq)
            if seq < before_seq and seq not in done and offset is not None:
                retain.append(Retain(run_id, seq, offset))
    watermark, held_by = min(holds)
    return PartitionPlan(truncations, retain, max(watermark, scan.start), held_by)


def _point(run: RunScan, frontier: Frontier, max_checkpoints: int) -> tuple[int, int] | None:
    """A run's truncation point as (seq, offset), or ``None`` while it keeps everything.

    A finished run keeps nothing; a live one its last ``max_checkpoints`` untagged boundaries.
    """
    if frontier.finished:
        return frontier.last_seq + 1, frontier.through_offset + 1
    tagged = {t.seq for t in frontier.tags}
    untagged = [seq for seq in run.boundaries if seq not in tagged]
    if len(untagged) <= max_checkpoints:
        return None
    seq = untagged[-max_checkpoints]
    offset = run.offset_of(seq)
    return None if offset is None else (seq, offset)
