"""On PostgreSQL alone, a step's checkpoint is folded beside the run's next step, not before it.

There every process folds what it appends, and a boundary's fold is a dozen statements the run
needs nothing from. The run goes on while it is stored; what a reader of the row must see at
once (the run's start and end, a wait on a person) is folded before its append returns, and the
run's holder waits for the folds under way before it lets the run go. Each test holds the
frontier store's writes back at a known moment.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest
import pytest_asyncio
from support.held_writes import HeldWrites, postgres_backends

from onward.eventlog import Message, ToolCall
from onward.runtime import Agent, ModelReply, reply, tool
from onward.runtime.backends import Backends

TENANT = "acme"


@pytest_asyncio.fixture
async def backends(database_url: str, pg_schema: str) -> AsyncIterator[Backends]:
    async with postgres_backends(database_url, pg_schema) as opened:
        yield opened


async def test_a_run_goes_on_while_its_step_checkpoint_is_stored(backends: Backends) -> None:
    held = HeldWrites(backends)
    seen: list[int] = []

    @tool(retry_safe=True)
    async def look(*, idempotency_key: str) -> str:
        # The model's answer is durable and its checkpoint is being stored, held back: the
        # call runs meanwhile, and the row still shows the run as it started.
        await asyncio.wait_for(held.waiting.wait(), 10)
        row = await backends.frontiers.get(run_id)
        assert row is not None
        assert row.frontier is not None
        seen.append(row.frontier.last_seq)
        held.go.set()
        return "nothing yet"

    class ArmsAfterTheStart:
        calls = 0

        async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
            self.calls += 1
            if self.calls == 1:
                held.armed = True  # the next store write is the step's checkpoint
                return reply("", ToolCall(call_id="c1", tool="look"))
            return reply("done")

    run_id = "beside"
    runner = backends.runner(ArmsAfterTheStart())
    agent = Agent(name="looker", instructions="look", tools=[look])
    result = await asyncio.wait_for(runner.run(agent, "go", tenant=TENANT, run_id=run_id), 30)

    assert result.status == "completed"
    assert seen == [1], "the tool ran only once the step's checkpoint was stored"
    row = await backends.frontiers.get(run_id)
    assert row is not None
    assert row.frontier is not None
    assert row.frontier.status == "completed"
    stored = await backends.log.read_run(run_id)
    assert row.frontier.last_seq == max(s.event.seq for s in stored)


async def test_a_holder_lets_a_run_go_only_once_its_checkpoints_are_stored(
    backends: Backends,
) -> None:
    """The model fails right after a step whose checkpoints are held back: the run's lease is
    still held until they are stored, and then the row shows the step."""
    held = HeldWrites(backends)
    run_id = "dies"

    class ModelDownError(Exception):
        pass

    @tool(retry_safe=True)
    async def look(*, idempotency_key: str) -> str:
        return "nothing yet"

    class FailsAtTheSecondCall:
        calls = 0

        async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
            self.calls += 1
            if self.calls == 1:
                held.armed = True  # the step's checkpoints are held back from here on
                return reply("", ToolCall(call_id="c1", tool="look"))
            raise ModelDownError

    runner = backends.runner(FailsAtTheSecondCall())
    agent = Agent(name="looker", instructions="look", tools=[look])
    running = asyncio.create_task(runner.run(agent, "go", tenant=TENANT, run_id=run_id))
    await asyncio.wait_for(held.waiting.wait(), 10)
    await asyncio.sleep(0.5)  # the model has failed; the holder waits on the held checkpoints
    assert not running.done()
    assert await backends.leases.current(run_id) is not None
    held.go.set()
    with pytest.raises(ModelDownError):
        await asyncio.wait_for(running, 10)
    row = await backends.frontiers.get(run_id)
    assert row is not None
    assert row.frontier is not None
    stored = await backends.log.read_run(run_id)
    assert row.frontier.last_seq == max(s.event.seq for s in stored)
    assert await backends.leases.current(run_id) is None
