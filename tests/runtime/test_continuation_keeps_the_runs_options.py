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

import pytest
import pytest_asyncio
from support.appapi import agents, provider, script
from support.runners import embedded_log

import onward
from onward.eventlog import Message, Position, RunStarted, StoredEvent, ToolCall
from onward.eventlog.base import EventLog
from onward.projections.frontier import Frontier, fold
from onward.runtime import Agent, AgentRunner, CheckpointPolicy, ScriptedProvider, reply, tool
from onward.runtime.application.messages import RunMessage
from onward.runtime.continuation import ContinuationPolicy, carried_options
from onward.runtime.options import ExecutionMode, Options, recorded_options
from onward.runtime.providers import ModelReply
from onward.runtime.settings import Settings

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


def _checkpoints(messages: Sequence[RunMessage]) -> list[tuple[int, str | None]]:
    return [(m.iteration, m.boundary) for m in messages if m.is_checkpoint]


@pytest.mark.parametrize(
    "options",
    [
        {"checkpoints": ["after_tool_result"]},
        {"checkpoints": ["after_model_call"], "checkpoint_frequency": 2},
        {"checkpoints": []},
    ],
    ids=["one-boundary", "one-boundary-every-2nd-step", "none"],
)
async def test_an_autonomous_run_streams_the_checkpoints_it_chose_across_its_carries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]
) -> None:
    """An autonomous run's checkpoints are not pauses, but they are what the application
    asked to be shown: the runs it is carried into stream the same ones, not every boundary."""
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        whole = app.backends.runner(ScriptedProvider(script))
        await whole.run(
            agents["stepper"], "work", tenant=app.tenant, run_id="whole", options=options
        )
        expected = await app.resume("whole", timeout=5).collect()
        runner = app.backends.runner(ScriptedProvider(script))
        runner.continuation = ContinuationPolicy(max_steps=4)
        last = await runner.run(
            agents["stepper"], "work", tenant=app.tenant, run_id="long", options=options
        )
        assert (last.status, last.run_id) == ("completed", "long~c3")
        seen: list[RunMessage] = []
        for run_id in ("long", "long~c1", "long~c2", "long~c3"):
            seen += await app.resume(run_id, timeout=5).collect()
    assert _checkpoints(seen) == _checkpoints(expected)
    assert seen[-1].output == expected[-1].output


@pytest.mark.parametrize(
    "options",
    [
        Options(),
        Options(
            user="ann",
            checkpoints=CheckpointPolicy(after_model_call=False),
            checkpoint_frequency=3,
            max_iterations=5,
            budget_micros=700,
            tenant_budget_micros=9000,
        ),
        Options(mode=ExecutionMode.COLLABORATIVE, checkpoints=CheckpointPolicy(False, True, False)),
        Options(mode=ExecutionMode.COLLABORATIVE, user="bo", checkpoint_frequency=2),
    ],
    ids=["defaults", "autonomous-every-option", "collaborative-one-pause", "collaborative"],
)
def test_a_carry_names_every_option_its_run_was_started_with(options: Options) -> None:
    agent = Agent(name="stepper", instructions="step", max_iterations=8)
    recorded = recorded_options(options.recorded(), agent)
    started = RunStarted(
        run_id=RUN, tenant=TENANT, seq=1, fence=1, agent="stepper", revision="r", options=recorded
    )
    frontier = fold(Frontier.empty(RUN, TENANT), StoredEvent(Position(0, 0), started))

    assert carried_options(frontier) == recorded


def test_a_carry_from_a_row_stored_before_it_kept_checkpoints_keeps_the_pauses() -> None:
    """A row folded before the frontier kept a run's checkpoints has its pauses only: a
    collaborative run carried on from it still pauses there."""
    frontier = Frontier(run_id=RUN, tenant=TENANT, pause_at=("after_tool_result",))

    assert carried_options(frontier) == {
        "mode": "collaborative",
        "checkpoints": ["after_tool_result"],
    }
