"""What one compaction pass decides for one partition, from what it read. Pure: no I/O.

The compactor scans a partition from its start up to where every projector has folded it
(`PartitionScan`), loads the frontier rows, truncation points, retained seqs, tag pins and
tombstones of the runs it met, and `plan_partition` decides (DESIGN §7):

* the partition's low watermark, from readers of the whole partition only: the projectors'
  positions, the first unreadable record (never cut: it could not be archived as an event) and
  the first event inside the retention window. No run holds it: a partition is shared by
  thousands of runs and some always wait on a person;
* per run with events below the watermark, its truncation point, the first of its seqs left in
  the log, and what it keeps of the events below, copied out before the cut:
  - a run read from its first event (no frontier to resume from: quarantined, or over the
    snapshot cap with no frontier kept uncapped; a LangGraph thread; a pydantic-ai run,
    executed again from its start; a run whose row is missing and was not collected) keeps all
    of them (``history``), and readers read those copies, then the log;
  - any other run keeps its tagged and pinned events (``tag``) and, while live, its last
    ``max_checkpoints`` untagged resume points (``checkpoint``): its frontier row and transcript
    hold what resume needs;
  - a run garbage collection removed (a tombstone) keeps nothing.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field

from onward.eventlog import codec
from onward.eventlog.base import LogRecord, UnreadableRecord, judge, partition_for
from onward.eventlog.events import ApprovalRequested, Event, ModelAnswered, TurnSettled
from onward.projections.base import StoredFrontier
from onward.projections.frontier import Frontier

from .base import KeptAs, RunTruncation

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
        raised: ``(seq, fence)`` for each counted event that raised the run's fence, in order.
    """

    first_offset: int
    tenant: str = ""
    first_seq: int = 0
    last_seq: int = 0
    fence: int = 0
    offsets: array[int] = field(default_factory=lambda: array("q"))
    boundaries: list[int] = field(default_factory=list)
    raised: list[tuple[int, int]] = field(default_factory=list)

    def offset_of(self, seq: int) -> int | None:
        """Where counted event ``seq`` sits, if it is in the range."""
        index = seq - self.first_seq
        return self.offsets[index] if self.first_seq and 0 <= index < len(self.offsets) else None

    def seed(self, event: Event, offset: int, point: RunTruncation | None) -> bool:
        """Start counting at the run's first event in the range: from its truncation point
        (seq and fence) when it has one, as the fold went on there, else from the event itself
        (no cut reached the run). False for an event below the point: gone for readers, and
        after a cut possibly a superseded writer's refused event, which must not seed."""
        if point is None:
            self.first_seq, self.last_seq, self.fence = event.seq, event.seq - 1, event.fence
        elif offset < point.before_offset:
            return False
        else:
            self.first_seq, self.last_seq, self.fence = (
                point.before_seq,
                point.before_seq - 1,
                point.fence,
            )
        return True

    def fence_before(self, seq: int) -> int:
        """The highest fence admitted among the counted events below ``seq`` (0: none here)."""
        index = bisect_left(self.raised, (seq,))
        return self.raised[index - 1][1] if index else 0


@dataclass(slots=True)
class PartitionScan:
    """What a pass read of one partition, from its start up to ``end`` (exclusive).

    Args:
        partition: The partition.
        start: The partition's start when the scan began.
        end: Where the scan stops: the lowest position any projector stored.
        recent_after: Events written at or after this time (microseconds) are inside the
            retention window; ``None`` for no window.
        points: The truncation points of the runs in the range, given before their first
            record is: a run with one is counted from it (its seq and fence), not from its
            first record here, which after a cut can be a superseded writer's refused event.
        partitions: How many partitions the log has: a record of a run whose partition is
            another (a producer that partitions keys otherwise, a mirror) is no part of the
            run, whose history is its own partition's (as the fold and a resume read it), and
            counts for no run here; ``None`` takes every record as in its run's partition.
    """

    partition: int
    start: int
    end: int
    recent_after: int | None = None
    measure: bool = False
    runs: dict[str, RunScan] = field(default_factory=dict)
    offsets: array[int] = field(default_factory=lambda: array("q"))
    sizes: array[int] = field(default_factory=lambda: array("q"))
    first_unreadable: int | None = None
    first_recent: int | None = None
    points: dict[str, RunTruncation] = field(default_factory=dict)
    partitions: int | None = None

    def add(self, records: Sequence[LogRecord]) -> None:
        """Take in the next records of the range, in offset order."""
        for record in records:
            offset = record.position.offset
            self.offsets.append(offset)
            if self.measure:
                self.sizes.append(_size(record))
            if isinstance(record, UnreadableRecord):
                if self.first_unreadable is None:
                    self.first_unreadable = offset
                run_id = record.run_id
                if run_id is not None and run_id not in self.runs and self._home(run_id):
                    self.runs[run_id] = RunScan(first_offset=offset)
                continue
            event = record.event
            if (
                self.first_recent is None
                and self.recent_after is not None
                and event.at >= self.recent_after
            ):
                self.first_recent = offset
            run = self._counting(event, offset)
            if run is None or judge(run.last_seq, run.fence, event) is not None:
                continue
            run.last_seq += 1
            if event.fence != run.fence or not run.raised:
                run.raised.append((run.last_seq, event.fence))
            run.fence = event.fence
            run.offsets.append(offset)
            if isinstance(event, BOUNDARIES):
                run.boundaries.append(run.last_seq)

    def _counting(self, event: Event, offset: int) -> RunScan | None:
        """The run ``event`` is counted for, its count seeded; None for an event of a run of
        another partition, or one below the run's truncation point."""
        if not self._home(event.run_id):
            return None
        run = self.runs.get(event.run_id)
        if run is None:
            run = self.runs[event.run_id] = RunScan(first_offset=offset)
        if not run.tenant:
            run.tenant = event.tenant
        if not run.first_seq and not run.seed(event, offset, self.points.get(event.run_id)):
            return None
        return run

    def _home(self, run_id: str) -> bool:
        """Whether this is the partition of ``run_id``'s records (a run met here already is
        this partition's: it is not hashed again for each of its records)."""
        if self.partitions is None or run_id in self.runs:
            return True
        return partition_for(run_id, self.partitions) == self.partition

    def records_below(self, offset: int) -> int:
        """How many records of the range lie below ``offset``."""
        return bisect_left(self.offsets, offset)

    def bytes_below(self, offset: int) -> int | None:
        """About how many bytes the records below ``offset`` take (events as the codec encodes
        them); ``None`` unless the scan measured."""
        return sum(self.sizes[: self.records_below(offset)]) if self.measure else None


def _size(record: LogRecord) -> int:
    """An unreadable record counts nothing: no pass cuts one."""
    if isinstance(record, UnreadableRecord):
        return 0
    return len(codec.encode(record.event))


@dataclass(frozen=True, slots=True)
class Retain:
    """An event to copy out of the log before the cut, and why it is kept."""

    run_id: str
    seq: int
    offset: int
    kept_as: KeptAs = "tag"


@dataclass(slots=True)
class PartitionPlan:
    """What a pass does to one partition.

    Attributes:
        truncations: The runs whose truncation point moves forward, with the new point.
        retain: The events to copy in the same transaction.
        watermark: Everything below this offset may be archived and cut.
        held_by: What keeps the watermark where it is, for the report.
    """

    truncations: list[RunTruncation]
    retain: list[Retain]
    watermark: int
    held_by: str

    def only(self, run_id: str) -> PartitionPlan:
        """This plan's logical part for one run; nothing is cut (``watermark`` is kept only
        for the report)."""
        return PartitionPlan(
            [t for t in self.truncations if t.run_id == run_id],
            [r for r in self.retain if r.run_id == run_id],
            self.watermark,
            self.held_by,
        )


@dataclass(frozen=True, slots=True)
class RunsMet:
    """What the stores hold of the runs a scan met.

    Attributes:
        rows: Their stored frontier rows.
        current: Their truncation points so far.
        retained: Their retained seqs so far.
        pins: The seqs tags pinned.
        tombstones: The runs garbage collection removed.
        snapshots: The frontiers kept uncapped of runs whose row refused theirs for size.
    """

    rows: Mapping[str, StoredFrontier]
    current: Mapping[str, RunTruncation]
    retained: Mapping[str, set[int]]
    pins: Mapping[str, set[int]] = field(default_factory=dict)
    tombstones: Set[str] = frozenset()
    snapshots: Mapping[str, Frontier] = field(default_factory=dict)


def plan_partition(
    scan: PartitionScan, met: RunsMet, *, max_checkpoints: int, now: int
) -> PartitionPlan:
    """Decide the watermark, truncation points and retained events of one scanned partition.

    Args:
        scan: The partition as read.
        met: What the stores hold of the runs it met.
        max_checkpoints: Untagged resume points a live run keeps (at least 1).
        now: Microseconds since the epoch, stamped on new points.
    """
    holds: list[tuple[int, str]] = [(scan.end, "the projectors' positions")]
    if scan.first_unreadable is not None:
        holds.append((scan.first_unreadable, "an unreadable record (never cut)"))
    if scan.first_recent is not None:
        holds.append((scan.first_recent, "the retention window"))
    watermark, held_by = min(holds)
    watermark = max(watermark, scan.start)
    truncations: list[RunTruncation] = []
    retain: list[Retain] = []
    for run_id, run in scan.runs.items():
        below = bisect_left(run.offsets, watermark)
        # A tombstone is the collected run's: a run with a frontier row again is a new run
        # under the same id (or the old one refolded), planned like any other.
        if not below or (run_id in met.tombstones and run_id not in met.rows):
            continue
        before_seq = run.first_seq + below
        was = met.current.get(run_id)
        if was is not None and was.before_seq >= before_seq:
            continue
        row = met.rows.get(run_id)
        frontier = row.frontier if row is not None else None
        if frontier is None and row is not None and row.set_aside is None:
            frontier = met.snapshots.get(run_id)  # over the row's cap, kept uncapped
        read_whole = _read_whole(row is not None, frontier)
        # Whole only if no cut took part of it before; a run that was not, and is read from
        # its first event now (set aside since), still keeps every event of it below the new
        # point: its reader folds them on from the frontier it holds (a quarantined run's,
        # from when it was set aside).
        whole = read_whole and (was is None or was.whole)
        truncations.append(
            RunTruncation(
                tenant=frontier.tenant if frontier is not None else run.tenant,
                run_id=run_id,
                partition=scan.partition,
                before_seq=before_seq,
                before_offset=run.offsets[below] if below < len(run.offsets) else watermark,
                at=now,
                whole=whole,
                fence=run.fence_before(before_seq),
            )
        )
        done = met.retained.get(run_id, set())
        first = max(run.first_seq, was.before_seq if was is not None else 0)
        kept: list[tuple[int, KeptAs]]
        if read_whole:
            kept = [(seq, "history") for seq in range(first, before_seq)]
        else:
            tagged = set(met.pins.get(run_id, ()))
            if frontier is not None:
                tagged.update(s for t in frontier.tags for s in (t.seq, t.tagged_seq))
            kept = [(seq, "tag") for seq in sorted(tagged)]
            if frontier is not None and not frontier.finished:
                untagged = [s for s in run.boundaries if s < before_seq and s not in tagged]
                kept += [(seq, "checkpoint") for seq in untagged[-max_checkpoints:]]
        for seq, kept_as in kept:
            offset = run.offset_of(seq)
            if seq < before_seq and seq not in done and offset is not None:
                retain.append(Retain(run_id, seq, offset, kept_as))
    return PartitionPlan(truncations, retain, watermark, held_by)


def _read_whole(has_row: bool, frontier: Frontier | None) -> bool:
    """Whether a reader folds (or executes) the run from its first event, so every event of it
    must be kept: no row (and no tombstone), no frontier to resume from (set aside in
    quarantine, or over the row's cap with none kept uncapped), no agent of Onward's own (a
    LangGraph thread), a run its executor replays (pydantic-ai), or a run whose row counts no
    message (it predates its transcript, or was carried on before it said anything) that is
    live or was carried into another run: its successor reads its conversation from the log."""
    if not has_row or frontier is None or not frontier.agent:
        return True  # a thread's next invocation reads it whole, even after a cancel
    if frontier.finished:
        return frontier.status == "continued" and frontier.messages == 0
    return frontier.replays or frontier.messages == 0
