"""`Resumer`: take the lease, claim the run in the log, fold the tail, plan. In that order.

1. The lease is taken before anything about the run is read, so the worker that loses
   (`ResumeConflictError`, naming the holder) never sees the run at all.
2. `RunClaimed` under the lease's fence is appended; its offset is the linearization point.
   Kafka has no conditional append, so fencing is enforced by readers: everything the
   superseded holder writes after this point is refused by every fold.
3. The frontier row is read with its position, and the run's events are read from there up to
   the claim's offset: the tail is bounded by the projector's lag, not by the run's length.
4. `plan_resume` decides what happens to each outstanding call. Nothing is acted on here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from onward.errors import ConfigurationError, NothingToResumeError, RevisionMismatchError
from onward.eventlog.base import EventLog, StoredEvent, partition_for
from onward.eventlog.events import RunClaimed
from onward.projections.base import FrontierStore
from onward.projections.frontier import Frontier, fold_all
from onward.projections.projector import DEFAULT_CONSUMER

from .agent import Agent
from .leases.base import LeasePolicy, LeaseStore, RunLease
from .resume import ResumePlan, plan_resume


@dataclass(frozen=True, slots=True)
class CarriedRun:
    """A run this worker now holds: its lease, its frontier through the claim, and the plan."""

    lease: RunLease
    frontier: Frontier
    plan: ResumePlan
    tail_events: int
    claimed: bool = True
    timings_ms: dict[str, float] = field(default_factory=dict)


class Resumer:
    """Puts a lease in front of resume.

    Args:
        log: The event log.
        leases: Who holds which run.
        frontiers: Frontier rows, if a projector keeps them; without, the whole history is
            folded.
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
        self, agent: Agent | None, run_id: str, *, tenant: str, worker: str
    ) -> CarriedRun:
        """Hold the run and return what resume must do with it.

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
            return await self._carry(
                agent,
                run_id,
                tenant=tenant,
                worker=worker,
                lease=lease,
                timings=timings,
                started=started,
            )
        except BaseException:
            await self.leases.release(lease)
            raise

    async def _carry(
        self,
        agent: Agent | None,
        run_id: str,
        *,
        tenant: str,
        worker: str,
        lease: RunLease,
        timings: dict[str, float],
        started: float,
    ) -> CarriedRun:
        mark = time.perf_counter()
        frontier, start = await self._stored(run_id, tenant)
        timings["frontier"] = _ms(mark)
        mark = time.perf_counter()
        partition = partition_for(run_id, self.log.partitions)
        read_to = (await self.log.bounds(partition)).end
        tail = await self.log.read_run(run_id, start=start, end=read_to)
        frontier = fold_all(frontier, tail)
        if frontier.last_seq == 0 or frontier.tenant != tenant:
            raise NothingToResumeError(
                f"no run {run_id!r} for tenant {tenant!r}; check the id and tenant", run_id=run_id
            )
        if agent is not None and frontier.revision != agent.revision:
            raise RevisionMismatchError(
                f"run {run_id!r} started with agent revision {frontier.revision}, the agent "
                f"passed in is {agent.revision}; resume it with the definition it started with",
                run_id=run_id,
            )
        if lease.fence <= frontier.fence:
            raise ConfigurationError(
                f"run {run_id!r}: the lease store gave fence {lease.fence} but the log already "
                f"holds fence {frontier.fence}; every worker of a run must share one lease store"
            )
        timings["tail"] = _ms(mark)
        if frontier.status in {"completed", "failed", "cancelled", "continued"} or (
            frontier.status == "waiting" and frontier.waiting_on is not None
        ):
            # Nothing to carry on: no claim, so the run's history stays as it was.
            plan = plan_resume(frontier, agent or _anonymous(frontier))
            return CarriedRun(lease, frontier, plan, len(tail), False, timings)
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
        timings["total"] = _ms(started)
        return CarriedRun(lease, frontier, plan, len(tail) + len(between), True, timings)

    async def _stored(self, run_id: str, tenant: str) -> tuple[Frontier, int | None]:
        """The stored frontier and the offset to read the tail from (None: the whole run).

        The tail starts at the projector's position for the run's partition when that is past
        the row: every event of the run below it is already in the row, and the records in
        between belong to other runs (in a busy partition, many of them).
        """
        if self.frontiers is None:
            return Frontier.empty(run_id, tenant), None
        row = await self.frontiers.get(run_id)
        if row is None or row.frontier is None:
            return Frontier.empty(run_id, tenant), None
        partition = partition_for(run_id, self.log.partitions)
        folded_to = (await self.frontiers.positions(self.projector)).get(partition, 0)
        return row.frontier, max(row.frontier.through_offset + 1, folded_to)


def _anonymous(frontier: Frontier) -> Agent:
    return Agent(name=frontier.agent or "unknown", instructions="")


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000.0


__all__ = ["CarriedRun", "Resumer", "StoredEvent"]
