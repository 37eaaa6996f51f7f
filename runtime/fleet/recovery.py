"""Recovery: how a `Worker` finds runs whose lease lapsed and carries them on, bounded.

When partitions are assigned (at start, and when a dead worker's partitions move) and every
``recheck_s`` after, the worker lists the runs that are ``running`` (so not waiting on a
person) and whose lease has lapsed, and carries each on with `AgentRunner.resume`. A run whose
lease is still held is looked at again on the next pass; one it found left for a person is
passed over until something is written to it (a person settling its call); one of an agent or
an agent revision the worker does not carry is passed over, said once, for a worker that does.

The periodic pass is not limited to the partitions the worker owns: a run of another partition
is taken too once its last event is a lease ttl old and its lease has lapsed. A dead worker
keeps its partitions until the group's session timeout ends (6 s at the least on a broker's
defaults) and the group has rebalanced; its runs need not wait for that, because the lease, not
the partition, decides who carries a run on. Two workers reaching for one run are settled by
the lease: one carries it on, the other counts a conflict. Requests (new runs, answers) still
go to the partition's owner.
Attempts are bounded: the claims (`RunClaimed`) the log shows since the run last made progress
(a model answer, a tool outcome but a call settled as never run only to be made again, a
settled turn or an approval) count (the fold keeps the
count, `Frontier.attempts`, so it costs no read of the run), with a backoff of
``backoff_s * 2**(attempts - 1)`` before each retry; at ``max_attempts`` the run ends ``failed``
with the reason and the last cause (the type and one masked line of the error the last
attempt failed with), written under its lease: the attempt that uses up the last one ends the
run at once, so the worker that saw the cause is the one that records it. A plan that is not
safe (`IndeterminateToolCallError`) is never guessed: the run is tagged ``needs-person`` and
left for `onward resolve`, also when it runs out of attempts before a plan refused it (its
undecided call's status check failed, or an outage met each attempt after its claim);
`ExecutionManager.list_pending` lists it, and once its calls are settled the next pass carries
it on.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Collection, Iterable

from onward.errors import (
    BudgetExceededError,
    IndeterminateToolCallError,
    NothingToResumeError,
    OnwardError,
    ResumeConflictError,
)
from onward.eventlog.base import partition_for
from onward.eventlog.events import (
    ApprovalGranted,
    Event,
    ModelAnswered,
    RunClaimed,
    RunFinished,
    ToolCompleted,
    ToolResolved,
    TurnSettled,
)
from onward.projections.audit import printable
from onward.projections.base import RunSummary, runs_in_pages
from onward.projections.frontier import Frontier, made_again
from onward.runtime.agent import Agent
from onward.runtime.conversation import Conversation
from onward.runtime.leases.base import current_leases
from onward.runtime.leases.holder import Leaseholder
from onward.runtime.manager import needs_person
from onward.runtime.planning import plan_resume
from onward.runtime.redaction import Redactor, window_to_mask
from onward.runtime.writer import HeldRun

from .member import FleetMember

_log = logging.getLogger("onward.worker")

_LISTED_AT_ONCE = 1024
"""Runs a recovery pass lists at once: one page, whose lapsed runs it launches before the next."""
_LEASE_CHECKS_AT_ONCE = 256
"""Lease checks of one look in flight together (one Redis pipeline; a bounded pool's worth)."""

_redactor = Redactor()
_LOGGED_CHARS = 300
_CAUSES_KEPT = 1024
"""Last causes a worker keeps for runs it saw fail and could not end at once (oldest go)."""
_LEFT_KEPT = 4096
"""Runs left for a person a worker remembers to pass over (the oldest go: looked at again)."""
_FOREIGN_KEPT = 4096
"""Runs of agents or revisions it does not carry a worker remembers having said so for (the
oldest go: said again)."""

_PROGRESS = (ModelAnswered, ToolCompleted, ToolResolved, TurnSettled, ApprovalGranted)


def attempts_since_progress(events: Iterable[Event]) -> int:
    """How many claims (`RunClaimed`) the run saw since it last made progress."""
    attempts = 0
    for event in events:
        if isinstance(event, RunClaimed):
            attempts += 1
        elif isinstance(event, _PROGRESS) and not made_again(event):
            attempts = 0
    return attempts


def one_line(text: str) -> str:
    """``text`` on one line, masked (`Redactor`), its control characters shown escaped (an
    ESC in a run's content must not reach an operator's terminal through the log), and cut at
    a few hundred characters."""
    window = window_to_mask(text, _LOGGED_CHARS * 4)
    line = printable(" ".join(_redactor.redact_text(window).split()))
    return line if len(line) <= _LOGGED_CHARS else line[: _LOGGED_CHARS - 1] + "…"


def described(error: BaseException) -> str:
    """An unexpected error for a log line: its type and one masked line of its message.

    The message is the error's first argument when that is text, never the other arguments
    (an error raised with the values it failed on would print them) nor a repr.
    """
    first = error.args[0] if error.args else None
    message = one_line(first) if isinstance(first, str) else ""
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def gave_up(attempts: int, cause: str | None) -> str:
    """The error a run out of attempts ends with: the count and, if known, the last cause."""
    reason = f"gave up: {attempts} attempts to carry it on made no progress"
    return f"{reason}; the last one failed with {cause}" if cause else reason


class Recovery:
    """A worker's recovery: carries its lapsed runs on, ends those out of attempts ``failed``,
    and leaves the ones whose plan is not safe to a person.

    Args:
        worker: Whose runner, stores, limits, slots and counters it uses.
    """

    def __init__(self, worker: FleetMember) -> None:
        self._worker = worker
        self._lapsed: dict[str, str] = {}
        self._causes: dict[str, str] = {}
        self._left: dict[str, int] = {}
        """Runs found left for a person, with their last seq then: each pass passes them over
        until something is written to them (a person settling a call), rather than take a
        slot, ahead of new requests, to read them and leave them again."""
        self._foreign: dict[str, None] = {}
        """Runs of an agent or revision this worker does not carry that it said so for."""

    @property
    def owed(self) -> bool:
        """The last pass found lapsed runs it had no slot for: runs of a dead worker are
        waiting, and they go before new requests (`launch_lapsed` as slots free)."""
        return bool(self._lapsed)

    async def recover(self, partitions: Collection[int], *, adopt: bool = False) -> int:
        """Carry on the lapsed runs of ``partitions`` (as many as there are free slots) and,
        with ``adopt``, those of every other partition that were quiet for a lease ttl: a
        page of runs (by run id) at a time, in each page those of ``partitions`` first. The
        rest wait for slots (`launch_lapsed`) until the next pass looks again.

        Returns how many were launched.
        """
        worker = self._worker
        wanted = set(partitions)
        if not (wanted or adopt) or worker.draining:
            return 0
        count = worker.backends.log.partitions
        ttl_us = int(worker.runner.lease_policy.ttl.total_seconds() * 1_000_000)
        quiet_since = time.time_ns() // 1_000 - ttl_us
        launched = 0
        first = True
        # Each page's lapsed runs launched before the next is read: after an outage that left
        # very many runs lapsed, the first is carried on at once and the pass holds a page.
        pages = runs_in_pages(worker.backends.frontiers, size=_LISTED_AT_ONCE, statuses={"running"})
        async for rows in pages:
            found = await self._lapsed_of(rows, wanted, adopt, quiet_since, count)
            if first:
                self._lapsed, first = found, False
            else:
                self._lapsed.update(found)
            launched += await self.launch_lapsed()
            if self._worker.draining:  # began draining meanwhile
                break
        return launched

    async def _lapsed_of(
        self,
        rows: list[RunSummary],
        wanted: set[int],
        adopt: bool,
        quiet_since: int,
        count: int,
    ) -> dict[str, str]:
        """The runs of a page to carry on (those of ``wanted`` partitions first, then, with
        ``adopt``, the quiet ones of the others) whose lease lapsed, with their tenants."""
        worker = self._worker
        owned: list[RunSummary] = []
        others: list[RunSummary] = []
        for row in rows:
            if worker.carrying(row.run_id) or self._left.get(row.run_id) == row.last_seq:
                continue
            if not self._carries(row):
                continue
            if partition_for(row.run_id, count) in wanted:
                owned.append(row)
            elif adopt and row.updated_at <= quiet_since:
                others.append(row)
        lapsed: dict[str, str] = {}
        candidates = owned + others
        for start in range(0, len(candidates), _LEASE_CHECKS_AT_ONCE):
            chunk = candidates[start : start + _LEASE_CHECKS_AT_ONCE]
            # Asked together: one query on PostgreSQL and SQLite, one pipeline on Redis.
            leases = await current_leases(worker.backends.leases, [r.run_id for r in chunk])
            # A run held is looked at again after its ttl.
            lapsed.update((row.run_id, row.tenant) for row in chunk if row.run_id not in leases)
        return lapsed

    def _carries(self, row: RunSummary) -> bool:
        """Whether this worker carries the run's agent at the revision the run is pinned to.

        A run of another agent or revision is another worker's (one still deployed with it,
        during a rolling deploy): passed over, and said once, rather than take its lease and a
        slot ahead of new requests on every pass only to be refused and say so again. An agent
        with toolsets (MCP servers) is carried whatever the row says: its runs' revision covers
        the tools built for each run, known only once resume builds them.
        """
        agent = self._worker.agents.get(row.agent)
        if agent is not None and (agent.toolsets or agent.revision == row.revision):
            return True
        if row.run_id not in self._foreign:
            self._foreign[row.run_id] = None
            while len(self._foreign) > _FOREIGN_KEPT:
                del self._foreign[next(iter(self._foreign))]
            if agent is None:
                # Expected where workers carry different agents (a PostgreSQL fleet).
                _log.info(
                    "run %s: lapsed, left for a worker carrying agent %r",
                    printable(row.run_id),
                    row.agent,
                )
            else:
                _log.warning(
                    "run %s: lapsed, left for a worker carrying revision %s of agent %r (this "
                    "worker carries %s)",
                    printable(row.run_id),
                    printable(row.revision),
                    row.agent,
                    agent.revision,
                )
        return False

    async def launch_lapsed(self) -> int:
        """Launch the lapsed runs the last pass found, while there are free slots."""
        worker = self._worker
        launched = 0
        while self._lapsed and worker.free > 0 and not worker.draining:
            run_id = next(iter(self._lapsed))
            tenant = self._lapsed.pop(run_id)
            if worker.carrying(run_id) or worker.stopping(run_id):
                continue  # taken since the pass here, or being cancelled
            if await worker.backends.leases.current(run_id):
                continue  # taken by another worker since the pass
            if worker.free <= 0:  # filled while the lease store answered
                self._lapsed = {run_id: tenant, **self._lapsed}
                break
            if not worker.carrying(run_id):
                worker.launch(run_id, functools.partial(self.carry, run_id, tenant, recovery=True))
                launched += 1
        return launched

    async def carry(self, run_id: str, tenant: str, *, recovery: bool) -> bool:
        """Carry a run on unless it is settled, left for a person, or out of attempts."""
        worker = self._worker
        looked: Frontier | None = None  # the run as it was before this attempt, once ready
        try:
            ready = await self._ready_to_carry(run_id, tenant)
            if ready is None:
                return True
            agent, looked = ready
            async with worker.for_run(agent, run_id, tenant) as bound:
                # Each run of its chain gets its own view of the toolsets: one keeping state
                # per run (an MCP schema cache) must see the run it serves.
                result = await worker.runner.resume(
                    bound,
                    run_id,
                    tenant=tenant,
                    bind=lambda new: worker.for_run(agent, new, tenant),
                )
        except ResumeConflictError:
            worker.stats.conflicts += 1
            return True
        except IndeterminateToolCallError as exc:
            await self._leave_for_person(run_id, tenant, exc)
            return True
        except BudgetExceededError as exc:  # ended failed before a call over its budget
            _log.warning("run %s: %s", printable(run_id), one_line(str(exc)))
            worker.count("failed")
            return True
        except NothingToResumeError:
            # No such run for that tenant (another tenant's request, or one ahead of its
            # start): a refused request, not an attempt of the run, so no cause of it.
            raise
        except Exception as exc:
            # Not ready (an outage reading or ending the run) or stopped on purpose: no
            # attempt of the run failed.
            if looked is not None and not worker.stopping(run_id):
                await self._failed_attempt(looked, exc)
            raise
        self._causes.pop(run_id, None)
        if recovery:
            worker.stats.recovered += 1
        worker.count(result.status)
        return True

    async def _ready_to_carry(self, run_id: str, tenant: str) -> tuple[Agent, Frontier] | None:
        """The agent to carry the run on with and the run as it is, after the backoff its
        attempts call for; None if it must not be (settled, left for a person, unknown agent,
        or out of attempts: then it is ended ``failed``).
        """
        worker = self._worker
        frontier = await worker.runner.inspect(run_id, tenant=tenant)
        agent = worker.agents.get(frontier.agent)
        if needs_person(frontier):
            self._left.pop(run_id, None)
            self._left[run_id] = frontier.last_seq
            while len(self._left) > _LEFT_KEPT:
                del self._left[next(iter(self._left))]
            return None
        if frontier.status != "running":
            return None
        if agent is None:
            _log.warning("run %s: no agent %r here; left alone", printable(run_id), frontier.agent)
            return None
        # Counted by the fold (`Frontier.attempts`): the run is not read again from its first
        # event for every request to carry it on.
        attempts = frontier.attempts
        if attempts >= worker.max_attempts:
            await self._give_up(frontier, gave_up(attempts, self._causes.get(run_id)))
            return None
        if attempts and not await worker.sleep(worker.backoff_s * 2 ** (attempts - 1)):
            return None
        return agent, frontier

    async def _failed_attempt(self, looked: Frontier, exc: Exception) -> None:
        """Keep the cause an attempt failed with and, if that attempt was the last one the
        run had, end it ``failed`` now with the cause: another worker giving up later on would
        not know it (the cause is only in this process until it is written).

        An attempt that wrote nothing since ``looked`` (the run before it) failed before it
        claimed the run (an outage of the lease store or the log): it counted no attempt, and
        its error is no cause the run could give up with.
        """
        run_id, tenant = looked.run_id, looked.tenant
        try:
            frontier: Frontier | None = await self._worker.runner.inspect(run_id, tenant=tenant)
        except OnwardError as nested:  # cannot tell: kept as the cause, as any attempt's
            _log.warning("run %s: not ended yet: %s", printable(run_id), one_line(str(nested)))
            frontier = None
        if frontier is not None and frontier.last_seq == looked.last_seq:
            return
        cause = described(exc)
        self._causes.pop(run_id, None)
        self._causes[run_id] = cause
        while len(self._causes) > _CAUSES_KEPT:
            del self._causes[next(iter(self._causes))]
        if frontier is None:
            return
        try:
            if (
                frontier.status == "running"
                and not needs_person(frontier)
                and frontier.attempts >= self._worker.max_attempts
            ):
                await self._give_up(frontier, gave_up(frontier.attempts, cause))
        except OnwardError as nested:  # the next look gives up, with the cause kept here
            _log.warning("run %s: not ended yet: %s", printable(run_id), one_line(str(nested)))

    async def _leave_for_person(
        self, run_id: str, tenant: str, why: IndeterminateToolCallError | str
    ) -> None:
        """Tag the run ``needs-person``, counted once the tag is written: a run another worker
        holds meanwhile is its holder's to leave (and count), and a tag that failed is written
        by the next pass, which would count it again."""
        worker = self._worker
        _log.warning("run %s needs a person: %s", printable(run_id), one_line(str(why)))
        try:
            await worker.runner.leave_for_person(run_id, "indeterminate call", tenant=tenant)
        except ResumeConflictError:
            return
        worker.stats.needs_person += 1

    def _revision_of(self, frontier: Frontier) -> Agent | None:
        """The worker's agent of the run's revision, whose tools say which calls are
        retry-safe; None without one (then no call is)."""
        agent = self._worker.agents.get(frontier.agent or "")
        return agent if agent is not None and agent.revision == frontier.revision else None

    async def _give_up(self, frontier: Frontier, reason: str) -> None:
        """End the run ``failed`` with ``reason``, written under its lease; or, if a call of
        it may have taken effect (its attempts can run out before a plan refuses it: a status
        check that does not answer, an outage after the claim), leave it for a person, as a
        plan that is not safe is: ending it would hide that call. A cancel ask heard with the
        lease (one its last holder let go of unanswered) ends it ``cancelled`` instead, as
        its driver would have: its asker was told it ends so."""
        worker = self._worker
        runner = worker.runner
        status = "failed"
        async with Leaseholder(
            worker.backends.leases,
            frontier.run_id,
            tenant=frontier.tenant,
            holder=worker.name,
            policy=runner.lease_policy,
        ) as held:
            current = await runner.inspect(frontier.run_id, tenant=frontier.tenant)
            agent = Agent(name=current.agent or "unknown", instructions="")
            if current.status != "running":
                if current.status == "waiting":
                    # Driven to a person since: a cancel ask heard ends it, as its driver's
                    # last look would (`answer_ask_left`), or it would wait for an answer.
                    await held.raise_fence(current.fence)
                    await runner.answer_ask_left(HeldRun(agent, held, current, Conversation("")))
                else:
                    held.keep_ask()  # not ended here: a cancel ask heard is its next driver's
                self._causes.pop(frontier.run_id, None)
                return
            undecided = plan_resume(current, self._revision_of(current) or agent).indeterminate
            if not undecided:
                await held.raise_fence(current.fence)
                run = HeldRun(agent, held, current, Conversation(""))
                asked = held.cancel_asked
                if asked is None:
                    worker.stats.gave_up += 1
                    _log.warning("run %s: %s", printable(frontier.run_id), reason)
                    error = reason
                else:
                    _log.info(
                        "run %s: %s as it was to be given up on (%s)",
                        printable(frontier.run_id),
                        printable(asked.error),
                        reason,
                    )
                    status, error = "cancelled", asked.error
                finished = runner.writer.event(run, RunFinished, status=status, error=error)
                await runner.writer.append(run, [finished])
            else:
                # Left for a person, not ended: released answered, a cancel ask heard here
                # would be dropped, and the run carried on once the person settles the call.
                held.keep_ask()
        if undecided:
            calls = ", ".join(f"{c.call_id} ({c.tool})" for c in undecided)
            await self._leave_for_person(
                frontier.run_id, frontier.tenant, f"{calls} may have taken effect; {reason}"
            )
            self._causes.pop(frontier.run_id, None)
            return
        # Kept until the end is durable: a write that failed leaves it for the next pass.
        self._causes.pop(frontier.run_id, None)
        worker.count(status)
