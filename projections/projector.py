"""Folding batches of the log into a `FrontierStore`, from any `EventLog`.

:class:`FrontierProjection` is the core every projector shares: given a batch of stored events
per partition, it loads the touched runs' frontiers once, folds in memory, and writes each
touched run once, together with the partitions' next offsets, in one store transaction.

:class:`LogProjector` drives it by reading partitions of any `EventLog` (SQLite, memory, or
Kafka for rebuilds); :class:`ProjectingEventLog` is the embedded mode, folding right after each
append. The Kafka consumer-group projector lives in :mod:`onward.projections.kafka`.

Poison records: a record that cannot be decoded (or is in a newer format, or of an unknown
kind) never stops a partition. :class:`FrontierProjection` folds the run's events before it,
sets the run aside with a `QuarantineEntry` stored in the same transaction as the positions
that move past the record, marks the run's row, and skips (and counts) the run's later events
while every other run is folded on. A person releases the run (``onward quarantine release``);
the projection's next pass folds it again from its first offset up to where the partition is
folded, and clears the entries, or, if the record is still unreadable, holds it again once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from onward.errors import InvalidInputError
from onward.eventlog.base import (
    EventLog,
    LogRecord,
    PartitionBounds,
    StoredEvent,
    UnreadableRecord,
)

from .base import (
    DEFAULT_MAX_BYTES,
    BuildSwitched,
    FrontierStore,
    QuarantineEntry,
    Snapshot,
    StoredFrontier,
)
from .frontier import Frontier, FrontierDraft, ToolCallRow, fold_into
from .transcript import TranscriptRow

log = logging.getLogger("onward.projector")

DEFAULT_CONSUMER = "frontiers"
_YIELD_EVERY_RUNS = 500


@dataclass(slots=True)
class ProjectorStats:
    """Counters a projector exposes."""

    batches: int = 0
    events: int = 0
    rows_written: int = 0
    refused_events: int = 0
    snapshots_refused: int = 0
    refolded_from_log: int = 0
    quarantined: int = 0
    """Unreadable records set aside (each logged once, in one line)."""
    quarantine_skipped: int = 0
    """Records of runs set aside, skipped until a person releases the run."""
    released: int = 0
    """Released runs folded again from the log."""


class ProjectionSink(Protocol):
    """What a projector folds into: stored positions, and an atomic fold-and-advance."""

    async def positions(self) -> dict[int, int]:
        """The next offset per partition stored so far."""
        ...

    async def apply(
        self,
        records: Mapping[int, Sequence[LogRecord]],
        next_offsets: Mapping[int, int],
    ) -> None:
        """Fold a batch; its rows and the partitions' next offsets are stored together,
        atomically, now or at a later :meth:`flush`. An unreadable record never stops it.

        Raises:
            BuildSwitched: The sink's active build changed; nothing folded since the last
                store was kept, and the caller seeks to :meth:`positions`.
        """
        ...

    async def flush(self) -> None:
        """Store whatever was folded and not stored yet.

        Raises:
            BuildSwitched: As for :meth:`apply`.
        """
        ...

    def forget(self, partitions: Collection[int]) -> None:
        """Drop anything cached about runs of these partitions (they were revoked)."""
        ...


class FrontierProjection:
    """Folds batches into a store: one load and one write per stored batch, whatever its size.

    A projector that keeps up stores every batch it folds. One that folds a backlog can fold
    several batches into the frontiers it holds in memory and store them together: each run is
    then written once per store, not once per batch, which is most of what a store costs.
    ``flush_events`` and ``flush_interval`` bound how much is folded and not yet stored; until
    it is stored it is not lost, only folded again from the stored positions after a crash.

    Args:
        store: Where frontiers, call rows and positions go.
        log: Read only to refold a run whose last snapshot was refused for size.
        consumer: The name positions are stored under.
        max_bytes: The snapshot cap.
        cache_runs: How many runs' frontiers to keep in memory between batches, so a run
            touched again is not loaded again. Correct while this projection is the only writer
            of its partitions: a rebalance drops the revoked partitions' entries (`forget`).
            Also the most runs folded and not yet stored.
        flush_events: Store once this many events are folded and not stored; 0 stores every
            batch.
        flush_interval: Store at least this often, in seconds, while batches keep coming; 0
            stores every batch.
        write_behind: Let a store that came due in :meth:`apply` finish in the background
            while the next batches are folded, instead of :meth:`apply` waiting for it. A
            store that fails is raised by the next :meth:`apply` or :meth:`flush`, and then
            everything folded and not stored is dropped as after any failed store.
            :meth:`flush` always waits. For a projector working through a backlog, whose
            process would otherwise sit idle while PostgreSQL commits.
        release_poll: How often, in seconds, to look for runs a person released from
            quarantine; 0 looks on every batch and every flush.
        every_partition: This projection alone folds every partition of the log (embedded
            mode): a released run is folded again up to the stored position even in a
            partition it has not folded since it started. A Kafka projector shares partitions
            with its group, so it folds a released run once it folds its partition again.
    """

    def __init__(
        self,
        store: FrontierStore,
        log: EventLog,
        *,
        consumer: str = DEFAULT_CONSUMER,
        max_bytes: int = DEFAULT_MAX_BYTES,
        cache_runs: int = 20_000,
        flush_events: int = 0,
        flush_interval: float = 0.0,
        write_behind: bool = False,
        release_poll: float = 1.0,
        every_partition: bool = False,
    ) -> None:
        if cache_runs < 1:
            raise InvalidInputError(f"cache_runs must be at least 1, got {cache_runs}")
        if flush_events < 0 or flush_interval < 0:
            raise InvalidInputError(
                f"flush_events and flush_interval must not be negative, got {flush_events} "
                f"and {flush_interval}"
            )
        self.store = store
        self.log = log
        self.consumer = consumer
        self.max_bytes = max_bytes
        self.stats = ProjectorStats()
        self._cache: OrderedDict[str, FrontierDraft] = OrderedDict()
        self._cache_runs = cache_runs
        self._flush_events = flush_events
        self._flush_interval = flush_interval
        self._dirty: dict[str, FrontierDraft] = {}
        self._calls: dict[tuple[str, str], ToolCallRow] = {}
        self._said: list[TranscriptRow] = []
        self._positions: dict[int, int] = {}
        self._pending_events = 0
        self._pending_since = 0.0
        self._write_behind = write_behind
        self._writing: asyncio.Task[int] | None = None
        self._writing_events = 0
        self._writing_runs: set[str] = set()
        self._lock = asyncio.Lock()
        # Quarantine: runs set aside (each has a cache entry), entries and releases not yet
        # stored, how far each partition is folded, and when releases were last looked for.
        self._held: dict[str, str] = {}
        self._quarantine: list[QuarantineEntry] = []
        self._cleared: set[str] = set()
        self._folded_to: dict[int, int] = {}
        self._release_poll = release_poll
        self._releases_checked = -float("inf")
        self._every_partition = every_partition

    @property
    def pending_events(self) -> int:
        """Events folded and not stored yet, counting a store still being written."""
        return self._pending_events + self._writing_events

    @property
    def held(self) -> dict[str, str]:
        """Runs this projection holds in quarantine, with why (those it has met since start)."""
        return dict(self._held)

    async def positions(self) -> dict[int, int]:
        """The next offset per partition this projection has stored."""
        stored = await self.store.positions(self.consumer)
        if self._every_partition:
            for partition, offset in stored.items():
                self._folded_to.setdefault(partition, offset)
        return stored

    async def apply(
        self,
        records: Mapping[int, Sequence[LogRecord]],
        next_offsets: Mapping[int, int],
    ) -> None:
        """Fold one batch; store it, with everything folded before it, if a store is due."""
        async with self._lock:
            if self._writing is not None and self._writing.done():
                await self._written()  # a failed write-behind is raised before folding on
            try:
                await self._refold_released()
                await self._fold(records, next_offsets)
            except BaseException:
                self._drop_unstored()
                raise
            if self._due():
                await self._store(wait=not self._write_behind)

    async def flush(self) -> None:
        """Store whatever is folded and not stored yet, and wait until it is stored."""
        async with self._lock:
            try:
                await self._refold_released()
            except BaseException:
                self._drop_unstored()
                raise
            if self._positions or self._dirty or self._quarantine or self._cleared:
                await self._store(wait=True)
            else:
                await self._written()

    def _due(self) -> bool:
        return (
            self._pending_events >= self._flush_events
            or time.monotonic() - self._pending_since >= self._flush_interval
            or len(self._dirty) >= self._cache_runs
        )

    async def _fold(
        self, records: Mapping[int, Sequence[LogRecord]], next_offsets: Mapping[int, int]
    ) -> None:
        by_run, poisoned, count = self._by_run(records)
        cache = self._cache
        missing = [r for r in by_run if r not in cache]
        if not self._writing_runs.isdisjoint(missing):
            # A run evicted from the cache is in the store being written: load it after.
            await self._written()
        current = await self.store.load(missing) if missing else {}
        held = self._held
        for folded, (run_id, items) in enumerate(by_run.items(), 1):
            if folded % _YIELD_EVERY_RUNS == 0 and self._writing is not None:
                # A store is being written: let it take its turns, or its round trips wait
                # behind the whole batch's fold and the next store comes due before it lands.
                await asyncio.sleep(0)
            draft = cache.get(run_id)
            if draft is None:
                draft = cache[run_id] = await self._draft(run_id, items[0], current.get(run_id))
            else:
                cache.move_to_end(run_id)
            if run_id in held:
                self.stats.quarantine_skipped += len(items)
                continue
            self._fold_run(draft, items, readable=run_id not in poisoned)
        if not self._positions:
            self._pending_since = time.monotonic()
        self._positions.update(next_offsets)
        self._folded_to.update(next_offsets)
        self._pending_events += count
        self.stats.batches += 1
        self.stats.events += count

    def _by_run(
        self, records: Mapping[int, Sequence[LogRecord]]
    ) -> tuple[dict[str, list[LogRecord]], set[str], int]:
        """A batch's records by run, the runs with an unreadable record, and how many records
        there are."""
        by_run: defaultdict[str, list[LogRecord]] = defaultdict(list)
        poisoned: set[str] = set()
        count = 0
        for items in records.values():
            count += len(items)
            for item in items:
                if isinstance(item, StoredEvent):
                    by_run[item.event.run_id].append(item)
                elif item.run_id is not None:
                    by_run[item.run_id].append(item)
                    poisoned.add(item.run_id)
                else:
                    self._hold(None, item)  # filed under no run: nothing to set aside
        return by_run, poisoned, count

    async def _draft(
        self, run_id: str, first: LogRecord, row: StoredFrontier | None
    ) -> FrontierDraft:
        """The draft to fold a run on from, given its stored row (a held run stays held)."""
        if row is None:
            return FrontierDraft.of(Frontier.empty(run_id, _tenant_of(first)))
        if row.quarantined is not None:
            self._held[run_id] = row.quarantined  # until a release is folded: nothing to fold
            draft = FrontierDraft.of(Frontier.empty(run_id, row.summary.tenant))
            draft.partition = row.summary.partition
            return draft
        if row.frontier is None:
            return await self._refold(run_id, first)
        return FrontierDraft.of(row.frontier)

    def _fold_run(
        self, draft: FrontierDraft, items: Sequence[LogRecord], *, readable: bool = False
    ) -> None:
        """Fold one run's records into its draft; an unreadable one past what the draft has
        folded sets the run aside, and the records after it are skipped. ``readable`` says
        the caller knows every record is an event (the common case: nothing is checked)."""
        events: Sequence[StoredEvent]
        bad: UnreadableRecord | None = None
        if readable:
            events = items  # type: ignore[assignment]  # the caller checked: all events
        else:
            events = []
            for index, item in enumerate(items):
                if isinstance(item, StoredEvent):
                    events.append(item)
                elif item.position.offset > draft.through_offset:
                    bad = item
                    self.stats.quarantine_skipped += len(items) - index - 1
                    break
        refused_before = draft.refused
        through_before = draft.through_offset
        fold_into(draft, events, self._calls, self._said)
        if draft.through_offset != through_before:
            self._dirty[draft.run_id] = draft
            self.stats.refused_events += draft.refused - refused_before
        if bad is not None:
            self._hold(draft, bad)

    def _hold(self, draft: FrontierDraft | None, bad: UnreadableRecord) -> None:
        """Set a run aside because of ``bad``: an entry to store with the positions, and its
        row (written even if nothing of the run was folded yet) to carry the mark."""
        entry = QuarantineEntry(
            run_id=draft.run_id if draft is not None else None,
            tenant=bad.tenant if bad.tenant is not None else (draft.tenant if draft else None),
            partition=bad.position.partition,
            offset=bad.position.offset,
            kind=bad.kind,
            reason=bad.reason,
            quarantined_at=time.time_ns() // 1_000,
        )
        self._quarantine.append(entry)
        self.stats.quarantined += 1
        if draft is None:
            return
        self._held[draft.run_id] = entry.mark
        if draft.partition < 0:
            draft.partition = entry.partition
        self._dirty[draft.run_id] = draft

    async def _released_runs(self) -> dict[str, int]:
        """Released runs not folded again yet, in partitions this projection folds: their
        partitions."""
        runs: dict[str, int] = {}
        for entry in await self.store.quarantined(self.consumer, states={"released"}):
            run_id = entry.run_id
            if run_id is None or run_id in self._cleared:
                continue
            if entry.partition in self._folded_to:
                runs.setdefault(run_id, entry.partition)
        return runs

    async def _refold_released(self) -> None:
        """Fold again, from their first offset, the runs a person released: those in the
        partitions this projection folds, up to where it folded them."""
        now = time.monotonic()
        if now - self._releases_checked < self._release_poll or not self._folded_to:
            return
        self._releases_checked = now
        runs = await self._released_runs()
        if not self._writing_runs.isdisjoint(runs):
            # The store being written may clear some of them: look again once it has landed.
            await self._written()
            runs = await self._released_runs()
        if not runs:
            return
        rows = await self.store.load(list(runs))
        for run_id, partition in runs.items():
            row = rows.get(run_id)
            # Where the run's first event is, as far as it was folded before it was set aside.
            known = (row.set_aside or row.frontier) if row is not None else None
            start = known.first_offset if known is not None and known.first_offset >= 0 else None
            end = self._folded_to[partition]
            records = await self.log.read_records(partition, start, end, run_id=run_id)
            tenant = row.summary.tenant if row is not None else ""
            if not tenant and records:
                tenant = _tenant_of(records[0])
            self._held.pop(run_id, None)
            draft = self._cache[run_id] = FrontierDraft.of(Frontier.empty(run_id, tenant))
            self._fold_run(draft, records)
            self._dirty[run_id] = draft
            self._cleared.add(run_id)
            self.stats.released += 1
            log.info(
                "run %r released: folded again from offset %s to %d%s",
                run_id,
                start if start is not None else "the partition's start",
                end,
                "; still unreadable, held again" if run_id in self._held else "",
            )

    async def _store(self, *, wait: bool) -> None:
        """Store everything folded, once the store before has landed; with ``wait`` False the
        write is left running, and what is folded next is stored after it."""
        await self._written()
        snapshots: list[Snapshot] = []
        for run_id, draft in self._dirty.items():
            snapshot = Snapshot.of(draft.frozen(), max_bytes=self.max_bytes)
            if snapshot.payload is None:
                self.stats.snapshots_refused += 1
                log.warning("run %r: snapshot refused: %s", run_id, snapshot.error)
            snapshots.append(snapshot)
        write = self._write(
            self._positions,
            snapshots,
            list(self._calls.values()),
            quarantine=self._quarantine,
            cleared=self._cleared,
            said=self._said,
        )
        self._said = []
        self._writing = asyncio.ensure_future(write)
        self._writing_events = self._pending_events
        self._writing_runs = set(self._dirty)
        self._dirty.clear()
        self._calls.clear()
        self._positions = {}
        self._quarantine = []
        self._cleared = set()
        self._pending_events = 0
        cache = self._cache
        while len(cache) > self._cache_runs:
            evicted, _ = cache.popitem(last=False)
            self._held.pop(evicted, None)
        if wait:
            await self._written()

    async def _write(
        self,
        positions: dict[int, int],
        snapshots: list[Snapshot],
        calls: list[ToolCallRow],
        *,
        quarantine: list[QuarantineEntry],
        cleared: set[str],
        said: list[TranscriptRow],
    ) -> int:
        # Only what the batch has is passed on, so a store that predates an option still works
        # for batches without it.
        options: dict[str, Any] = {}
        if quarantine or cleared:
            options.update(quarantine=quarantine, cleared=cleared)
        if said:
            options["messages"] = said
        await self.store.write(self.consumer, positions, snapshots, calls, **options)
        for entry in quarantine:
            _say_quarantined(entry)
        return len(snapshots)

    async def _written(self) -> None:
        """Wait for the store being written, if any; if it failed, drop everything unstored
        (what was folded after it builds on it) and raise its error."""
        writing = self._writing
        if writing is None:
            return
        try:
            rows = await asyncio.shield(writing)
        except BaseException:
            if not writing.done():
                raise  # this caller was cancelled; the write carries on for the next one
            self._forget_write()
            self._drop_unstored()
            raise
        self._forget_write()
        self.stats.rows_written += rows

    def _forget_write(self) -> None:
        self._writing = None
        self._writing_events = 0
        self._writing_runs = set()

    def _drop_unstored(self) -> None:
        """Forget everything folded and not stored (a store still being written carries on):
        what is stored is all that is known now."""
        self._cache.clear()
        self._dirty.clear()
        self._calls.clear()
        self._said = []
        self._positions = {}
        self._pending_events = 0
        self._held.clear()
        self._quarantine = []
        self._cleared = set()
        self._folded_to.clear()

    def assigned(self, positions: Mapping[int, int]) -> None:
        """These partitions are this projection's now, folded up to these offsets (a Kafka
        projector sought to them): runs released from quarantine in them are folded again on
        the next pass, even before a record of the partition arrives."""
        for partition, offset in positions.items():
            self._folded_to.setdefault(partition, offset)

    def forget(self, partitions: Collection[int]) -> None:
        """Drop cached frontiers of runs in these partitions; another projector owns them now.

        Call :meth:`flush` first: what is folded and not stored is dropped with them.
        """
        gone = set(partitions)
        for run_id in [r for r, d in self._cache.items() if d.partition in gone]:
            del self._cache[run_id]
            self._dirty.pop(run_id, None)
            self._held.pop(run_id, None)
        for key in [k for k in self._calls if k[0] not in self._cache]:
            del self._calls[key]
        self._said = [m for m in self._said if m.run_id in self._cache]
        for partition in gone:
            self._positions.pop(partition, None)
            self._folded_to.pop(partition, None)

    async def _refold(self, run_id: str, first: LogRecord) -> FrontierDraft:
        """A run whose snapshot was refused: fold its history from the log up to ``first``
        (an unreadable record in it sets the run aside, as anywhere)."""
        self.stats.refolded_from_log += 1
        position = first.position
        history = await self.log.read_records(
            position.partition, None, position.offset, run_id=run_id
        )
        draft = FrontierDraft.of(Frontier.empty(run_id, _tenant_of(first)))
        self._fold_run(draft, history)
        return draft


def _say_quarantined(entry: QuarantineEntry) -> None:
    """Logged once the entry is stored, so the line never runs ahead of the store."""
    log.warning(
        "quarantined the record at partition %d offset %d (run %r, kind %s): %s; %s",
        entry.partition,
        entry.offset,
        entry.run_id,
        entry.kind or "unknown",
        entry.reason,
        "the run is set aside until `onward quarantine release` names it"
        if entry.run_id is not None
        else "it names no run",
    )


def _tenant_of(record: LogRecord) -> str:
    if isinstance(record, StoredEvent):
        return record.event.tenant
    return record.tenant or ""


class LogProjector:
    """Projects every partition of any `EventLog` by reading it, for embedded mode and rebuilds.

    Args:
        log: The log to read.
        projection: What to fold into.
        batch_size: Most records read per partition per pass; bounds memory.
    """

    def __init__(
        self, log: EventLog, projection: ProjectionSink, *, batch_size: int = 5_000
    ) -> None:
        self.log = log
        self.projection = projection
        self.batch_size = batch_size
        self._folded: dict[int, int] = {}
        self._stored_by_me: dict[int, int] = {}
        # One catch-up at a time: a process's runs append (and so catch up) concurrently, and
        # one that began while another was half done could not tell that one's unstored folds
        # from a position another process moved.
        self._catching_up = asyncio.Lock()

    async def _start(
        self, partition: int, stored: Mapping[int, int]
    ) -> tuple[int, PartitionBounds]:
        bounds = await self.log.bounds(partition)
        start = max(stored.get(partition, bounds.start), self._folded.get(partition, 0))
        return start, bounds

    async def step(self, partitions: Sequence[int] | None = None) -> int:
        """Fold one batch from each partition that has news; return how many events it read.

        The projection may keep what it folded unstored (see `FrontierProjection`); the next
        step reads on from what was folded, and :meth:`flush` stores it.
        """
        try:
            return await self._step(partitions)
        except BuildSwitched:
            self._folded.clear()
            return await self._step(partitions)  # positions are re-read: the new build's
        except BaseException:
            self._folded.clear()  # what was folded and not stored is gone with the error
            raise

    async def _step(self, partitions: Sequence[int] | None) -> int:
        stored = await self.projection.positions()
        # Another process folding the same file (embedded mode) moved a position this one did
        # not store: what this projector cached about that partition's runs is stale.
        moved = [
            p
            for p, mine in self._stored_by_me.items()
            if stored.get(p) != mine and p not in self._folded
        ]
        if moved:
            self.projection.forget(moved)
            for partition in moved:
                del self._stored_by_me[partition]
        records: dict[int, list[LogRecord]] = {}
        next_offsets: dict[int, int] = {}
        for partition in partitions if partitions is not None else range(self.log.partitions):
            start, bounds = await self._start(partition, stored)
            if start >= bounds.end:
                continue
            end = min(bounds.end, start + self.batch_size)
            records[partition] = await self.log.read_records(partition, start, end)
            next_offsets[partition] = end
        if not next_offsets:
            return 0
        await self.projection.apply(records, next_offsets)
        self._folded.update(next_offsets)
        return sum(len(e) for e in records.values())

    async def flush(self) -> None:
        """Store whatever the projection folded and has not stored yet."""
        try:
            await self.projection.flush()
            self._stored_by_me.update(self._folded)
        finally:
            self._folded.clear()

    async def catch_up(self, partitions: Sequence[int] | None = None) -> int:
        """Fold and store until every partition's position reaches its end as of now."""
        async with self._catching_up:
            total = 0
            while read := await self.step(partitions):
                total += read
            await self.flush()
            return total

    async def backlog(self) -> dict[int, int]:
        """Records not yet folded, per partition (folded ones may not be stored yet)."""
        stored = await self.projection.positions()
        backlog: dict[int, int] = {}
        for partition in range(self.log.partitions):
            start, bounds = await self._start(partition, stored)
            backlog[partition] = max(0, bounds.end - start)
        return backlog

    async def lag(self) -> dict[int, int]:
        """Records not yet stored, per partition."""
        stored = await self.projection.positions()
        lags: dict[int, int] = {}
        for partition in range(self.log.partitions):
            bounds = await self.log.bounds(partition)
            lags[partition] = max(0, bounds.end - stored.get(partition, bounds.start))
        return lags

    async def run(self, stop: asyncio.Event, *, poll_interval: float = 0.2) -> None:
        """Fold continuously until ``stop`` is set; what was folded is stored before it returns."""
        try:
            while not stop.is_set():
                if not await self.step():
                    await self.flush()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), poll_interval)
        finally:
            await self.flush()
