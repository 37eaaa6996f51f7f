"""The Resumer's order of work and the ExecutionManager's view, on the in-memory backends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import cast

import pytest
from support.workers import CountingLog

from onward.errors import (
    InvalidInputError,
    NothingToResumeError,
    ResumeConflictError,
    RevisionMismatchError,
)
from onward.eventlog import (
    Event,
    MemoryEventLog,
    Position,
    ResumePlanned,
    RunClaimed,
    ToolCall,
    ToolCompleted,
)
from onward.projections.base import FrontierStore, StoredFrontier
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.log_projector import LogProjector
from onward.projections.memory import MemoryFrontierStore
from onward.runtime.agent import Agent
from onward.runtime.leases import Leaseholder, MemoryLeaseStore, RunLease
from onward.runtime.manager import ExecutionManager, pending_ids
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.resumer import CarriedRun, Resumer
from onward.runtime.runner import AgentRunner
from onward.runtime.tools import tool
from onward.testing.eventlog import WrappedEventLog
from onward.testing.leases import WrappedLeaseStore

TENANT = "acme"


@tool(retry_safe=True)  # dispatched with the answer: a resume after it calls it again
async def search(query: str, *, idempotency_key: str) -> str:
    return query


@tool(requires_approval=True)
async def pay(amount: int, *, idempotency_key: str) -> str:
    return "paid"


AGENT = Agent(name="a", instructions="", tools=[search, pay])


class Stop(BaseException):
    pass


class StopAfterAnswer:
    async def appended(self, events: Sequence[Event]) -> None:
        if any(type(e).__name__ == "ModelAnswered" for e in events):
            raise Stop

    async def tool_returned(self, call_id: str) -> None:
        return None

    async def before_model_call(self) -> None:
        return None


def provider() -> ScriptedProvider:
    return ScriptedProvider(
        [reply("", ToolCall(call_id="s", tool="search", args={"query": "x"})), reply("ok")]
    )


async def interrupted_run(log: MemoryEventLog, leases: MemoryLeaseStore, run_id: str = "r") -> None:
    """A run whose worker stopped right after the model answered and its call was dispatched
    (its lease is given back)."""
    with pytest.raises(Stop):
        await AgentRunner(
            provider=provider(), log=log, leases=leases, observer=StopAfterAnswer()
        ).run(AGENT, "go", tenant=TENANT, run_id=run_id)


@contextlib.asynccontextmanager
async def claiming(
    resumer: Resumer, agent: Agent, run_id: str, *, worker: str
) -> AsyncIterator[CarriedRun]:
    """Claim a run as resume does: hold its lease first, then read and claim under it."""
    async with Leaseholder(
        resumer.leases, run_id, tenant=TENANT, holder=worker, policy=resumer.policy
    ) as held:
        yield await resumer.claim(agent, held, worker=worker)


async def claimed(resumer: Resumer, agent: Agent, run_id: str, *, worker: str) -> CarriedRun:
    """What a claim found; the lease is handed back after."""
    async with claiming(resumer, agent, run_id, worker=worker) as carried:
        return carried


async def test_the_loser_of_a_resume_reads_nothing() -> None:
    log, leases = MemoryEventLog(), MemoryLeaseStore()
    await interrupted_run(log, leases)
    async with claiming(Resumer(log, leases), AGENT, "r", worker="w1") as winner:
        counting = CountingLog(log)
        with pytest.raises(ResumeConflictError) as caught:
            await claimed(Resumer(counting, leases), AGENT, "r", worker="w2")
    assert caught.value.holder == "w1"
    assert counting.reads == 0
    assert winner.claimed
    assert winner.lease.fence == 2


async def test_the_tail_is_read_from_the_frontier_rows_position() -> None:
    log, leases, store = MemoryEventLog(), MemoryLeaseStore(), MemoryFrontierStore()
    await interrupted_run(log, leases)
    await LogProjector(log, FrontierProjection(store, log)).catch_up()
    carried = await claimed(Resumer(log, leases, store), AGENT, "r", worker="w")
    assert carried.tail_events == 1  # only the claim itself
    assert [c.call_id for c in carried.plan.to_dispatch] == ["s"]
    assert set(carried.timings_ms) >= {"frontier", "tail", "claim", "plan", "total"}


async def test_a_superseded_writer_slipping_in_before_the_claim_is_folded() -> None:
    log, leases = MemoryEventLog(), MemoryLeaseStore()
    await interrupted_run(log, leases)
    history = await log.read_run("r")
    last = history[-1].event
    # The old holder records a result after the new holder's lease, before its claim lands.
    await log.append(
        [
            ToolCompleted(
                run_id="r",
                tenant=TENANT,
                seq=last.seq + 1,
                fence=last.fence,
                call_id="s",
                result="x",
            )
        ]
    )
    carried = await claimed(Resumer(log, leases), AGENT, "r", worker="new")
    assert [c.call_id for c in carried.plan.completed] == ["s"]
    assert carried.frontier.fence == carried.lease.fence == 2


class SlipsBeforeTheClaim(WrappedEventLog):
    """A log on which the old holder's result lands after the new holder read the run and
    before its claim, and a projector stores the row right then: the claim then carries a seq
    the slipped result already took, and is counted as the next one."""

    def __init__(self, inner: MemoryEventLog, projector: LogProjector, slipped: Event) -> None:
        super().__init__(inner)
        self.projector = projector
        self.slipped: Event | None = slipped

    async def append(self, events: Sequence[Event]) -> list[Position]:
        if self.slipped is not None and isinstance(events[0], RunClaimed):
            await self.inner.append([self.slipped])
            await self.projector.catch_up()
            self.slipped = None
        return await self.inner.append(events)


async def test_a_claim_counted_past_a_slipped_event_is_no_hole_for_the_next_reader() -> None:
    """The claim carries the seq the superseded writer's event already took; the fold counts
    it as the next seq and the new holder numbers its events after that. A reader whose row
    ends at the slipped event had taken the tail (the claim's old seq, then seqs one past the
    row's next) for a hole in the run's history, and refused to resume or read the run."""
    log, leases, store = MemoryEventLog(), MemoryLeaseStore(), MemoryFrontierStore()
    await interrupted_run(log, leases)
    last = (await log.read_run("r"))[-1].event
    slipped = ToolCompleted(
        run_id="r", tenant=TENANT, seq=last.seq + 1, fence=last.fence, call_id="s", result="x"
    )
    projector = LogProjector(log, FrontierProjection(store, log))
    slipping = SlipsBeforeTheClaim(log, projector, slipped)
    async with claiming(Resumer(slipping, leases, store), AGENT, "r", worker="w2") as carried:
        assert carried.frontier.last_seq == last.seq + 2  # the slipped result, then the claim
        # The new holder writes once more, then dies before the projector folds its claim.
        planned = ResumePlanned(
            run_id="r",
            tenant=TENANT,
            seq=carried.frontier.last_seq + 1,
            fence=carried.lease.fence,
            replayed=["s"],
        )
        await log.append([planned])

    frontier = await Resumer(log, leases, store).read("r", tenant=TENANT)
    assert frontier.last_seq == last.seq + 3
    assert frontier.refused == 0
    runner = AgentRunner(provider=provider(), log=log, leases=leases, frontiers=store)
    result = await runner.resume(AGENT, "r", tenant=TENANT)
    assert result.status == "completed"


async def test_nothing_to_resume_and_a_wrong_revision_give_the_lease_back() -> None:
    log, leases = MemoryEventLog(), MemoryLeaseStore()
    with pytest.raises(NothingToResumeError):
        await claimed(Resumer(log, leases), AGENT, "nope", worker="w")
    assert await leases.current("nope") is None
    await interrupted_run(log, leases)
    other = Agent(name="a", instructions="changed", tools=[search, pay])
    with pytest.raises(RevisionMismatchError):
        await claimed(Resumer(log, leases), other, "r", worker="w")
    assert await leases.current("r") is None


async def test_a_finished_run_is_not_claimed() -> None:
    log, leases = MemoryEventLog(), MemoryLeaseStore()
    await AgentRunner(provider=provider(), log=log, leases=leases).run(
        AGENT, "go", tenant=TENANT, run_id="r"
    )
    before = len(await log.read_run("r"))
    carried = await claimed(Resumer(log, leases), AGENT, "r", worker="w")
    assert not carried.claimed
    assert len(await log.read_run("r")) == before


async def test_the_manager_lists_runs_waiting_on_people_and_runs_nobody_holds() -> None:
    log, leases, store = MemoryEventLog(), MemoryLeaseStore(), MemoryFrontierStore()
    await interrupted_run(log, leases, "interrupted")
    waiting = ScriptedProvider(
        [reply("", ToolCall(call_id="p", tool="pay", args={"amount": 3})), reply("ok")]
    )
    await AgentRunner(provider=waiting, log=log, leases=leases).run(
        AGENT, "go", tenant=TENANT, run_id="waiting"
    )
    await AgentRunner(provider=provider(), log=log, leases=leases).run(
        AGENT, "go", tenant=TENANT, run_id="done"
    )
    await interrupted_run(log, leases, "held")
    await leases.acquire("held", tenant=TENANT, holder="w9", ttl_s=60)
    await LogProjector(log, FrontierProjection(store, log)).catch_up()
    manager = ExecutionManager(store, leases)
    pending = await manager.list_pending(tenant=TENANT)
    assert sorted(pending_ids(pending)) == ["interrupted", "waiting"]
    assert {s.summary.run_id: s.attention for s in pending} == {
        "interrupted": "interrupted",
        "waiting": "waiting_on_approval",
    }
    held = await manager.get_status("held")
    assert held.attention == "held"
    assert held.lease is not None
    assert held.lease.holder == "w9"
    assert (await manager.get_status("done")).attention is None
    with pytest.raises(NothingToResumeError):
        await manager.get_status("missing")


async def test_a_lease_store_behind_the_log_raises_its_fence_above_the_logs() -> None:
    log = MemoryEventLog()
    await interrupted_run(log, MemoryLeaseStore())
    in_log = (await Resumer(log, MemoryLeaseStore()).read("r", tenant=TENANT)).fence
    wiped = MemoryLeaseStore()  # a store that never saw the run: it hands out fence 1
    carried = await claimed(Resumer(log, wiped), AGENT, "r", worker="w")
    assert carried.lease.fence > in_log
    assert carried.frontier.fence == carried.lease.fence  # the claim is counted, not refused
    assert carried.frontier.refused == 0
    later = await wiped.acquire("r", tenant=TENANT, holder="w2", ttl_s=60)
    assert later.fence > carried.lease.fence  # the store remembers the raised fence


async def test_the_tail_skips_other_runs_the_projector_already_folded() -> None:
    log, leases, store = MemoryEventLog(partitions=1), MemoryLeaseStore(), MemoryFrontierStore()
    await interrupted_run(log, leases)
    for n in range(30):  # a busy partition: other runs write after this one stopped
        await AgentRunner(provider=provider(), log=log).run(
            AGENT, "go", tenant=TENANT, run_id=f"o{n}"
        )
    await LogProjector(log, FrontierProjection(store, log)).catch_up()
    row = await store.get("r")
    assert row is not None
    end = (await log.bounds(0)).end
    recording = CountingLog(log)
    carried = await claimed(Resumer(recording, leases, store), AGENT, "r", worker="w")
    assert end > row.summary.through_offset + 1
    # The projector folded the partition to its end and the claim landed there: the log is
    # not read at all.
    assert recording.starts == []
    assert carried.tail_events == 1


async def test_a_reused_run_id_is_refused_with_leases_too() -> None:
    log, leases = MemoryEventLog(), MemoryLeaseStore()
    runner = AgentRunner(provider=provider(), log=log, leases=leases)
    await runner.run(AGENT, "go", tenant=TENANT, run_id="r")
    counting = CountingLog(log)
    again = AgentRunner(provider=provider(), log=counting, leases=leases)
    with pytest.raises(InvalidInputError, match="already exists"):
        await again.run(AGENT, "go", tenant=TENANT, run_id="r")
    fresh = AgentRunner(provider=provider(), log=counting, leases=leases)
    reads = counting.reads
    await fresh.run(AGENT, "go", tenant=TENANT, run_id="new")
    assert counting.reads == reads  # a new id is proven new by the lease store alone


class FoldsDuringRead:
    """A reader's view of a store whose projector stores a batch while the reader's query for
    a run's row is in flight: a positions query asked meanwhile sees that batch (as a query on
    another connection would), one asked before the row sees the store as it was."""

    def __init__(self, store: MemoryFrontierStore, projector: LogProjector) -> None:
        self.store = store
        self.projector = projector
        self.row_asked = False
        self.stored = asyncio.Event()

    async def get(self, run_id: str) -> StoredFrontier | None:
        self.row_asked = True
        row = await self.store.get(run_id)
        await self.projector.catch_up()
        self.stored.set()
        return row

    async def positions(self, consumer: str) -> dict[int, int]:
        if self.row_asked:
            await self.stored.wait()
        return await self.store.positions(consumer)


async def test_a_projector_storing_between_the_reads_of_a_resume_loses_no_event() -> None:
    log, leases, store = MemoryEventLog(partitions=1), MemoryLeaseStore(), MemoryFrontierStore()
    await interrupted_run(log, leases)  # its events are in the log, none folded yet
    view = FoldsDuringRead(store, LogProjector(log, FrontierProjection(store, log)))
    frontier = await Resumer(log, leases, cast("FrontierStore", view)).read("r", tenant=TENANT)
    assert (frontier.last_seq, frontier.iteration) == (3, 1)


class LeaseFirst(WrappedLeaseStore):
    """A lease store that notes how many reads of the log came before each acquisition."""

    def __init__(self, inner: MemoryLeaseStore, log: CountingLog) -> None:
        super().__init__(inner)
        self.log = log
        self.reads_before: list[int] = []

    async def acquire(self, run_id: str, *, tenant: str, holder: str, ttl_s: float) -> RunLease:
        self.reads_before.append(self.log.reads)
        return await super().acquire(run_id, tenant=tenant, holder=holder, ttl_s=ttl_s)


async def test_agent_runner_resume_reads_the_run_once_and_only_under_its_lease() -> None:
    """The public entry point: the lease comes first, then one read of the run (its row, here
    none yet, and one tail read); the claim landing right after the tail is not read back."""
    log, store = MemoryEventLog(), MemoryFrontierStore()
    await interrupted_run(log, MemoryLeaseStore())
    counting = CountingLog(log)
    leases = LeaseFirst(MemoryLeaseStore(), counting)
    runner = AgentRunner(provider=provider(), log=counting, leases=leases, frontiers=store)
    result = await runner.resume(AGENT, "r", tenant=TENANT)
    assert result.status == "completed"
    assert leases.reads_before == [0]
    assert counting.reads == 1
