"""`Resumer`: read a held run, claim it in the log, plan. In that order.

1. The lease is taken (by the caller, with a `Leaseholder`, which renews it from then on) before
   anything about the run is read, so the worker that loses (`ResumeConflictError`, naming the
   holder) never sees the run at all.
2. The run is read once: the frontier row, the projector's position for the run's partition,
   then the run's events from there to the partition's end. The tail is bounded by the
   projector's lag, not by the run's length nor by other runs' traffic. When the caller also
   needs the conversation (``history=True``), the run's transcript is read up to the row's
   handle (``last_seq``; the row counts its messages) and the tail's events follow it. A
   history with a hole (the tail starts below the log's start, or the transcript lacks rows the
   row counts) raises `HistoryUnavailableError`: the model never sees a conversation with a
   hole. Without a frontier store (embedded logs only) the run is folded from its partition.
3. If the lease store handed out a fence the log has already seen (it was wiped, or the run was
   written before it was configured), the store's fence is raised above the log's while the
   lease is held. A wiped store costs time, never the run.
4. `RunClaimed` under the lease's fence is appended; its offset is the linearization point.
   Kafka has no conditional append, so fencing is enforced by readers: everything the
   superseded holder writes after this point is refused by every fold.
5. `plan_resume` decides what happens to each outstanding call. Nothing is acted on here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from onward.errors import (
    HistoryUnavailableError,
    InvalidInputError,
    LogTruncatedError,
    NothingToResumeError,
    RevisionMismatchError,
)
from onward.eventlog.base import EventLog, SequenceGuard, StoredEvent, judge, partition_for
from onward.eventlog.events import Event, RunClaimed, stamped
from onward.projections.base import DEFAULT_CONSUMER, FrontierStore
from onward.projections.compaction import CompactionStore
from onward.projections.compaction.history import read_whole_run
from onward.projections.frontier import Frontier, fold_all
from onward.projections.transcript import TranscriptRow, stored_message_of

from .agent import Agent
from .leases.base import LeasePolicy, LeaseStore, RunLease
from .leases.holder import Leaseholder
from .planning import ResumePlan, plan_resume


@dataclass(frozen=True, slots=True)
class CarriedRun:
    """A run this worker now holds: its lease, its frontier through the claim, and the plan.

    Attributes:
        transcript: With ``history=True``, the run's transcript through the frontier row's
            handle, by seq; otherwise empty.
        events: With ``history=True``, the run's counted events after the transcript, through
            the claim, in order: with ``transcript``, what the conversation is rebuilt from;
            otherwise empty.
        claimed: False when there was nothing to carry on (the run is settled), so nothing was
            appended.
        claim_seq: The seq of the `RunClaimed` appended (0 when nothing was claimed): the seq
            a model call's answer would have taken had the holder before died mid-call.
    """

    lease: RunLease
    frontier: Frontier
    plan: ResumePlan
    tail_events: int
    claimed: bool = True
    events: tuple[StoredEvent, ...] = ()
    timings_ms: dict[str, float] = field(default_factory=dict)
    transcript: tuple[TranscriptRow, ...] = ()
    claim_seq: int = 0


class Resumer:
    """Puts a lease in front of resume, and reads runs no further back than it must.

    Args:
        log: The event log.
        leases: Who holds which run.
        frontiers: Frontier rows and transcripts, kept by a projector (or the embedded
            checkpointer); without (embedded logs only), a run is folded from the start of its
            partition.
        policy: The lease's ttl.
        projector: The consumer name the frontier projector stores its positions under.
        compaction: Where compaction retained what it cut of runs read from their first
            event (a row without a frontier to resume from); without it such a run's history
            ends where the log starts.
    """

    def __init__(
        self,
        log: EventLog,
        leases: LeaseStore,
        frontiers: FrontierStore | None = None,
        *,
        policy: LeasePolicy | None = None,
        projector: str = DEFAULT_CONSUMER,
        compaction: CompactionStore | None = None,
    ) -> None:
        self.log = log
        self.compaction = compaction
        self.projector = projector
        self.leases = leases
        self.frontiers = frontiers
        self.policy = policy or LeasePolicy()

    async def claim(
        self, agent: Agent | None, held: Leaseholder, *, worker: str, history: bool = False
    ) -> CarriedRun:
        """Read the held run once, lift the lease's fence above the log's, claim the run in the
        log, and plan: what resume must do with it.

        The lease is the caller's, taken (and renewed) before this is called, so nothing about
        the run is read by a worker that does not hold it, and the lease outlasts the read and
        the claim however long they take. Releasing it is the caller's too; when the run
        turns out not to exist, ``held`` is marked to forget the lease instead
        (`Leaseholder.found_no_run`), so the id keeps no lease state.

        Args:
            history: Also return the run's counted events (to rebuild its conversation).

        Raises:
            NothingToResumeError: No such run for that tenant.
            RevisionMismatchError: ``agent`` is not the run's revision.
            HistoryUnavailableError: The run's history has a hole.
            FencedError: The lease was lost before the claim.
        """
        timings: dict[str, float] = {}
        started = time.perf_counter()
        try:
            carried = await self._carry(
                agent, held, worker=worker, history=history, timings=timings
            )
        except NothingToResumeError:
            held.found_no_run()  # an id nobody wrote keeps no lease state once handed back
            raise
        timings["total"] = _ms(started)
        return carried

    async def read(self, run_id: str, *, tenant: str, agent: Agent | None = None) -> Frontier:
        """The run's frontier as the log has it now, read no further back than the row allows.

        Takes no lease and writes nothing.

        Raises:
            NothingToResumeError: No such run for that tenant.
            RevisionMismatchError: ``agent`` is given and is not the run's revision.
            HistoryUnavailableError: The tail the row needs starts below the log's start.
        """
        return (await self._read(run_id, tenant, agent, whole=False)).frontier

    async def inherited(self, frontier: Frontier) -> list[TranscriptRow]:
        """The messages of the runs this one was carried on from, oldest first: each one's
        transcript up to its handle, what its row has not folded yet read from the log.

        Raises:
            HistoryUnavailableError: One of them lacks messages its handle counts.
        """
        rows: list[TranscriptRow] = []
        for handle in frontier.history:
            try:
                read = await self._fold(handle.run_id, frontier.tenant, whole=True)
            except HistoryUnavailableError as exc:
                raise HistoryUnavailableError(
                    f"run {frontier.run_id!r} was carried on from {handle.run_id!r}: {exc}",
                    run_id=frontier.run_id,
                ) from exc
            tail = [s.event for s in _counted(read.base, read.tail, True)]
            said = [*read.transcript, *_transcript_rows(tail)]
            said = [row for row in said if row.seq <= handle.through_seq]
            if len(said) != handle.messages:
                raise _hole(
                    frontier.run_id,
                    f"{handle.messages - len(said)} of the {handle.messages} messages of run "
                    f"{handle.run_id!r} through seq {handle.through_seq}, which it was carried on "
                    "from",
                )
            rows.extend(said)
        return rows

    async def _carry(
        self,
        agent: Agent | None,
        held: Leaseholder,
        *,
        worker: str,
        history: bool,
        timings: dict[str, float],
    ) -> CarriedRun:
        run_id, tenant = held.run_id, held.tenant
        mark = time.perf_counter()
        read = await self._read(run_id, tenant, agent, whole=history, timings=timings)
        frontier, transcript, tail, read_to = read.frontier, read.transcript, read.tail, read.end
        lease = await held.raise_fence(frontier.fence)
        timings["tail"] = _ms(mark) - timings["frontier"]
        if frontier.settled:
            # Nothing to carry on: no claim, so the run's history stays as it was.
            plan = plan_resume(frontier, agent or _anonymous(frontier))
            return CarriedRun(
                lease,
                frontier,
                plan,
                len(tail),
                False,
                _counted(read.base, tail, history),
                transcript=transcript,
            )
        mark = time.perf_counter()
        await held.check()
        claim = stamped(
            RunClaimed,
            run_id=run_id,
            tenant=tenant,
            seq=frontier.last_seq + 1,
            fence=lease.fence,
            worker=worker,
        )
        (position,) = await self.log.append([claim])
        # Whatever a superseded writer slipped in before the claim landed is part of the run;
        # what it writes after is refused by the fold. The claim landing right where the read
        # ended means nothing did: then the claim is all there is, and nothing is read back.
        if position.offset == read_to:
            between = [StoredEvent(position, claim)]
        else:
            between = await self.log.read_run(run_id, start=read_to, end=position.offset + 1)
        frontier = fold_all(frontier, between)
        timings["claim"] = _ms(mark)
        mark = time.perf_counter()
        plan = plan_resume(frontier, agent or _anonymous(frontier))
        timings["plan"] = _ms(mark)
        return CarriedRun(
            lease,
            frontier,
            plan,
            len(tail) + len(between),
            True,
            _counted(read.base, [*tail, *between], history),
            timings,
            transcript,
            claim.seq,
        )

    async def refuse_existing(self, run_id: str, lease: RunLease) -> None:
        """Refuse to start a run under an id already in use, reading as little as possible.

        A lease store that never saw the id (fence 1) has never let anyone write to it, so at
        most the frontier row is looked at (on Kafka, reading the partition would mean every
        other run's records since the start). A store that did see the id is not taken at its
        word: the log is asked, from the row on.

        The refusal reads the same whether the run is the caller's tenant's or another's, so
        it never tells another tenant that the run is there.

        Raises:
            InvalidInputError: A run under that id exists; resume it instead.
        """
        if lease.fence == 1:
            exists = self.frontiers is not None and await self.frontiers.get(run_id) is not None
        else:
            exists = await self.exists(run_id)
        if exists:
            raise _taken(run_id, lease.tenant)

    async def refuse_stored(self, run_id: str, tenant: str) -> None:
        """Refuse to start a run under an id its frontier row already holds, before any lease
        is taken: a start under another tenant's id then never holds that run, even briefly.
        A run too new to have a row is left to `refuse_existing`, under the lease.

        Raises:
            InvalidInputError: A run under that id exists; resume it instead. Or garbage
                collection removed a run under that id (`refuse_collected`).
        """
        if self.frontiers is not None and await self.frontiers.get(run_id) is not None:
            raise _taken(run_id, tenant)
        await self.refuse_collected(run_id)

    async def collected(self, run_id: str) -> bool:
        """Whether garbage collection removed a run under this id (its tombstone). Without a
        compaction store (a memory log, or a runner built without one) nothing is known: False.
        """
        return self.compaction is not None and bool(await self.compaction.tombstones([run_id]))

    async def refuse_collected(self, run_id: str) -> None:
        """Refuse a start under the id of a run garbage collection removed while its events
        are still in the log: a second history under the id would be read with them (the new
        run's events refused as duplicates of the old one's). Once compaction has cut them the
        id is free. One tombstone lookup per start; only an id with a tombstone has its events
        looked for (on Kafka, a read of its partition).

        Raises:
            InvalidInputError: The id belonged to a collected run; choose a new one.
        """
        if await self.collected(run_id) and await self.log.read_run(run_id):
            raise InvalidInputError(
                f"run id {run_id!r} belonged to a run that garbage collection removed, whose "
                "events are still in the log; start the run under a new id",
                run_id=run_id,
            )

    async def refuse_another_tenants(self, run_id: str, tenant: str) -> None:
        """Refuse to resume a run whose stored row is another tenant's, before any lease is
        taken: that resume must not hold the run, even briefly, nor raise its fence. One row
        lookup, no read of the log (a run without a row is read under its lease, once).

        Raises:
            NothingToResumeError: The run's row is another tenant's.
        """
        stored = await self.frontiers.get(run_id) if self.frontiers is not None else None
        if stored is not None and stored.summary.tenant != tenant:
            raise _no_such_run(run_id, tenant)

    async def exists(self, run_id: str) -> bool:
        """Whether the log holds any counted event of the run, for any tenant."""
        return (await self._fold(run_id, "", whole=False)).frontier.last_seq > 0

    async def _read(
        self,
        run_id: str,
        tenant: str,
        agent: Agent | None,
        *,
        whole: bool,
        timings: dict[str, float] | None = None,
    ) -> _Read:
        """The run folded to the partition's end, and what was read to fold it.

        Raises:
            NothingToResumeError: No such run for that tenant.
            RevisionMismatchError: ``agent`` is given and is not the run's revision.
            HistoryUnavailableError: The run's history has a hole.
        """
        try:
            read = await self._fold(run_id, tenant, whole=whole, timings=timings)
        except HistoryUnavailableError:
            # A hole is the owner's to hear of: to another tenant it is no run.
            await self.refuse_another_tenants(run_id, tenant)
            raise
        frontier = read.frontier
        if frontier.last_seq == 0 or _owner(read) != tenant:
            raise _no_such_run(run_id, tenant)
        if agent is not None and not frontier.agent:
            # No `RunStarted`: a LangGraph thread, which no agent of Onward's carries on.
            raise RevisionMismatchError(
                f"run {run_id!r} is a LangGraph thread: its graph carries it on (ainvoke with "
                "its thread_id and the saver), not an Onward agent",
                run_id=run_id,
            )
        if agent is not None and frontier.revision != agent.revision:
            raise RevisionMismatchError(
                f"run {run_id!r} started with agent revision {frontier.revision}, the agent "
                f"passed in is {agent.revision}; resume it with the definition it started with",
                run_id=run_id,
            )
        return read

    async def _fold(
        self, run_id: str, tenant: str, *, whole: bool, timings: dict[str, float] | None = None
    ) -> _Read:
        """Fold the run from where the stores allow up to the partition's end. No checks.

        With a frontier store: the run's row, and the tail from the later of the row's offset
        and the projector's position for the run's partition (every event of the run below
        that position is in the row; the records in between belong to other runs). With
        ``whole``, also the transcript up to the row's handle. A run with no row yet has no
        event below the projector's position either, so its tail starts there too.
        """
        mark = time.perf_counter()
        partition = partition_for(run_id, self.log.partitions)
        if self.frontiers is None:
            frontier, start = Frontier.empty(run_id, tenant), None
            bounds = await self.log.bounds(partition)
        else:
            # The row, the projector's position and the log's bounds are independent reads.
            (frontier, start), bounds = await asyncio.gather(
                self._stored(run_id, tenant, partition), self.log.bounds(partition)
            )
            if whole and frontier.last_seq > 0 and frontier.messages == 0:
                # A row written before the transcript was (every run's first event speaks):
                # its conversation is in the log, from the run's first event on.
                frontier, start = Frontier.empty(run_id, tenant), max(frontier.first_offset, 0)
        if timings is not None:
            timings["frontier"] = _ms(mark)
        if start is not None and start < bounds.start and self.compaction is None:
            raise _hole(
                run_id,
                f"its events from offset {start} of partition {partition} (the log now starts "
                f"at {bounds.start})",
            )
        wants_transcript = whole and self.frontiers is not None and frontier.messages > 0
        transcript, tail = await asyncio.gather(
            self._transcript(frontier) if wants_transcript else _nothing(),
            self._tail(run_id, partition, start, bounds.end),
        )
        gap = _gap_after(frontier, tail)
        if gap is not None:
            raise _hole(
                run_id,
                f"seqs {frontier.last_seq + 1} to {gap - 1} (the stored history ends at "
                f"seq {frontier.last_seq}, the log's tail starts at seq {gap})",
            )
        return _Read(fold_all(frontier, tail), frontier, transcript, tail, bounds.end)

    async def _tail(
        self, run_id: str, partition: int, start: int | None, end: int
    ) -> list[StoredEvent]:
        """The run's events from ``start`` (None: the partition's start) up to ``end``."""
        if start is not None and start >= end:
            return []  # the projector has folded the partition to its end: nothing to read
        try:
            return await read_whole_run(self.log, self.compaction, run_id, start=start, end=end)
        except LogTruncatedError as exc:
            raise _hole(
                run_id, f"its events from offset {start} of partition {partition} ({exc})"
            ) from exc

    async def _stored(self, run_id: str, tenant: str, partition: int) -> tuple[Frontier, int]:
        """Where to fold from: the run's row (or nothing), and the offset to read its tail from.

        A row whose snapshot was refused for size is read on from the frontier the projector
        kept uncapped in the compaction store, once the stored positions are past it: one
        ahead of them was kept for a row write that has not landed (or failed), and the
        transcript lacks the messages it counts. A row with no frontier to fold on from (set
        aside in quarantine, no compaction store, or a kept frontier ahead) is folded from
        the log: from the run's first event when a frontier knows where that is, else from
        the partition's start.
        """
        assert self.frontiers is not None
        # Positions first, then the row: a projector that stores a batch between the two reads
        # then only makes the row newer than the position, never the position newer than the
        # row (which would skip the events in between, or find a hole before a new run's tail).
        positions = await self.frontiers.positions(self.projector)
        row = await self.frontiers.get(run_id)
        folded_to = positions.get(partition, 0)
        if row is None:
            return Frontier.empty(run_id, tenant), folded_to
        if row.frontier is None:
            known = row.set_aside
            if known is None and self.compaction is not None:
                # Over the row's cap: the projector kept it uncapped beside the row.
                known = (await self.compaction.snapshots([run_id])).get(run_id)
                if known is not None and known.through_offset < folded_to:
                    return known, folded_to
            first = known.first_offset if known is not None and known.first_offset >= 0 else 0
            return Frontier.empty(run_id, tenant), first
        return row.frontier, max(row.frontier.through_offset + 1, folded_to)

    async def _transcript(self, frontier: Frontier) -> tuple[TranscriptRow, ...]:
        """The transcript up to the row's handle, every row the frontier counts, or an error.

        Raises:
            HistoryUnavailableError: The transcript lacks rows the frontier counts.
        """
        assert self.frontiers is not None
        rows = await self.frontiers.transcript(
            frontier.run_id, tenant=frontier.tenant, through=frontier.last_seq
        )
        if len(rows) != frontier.messages:
            held = [row.seq for row in rows]
            raise _hole(
                frontier.run_id,
                f"{frontier.messages - len(rows)} of the {frontier.messages} messages of its "
                f"transcript through seq {frontier.last_seq} (the transcript holds "
                + (f"seqs {_ranges(held)})" if held else "none of them)"),
            )
        return tuple(rows)


def _gap_after(frontier: Frontier, tail: Sequence[StoredEvent]) -> int | None:
    """The lowest seq of the tail ahead of ``frontier`` when the tail does not go on from it
    (events are missing in between), else ``None``.

    The tail goes on from the frontier when one of its events counts right after it: a claim
    under a higher fence counts whatever seq it carries (`judge`), so the seqs written after it
    may start past the frontier's next one although nothing is missing.
    """
    ahead: list[int] = []
    for stored in tail:
        event = stored.event
        if judge(frontier.last_seq, frontier.fence, event) is None:
            return None
        if event.seq > frontier.last_seq:
            ahead.append(event.seq)
    return min(ahead) if ahead and min(ahead) > frontier.last_seq + 1 else None


def _transcript_rows(events: Sequence[Event]) -> list[TranscriptRow]:
    """The transcript rows the counted ``events`` add, as the projector would store them."""
    return [
        TranscriptRow(tenant=e.tenant, run_id=e.run_id, seq=e.seq, message=message)
        for e in events
        if (message := stored_message_of(e)) is not None
    ]


async def _nothing() -> tuple[TranscriptRow, ...]:
    return ()


def _taken(run_id: str, tenant: str) -> InvalidInputError:
    """The refusal of a start under an id in use, worded alike for every tenant."""
    return InvalidInputError(
        f"run {run_id!r} cannot be started for tenant {tenant!r}: it already exists or is not "
        "permitted; if it is this tenant's, resume it instead",
        run_id=run_id,
    )


def _hole(run_id: str, missing: str) -> HistoryUnavailableError:
    return HistoryUnavailableError(
        f"run {run_id!r}: its history has a hole, missing {missing}; the run stops rather than "
        "go on without it: restore the missing history or settle the run by hand",
        run_id=run_id,
    )


def _ranges(seqs: list[int]) -> str:
    """Seqs as ranges: ``1-3, 7, 9-12``."""
    spans: list[str] = []
    first = last = seqs[0]
    for seq in [*seqs[1:], None]:
        if seq is not None and seq == last + 1:
            last = seq
            continue
        spans.append(str(first) if first == last else f"{first}-{last}")
        if seq is not None:
            first = last = seq
    return ", ".join(spans)


class _Read(NamedTuple):
    """One read of a run: ``base`` (the stored row, or empty) and ``tail`` folded into
    ``frontier``; the transcript up to ``base``'s handle; the partition's end as of the read."""

    frontier: Frontier
    base: Frontier
    transcript: tuple[TranscriptRow, ...]
    tail: list[StoredEvent]
    end: int


def _counted(base: Frontier, stored: list[StoredEvent], wanted: bool) -> tuple[StoredEvent, ...]:
    """The events of ``stored`` that count after ``base`` (seq and fence rules), if wanted."""
    if not wanted:
        return ()
    return tuple(SequenceGuard(base.last_seq, base.fence).admit_all(stored))


def _no_such_run(run_id: str, tenant: str) -> NothingToResumeError:
    return NothingToResumeError(
        f"no run {run_id!r} for tenant {tenant!r}; check the id and tenant", run_id=run_id
    )


def _owner(read: _Read) -> str | None:
    """Whose run it is: the stored row's tenant, or that of the run's own first counted event.
    Never the first record of the tail: another tenant's event appended to the run (refused by
    the fold) must not make the run look like theirs."""
    if read.base.last_seq > 0:
        return read.base.tenant
    first = next(iter(SequenceGuard().admit_all(read.tail)), None)
    return first.event.tenant if first is not None else None


def _anonymous(frontier: Frontier) -> Agent:
    return Agent(name=frontier.agent or "unknown", instructions="")


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000.0


__all__ = ["CarriedRun", "Resumer", "StoredEvent"]
