"""`Resumer`: take the lease, read the run, claim it in the log, plan. In that order.

1. The lease is taken before anything about the run is read, so the worker that loses
   (`ResumeConflictError`, naming the holder) never sees the run at all.
2. The run is read once. For a plan alone, the frontier row and the projector's position for
   the run's partition are read, then the run's events from there to the partition's end: the
   tail is bounded by the projector's lag, not by the run's length. When the caller also needs
   the conversation (``history=True``), the run is read from its first event instead (the row
   says where that is), and the frontier is folded from those same events.
3. If the lease store handed out a fence the log has already seen (it was wiped, or the run was
   written before it was configured), the store's fence is raised above the log's while the
   lease is held. A wiped store costs time, never the run.
4. `RunClaimed` under the lease's fence is appended; its offset is the linearization point.
   Kafka has no conditional append, so fencing is enforced by readers: everything the
   superseded holder writes after this point is refused by every fold.
5. `plan_resume` decides what happens to each outstanding call. Nothing is acted on here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from onward.errors import NothingToResumeError, RevisionMismatchError
from onward.eventlog.base import EventLog, SequenceGuard, StoredEvent, partition_for
from onward.eventlog.events import RunClaimed
from onward.projections.base import FrontierStore
from onward.projections.frontier import Frontier, fold_all
from onward.projections.projector import DEFAULT_CONSUMER

from .agent import Agent
from .leases.base import LeasePolicy, LeaseStore, RunLease
from .planning import ResumePlan, plan_resume


@dataclass(frozen=True, slots=True)
class CarriedRun:
    """A run this worker now holds: its lease, its frontier through the claim, and the plan.

    Attributes:
        events: With ``history=True``, the run's counted events through the claim, in order
            (what the conversation is rebuilt from); otherwise empty.
        claimed: False when there was nothing to carry on (the run is settled), so nothing was
            appended.
    """

    lease: RunLease
    frontier: Frontier
    plan: ResumePlan
    tail_events: int
    claimed: bool = True
    events: tuple[StoredEvent, ...] = ()
    timings_ms: dict[str, float] = field(default_factory=dict)


class Resumer:
    """Puts a lease in front of resume, and reads runs no further back than it must.

    Args:
        log: The event log.
        leases: Who holds which run.
        frontiers: Frontier rows, if a projector (or the embedded checkpointer) keeps them;
            without, a run is folded from the start of its partition.
        policy: The lease's ttl.
        projector: The consumer name the frontier projector stores its positions under.
    """

    def __init__(
        self,
        log: EventLog,
        leases: LeaseStore,
        frontiers: FrontierStore | None = None,
        *,
        policy: LeasePolicy | None = None,
        projector: str = DEFAULT_CONSUMER,
    ) -> None:
        self.log = log
        self.projector = projector
        self.leases = leases
        self.frontiers = frontiers
        self.policy = policy or LeasePolicy()

    async def resume(
        self,
        agent: Agent | None,
        run_id: str,
        *,
        tenant: str,
        worker: str,
        history: bool = False,
    ) -> CarriedRun:
        """Hold the run and return what resume must do with it.

        Args:
            history: Also return the run's counted events (to rebuild its conversation).

        Raises:
            ResumeConflictError: Another worker holds it (before anything was read).
            NothingToResumeError: No such run for that tenant (the lease is released).
            RevisionMismatchError: ``agent`` is not the run's revision (the lease is released).
        """
        timings: dict[str, float] = {}
        started = time.perf_counter()
        lease = await self.leases.acquire(
            run_id, tenant=tenant, holder=worker, ttl_s=self.policy.ttl_s
        )
        timings["lease"] = _ms(started)
        try:
            carried = await self._carry(
                agent, lease, worker=worker, history=history, timings=timings
            )
        except BaseException:
            await self.leases.release(lease)
            raise
        timings["total"] = _ms(started)
        return carried

    async def read(self, run_id: str, *, tenant: str, agent: Agent | None = None) -> Frontier:
        """The run's frontier as the log has it now, read no further back than the row allows.

        Takes no lease and writes nothing.

        Raises:
            NothingToResumeError: No such run for that tenant.
            RevisionMismatchError: ``agent`` is given and is not the run's revision.
        """
        frontier, _, _ = await self._read(run_id, tenant, agent, whole=False)
        return frontier

    async def fence_above_log(self, lease: RunLease, frontier: Frontier) -> RunLease:
        """The lease, its fence raised above every fence the log holds for the run if need be."""
        if lease.fence > frontier.fence:
            return lease
        return await self.leases.raise_fence(lease, above=frontier.fence)

    async def _carry(
        self,
        agent: Agent | None,
        lease: RunLease,
        *,
        worker: str,
        history: bool,
        timings: dict[str, float],
    ) -> CarriedRun:
        run_id, tenant = lease.run_id, lease.tenant
        mark = time.perf_counter()
        frontier, tail, read_to = await self._read(
            run_id, tenant, agent, whole=history, timings=timings
        )
        lease = await self.fence_above_log(lease, frontier)
        timings["tail"] = _ms(mark) - timings["frontier"]
        if frontier.settled:
            # Nothing to carry on: no claim, so the run's history stays as it was.
            plan = plan_resume(frontier, agent or _anonymous(frontier))
            return CarriedRun(lease, frontier, plan, len(tail), False, _counted(tail, history))
        mark = time.perf_counter()
        claim = RunClaimed(
            run_id=run_id,
            tenant=tenant,
            seq=frontier.last_seq + 1,
            fence=lease.fence,
            at=time.time_ns() // 1_000,
            worker=worker,
        )
        (position,) = await self.log.append([claim])
        # Whatever a superseded writer slipped in before the claim landed is part of the run;
        # what it writes after is refused by the fold.
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
            _counted([*tail, *between], history),
            timings,
        )

    async def exists(self, run_id: str) -> bool:
        """Whether the log holds any counted event of the run, for any tenant."""
        frontier, _, _ = await self._fold(run_id, "", whole=False)
        return frontier.last_seq > 0

    async def _read(
        self,
        run_id: str,
        tenant: str,
        agent: Agent | None,
        *,
        whole: bool,
        timings: dict[str, float] | None = None,
    ) -> tuple[Frontier, list[StoredEvent], int]:
        """The run folded to the partition's end, the events read to fold it, and that end.

        Raises:
            NothingToResumeError: No such run for that tenant.
            RevisionMismatchError: ``agent`` is given and is not the run's revision.
        """
        frontier, tail, end = await self._fold(run_id, tenant, whole=whole, timings=timings)
        owner = tail[0].event.tenant if tail else frontier.tenant
        if frontier.last_seq == 0 or owner != tenant:
            raise NothingToResumeError(
                f"no run {run_id!r} for tenant {tenant!r}; check the id and tenant", run_id=run_id
            )
        if agent is not None and frontier.revision != agent.revision:
            raise RevisionMismatchError(
                f"run {run_id!r} started with agent revision {frontier.revision}, the agent "
                f"passed in is {agent.revision}; resume it with the definition it started with",
                run_id=run_id,
            )
        return frontier, tail, end

    async def _fold(
        self, run_id: str, tenant: str, *, whole: bool, timings: dict[str, float] | None = None
    ) -> tuple[Frontier, list[StoredEvent], int]:
        """Fold the run from where the stores allow up to the partition's end. No checks."""
        mark = time.perf_counter()
        frontier, start = await self._stored(run_id, tenant, whole=whole)
        if timings is not None:
            timings["frontier"] = _ms(mark)
        partition = partition_for(run_id, self.log.partitions)
        end = (await self.log.bounds(partition)).end
        tail = await self.log.read_run(run_id, start=start, end=end)
        return fold_all(frontier, tail), tail, end

    async def _stored(
        self, run_id: str, tenant: str, *, whole: bool
    ) -> tuple[Frontier, int | None]:
        """Where to fold from: a frontier, and the offset to read the run from (None: the start).

        For the frontier alone, the tail starts at the projector's position for the run's
        partition when that is past the row: every event of the run below it is already in the
        row, and the records in between belong to other runs (in a busy partition, many of
        them). For the whole run, the row only says where the run's first event is.
        """
        empty = Frontier.empty(run_id, tenant)
        if self.frontiers is None:
            return empty, None
        row = await self.frontiers.get(run_id)
        if row is None or row.frontier is None:
            return empty, None
        if whole:
            first = row.frontier.first_offset
            return empty, first if first >= 0 else None
        partition = partition_for(run_id, self.log.partitions)
        folded_to = (await self.frontiers.positions(self.projector)).get(partition, 0)
        return row.frontier, max(row.frontier.through_offset + 1, folded_to)


def _counted(stored: list[StoredEvent], wanted: bool) -> tuple[StoredEvent, ...]:
    """The events of ``stored`` that count (seq and fence rules), if they are wanted."""
    return tuple(SequenceGuard().admit_all(stored)) if wanted else ()


def _anonymous(frontier: Frontier) -> Agent:
    return Agent(name=frontier.agent or "unknown", instructions="")


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000.0


__all__ = ["CarriedRun", "Resumer", "StoredEvent"]
