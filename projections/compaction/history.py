"""A run's history after compaction: the whole run for readers that fold it from its first
event (the retained copies, then the log), and the audit timeline (what is left in the log,
the retained events in their places, what was compacted away and where it was archived)."""

from __future__ import annotations

from dataclasses import dataclass

from onward.errors import LogTruncatedError
from onward.eventlog.base import EventLog, LogRecord, StoredEvent, partition_for, strict
from onward.projections.audit import AuditLine, check_owner, timeline_of

from .base import CompactionStore, LogCut, RetainedEvent, RunTruncation


async def read_whole_run(
    log: EventLog,
    store: CompactionStore | None,
    run_id: str,
    *,
    start: int | None = None,
    end: int | None = None,
) -> list[StoredEvent]:
    """The run's events from offset ``start`` (``None``: its first) up to ``end``, as if the
    log had never been cut: what compaction retained of the run below the log's start, then
    the log. What readers that fold or execute a run from its first event read (a LangGraph
    thread, a pydantic-ai run, a run without a frontier to resume from).

    A run with no truncation point had no event below any cut (every cut gives each run below
    it a point first), so the log from its start holds all of it; one whose log start moved
    past ``start`` by other means (Kafka retention) has a hole, as it has without a store.

    Raises:
        LogTruncatedError: The log was cut below ``start`` and compaction kept only part of
            the run there (its tags and resume points), naming the archive that holds the
            rest; or the log's start moved past ``start`` and compaction kept nothing of it.
        EventDecodeError: A record of the run in the log is unreadable.
    """
    if store is None:
        return await log.read_run(run_id, start=start, end=end)
    if start is not None:
        try:
            return await log.read_run(run_id, start=start, end=end)
        except LogTruncatedError:
            pass  # cut below start: what was retained, then the log from its start
    return strict(await _past_the_cut(log, store, run_id, start=start, end=end, have_seq=0))


async def read_whole_records(
    log: EventLog,
    store: CompactionStore | None,
    run_id: str,
    *,
    start: int | None = None,
    end: int | None = None,
    have_seq: int = 0,
) -> list[LogRecord]:
    """As :func:`read_whole_run`, with the run's unreadable records in their places (what a
    projector folding a run again reads).

    Args:
        have_seq: The reader already holds the run's events through this seq (a frontier it
            folds on from): compacted events below it are not missed.
    """
    partition = partition_for(run_id, log.partitions)
    if store is None:
        return await log.read_records(partition, start, end, run_id=run_id)
    if start is not None:
        try:
            return await log.read_records(partition, start, end, run_id=run_id)
        except LogTruncatedError:
            pass  # cut below start: what was retained, then the log from its start
    return await _past_the_cut(log, store, run_id, start=start, end=end, have_seq=have_seq)


async def _past_the_cut(
    log: EventLog,
    store: CompactionStore,
    run_id: str,
    *,
    start: int | None,
    end: int | None,
    have_seq: int,
) -> list[LogRecord]:
    """The run's records from ``start`` when the log may start above it: the retained ones
    below the log's start, then the log's."""
    partition = partition_for(run_id, log.partitions)
    for _ in range(2):
        bounds = await log.bounds(partition)
        point = (await store.truncations([run_id])).get(run_id)
        kept: list[LogRecord] = []
        missed = False
        if point is not None:
            retained = await store.retained(run_id)
            missed = start is None or start < point.before_offset
            if not point.whole and missed and not _retained_from(retained, have_seq + 1, point):
                raise LogTruncatedError(
                    await _gone(store, run_id, point),
                    run_id=run_id,
                    partition=partition,
                    offset=start,
                    start=bounds.start,
                )
            kept = [
                e.stored()
                for e in retained
                if (start is None or e.offset >= start)
                and e.offset < bounds.start
                and (end is None or e.offset < end)
            ]
        elif (
            start is not None
            and start < bounds.start
            and not _cut_by_compaction(await store.cuts(partition), start, bounds.start)
        ):
            raise LogTruncatedError(
                f"run {run_id!r}: partition {partition} starts at offset {bounds.start}, past "
                f"offset {start}, and compaction kept nothing of the run below it (the log was "
                "cut by other means, such as Kafka retention)",
                run_id=run_id,
                partition=partition,
                offset=start,
                start=bounds.start,
            )
        if end is not None and end <= bounds.start:
            return kept
        try:
            rest = await log.read_records(partition, bounds.start, end, run_id=run_id)
        except LogTruncatedError:
            continue  # cut again between the bounds and the read: once more
        if point is not None and missed and bounds.start > point.before_offset:
            _check_goes_on(rest, run_id, point, bounds.start, have_seq)
        return [*kept, *rest]
    raise LogTruncatedError(
        f"run {run_id!r}: partition {partition} was cut twice while it was read; read it again",
        run_id=run_id,
        partition=partition,
        offset=start,
        start=bounds.start,
    )


def _check_goes_on(
    rest: list[LogRecord], run_id: str, point: RunTruncation, start: int, have_seq: int
) -> None:
    """Refuse a log that starts past the run's point (moved by other means, such as Kafka
    retention) when the run's first event left in it is past the point's seq: compaction kept
    the events below the point, none of those from it up to there, and the run read on from
    what was kept would have a hole.

    Raises:
        LogTruncatedError: The run's events from the point's seq on were cut.
    """
    first = next((r.event for r in rest if isinstance(r, StoredEvent)), None)
    if first is None or first.seq <= max(point.before_seq, have_seq + 1):
        return
    raise LogTruncatedError(
        f"run {run_id!r}: partition {point.partition} starts at offset {start}, past the run's "
        f"truncation point (offset {point.before_offset}): its events from seq "
        f"{point.before_seq} to {first.seq - 1} were cut by other means (such as Kafka "
        "retention), and compaction kept only those below the point",
        run_id=run_id,
        partition=point.partition,
        offset=point.before_offset,
        start=start,
    )


def _cut_by_compaction(cuts: list[LogCut], start: int, end: int) -> bool:
    """Whether compaction's cuts cover the offsets from ``start`` to ``end``: a run with no
    truncation point then had no event there (every cut gives each run below it a point)."""
    reached = start
    for cut in sorted(cuts, key=lambda c: c.start):
        if cut.start <= reached < cut.end:
            reached = cut.end
    return reached >= end


def _retained_from(retained: list[RetainedEvent], seq: int, point: RunTruncation) -> bool:
    """Whether every event of the run from ``seq`` up to its point is retained: a run cut in
    part, then read from its first event (set aside), keeps all of them from then on."""
    return len({e.seq for e in retained if seq <= e.seq < point.before_seq}) >= (
        point.before_seq - seq
    )


async def _gone(store: CompactionStore, run_id: str, point: RunTruncation) -> str:
    """Where a run's compacted events went, for an error."""
    archives = sorted(
        {c.archive for c in await store.cuts(point.partition) if c.archive is not None}
    )
    where = (
        f"archived in {', '.join(archives)} (read them with --archive)"
        if archives
        else "cut without an archive, they are gone"
    )
    return (
        f"run {run_id!r}: its events before seq {point.before_seq} (below offset "
        f"{point.before_offset} of partition {point.partition}) were compacted: only its "
        f"tagged events and resume points were kept; the rest are {where}"
    )


@dataclass(frozen=True, slots=True)
class CompactedSpan:
    """The part of a run's history compaction took out of the log.

    Attributes:
        partition: The run's partition.
        before_seq: The run's events below this seq are compacted.
        before_offset: None of the run's events below this offset is in the log for readers.
        retained: How many of them were kept (tagged events, the last resume points, or all
            of them when ``whole``).
        archives: Where the cuts that removed them were archived (empty: not cut yet, or cut
            without an archive).
        cut: Whether a cut of the partition has reached into the span (else the records are
            still stored, only no longer read).
    """

    partition: int
    before_seq: int
    before_offset: int
    retained: int
    archives: tuple[str, ...]
    cut: bool
    whole: bool = False

    def describe(self, run_id: str) -> str:
        """One line for a person reading the timeline."""
        line = (
            f"run {run_id!r}: seqs 1 to {self.before_seq - 1} (below offset {self.before_offset} "
            f"of partition {self.partition}) were compacted"
        )
        if self.whole:
            line += f"; all {self.retained} were retained (the run is read from its first event)"
        elif self.retained:
            line += f"; {self.retained} retained (tags, last resume points) are shown in place"
        if self.archives:
            line += f"; archived in {', '.join(self.archives)} (replay --archive DIR shows them)"
        elif self.cut:
            line += "; cut without an archive, they are gone"
        else:
            line += "; not cut yet"
        return line


async def compacted_timeline(
    log: EventLog, store: CompactionStore, run_id: str, *, tenant: str
) -> tuple[list[AuditLine], CompactedSpan | None]:
    """The run's timeline as readers see it after compaction, and the compacted span.

    Events below the run's truncation point are left out (readers treat them as gone) but for
    the retained ones, shown in their places and marked; the verdicts are reached from the
    first event the log still shows.

    Raises:
        NothingToResumeError: No run under that id for that tenant.
    """
    partition = partition_for(run_id, log.partitions)
    point = (await store.truncations([run_id])).get(run_id)
    records = await log.read_records(partition, run_id=run_id)
    if point is None:
        lines = timeline_of(records)
        check_owner(lines, run_id, tenant)
        return lines, None
    # By offset, not seq: a superseded writer's refused events can carry seqs at or past the
    # point from below it. Past it, the verdicts go on from the point's seq and fence, as the
    # fold did: one such event shown first would otherwise seed them as counted.
    shown = [
        r
        for r in records
        if not isinstance(r, StoredEvent) or r.position.offset >= point.before_offset
    ]
    kept = [AuditLine(e.stored(), None, retained=True) for e in await store.retained(run_id)]
    after: tuple[int, int] | None = (point.before_seq - 1, point.fence)
    first = next((r.event for r in shown if isinstance(r, StoredEvent)), None)
    if first is not None and first.seq > point.before_seq:
        start = (await log.bounds(partition)).start
        if start > point.before_offset:
            # The log's start moved past the point (Kafka retention, a cut made elsewhere):
            # the events between are gone, and the verdicts go on from the first one left.
            after = None
    verdicts = timeline_of(shown, after=after)
    lines = sorted([*kept, *verdicts], key=lambda line: line.position.offset)
    if point.tenant != tenant:
        check_owner([], run_id, tenant)
    return lines, await _span(store, point, retained=len(kept))


async def compacted_span(store: CompactionStore, run_id: str) -> CompactedSpan | None:
    """The part of the run compaction took out of the log, and where it went; ``None`` for a
    run never compacted."""
    point = (await store.truncations([run_id])).get(run_id)
    if point is None:
        return None
    seqs = (await store.retained_seqs([run_id])).get(run_id, set())
    return await _span(store, point, retained=len(seqs))


async def _span(store: CompactionStore, point: RunTruncation, *, retained: int) -> CompactedSpan:
    cuts = [c for c in await store.cuts(point.partition) if c.start < point.before_offset]
    return CompactedSpan(
        partition=point.partition,
        before_seq=point.before_seq,
        before_offset=point.before_offset,
        retained=retained,
        archives=tuple(dict.fromkeys(c.archive for c in cuts if c.archive is not None)),
        cut=bool(cuts),
        whole=point.whole,
    )
