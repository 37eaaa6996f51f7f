"""A run asked to cancel whose end cannot be written at once still ends, once.

The ask lives with the holding that heard it, so the holder does not give up on a failed end:
it reads the log back (the append may have landed and lost its answer) and writes the end
again only if it is not there, for as long as its lease holds. Embedded SQLite, and Kafka +
PostgreSQL + Redis, each with an event log that fails the end's append in one of the ways a
real server does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from pathlib import Path

import pytest
import pytest_asyncio
from support.compaction_world import World, world_of
from support.failing_ends import EndFails
from support.servers import KafkaServers

from onward.errors import FencedError
from onward.eventlog import Message, RunFinished, ToolCall
from onward.eventlog.base import EventLog, SequenceGuard
from onward.runtime import Agent, ModelReply, reply, tool
from onward.runtime.leases.base import LeasePolicy
from onward.runtime.runner import AgentRunner

TENANT = "acme"


@tool(retry_safe=True)
async def look(*, idempotency_key: str) -> str:
    return "nothing yet"


AGENT = Agent(name="looper", instructions="go on", tools=[look])
POLICY = LeasePolicy(ttl=timedelta(seconds=1.5))


@pytest_asyncio.fixture
async def world(clustered: KafkaServers | None, tmp_path: Path) -> AsyncIterator[World]:
    async with world_of(clustered, tmp_path) as opened:
        yield opened


class AsksToCancel:
    """A model that, at its second call, asks its own run's holder to cancel the run and then
    takes an hour to answer: the holder hears the ask at its next renewal and abandons it."""

    def __init__(self, run_id: str) -> None:
        self.run_id, self.calls = run_id, 0
        self.runner: AgentRunner | None = None

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        self.calls += 1
        if self.calls == 1:
            return reply("", ToolCall(call_id="c1", tool="look"))
        assert self.runner is not None
        holding = await self.runner.ask_to_cancel(
            self.run_id, tenant=TENANT, by="ops", why="runaway"
        )
        assert holding is not None
        await asyncio.sleep(3600)
        raise AssertionError("the call was not abandoned")


def asked_to_cancel(world: World, log: EventLog, run_id: str) -> AgentRunner:
    """A runner on ``log`` whose model asks to cancel ``run_id`` at its second call."""
    model = AsksToCancel(run_id)
    runner = AgentRunner(
        provider=model,
        log=log,
        frontiers=world.frontiers,
        leases=world.leases,
        checkpoint_inline=world.inline,
        compaction=world.store,
        lease_policy=POLICY,
        worker="w1",
    )
    model.runner = runner
    return runner


async def ends(world: World, run_id: str) -> list[tuple[str, str | None]]:
    """Every `RunFinished` of the run in the log, and which of them count."""
    stored = await world.log.read_run(run_id)
    counted = SequenceGuard().admit_all(stored)
    assert [s.event for s in counted if isinstance(s.event, RunFinished)] == [
        s.event for s in stored if isinstance(s.event, RunFinished)
    ], "an end in the log was refused"
    return [(s.event.status, s.event.error) for s in counted if isinstance(s.event, RunFinished)]


@pytest.mark.parametrize(
    ("failures", "landing", "reads_failing"),
    [
        (1, 1, 0),  # stored, answer lost: found by the read-back, not written again
        (1, 0, 0),  # not stored: written again after the read-back
        (3, 1, 2),  # stored, and the log unreadable for two more looks
        (3, 0, 1),  # not stored three times over, the log unreadable once
    ],
    ids=["landed", "lost", "landed-log-down", "lost-thrice"],
)
async def test_an_asked_for_end_is_written_once_whatever_its_first_append_said(
    world: World, failures: int, landing: int, reads_failing: int, caplog: pytest.LogCaptureFixture
) -> None:
    run_id = f"doubt-{failures}-{landing}-{reads_failing}"
    log = EndFails(world.log, failures=failures, landing=landing, reads_failing=reads_failing)
    runner = asked_to_cancel(world, log, run_id)
    result = await asyncio.wait_for(runner.run(AGENT, "go", tenant=TENANT, run_id=run_id), 60)
    assert result.status == "cancelled"
    assert await ends(world, run_id) == [("cancelled", "cancelled by ops: runaway")]
    assert "may not be in the log" in caplog.text
    if not world.inline:
        await world.fold()
    row = await world.frontiers.get(run_id)
    assert row is not None
    assert row.frontier is not None
    assert (row.frontier.status, row.frontier.error) == ("cancelled", "cancelled by ops: runaway")
    # The lease was let go with the run ended: nobody holds it.
    assert await world.leases.current(run_id) is None


async def test_an_end_that_cannot_be_written_before_the_lease_lapses_stops_the_drive(
    world: World,
) -> None:
    """A log down for longer than the lease: the holder stops (the ask went with its holding,
    as before) rather than write after another worker may have taken the run."""
    run_id = "doubt-forever"
    log = EndFails(world.log, failures=10**6, landing=0, reads_failing=10**6)
    # The lease store is up, so the renewals would keep the lease: another worker takes it.
    runner = asked_to_cancel(world, log, run_id)
    task = asyncio.create_task(runner.run(AGENT, "go", tenant=TENANT, run_id=run_id))
    await asyncio.wait_for(log.end_tried.wait(), 30)
    current = await world.leases.current(run_id)
    assert current is not None
    await world.leases.release(current)
    assert (await world.leases.acquire(run_id, tenant=TENANT, holder="w2", ttl_s=30)).fence
    with pytest.raises(FencedError):
        await asyncio.wait_for(task, 30)
    assert await ends(world, run_id) == []
