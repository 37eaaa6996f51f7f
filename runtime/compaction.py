"""`CheckpointCompactor`: snapshot plus truncation, keeping tagged events, on a schedule.

A pass goes partition by partition (DESIGN §7):

1. Scan the partition from its start up to where every live projector has stored its position
   (only folded events are candidates), load the frontier rows and truncation points of the
   runs met, and plan (:func:`~onward.projections.compaction.plan.plan_partition`).
2. Logical: in one transaction, copy the tagged events below each run's new truncation point
   to ``onward_retained_events`` and move the points forward. Readers treat a run's events
   below its point as gone; its frontier row and transcript hold what resume needs.
3. Physical: below the partition's low watermark, write every record to the archive (when one
   is configured) and make it durable, record the cut and where it was archived, then cut
   (Kafka DeleteRecords; SQLite deletes the rows).

Every step can be repeated: a pass killed between the archive and the cut, or inside the cut,
leaves the log whole and the archive holding a range its manifest names; the next pass finds
the range archived (and archives only beyond it), records the cut again and cuts. Nothing is
lost, because nothing is cut before the archive holding it is durable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from onward._storage import Resource
from onward.errors import InvalidInputError, LogTruncatedError, OnwardError
from onward.eventlog.archive import ArchiveSink
from onward.eventlog.base import EventLog, StoredEvent, UnreadableRecord
from onward.projections.base import FrontierStore
from onward.projections.compaction import (
    CompactionStore,
    LogCut,
    PostgresCompactionStore,
    RetainedEvent,
    embedded_compaction,
)
from onward.projections.compaction.plan import PartitionScan, Retain, plan_partition

from .backends import Backends

log = logging.getLogger("onward.compaction")

ARCHIVE_FILE_EVENTS = 100_000
"""Most records per archive file: a long range is archived as several files."""

Pause = Callable[[str, int], Awaitable[None]]
"""Called at each step of a cut with the step's name (``archived``: the archive holds the
range, nothing is cut yet; ``cut``: this partition is cut, the next ones not) and the
partition. The default does nothing; a crash test stops the process there."""


@dataclass(frozen=True, slots=True)
class PartitionReport:
    """What a pass did (or, dry, would do) to one partition.

    Attributes:
        partition: The partition.
        start: Its first offset before the pass.
        end: Its next offset when the pass looked.
        folded: The lowest position a live projector stored for it.
        watermark: Records below this offset are (or would be) cut.
        held_by: What keeps the watermark where it is.
        events_cut: Records below the watermark: cut, or to be cut.
        archived: Records written to the archive by this pass (a rerun finds some archived).
        archive_start: Where this pass's archiving began (``None``: nothing to archive).
        runs_compacted: Runs whose truncation point moved forward.
        retained: Tagged events copied out of the log.
        cut: Whether the cut was made.
    """

    partition: int
    start: int
    end: int
    folded: int
    watermark: int
    held_by: str
    events_cut: int
    archived: int
    archive_start: int | None
    runs_compacted: int
    retained: int
    cut: bool


@dataclass(slots=True)
class CompactionReport:
    """One pass over every partition.

    Attributes:
        dry_run: Nothing was written, archived or cut.
        archive: Where cut records went; ``None`` without an archive.
        partitions: One report per partition, in order.
    """

    dry_run: bool
    archive: str | None
    partitions: list[PartitionReport] = field(default_factory=list)

    @property
    def events_cut(self) -> int:
        """Records cut (or, dry, to be cut) over every partition."""
        return sum(p.events_cut for p in self.partitions)

    @property
    def archived(self) -> int:
        """Records this pass wrote to the archive."""
        return sum(p.archived for p in self.partitions)


async def _go_on(step: str, partition: int) -> None:
    return None


class CheckpointCompactor(Resource):
    """Compacts the log: per run, then per partition; once (:meth:`compact`) or on a schedule.

    Args:
        log: The event log.
        frontiers: The frontier rows the runs' truncation points are decided from.
        store: Where truncation points, retained events and cuts are stored.
        archive: Where records go before they are cut; ``None`` cuts without archiving (the
            audit history below the cut is then gone for good).
        max_checkpoints: Untagged boundaries (resume points) a live run keeps in the log;
            tagged ones are always kept.
        compaction_interval_mins: How often :meth:`start` runs a pass.
        retention_mins: Records younger than this are never cut, whatever else allows.
        scan_batch: Records read per round trip while scanning.
        pause: Called at each step of a cut (see `Pause`).
    """

    def __init__(
        self,
        log: EventLog,
        frontiers: FrontierStore,
        store: CompactionStore,
        *,
        archive: ArchiveSink | None = None,
        max_checkpoints: int = 50,
        compaction_interval_mins: float = 60.0,
        retention_mins: float = 0.0,
        scan_batch: int = 5_000,
        pause: Pause = _go_on,
    ) -> None:
        for name, value, least in (
            ("max_checkpoints", max_checkpoints, 1),
            ("scan_batch", scan_batch, 1),
            ("retention_mins", retention_mins, 0),
        ):
            if value < least:
                raise InvalidInputError(f"{name} must be at least {least}, got {value}")
        if compaction_interval_mins <= 0:
            raise InvalidInputError(
                f"compaction_interval_mins must be positive, got {compaction_interval_mins}"
            )
        self.log = log
        self.frontiers = frontiers
        self.store = store
        self.archive = archive
        self.max_checkpoints = max_checkpoints
        self.interval_s = compaction_interval_mins * 60.0
        self.retention_us = int(retention_mins * 60e6)
        self.scan_batch = scan_batch
        self._pause = pause
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.last_report: CompactionReport | None = None
        self.last_error: str | None = None

    @property
    def is_open(self) -> bool:
        return self._task is not None

    async def _connect(self) -> None:
        """Start passes on the schedule, the first one now."""
        self._stop.clear()
        self._task = asyncio.create_task(self.run(self._stop))

    async def close(self) -> None:
        """Stop the schedule; a pass in progress is cancelled (a rerun finishes its work)."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stop.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def run(self, stop: asyncio.Event) -> None:
        """Run a pass every ``compaction_interval_mins`` until ``stop`` is set.

        A pass that fails is logged and kept in :attr:`last_error`; the next one tries again.
        """
        while not stop.is_set():
            try:
                self.last_report = await self.compact()
                self.last_error = None
            except OnwardError as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("compaction pass failed, retried next time: %s", self.last_error)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)

    async def dry_run(self) -> CompactionReport:
        """What a pass would do: computed the same way, nothing written, archived or cut."""
        return await self.compact(dry_run=True)

    async def compact(self, *, dry_run: bool = False) -> CompactionReport:
        """One pass over every partition.

        Raises:
            ArchiveError: The archive's manifest or a file is corrupt; nothing more is cut.
            ConfigurationError: The archive cannot be written; nothing more is cut.
            BackendError: The log or a store failed; a rerun carries on where this stopped.
        """
        if self.archive is not None:
            # An archive that cannot be written, or a corrupt manifest, stops the pass first.
            await (self.archive.ranges() if dry_run else self.archive.ready())
        report = CompactionReport(dry_run, self.archive.location if self.archive else None)
        positions = await self.store.positions()
        for partition in range(self.log.partitions):
            folded = [p[partition] for p in positions.values() if partition in p]
            report.partitions.append(await self._partition(partition, folded, dry_run))
        return report

    async def _partition(self, partition: int, folded: list[int], dry_run: bool) -> PartitionReport:
        bounds = await self.log.bounds(partition)
        # No projector has folded the partition: nothing of it is a candidate yet.
        lowest = min(folded) if folded else bounds.start
        now = time.time_ns() // 1_000
        scan = PartitionScan(
            partition,
            bounds.start,
            min(max(lowest, bounds.start), bounds.end),
            recent_after=now - self.retention_us if self.retention_us else None,
        )
        offset = scan.start
        while offset < scan.end:
            records = await self.log.read_records(
                partition, offset, min(scan.end, offset + self.scan_batch)
            )
            scan.add(records)
            offset = records[-1].position.offset + 1 if records else scan.end
        runs = list(scan.runs)
        rows, current, retained = await asyncio.gather(
            self.frontiers.load(runs), self.store.truncations(runs), self.store.retained_seqs(runs)
        )
        plan = plan_partition(
            scan, rows, current, retained, max_checkpoints=self.max_checkpoints, now=now
        )
        events_cut = scan.records_below(plan.watermark)
        if not dry_run:
            copies = await self._copies(partition, plan.retain)
            await self.store.truncate(plan.truncations, copies)
        archived, archive_start = 0, None
        cut = False
        if plan.watermark > bounds.start:
            archive_start = await self._archive_start(partition, bounds.start, plan.watermark)
            if not dry_run:
                archived = await self._archive(partition, archive_start, plan.watermark)
                await self._pause("archived", partition)
                await self.store.record_cut(
                    LogCut(
                        partition=partition,
                        start=bounds.start,
                        end=plan.watermark,
                        events=events_cut,
                        archive=self.archive.location if self.archive else None,
                        at=now,
                    )
                )
                await self.log.truncate_before(partition, plan.watermark)
                cut = True
                await self._pause("cut", partition)
        return PartitionReport(
            partition=partition,
            start=bounds.start,
            end=bounds.end,
            folded=lowest,
            watermark=plan.watermark,
            held_by=plan.held_by,
            events_cut=events_cut,
            archived=archived,
            archive_start=archive_start,
            runs_compacted=len(plan.truncations),
            retained=len(plan.retain),
            cut=cut,
        )

    async def _copies(self, partition: int, retain: list[Retain]) -> list[RetainedEvent]:
        """The tagged events to retain, read back from the log where the scan saw them."""
        copies: list[RetainedEvent] = []
        for item in retain:
            found = await self.log.read_records(
                partition, item.offset, item.offset + 1, run_id=item.run_id
            )
            record = found[0] if found else None
            if not isinstance(record, StoredEvent) or record.event.seq != item.seq:
                raise LogTruncatedError(
                    f"run {item.run_id!r}: tagged seq {item.seq} is not at offset {item.offset} "
                    f"of partition {partition} any more; nothing was compacted",
                    run_id=item.run_id,
                )
            copies.append(RetainedEvent.of(record))
        return copies

    async def _archive_start(self, partition: int, start: int, watermark: int) -> int | None:
        """Where archiving must begin: past what the archive already holds of the partition."""
        if self.archive is None:
            return None
        archived = [r.end for r in await self.archive.ranges(partition) if r.end > start]
        begin = max([start, *archived])
        return begin if begin < watermark else None

    async def _archive(self, partition: int, begin: int | None, watermark: int) -> int:
        """Write ``[begin, watermark)`` to the archive, in files of `ARCHIVE_FILE_EVENTS`."""
        if self.archive is None or begin is None:
            return 0
        written = 0
        while begin < watermark:
            records = await self.log.read_records(
                partition, begin, watermark, limit=ARCHIVE_FILE_EVENTS
            )
            events: list[StoredEvent] = []
            for record in records:
                if isinstance(record, UnreadableRecord):  # the plan never cuts one
                    raise InvalidInputError(
                        f"partition {partition} offset {record.position.offset} cannot be "
                        "archived: it is not a readable event"
                    )
                events.append(record)
            end = events[-1].position.offset + 1 if len(events) == ARCHIVE_FILE_EVENTS else None
            until = watermark if end is None else end
            await self.archive.write(partition, begin, until, events)
            written += len(events)
            begin = until
        return written


def compaction_store(backends: Backends) -> CompactionStore:
    """The compaction store of a deployment's stores (unopened): in the SQLite file, on the
    log's own connection, or in PostgreSQL beside the frontier rows."""
    settings = backends.settings
    embedded = embedded_compaction(backends.log)
    if embedded is not None:
        return embedded
    return PostgresCompactionStore(
        settings.require_database_url(),
        schema=settings.database_schema,
        timeout_s=settings.backend_timeout,
    )


__all__ = ["CheckpointCompactor", "CompactionReport", "PartitionReport", "compaction_store"]
