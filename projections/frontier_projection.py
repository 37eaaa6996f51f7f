"""Folding batches of the log into a `FrontierStore`, from any `EventLog`.

:class:`FrontierProjection` is the core every projector shares: given a batch of stored events
per partition, it loads the touched runs' frontiers once, folds in memory, and writes each
touched run once, together with the partitions' next offsets, in one store transaction.

`LogProjector` (:mod:`onward.projections.log_projector`) drives it by reading partitions of any
`EventLog` (SQLite, memory, or Kafka for rebuilds); the Kafka consumer-group projector lives in
:mod:`onward.projections.kafka`. A poison record sets its run aside
(:mod:`onward.projections.quarantine`) and never stops a partition.

A run garbage collection removed (a tombstone, and no row) is not folded from events that do
not start it: what is left of it in the log brings no row back (`FrontierProjection._collected`).
A start under its id past its end is a new run, folded afresh, whether the collected run's
frontier was cached or folded again from the archive (`FrontierProjection._fold_reused`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from onward.errors import EventDecodeError, InvalidInputError, LogTruncatedError
from onward.eventlog.base import (
    EventLog,
    LogRecord,
    StoredEvent,
    UnreadableRecord,
    partition_for,
)

from .base import (
    DEFAULT_CONSUMER,
    DEFAULT_MAX_BYTES,
    FrontierStore,
    QuarantineEntry,
    Snapshot,
    StoredFrontier,
)
from .compaction.base import CompactionStore
from .compaction.history import read_whole_records
from .compaction.sqlite import embedded_compaction
from .frontier import TERMINAL_STATUSES, Frontier, FrontierDraft, ToolCallRow, fold_into
from .quarantine import Quarantine, say_quarantined
from .transcript import TranscriptRow

log = logging.getLogger("onward.projector")

_YIELD_EVERY_RUNS = 500

DEFAULT_CACHE_BYTES = 40 * 1024 * 1024
"""How many bytes of frontiers a projection keeps in memory by default (40 MiB: some 20,000 to
35,000 runs, each counted as its encoded size and a little, as many as the 20,000 runs it kept
before it counted bytes)."""

_UNSIZED_DRAFT_BYTES = 1024
"""What a cached frontier is counted as until its first store encodes it (a run's encoded
frontier is most often well under a kilobyte)."""

_KEPT_DRAFT_BYTES = 256
"""What keeping a frontier costs besides its encoded size: its objects take a little more than
their JSON (numbers and the struct itself), and its entries in the cache."""


class _DraftCache:
    """The frontiers a projection keeps between batches, least recently folded first, with the
    bytes each is counted as: its encoded size as last stored and `_KEPT_DRAFT_BYTES`, near
    what its objects and entries take in memory."""

    __slots__ = ("_drafts", "_sizes", "bytes")

    def __init__(self) -> None:
        self._drafts: OrderedDict[str, FrontierDraft] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._drafts)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._drafts

    def get(self, run_id: str) -> FrontierDraft | None:
        """The run's draft, now the most recently used; ``None`` if it is not kept."""
        draft = self._drafts.get(run_id)
        if draft is not None:
            self._drafts.move_to_end(run_id)
        return draft

    def put(self, run_id: str, draft: FrontierDraft) -> FrontierDraft:
        """Keep ``draft`` as the run's, counted as an unsized one until it is stored."""
        self.pop(run_id)
        self._drafts[run_id] = draft
        size = self._sizes[run_id] = _UNSIZED_DRAFT_BYTES + _KEPT_DRAFT_BYTES
        self.bytes += size
        return draft

    def sized(self, run_id: str, size: int) -> None:
        """The run's frontier was encoded in ``size`` bytes: count it as that."""
        before = self._sizes.get(run_id)
        if before is not None:
            size += _KEPT_DRAFT_BYTES
            self._sizes[run_id] = size
            self.bytes += size - before

    def pop(self, run_id: str) -> None:
        if self._drafts.pop(run_id, None) is not None:
            self.bytes -= self._sizes.pop(run_id)

    def items(self) -> list[tuple[str, FrontierDraft]]:
        return list(self._drafts.items())

    def clear(self) -> None:
        self._drafts.clear()
        self._sizes.clear()
        self.bytes = 0

    def evict(self, runs: int | None, size: int, keep: Collection[str] = ()) -> list[str]:
        """Drop the least recently used drafts, except those in ``keep``, until at most
        ``runs`` (if set) are kept, counted as at most ``size`` bytes; the runs dropped."""
        drafts, sizes = self._drafts, self._sizes
        over_runs = len(drafts) - runs if runs is not None else 0
        over_bytes = self.bytes - size
        evicted: list[str] = []
        if over_runs <= 0 and over_bytes <= 0:
            return evicted
        for run_id in drafts:  # the least recently used first
            if over_runs <= 0 and over_bytes <= 0:
                break
            if run_id in keep:
                continue
            evicted.append(run_id)
            over_runs -= 1
            over_bytes -= sizes[run_id]
        for run_id in evicted:
            self.pop(run_id)
        return evicted


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
            Also the most runs folded and not yet stored. ``None`` (the default): as many as
            ``cache_bytes`` holds.
        cache_bytes: The memory budget of those frontiers, in bytes, each counted as its
            encoded size and a little (a run not stored yet as a kilobyte and a little, about
            what its objects take): the least recently folded are dropped past it (those
            folded and not stored once they are), and a store comes due once the runs folded
            and not stored take all of it. Memory then follows the budget, not the number of
            runs.
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
            quarantine; 0 looks on every batch, and on a flush when no batch looked since the
            flush before (a look a moment before the store would find the same).
        every_partition: This projection alone folds every partition of the log (embedded
            mode): a released run is folded again up to the stored position even in a
            partition it has not folded since it started. A Kafka projector shares partitions
            with its group, so it folds a released run once it folds its partition again.
        compaction: Where compaction retained the events of runs it cut below, so a run
            folded again (a refused snapshot, a release from quarantine) is folded from its
            first event even once its partition was cut. An embedded SQLite log brings its
            own.
    """

    def __init__(
        self,
        store: FrontierStore,
        log: EventLog,
        *,
        consumer: str = DEFAULT_CONSUMER,
        max_bytes: int = DEFAULT_MAX_BYTES,
        cache_runs: int | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        flush_events: int = 0,
        flush_interval: float = 0.0,
        write_behind: bool = False,
        release_poll: float = 1.0,
        every_partition: bool = False,
        compaction: CompactionStore | None = None,
    ) -> None:
        if cache_runs is not None and (type(cache_runs) is not int or cache_runs < 1):
            raise InvalidInputError(
                f"cache_runs must be a whole number of at least 1, or None, got {cache_runs!r}"
            )
        if type(cache_bytes) is not int or cache_bytes < 1:
            raise InvalidInputError(
                f"cache_bytes must be a whole number of bytes, at least 1, got {cache_bytes!r}"
            )
        if flush_events < 0 or flush_interval < 0:
            raise InvalidInputError(
                f"flush_events and flush_interval must not be negative, got {flush_events} "
                f"and {flush_interval}"
            )
        self.store = store
        self.log = log
        self.compaction = compaction or embedded_compaction(log)
        self.consumer = consumer
        self.max_bytes = max_bytes
        self.stats = ProjectorStats()
        self.over_cap: set[str] | None = None
        """While a set (the inline checkpointer's): the runs whose latest snapshot stored here
        was refused for size, one id each until a snapshot of the run fits again."""
        self._cache = _DraftCache()
        self._cache_runs = cache_runs
        self._cache_bytes = cache_bytes
        self._flush_events = flush_events
        self._flush_interval = flush_interval
        self._dirty: dict[str, FrontierDraft] = {}
        self._calls: dict[tuple[str, str], ToolCallRow] = {}
        self._said: list[TranscriptRow] = []
        # ``(tenant, run_id, last_seq)`` of collected runs whose ids began again since the last
        # store: the old run's call and transcript rows a store before may hold go with the next.
        self._restarted: set[tuple[str, str, int]] = set()
        self._positions: dict[int, int] = {}
        self._pending_events = 0
        self._pending_since = 0.0
        self._write_behind = write_behind
        self._writing: asyncio.Task[int] | None = None
        self._writing_events = 0
        self._writing_runs: set[str] = set()
        self._lock = asyncio.Lock()
        self.quarantine = Quarantine(store, consumer, release_poll=release_poll)
        self._looked_since_flush = False
        self._every_partition = every_partition

    @property
    def pending_events(self) -> int:
        """Events folded and not stored yet, counting a store still being written."""
        return self._pending_events + self._writing_events

    @property
    def held(self) -> dict[str, str]:
        """Runs this projection holds in quarantine, with why (those it has met since start)."""
        return dict(self.quarantine.held)

    async def positions(self) -> dict[int, int]:
        """The next offset per partition this projection has stored."""
        stored = await self.store.positions(self.consumer)
        if self._every_partition:
            # Another process may have stored a partition further than this one folded it: a
            # released run is folded again up to there, past the events skipped while it was
            # set aside (the partition's runs cached here, if any, are forgotten before a fold
            # reads on from the positions: `LogProjector`).
            folded_to = self.quarantine.folded_to
            for partition, offset in stored.items():
                if offset > folded_to.get(partition, -1):
                    folded_to[partition] = offset
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
            else:
                self._evict()

    async def flush(self) -> None:
        """Store whatever is folded and not stored yet, and wait until it is stored."""
        async with self._lock:
            looked, self._looked_since_flush = self._looked_since_flush, False
            try:
                if not looked:
                    await self._refold_released()
                    self._looked_since_flush = False
            except BaseException:
                self._drop_unstored()
                raise
            if self._positions or self._dirty or self.quarantine.unstored:
                await self._store(wait=True)
            else:
                await self._written()

    def _due(self) -> bool:
        dirty = len(self._dirty)
        return (
            self._pending_events >= self._flush_events
            or time.monotonic() - self._pending_since >= self._flush_interval
            or (self._cache_runs is not None and dirty >= self._cache_runs)
            # The runs folded and not stored, counted at the cache's mean size, fill the budget.
            or (dirty > 0 and dirty * self._cache.bytes >= self._cache_bytes * len(self._cache))
        )

    def _evict(self) -> None:
        """Drop the least recently folded frontiers past the budget; those folded and not
        stored are kept until they are."""
        for evicted in self._cache.evict(self._cache_runs, self._cache_bytes, keep=self._dirty):
            self.quarantine.held.pop(evicted, None)

    async def _fold(
        self, records: Mapping[int, Sequence[LogRecord]], next_offsets: Mapping[int, int]
    ) -> None:
        by_run, poisoned, started, count = self._by_run(records)
        cache = self._cache
        held = self.quarantine.held
        # A run held as its stored row says is read again too: another projector may have
        # folded it again since (a release), and its records are then folded, not skipped.
        missing = [r for r in by_run if r not in cache or (r in held and r not in self._dirty)]
        # A run that ended, cached and stored, is read again too: garbage collection may have
        # removed its row since (`_forget_collected`). Few ended runs have events to fold.
        ended = [
            r for r in by_run if r not in self._dirty and r not in held and _ended(cache.get(r))
        ]
        if not self._writing_runs.isdisjoint(missing) or not self._writing_runs.isdisjoint(ended):
            # A run evicted from the cache is in the store being written: load it after.
            await self._written()
        loading = [*missing, *ended]
        current = await self.store.load(loading) if loading else {}
        missing += await self._forget_collected(ended, current)
        for run_id in await self._collected(by_run, missing, current):
            del by_run[run_id]
        reused = await self._reused(by_run, started, current)
        for folded, (run_id, items) in enumerate(by_run.items(), 1):
            if folded % _YIELD_EVERY_RUNS == 0 and self._writing is not None:
                # A store is being written: let it take its turns, or its round trips wait
                # behind the whole batch's fold and the next store comes due before it lands.
                await asyncio.sleep(0)
            draft = cache.get(run_id)
            row = current.get(run_id)
            if run_id in held and row is not None and row.quarantined is None:
                del held[run_id]  # folded again elsewhere: on from its row
                draft = None
            if draft is None:
                draft = cache.put(run_id, await self._draft(run_id, items[0], row))
            if run_id in held:
                self.stats.quarantine_skipped += len(items)
                continue
            if run_id in reused:
                stored = row.summary.through_offset if row is not None else -1
                self._fold_reused(draft, items, stored, readable=run_id not in poisoned)
            else:
                self._fold_run(draft, items, readable=run_id not in poisoned)
        if not self._positions:
            self._pending_since = time.monotonic()
        self._positions.update(next_offsets)
        self.quarantine.folded_to.update(next_offsets)
        self._pending_events += count
        self.stats.batches += 1
        self.stats.events += count

    async def _collected(
        self,
        by_run: Mapping[str, Sequence[LogRecord]],
        missing: Sequence[str],
        current: Mapping[str, StoredFrontier],
    ) -> set[str]:
        """The runs of a batch garbage collection removed, whose records are not folded: no
        row, a tombstone, and no start (the batch does not begin at seq 1). Their records are
        what is left of the collected run in the log (a late append, a fold from before where
        this projection stood); folded, they would write a row of nothing but refused events,
        never finished, that no collection removes. A run that begins again at seq 1 is
        folded: a new run under the same id, or the collected one folded whole again (a
        rebuild), finished and collected again in its time; so is one whose first record
        cannot be read but says it is at seq 1 (a newer Onward's start): set aside until a
        release, not dropped with every later event of the run, unsaid."""
        unstarted = [
            run_id
            for run_id in missing
            if run_id not in current and not _starts_or_says_so(by_run[run_id][0])
        ]
        if not unstarted or self.compaction is None:
            return set()
        return await self.compaction.tombstones(unstarted)

    async def _forget_collected(
        self, ended: Sequence[str], current: Mapping[str, StoredFrontier]
    ) -> list[str]:
        """Drop the cached frontiers of the ``ended`` runs garbage collection removed (no row,
        a tombstone), and return those runs: folded on from the cached frontier, a late event
        of the collected run would write its row back, and a new run under its id would be
        folded into the collected one. They are folded as runs without a row
        (`_collected`)."""
        gone = [run_id for run_id in ended if run_id not in current]
        if not gone or self.compaction is None:
            return []
        collected = await self.compaction.tombstones(gone)
        for run_id in collected:
            self._cache.pop(run_id)
            self.quarantine.held.pop(run_id, None)
        return [run_id for run_id in gone if run_id in collected]

    async def _reused(
        self,
        by_run: Mapping[str, Sequence[LogRecord]],
        started: Collection[str],
        current: Mapping[str, StoredFrontier],
    ) -> set[str]:
        """The runs of a batch that may begin again under their id: a start (seq 1) after
        something of the run was folded (earlier in the batch, or before it), and a tombstone.
        A projector that folded the collected run before (its frontier cached), or a fold from
        before the collection (a rebuild read with the archive), meets a new run under its id
        from seq 1 (`_fold_reused`). ``started``: the runs with an event at seq 1."""
        cache = self._cache
        again = [
            run_id
            for run_id in started
            if run_id in by_run
            and (
                run_id in cache
                or run_id in current
                or any(_starts(item) for item in by_run[run_id][1:])
            )
        ]
        if not again or self.compaction is None:
            return set()
        return await self.compaction.tombstones(again)

    def _fold_reused(
        self, draft: FrontierDraft, items: Sequence[LogRecord], stored: int, *, readable: bool
    ) -> FrontierDraft:
        """Fold the records of a run that has a tombstone: a start past the end of the run
        folded so far is a new run under the id (the collected one was removed, its rows with
        it), folded into a fresh draft, as a live projector folded it, and the collected run's
        call and transcript rows are dropped: those not stored yet here, and those a store
        may hold by the next store, unless the stored row (folded through offset ``stored``)
        is of a later run already (another writer folded the new run: the old run's rows
        went with the collection). A start while the run folded so far has not ended is
        refused as a duplicate, as anywhere. Returns the draft folded last (the latest run's)."""
        held = self.quarantine.held
        begun = 0
        for index, item in enumerate(items):
            if not _starts(item):
                continue
            if index > begun:
                self._fold_run(draft, items[begun:index], readable=readable)
                begun = index
                if draft.run_id in held:
                    return draft
            ended = draft.last_seq > 0 and draft.status in TERMINAL_STATUSES
            if ended and item.position.offset > draft.through_offset:
                draft = self._begun_again(draft, item, stored_old=stored <= draft.through_offset)
        self._fold_run(draft, items[begun:], readable=readable)
        return draft

    def _begun_again(
        self, draft: FrontierDraft, start: LogRecord, *, stored_old: bool
    ) -> FrontierDraft:
        """A fresh draft for a new run under ``draft``'s id, starting at ``start``; with
        ``stored_old``, the store may hold rows of ``draft``'s run, deleted by the next store."""
        run_id = draft.run_id
        for key in [k for k in self._calls if k[0] == run_id]:
            del self._calls[key]
        self._said = [m for m in self._said if m.run_id != run_id]
        if stored_old:
            self._restarted.add((draft.tenant, run_id, draft.last_seq))
        fresh = FrontierDraft.of(Frontier.empty(run_id, _tenant_of(start)))
        fresh.partition = start.position.partition
        self._dirty[run_id] = fresh
        return self._cache.put(run_id, fresh)

    def _by_run(
        self, records: Mapping[int, Sequence[LogRecord]]
    ) -> tuple[dict[str, list[LogRecord]], set[str], set[str], int]:
        """A batch's records by run, the runs with an unreadable record, those with an event
        at seq 1, and how many records there are."""
        by_run: defaultdict[str, list[LogRecord]] = defaultdict(list)
        poisoned: set[str] = set()
        started: set[str] = set()
        count = 0
        partitions = self.log.partitions
        for items in records.values():
            count += len(items)
            # Each run's partition, asked once per batch: murmur2 is pure Python, and a batch
            # holds many records of a run.
            homes: dict[str, int] = {}
            for item in items:
                run_id = item.event.run_id if isinstance(item, StoredEvent) else item.run_id
                if run_id is not None:
                    home = homes.get(run_id)
                    if home is None:
                        home = homes[run_id] = partition_for(run_id, partitions)
                    if home != item.position.partition:
                        self._hold(None, _astray(item, run_id, partitions))
                        continue
                if isinstance(item, StoredEvent):
                    event = item.event
                    by_run[event.run_id].append(item)
                    if event.seq == 1:
                        started.add(event.run_id)
                elif item.run_id is not None:
                    by_run[item.run_id].append(item)
                    poisoned.add(item.run_id)
                else:
                    self._hold(None, item)  # filed under no run: nothing to set aside
        return by_run, poisoned, started, count

    async def _draft(
        self, run_id: str, first: LogRecord, row: StoredFrontier | None
    ) -> FrontierDraft:
        """The draft to fold a run on from, given its stored row (a held run stays held)."""
        if row is None:
            return FrontierDraft.of(Frontier.empty(run_id, _tenant_of(first)))
        if row.quarantined is not None:
            # Held until a release is folded: nothing to fold.
            self.quarantine.held[run_id] = row.quarantined
            draft = FrontierDraft.of(Frontier.empty(run_id, row.summary.tenant))
            draft.partition = row.summary.partition
            return draft
        if row.frontier is None:
            return await self._refold(run_id, first, row)
        return FrontierDraft.of(row.frontier)

    def _fold_run(
        self, draft: FrontierDraft, items: Sequence[LogRecord], *, readable: bool = False
    ) -> None:
        """Fold one run's records into its draft; an unreadable one past what the draft has
        folded sets the run aside, and the records after it are skipped. ``readable`` says
        the caller knows every record is an event (the common case: nothing is checked)."""
        events: Sequence[StoredEvent]
        bad: UnreadableRecord | None = None
        if items and items[0].position.offset <= draft.through_offset:
            # A kept frontier stored ahead of a row write that then failed: what it holds
            # already is not folded twice.
            items = [i for i in items if i.position.offset > draft.through_offset]
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
        if draft is None:
            self.quarantine.set_aside(None, None, bad)  # filed under no run: nothing to hold
            self.stats.quarantined += 1
            return
        self.quarantine.set_aside(draft.run_id, draft.tenant, bad)
        self.stats.quarantined += 1
        if draft.partition < 0:
            draft.partition = bad.position.partition
        self._dirty[draft.run_id] = draft

    async def _refold_released(self) -> None:
        """Fold again, from their first offset, the runs a person released: those in the
        partitions this projection folds, up to where it folded them."""
        quarantine = self.quarantine
        if not quarantine.release_due():
            return
        self._looked_since_flush = True
        runs = await quarantine.released()
        if not self._writing_runs.isdisjoint(runs):
            # The store being written may clear some of them: look again once it has landed.
            await self._written()
            runs = await quarantine.released()
        if not runs:
            return
        rows = await self.store.load(list(runs))
        kept = await self._kept_uncapped(rows)
        # A run under a collected id may be read with the collected run before it (a log read
        # with the archive): it is folded as `_fold` folds it, the latest run alone.
        collected = await self.compaction.tombstones(list(runs)) if self.compaction else set()
        for run_id, partition in runs.items():
            row = rows.get(run_id)
            # Where the run's first event is, as far as it was folded before it was set aside.
            known = (row.set_aside or row.frontier) if row is not None else None
            known = known or kept.get(run_id)
            start = known.first_offset if known is not None and known.first_offset >= 0 else None
            end = quarantine.folded_to[partition]
            tenant = row.summary.tenant if row is not None else ""
            base = Frontier.empty(run_id, tenant)
            try:
                records = await read_whole_records(
                    self.log, self.compaction, run_id, start=start, end=end
                )
            except LogTruncatedError:
                if known is None:
                    raise
                # Compaction cut the run's first events and kept only part of them: fold on
                # from what was folded before it was set aside (the same fold, read less).
                base, start = known, known.through_offset + 1
                records = await read_whole_records(
                    self.log, self.compaction, run_id, start=start, end=end, have_seq=known.last_seq
                )
            if not tenant and records:
                tenant = _tenant_of(records[0])
                base = Frontier.empty(run_id, tenant)
            quarantine.held.pop(run_id, None)
            draft = self._cache.put(run_id, FrontierDraft.of(base))
            if run_id in collected:
                stored = row.summary.through_offset if row is not None else -1
                draft = self._fold_reused(draft, records, stored, readable=False)
            else:
                self._fold_run(draft, records)
            self._dirty[run_id] = draft
            quarantine.cleared.add(run_id)
            self.stats.released += 1
            log.info(
                "run %r released: folded again from offset %s to %d%s",
                run_id,
                start if start is not None else "the partition's start",
                end,
                "; still unreadable, held again" if run_id in quarantine.held else "",
            )

    async def _kept_uncapped(self, rows: Mapping[str, StoredFrontier]) -> dict[str, Frontier]:
        """The frontiers kept uncapped in the compaction store of those ``rows`` that hold
        none, being over the snapshot cap: a run set aside then holds its frontier only there
        (`_write` keeps it before the row), and a release folds on from it once compaction
        cut the run's first events."""
        capped = [r for r, row in rows.items() if row.set_aside is None and row.frontier is None]
        if self.compaction is None or not capped:
            return {}
        return await self.compaction.snapshots(capped)

    async def _store(self, *, wait: bool) -> None:
        """Store everything folded, once the store before has landed; with ``wait`` False the
        write is left running, and what is folded next is stored after it."""
        await self._written()
        snapshots: list[Snapshot] = []
        cache = self._cache
        over_cap = self.over_cap
        for run_id, draft in self._dirty.items():
            snapshot = Snapshot.of(draft.frozen(), max_bytes=self.max_bytes)
            if snapshot.payload is None:
                self.stats.snapshots_refused += 1
                log.warning("run %r: snapshot refused: %s", run_id, snapshot.error)
                cache.sized(run_id, self.max_bytes)
                if over_cap is not None:
                    over_cap.add(run_id)
            else:
                cache.sized(run_id, len(snapshot.payload))
                if over_cap is not None:
                    over_cap.discard(run_id)
            snapshots.append(snapshot)
        entries, cleared = self.quarantine.take()
        write = self._write(
            self._positions,
            snapshots,
            list(self._calls.values()),
            quarantine=entries,
            cleared=cleared,
            said=self._said,
            restarted=self._restarted,
        )
        self._said = []
        self._restarted = set()
        self._writing = asyncio.ensure_future(write)
        self._writing_events = self._pending_events
        self._writing_runs = set(self._dirty)
        self._dirty.clear()
        self._calls.clear()
        self._positions = {}
        self._pending_events = 0
        self._evict()
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
        restarted: set[tuple[str, str, int]],
    ) -> int:
        # Only what the batch has is passed on, so a store that predates an option still works
        # for batches without it.
        options: dict[str, Any] = {}
        if quarantine or cleared:
            options.update(quarantine=quarantine, cleared=cleared)
        if said:
            options["messages"] = said
        if restarted:
            options["restarted"] = restarted
        refused = [s.frontier for s in snapshots if s.payload is None]
        if refused and self.compaction is not None:
            # Before the row and the positions: a reader that finds the row without its
            # frontier finds this one at least as far on.
            await self.compaction.put_snapshots(refused)
        await self.store.write(self.consumer, positions, snapshots, calls, **options)
        for entry in quarantine:
            say_quarantined(entry)
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
        self._restarted = set()
        self._positions = {}
        self._pending_events = 0
        self._looked_since_flush = False
        self.quarantine.drop()

    def assigned(self, positions: Mapping[int, int]) -> None:
        """These partitions are this projection's now, folded up to these offsets (a Kafka
        projector sought to them): runs released from quarantine in them are folded again on
        the next pass, even before a record of the partition arrives."""
        for partition, offset in positions.items():
            self.quarantine.folded_to.setdefault(partition, offset)

    def forget(self, partitions: Collection[int]) -> None:
        """Drop cached frontiers of runs in these partitions; another projector owns them now.

        Call :meth:`flush` first: what is folded and not stored is dropped with them.
        """
        gone = set(partitions)
        for run_id in [r for r, d in self._cache.items() if d.partition in gone]:
            self._cache.pop(run_id)
            self._dirty.pop(run_id, None)
            self.quarantine.held.pop(run_id, None)
        for key in [k for k in self._calls if k[0] not in self._cache]:
            del self._calls[key]
        self._said = [m for m in self._said if m.run_id in self._cache]
        self._restarted = {r for r in self._restarted if r[1] in self._cache}
        for partition in gone:
            self._positions.pop(partition, None)
            self.quarantine.folded_to.pop(partition, None)

    async def _refold(
        self, run_id: str, first: LogRecord, row: StoredFrontier | None = None
    ) -> FrontierDraft:
        """A run whose snapshot was refused: on from its frontier kept uncapped in the
        compaction store (stored before every row write, so it holds every event of the run
        below the stored positions), or else folded from its first event up to ``first`` (an
        unreadable record in it sets the run aside, as anywhere).

        A kept frontier already past ``first`` was kept for a row write that then failed: the
        transcript and call rows of the events it holds past the stored positions were never
        stored, and folding on from it would never store them. The run is folded from its
        first event instead, unless compaction cut that below the log's start."""
        kept: Frontier | None = None
        if self.compaction is not None and (row is None or row.set_aside is None):
            kept = (await self.compaction.snapshots([run_id])).get(run_id)
            if kept is not None and kept.through_offset < first.position.offset:
                return FrontierDraft.of(kept)
        position = first.position
        try:
            history = await read_whole_records(
                self.log, self.compaction, run_id, end=position.offset
            )
        except LogTruncatedError:
            if kept is None:
                raise
            return FrontierDraft.of(kept)  # what it holds is not folded twice (`_fold_run`)
        self.stats.refolded_from_log += 1
        # The tenant of the run folded first: under a reused id, the collected run's, whose
        # rows a new run's start deletes under it (`_begun_again`), not the new run's.
        draft = FrontierDraft.of(
            Frontier.empty(run_id, _tenant_of(history[0] if history else first))
        )
        if self.compaction is not None and await self.compaction.tombstones([run_id]):
            # A log read with the archive holds the collected run before a new one under its
            # id: the latest run alone, as `_fold` folds it.
            stored = row.summary.through_offset if row is not None else -1
            return self._fold_reused(draft, history, stored, readable=False)
        self._fold_run(draft, history)
        return draft


def _ended(draft: FrontierDraft | None) -> bool:
    """Whether a cached frontier is of a run that ended."""
    return draft is not None and draft.status in TERMINAL_STATUSES


def _starts(first: LogRecord) -> bool:
    """Whether a run's first record in a batch is its first event."""
    return isinstance(first, StoredEvent) and first.event.seq == 1


def _starts_or_says_so(first: LogRecord) -> bool:
    """Whether a run's first record in a batch is its first event, or an unreadable record
    whose envelope says it is at seq 1 (written by a newer Onward, say)."""
    return _starts(first) or (isinstance(first, UnreadableRecord) and first.error.seq == 1)


def _astray(record: LogRecord, run_id: str, partitions: int) -> UnreadableRecord:
    """A record of a run found in another partition than the run's (a producer that
    partitions keys otherwise, a mirror), filed under no run: the run's history is what its
    own partition holds, as a resume reads it, and folded, the record's offset (of another
    partition) would pass for how far the run was folded, and its own later events be
    skipped."""
    seq: int | None = None
    kind = record.kind if isinstance(record, UnreadableRecord) else None
    if isinstance(record, StoredEvent):
        seq, kind = record.event.seq, str(type(record.event).__struct_config__.tag)
    error = EventDecodeError(
        f"a record of run {run_id!r} in partition {record.position.partition}, but the run's "
        f"records are in partition {partition_for(run_id, partitions)}: not read as the run's",
        run_id=run_id,
        seq=seq,
    )
    return UnreadableRecord(record.position, None, None, kind, error)


def _tenant_of(record: LogRecord) -> str:
    if isinstance(record, StoredEvent):
        return record.event.tenant
    return record.tenant or ""
