"""`CheckpointCompactor`: snapshot plus truncation, keeping tagged events, on a schedule.

A pass goes partition by partition (DESIGN §7):

1. Scan the partition from its start up to where every live projector has stored its position
   (only folded events are candidates), load what the stores hold of the runs met, and plan
   (:func:`~onward.projections.compaction.plan.plan_partition`). The watermark depends on
   readers of the whole partition only: no run, waiting or not, holds it.
2. Logical: in one transaction, copy out what each run with events below the watermark still
   needs (its tagged events and last resume points; every event of a run read from its first
   event) and move its truncation point past them. Tags pinned meanwhile are copied too before
   the transaction is allowed to commit.
3. Physical: below the watermark, write every record to the archive and make it durable,
   record the cut and where it was archived, then cut (Kafka DeleteRecords; SQLite deletes
   the rows). Without an archive nothing is cut unless ``no_archive=True`` says so.

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
from onward.errors import (
    ArchiveError,
    ConfigurationError,
    InvalidInputError,
    LogTruncatedError,
    NothingToResumeError,
    OnwardError,
)
from onward.eventlog.archive import ArchivedRange, ArchiveSink
from onward.eventlog.base import (
    EventLog,
    LogRecord,
    StoredEvent,
    UnreadableRecord,
    keeping_records,
    partition_for,
)
from onward.projections.base import DEFAULT_CONSUMER, FrontierStore
from onward.projections.compaction import (
    CompactionStore,
    LogCut,
    PostgresCompactionStore,
    RetainedEvent,
    embedded_compaction,
)
from onward.projections.compaction.plan import (
    PartitionPlan,
    PartitionScan,
    Retain,
    RunsMet,
    plan_partition,
)
from onward.projections.postgres import PostgresFrontierStore

from .backends import Backends, open_backends
from .observability.counts import COUNTS
from .settings import Settings, load_settings

log = logging.getLogger("onward.compaction")

ARCHIVE_FILE_EVENTS = 100_000
"""Most records per archive file: a long range is archived as several files."""

FEW_COPIES = 16
"""Up to this many events to copy, each is read on its own; more, and their span is read."""

Pause = Callable[[str, int], Awaitable[None]]
"""Called at each step of a pass with the step's name (``planned``: the partition is read and
planned, nothing written; ``archived``: the archive holds the range, nothing is cut yet;
``cut``: this partition is cut, the next ones not) and the partition. The default does
nothing; a crash or race test stops the process there."""

TRUNCATE_ATTEMPTS = 5
"""How often a partition's logical step is tried while tags keep pinning events under it."""

NO_ARCHIVE = "no archive (name one, or choose no_archive to cut without)"
"""What holds every partition of a compactor with no archive that was not told to cut
without one."""


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
        retained: Events copied out of the log (tagged ones, resume points, whole runs).
        cut: Whether the cut was made.
        bytes_cut: About how many bytes the records below the watermark take (events as
            encoded); measured by dry runs only, ``None`` otherwise.
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
    bytes_cut: int | None = None


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

    @property
    def bytes_cut(self) -> int | None:
        """About how many bytes a dry run would free; ``None`` for a pass that cut."""
        sizes = [p.bytes_cut for p in self.partitions]
        return None if None in sizes else sum(s for s in sizes if s is not None)


async def _go_on(step: str, partition: int) -> None:
    return None


class CheckpointCompactor(Resource):
    """Compacts the log: per run, then per partition; once (:meth:`compact`) or on a schedule.

    Built without stores (``CheckpointCompactor()``), it compacts the log the deployment's
    `Settings` name (`open_backends`, `compaction_store`), opening the stores for each pass and
    closing them after, as ``onward compact`` does.

    Args:
        log: The event log. ``log``, ``frontiers`` and ``store`` are given together, opened by
            the caller, or none of them: those ``settings`` name.
        frontiers: The frontier rows the runs' truncation points are decided from.
        store: Where truncation points, retained events and cuts are stored.
        archive: Where records go before they are cut. Without one nothing is cut (the runs
            are still compacted logically) unless ``no_archive`` is set.
        no_archive: Cut without an archive: the audit history below each cut is then gone
            for good (what a run needs is still kept per run).
        max_checkpoints: Untagged boundaries (resume points) a live run keeps in the log;
            tagged ones are always kept.
        compaction_interval_mins: How often :meth:`start` runs a pass.
        retention_mins: Records younger than this are never cut, whatever else allows.
        scan_batch: Records read per round trip while scanning.
        pause: Called at each step of a cut (see `Pause`).
        settings: Where the stores are when none is given; read from the environment
            (`load_settings`) when not given either.

    Raises:
        InvalidInputError: A bound out of range, or some of the stores given but not all.
        ConfigurationError: Without stores: settings that are unusable, or name the memory
            backend (nothing there outlives the process to compact).
    """

    def __init__(
        self,
        log: EventLog | None = None,
        frontiers: FrontierStore | None = None,
        store: CompactionStore | None = None,
        *,
        archive: ArchiveSink | None = None,
        no_archive: bool = False,
        max_checkpoints: int = 50,
        compaction_interval_mins: float = 60.0,
        retention_mins: float = 0.0,
        scan_batch: int = 5_000,
        pause: Pause = _go_on,
        settings: Settings | None = None,
    ) -> None:
        for name, value, least in (
            ("max_checkpoints", max_checkpoints, 1),
            ("scan_batch", scan_batch, 1),
            ("retention_mins", retention_mins, 0),
        ):
            if not value >= least:  # NaN too: it compares false with any bound
                raise InvalidInputError(f"{name} must be at least {least}, got {value}")
        if not compaction_interval_mins > 0:
            raise InvalidInputError(
                f"compaction_interval_mins must be positive, got {compaction_interval_mins}"
            )
        self._stores: tuple[EventLog, FrontierStore, CompactionStore] | None = None
        self.settings: Settings | None = None
        if log is not None and frontiers is not None and store is not None:
            self._stores = (log, frontiers, store)
        elif log is not None or frontiers is not None or store is not None:
            raise InvalidInputError(
                "give the log, the frontier store and the compaction store together, or none "
                "of them (the stores the settings name)"
            )
        else:
            self.settings = settings or load_settings()
            if self.settings.backend == "memory":
                raise ConfigurationError(
                    "CheckpointCompactor() compacts the log the settings name, and "
                    "ONWARD_BACKEND=memory keeps nothing past the process; pass the log and "
                    "stores (CheckpointCompactor(log, frontiers, store))"
                )
        self._retention_mins = retention_mins
        if archive is not None and no_archive:
            raise InvalidInputError("give an archive or no_archive=True, not both")
        self.archive = archive
        self.no_archive = no_archive
        self.max_checkpoints = max_checkpoints
        self.interval_s = compaction_interval_mins * 60.0
        # A retention past any record's age (``inf`` among them) cuts nothing: bounded so it
        # stays an int64 wherever a store compares it.
        self.retention_us = int(min(retention_mins * 60e6, float(2**62)))
        self.scan_batch = scan_batch
        self._pause = pause
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.last_report: CompactionReport | None = None
        self.last_error: str | None = None

    @property
    def log(self) -> EventLog:
        """The event log compacted."""
        return self._given()[0]

    @property
    def frontiers(self) -> FrontierStore:
        """The frontier rows the runs' truncation points are decided from."""
        return self._given()[1]

    @property
    def store(self) -> CompactionStore:
        """Where truncation points, retained events and cuts are stored."""
        return self._given()[2]

    def _given(self) -> tuple[EventLog, FrontierStore, CompactionStore]:
        if self._stores is None:
            raise InvalidInputError(
                "this compactor opens the stores its settings name for each pass, and holds "
                "none between passes"
            )
        return self._stores

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

        A pass that fails, whatever the error, is logged and kept in :attr:`last_error`; the
        next one tries again an interval later.
        """
        while not stop.is_set():
            try:
                self.last_report = await self.compact()
                self.last_error = None
            except Exception as exc:  # any error, not Onward's alone: the schedule goes on
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "compaction pass failed, retried next time: %s",
                    self.last_error,
                    exc_info=not isinstance(exc, OnwardError),
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)

    async def dry_run(self) -> CompactionReport:
        """What a pass would do: computed the same way, nothing written, archived or cut."""
        return await self.compact(dry_run=True)

    async def compact(
        self, *, dry_run: bool = False, run_id: str | None = None
    ) -> CompactionReport:
        """One pass over every partition, or, with ``run_id``, one run compacted logically.

        Args:
            run_id: Compact only this run: its truncation point moves to its partition's
                watermark and what it needs below is copied out; nothing is cut (the
                physical cut is per partition, and the next full pass makes it).

        Raises:
            NothingToResumeError: ``run_id`` names no run: no frontier row, truncation point,
                tombstone or event in the log.
            ArchiveError: The archive's manifest or a file is corrupt; nothing more is cut.
            ConfigurationError: The archive cannot be written; nothing more is cut.
            BackendError: The log or a store failed; a rerun carries on where this stopped.
        """
        if self._stores is None:
            return await self._compact_configured(dry_run=dry_run, run_id=run_id)
        if self.archive is not None and run_id is None:
            # An archive that cannot be written, or a corrupt manifest, stops the pass first.
            await (self.archive.ranges() if dry_run else self.archive.ready())
        report = CompactionReport(dry_run, self.archive.location if self.archive else None)
        positions = await self.store.positions()
        if isinstance(self.store, PostgresCompactionStore) and not isinstance(
            self.frontiers, PostgresFrontierStore
        ):
            # The frontiers projector stores its positions beside its rows (Redis), where the
            # PostgreSQL compaction store does not read them: they hold the partitions too.
            # The frontiers builds in PostgreSQL that never stored a position (`onward db
            # migrate` creates one) are folded by nothing here: they hold nothing.
            positions = {
                **{
                    consumer: stored
                    for consumer, stored in positions.items()
                    if stored or not consumer.startswith(f"{DEFAULT_CONSUMER}@")
                },
                f"{DEFAULT_CONSUMER} (frontier store)": await self.frontiers.positions(
                    DEFAULT_CONSUMER
                ),
            }
        partitions = (
            range(self.log.partitions)
            if run_id is None
            else [partition_for(run_id, self.log.partitions)]
        )
        for partition in partitions:
            # A projector with no position in this partition has folded none of it (it stores
            # a partition's position only once a batch held records there): it holds it.
            folded = [p.get(partition) for p in positions.values()]
            report.partitions.append(await self._partition(partition, folded, dry_run, run_id))
        return report

    async def _compact_configured(self, *, dry_run: bool, run_id: str | None) -> CompactionReport:
        """One pass on the stores the settings name, opened for it."""
        assert self.settings is not None  # set when no store was given
        async with (
            open_backends(self.settings) as backends,
            compaction_store(backends) as store,
        ):
            on_stores = CheckpointCompactor(
                backends.log,
                backends.frontiers,
                store,
                archive=self.archive,
                no_archive=self.no_archive,
                max_checkpoints=self.max_checkpoints,
                compaction_interval_mins=self.interval_s / 60.0,
                retention_mins=self._retention_mins,
                scan_batch=self.scan_batch,
                pause=self._pause,
            )
            return await on_stores.compact(dry_run=dry_run, run_id=run_id)

    async def _partition(
        self, partition: int, folded: list[int | None], dry_run: bool, run_id: str | None
    ) -> PartitionReport:
        bounds = await self.log.bounds(partition)
        # No projector has folded the partition: nothing of it is a candidate yet.
        lowest = min((bounds.start if f is None else f) for f in folded) if folded else bounds.start
        now = time.time_ns() // 1_000
        scan = PartitionScan(
            partition,
            bounds.start,
            min(max(lowest, bounds.start), bounds.end),
            recent_after=now - self.retention_us if self.retention_us else None,
            # A dry run reports the bytes; a pass that may cut counts them (metrics).
            measure=dry_run or (run_id is None and (self.archive is not None or self.no_archive)),
            partitions=self.log.partitions,
        )
        offset = scan.start
        while offset < scan.end:
            records = await self.log.read_records(
                partition, offset, min(scan.end, offset + self.scan_batch)
            )
            # The points of the runs met first here, before their records are counted.
            met_first = {
                run for r in records if (run := _run_of(r)) is not None and run not in scan.runs
            }
            if met_first:
                scan.points.update(await self.store.truncations(met_first))
            scan.add(records)
            offset = records[-1].position.offset + 1 if records else scan.end
        if run_id is not None and run_id not in scan.runs:
            await self._known(run_id, partition, scan.end)
        runs = list(scan.runs)
        current = scan.points
        rows, retained, pins, tombstones = await asyncio.gather(
            self.frontiers.load(runs),
            self.store.retained_seqs(runs),
            self.store.pins(runs),
            self.store.tombstones(runs),
        )
        capped = [r for r, row in rows.items() if row.frontier is None and row.set_aside is None]
        snapshots = await self.store.snapshots(capped) if capped else {}
        met = RunsMet(rows, current, retained, pins, tombstones, snapshots)
        plan = plan_partition(scan, met, max_checkpoints=self.max_checkpoints, now=now)
        cuts = run_id is None and (self.archive is not None or self.no_archive)
        if run_id is not None:
            plan = plan.only(run_id)
        elif not cuts:
            plan = PartitionPlan([], [], bounds.start, NO_ARCHIVE)
        watermark = plan.watermark if cuts else bounds.start
        events_cut = scan.records_below(watermark)
        await self._pause("planned", partition)
        retained_count = len(plan.retain)
        if not dry_run:
            retained_count = await self._truncate(partition, scan, plan)
        archived, archive_start = 0, None
        cut = False
        if watermark > bounds.start:
            archive_start = await self._archive_start(partition, bounds.start, watermark)
            if not dry_run:
                archived = await self._archive(partition, archive_start, watermark)
                await self._pause("archived", partition)
                await self.store.record_cut(
                    LogCut(
                        partition=partition,
                        start=bounds.start,
                        end=watermark,
                        events=events_cut,
                        archive=self.archive.location if self.archive else None,
                        at=now,
                    )
                )
                await self.log.truncate_before(partition, watermark)
                cut = True
                COUNTS.compaction_events_cut += events_cut
                COUNTS.compaction_bytes_cut += scan.bytes_below(watermark) or 0
                await self._pause("cut", partition)
        return PartitionReport(
            partition=partition,
            start=bounds.start,
            end=bounds.end,
            folded=lowest,
            watermark=watermark,
            held_by=plan.held_by,
            events_cut=events_cut,
            archived=archived,
            archive_start=archive_start,
            runs_compacted=len(plan.truncations),
            retained=retained_count,
            cut=cut,
            bytes_cut=scan.bytes_below(watermark) if dry_run else None,
        )

    async def _known(self, run_id: str, partition: int, folded: int) -> None:
        """Check that a run met nowhere below the folded position is a run at all: it has a
        frontier row, a truncation point or a tombstone, or events not folded yet.

        Raises:
            NothingToResumeError: None of these: no run goes by that id (a mistyped one).
        """
        rows, points, tombstones = await asyncio.gather(
            self.frontiers.load([run_id]),
            self.store.truncations([run_id]),
            self.store.tombstones([run_id]),
        )
        if rows or points or tombstones:
            return
        if await self.log.read_records(partition, folded, run_id=run_id, limit=1):
            return
        raise NothingToResumeError(
            f"run {run_id!r}: no such run (no frontier row, never compacted, and no event of "
            f"it in partition {partition} of the log); nothing was compacted",
            run_id=run_id,
        )

    async def _truncate(self, partition: int, scan: PartitionScan, plan: PartitionPlan) -> int:
        """The logical step: copy out what the plan keeps and move the points, in one
        transaction; a tag pinned while this pass ran has its event copied and the step is
        tried again (the log still holds it: nothing is cut yet). Returns how many events
        were copied.

        Raises:
            OnwardError: Tags kept pinning events faster than this pass copied them;
                nothing was cut, the next pass tries again.
        """
        copies = await self._copies(partition, plan.retain)
        for _ in range(TRUNCATE_ATTEMPTS):
            missing = await self.store.truncate(
                plan.truncations, copies, checkpoints=self.max_checkpoints
            )
            if not missing:
                return len(copies)
            extra: list[Retain] = []
            for pin in missing:
                run = scan.runs.get(pin.run_id)
                offset = run.offset_of(pin.seq) if run is not None else None
                if offset is None:
                    raise LogTruncatedError(
                        f"run {pin.run_id!r}: tagged seq {pin.seq} is not in partition "
                        f"{partition} any more, so it cannot be retained; nothing was compacted",
                        run_id=pin.run_id,
                        partition=partition,
                    )
                extra.append(Retain(pin.run_id, pin.seq, offset, "tag"))
            copies = [*copies, *await self._copies(partition, extra)]
        raise OnwardError(
            f"partition {partition}: tags kept pinning events while a pass copied them "
            f"({TRUNCATE_ATTEMPTS} tries); nothing was cut, the next pass tries again"
        )

    async def _copies(self, partition: int, retain: list[Retain]) -> list[RetainedEvent]:
        """The events to retain, read back from the log where the scan saw them: one read per
        event when they are few, else the span they lie in, read once."""
        if not retain:
            return []
        wanted = {item.offset: item for item in retain}
        found: dict[int, StoredEvent] = {}
        # Copied as the log holds them: re-encoded, they would lose a newer writer's fields.
        with keeping_records():
            if len(wanted) <= FEW_COPIES:
                for item in retain:
                    records = await self.log.read_records(
                        partition, item.offset, item.offset + 1, run_id=item.run_id
                    )
                    for stored in records:
                        if isinstance(stored, StoredEvent):
                            found[stored.position.offset] = stored
            else:
                offset, end = min(wanted), max(wanted) + 1
                while offset < end:
                    records = await self.log.read_records(
                        partition, offset, end, limit=self.scan_batch
                    )
                    if not records:
                        break
                    for stored in records:
                        if stored.position.offset in wanted and isinstance(stored, StoredEvent):
                            found[stored.position.offset] = stored
                    offset = records[-1].position.offset + 1
        copies: list[RetainedEvent] = []
        for offset, item in wanted.items():
            record = found.get(offset)
            if record is None or record.event.seq != item.seq or record.event.run_id != item.run_id:
                raise LogTruncatedError(
                    f"run {item.run_id!r}: seq {item.seq} is not at offset {offset} of "
                    f"partition {partition} any more; nothing was compacted",
                    run_id=item.run_id,
                    partition=partition,
                    offset=offset,
                )
            copies.append(RetainedEvent.of(record, item.kept_as))
        return copies

    async def _archive_start(self, partition: int, start: int, watermark: int) -> int | None:
        """Where archiving must begin: past the ranges the archive holds from ``start`` on
        without a gap (a rerun's own work). A range beyond a gap (another log's, a topic
        recreated since) archived nothing below it: skipped over, that part would be cut
        unarchived."""
        if self.archive is None:
            return None
        begin = start
        for entry in await self.archive.ranges(partition):  # by start
            if entry.start <= begin < entry.end:
                await self._archived_here(entry, begin, watermark)
                begin = entry.end
        return begin if begin < watermark else None

    async def _archived_here(self, entry: ArchivedRange, begin: int, watermark: int) -> None:
        """Check that an archived range reaching past ``begin`` holds this log's records
        there (a rerun's own work), not another log's at the same offsets (one recreated
        since, a database started afresh): taken as this log's, the log would be cut
        unarchived, and replay would read the other log's records in its place.

        Raises:
            ArchiveError: The first record both hold from ``begin`` on differs; nothing is cut.
        """
        assert self.archive is not None  # only asked with an archive
        upto = min(entry.end, watermark)
        logged = await self.log.read_records(entry.partition, begin, upto, limit=1)
        if not logged:
            return
        (first,) = logged
        offset = first.position.offset
        archived = await self.archive.read(entry.partition, offset, offset + 1)
        held = archived[0] if archived else None
        if (
            isinstance(held, StoredEvent)
            and isinstance(first, StoredEvent)
            and held.event == first.event
        ):
            return
        raise ArchiveError(
            f"archive {self.archive.location}: partition {entry.partition} [{entry.start}, "
            f"{entry.end}) does not hold the log's record at offset {offset}: the archive is "
            "another log's (one recreated since?); nothing was cut. Point --archive at this "
            "log's archive, or a new directory"
        )

    async def _archive(self, partition: int, begin: int | None, watermark: int) -> int:
        """Write ``[begin, watermark)`` to the archive, in files of `ARCHIVE_FILE_EVENTS`."""
        if self.archive is None or begin is None:
            return 0
        written = 0
        while begin < watermark:
            # Archived as the log holds them: re-encoded, they would lose a newer writer's
            # fields, and the archive would no longer be the history audit replays.
            with keeping_records():
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


def _run_of(record: LogRecord) -> str | None:
    return record.event.run_id if isinstance(record, StoredEvent) else record.run_id


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
