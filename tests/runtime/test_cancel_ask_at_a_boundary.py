"""A cancel ask its holder heard is never lost at the boundary the run stops at.

A holder that heard the ask and let the run go without ending it (to wait on a person, or
carried into a new run under a new lease) would answer it by its release (`LeaseStore.release`
drops an ask the released lease carries), and the run would go on for whoever answers or resumes
it, although the person who asked was told it ends at its next boundary. Here the ask is made
while the run's first model call is in flight and heard when the lease is confirmed before its
tool call; the turn settles, and the run reaches its boundary with the ask heard.
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
from onward.eventlog.events import ApprovalRequested
from onward.runtime import Agent, AgentRunner, ScriptedProvider, ask, reply, tool
from onward.runtime.continuation import ContinuationPolicy, successor_id
from onward.runtime.providers import ModelReply

TENANT = "acme"
RUN = "r"


@dataclass
class AskingModel:
    """A scripted model that, during the run's first call, asks its holder to cancel it."""

    runner: AgentRunner | None = None
    inner: ScriptedProvider = field(
        default_factory=lambda: ScriptedProvider(
            [reply("", ToolCall(call_id="a", tool="step", args={})), reply("done")]
        )
    )
    asked: list[Any] = field(default_factory=list)

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        if not self.asked:
            assert self.runner is not None
            held = await self.runner.ask_to_cancel(RUN, tenant=TENANT, by="ann", why="stop it")
            self.asked.append(held)
        return await self.inner.complete(agent, messages)


@dataclass
class World:
    log: EventLog
    options: dict[str, Any]
    steps: list[str] = field(default_factory=list)

    def agent(self) -> Agent:
        @tool
        async def step(*, idempotency_key: str) -> str:
            self.steps.append(idempotency_key)
            return "stepped"

        return Agent(name="stepper", instructions="step", tools=[step])

    def runner(self, **options: Any) -> tuple[AgentRunner, AskingModel]:
        model = AskingModel()
        runner = AgentRunner(provider=model, log=self.log, **self.options, **options)
        model.runner = runner
        return runner, model


@pytest_asyncio.fixture(params=["memory", "sqlite"])
async def world(request: Any, tmp_path: Path) -> AsyncIterator[World]:
    async with embedded_log(request.param, tmp_path) as (log, options):
        yield World(log, options)


async def test_an_ask_heard_before_a_carry_ends_the_run_instead_of_carrying_it(
    world: World,
) -> None:
    # Started, answered, dispatched, completed, settled: five events, so the carry is due at
    # the boundary where the ask is to end the run.
    runner, model = world.runner(continuation=ContinuationPolicy(max_steps=5))

    result = await runner.run(world.agent(), "step once", tenant=TENANT, run_id=RUN)

    assert model.asked[0] is not None  # the run's holder was asked
    assert (result.run_id, result.status) == (RUN, "cancelled")
    assert result.error is not None
    assert "ann" in result.error
    assert model.inner.calls == 1  # no model call after the ask was heard
    assert len(world.steps) == 1


async def test_an_ask_heard_as_a_carry_starts_ends_the_run_instead_of_carrying_it(
    world: World,
) -> None:
    """Made while the turn's call runs, the ask is first heard when the carry confirms the
    lease, right before the new run would be started."""
    runner = AgentRunner(
        provider=ScriptedProvider(
            [reply("", ToolCall(call_id="a", tool="step", args={})), reply("done")]
        ),
        log=world.log,
        continuation=ContinuationPolicy(max_steps=5),
        **world.options,
    )

    @tool
    async def step(*, idempotency_key: str) -> str:
        world.steps.append(idempotency_key)
        await runner.ask_to_cancel(RUN, tenant=TENANT, by="ann", why="stop it")
        return "stepped"

    agent = Agent(name="stepper", instructions="step", tools=[step])

    result = await runner.run(agent, "step once", tenant=TENANT, run_id=RUN)

    assert (result.run_id, result.status) == (RUN, "cancelled")
    assert len(world.steps) == 1
    assert list(await world.log.read_run(successor_id(RUN))) == []  # no run was started


async def test_an_ask_heard_before_a_pause_ends_the_run_instead_of_waiting(
    world: World,
) -> None:
    runner, model = world.runner()
    options = {"mode": "collaborative", "checkpoints": ["after_tool_result"]}

    result = await runner.run(
        world.agent(), "step once", tenant=TENANT, run_id=RUN, options=options
    )

    assert model.asked[0] is not None
    assert result.status == "cancelled"
    assert result.waiting_on is None
    frontier = await runner.inspect(RUN, tenant=TENANT)
    assert (frontier.status, frontier.waiting_on) == ("cancelled", None)


async def test_an_ask_heard_before_a_question_ends_the_run_instead_of_waiting(
    world: World,
) -> None:
    """Heard before the turn's call, which then stops at a question for a person: the run
    ends rather than wait for an answer that would carry it on."""
    runner, model = world.runner()

    @tool
    async def step(*, idempotency_key: str) -> str:
        world.steps.append(idempotency_key)
        return f"stepped {ask('how far?', schema=int)}"

    agent = Agent(name="stepper", instructions="step", tools=[step])

    result = await runner.run(agent, "step once", tenant=TENANT, run_id=RUN)

    assert model.asked[0] is not None
    assert (result.status, result.waiting_on) == ("cancelled", None)
    assert len(world.steps) == 1


async def test_an_ask_made_as_the_run_pauses_ends_the_run_instead_of_waiting(
    world: World,
) -> None:
    """Made as the run writes its pause, after the last renewal: the holder was asked (Ann is
    told it ends at its next boundary), so the run must end rather than wait for a person
    with the ask dropped as its lease is let go."""
    runner, model = world.runner()
    model.asked.append(None)  # no ask during the model call
    append = runner.writer.append
    asked: list[Any] = []

    async def asked_as_it_pauses(run: Any, events: Sequence[Any]) -> None:
        await append(run, events)
        if any(isinstance(e, ApprovalRequested) for e in events):
            asked.append(await runner.ask_to_cancel(RUN, tenant=TENANT, by="ann"))

    runner.writer.append = asked_as_it_pauses  # type: ignore[method-assign]
    options = {"mode": "collaborative", "checkpoints": ["after_tool_result"]}

    result = await runner.run(
        world.agent(), "step once", tenant=TENANT, run_id=RUN, options=options
    )

    assert asked[0] is not None  # the run's holder was asked
    assert (result.status, result.waiting_on) == ("cancelled", None)
    frontier = await runner.inspect(RUN, tenant=TENANT)
    assert frontier.status == "cancelled"
    assert "ann" in (frontier.error or "")
