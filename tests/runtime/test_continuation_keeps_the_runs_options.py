"""A run carried into a new run keeps the options it was started with: its bound on model calls
(which spans the chain, as its iteration count does), its pauses for a person, its budget and
the person it is for. Without them the successor would run on to the agent's own bound, stop
pausing, or spend without the budget it was given.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest_asyncio
from support.runners import embedded_log

from onward.eventlog import Message, ToolCall
from onward.eventlog.base import EventLog
from onward.runtime import Agent, AgentRunner, ScriptedProvider, reply, tool
from onward.runtime.continuation import ContinuationPolicy
from onward.runtime.providers import ModelReply

TENANT = "acme"
RUN = "r"
POLICY = ContinuationPolicy(max_steps=5)
"""Due after every turn: started (or claimed and planned), answered, dispatched, completed,
settled."""


def stepping(messages: Sequence[Message]) -> ModelReply:
    """A model that never stops asking for another step."""
    turn = sum(1 for m in messages if m.role == "assistant")
    return reply("", ToolCall(call_id=f"s{turn}", tool="step", args={}))


@dataclass
class World:
    log: EventLog
    options: dict[str, Any]
    steps: list[str] = field(default_factory=list)
    model: ScriptedProvider = field(default_factory=lambda: ScriptedProvider(stepping))

    def agent(self) -> Agent:
        @tool
        async def step(*, idempotency_key: str) -> str:
            self.steps.append(idempotency_key)
            return "stepped"

        return Agent(name="stepper", instructions="step", tools=[step], max_iterations=8)

    def runner(self) -> AgentRunner:
        return AgentRunner(provider=self.model, log=self.log, continuation=POLICY, **self.options)


@pytest_asyncio.fixture(params=["memory", "sqlite"])
async def world(request: Any, tmp_path: Path) -> AsyncIterator[World]:
    async with embedded_log(request.param, tmp_path) as (log, options):
        yield World(log, options)


async def test_a_runs_own_bound_on_model_calls_spans_its_continuations(world: World) -> None:
    result = await world.runner().run(
        world.agent(), "step", tenant=TENANT, run_id=RUN, options={"max_iterations": 3}
    )

    assert result.run_id != RUN  # carried on at least once
    assert (result.status, result.error) == ("failed", "stopped after max_iterations=3")
    assert world.model.calls == 3
    assert len(world.steps) == 3


async def test_a_carried_run_keeps_the_person_it_is_for(world: World) -> None:
    result = await world.runner().run(
        world.agent(), "step", tenant=TENANT, run_id=RUN, options={"user": "ann"}
    )

    assert result.run_id != RUN
    frontier = await world.runner().inspect(result.run_id, tenant=TENANT)
    assert frontier.user_id == "ann"


async def test_a_collaborative_run_pauses_at_its_checkpoint_before_it_is_carried_on(
    world: World,
) -> None:
    """The run reaches its checkpoint after a model call as the carry becomes due: it waits
    for a person before the turn's calls are made, in this run; once answered, the turn is
    carried on with the answer and made once, and the next checkpoint is waited at again."""
    agent = world.agent()
    runner = AgentRunner(
        provider=world.model,
        log=world.log,
        continuation=ContinuationPolicy(max_steps=2),
        **world.options,
    )
    options = {"mode": "collaborative", "checkpoints": ["after_model_call"]}

    result = await runner.run(agent, "step", tenant=TENANT, run_id=RUN, options=options)

    assert (result.run_id, result.status) == (RUN, "waiting")
    assert result.waiting_on is not None
    assert world.steps == []

    await runner.approve(RUN, result.waiting_on, tenant=TENANT, by="ann")
    result = await runner.resume(agent, RUN, tenant=TENANT)

    assert result.run_id != RUN
    assert result.status == "waiting"
    assert len(world.steps) == 1
