"""A run's audit timeline after compaction: what is left in the log, the retained (tagged)
events in their places, and what was compacted away and where it was archived."""

from __future__ import annotations

from dataclasses import dataclass

from onward.eventlog.base import EventLog, StoredEvent, partition_for
from onward.projections.audit import AuditLine, check_owner, timeline_of

from .base import CompactionStore


@dataclass(frozen=True, slots=True)
class CompactedSpan:
    """The part of a run's history compaction took out of the log.

    Attributes:
        partition: The run's partition.
        before_seq: The run's events below this seq are compacted.
        before_offset: None of the run's events below this offset is in the log for readers.
        retained: How many of them were kept because they are tagged.
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

    def describe(self, run_id: str) -> str:
        """One line for a person reading the timeline."""
        line = (
            f"run {run_id!r}: seqs 1 to {self.before_seq - 1} (below offset {self.before_offset} "
            f"of partition {self.partition}) were compacted"
        )
        if self.retained:
            line += f"; {self.retained} tagged event(s) retained are shown in place"
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
    shown = [
        r for r in records if not isinstance(r, StoredEvent) or r.event.seq >= point.before_seq
    ]
    kept = [AuditLine(e.stored(), None, retained=True) for e in await store.retained(run_id)]
    lines = sorted([*kept, *timeline_of(shown)], key=lambda line: line.position.offset)
    if point.tenant != tenant:
        check_owner([], run_id, tenant)
    cuts = [c for c in await store.cuts(partition) if c.start < point.before_offset]
    span = CompactedSpan(
        partition=partition,
        before_seq=point.before_seq,
        before_offset=point.before_offset,
        retained=len(kept),
        archives=tuple(dict.fromkeys(c.archive for c in cuts if c.archive is not None)),
        cut=bool(cuts),
    )
    return lines, span
