"""A fleet `CancelRun` of the run a worker's task was carried on into: the task was launched
for the run it started as, and the cancel names the run it goes on as (the one `onward cancel`
is told to cancel). It must stop at its next boundary as any cancelled run does, not make its
next model call and end as if no cancel had come."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
import pytest_asyncio
from support.fault_runs import until

from onward.eventlog import Message, ToolCall
from onward.projections.frontier import Frontier
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.continuation import ContinuationPolicy, successor_id
from onward.runtime.fleet.requests import CancelRun, StartRun
from onward.runtime.fleet.worker import Worker
from onward.runtime.providers import ModelReply, ScriptedProvider, reply
from onward.runtime.settings import Settings
from onward.runtime.tools import tool

TENANT = "acme"
RUN = "r"


class Gated:
    """The agent's tool and model: ``b`` is looked up once ``go`` is set (the call in flight as
    the cancel comes); the model looks ``a`` up, then ``b``, then answers ``done``. ``calls``
    counts the model's calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.waiting = asyncio.Event()
        self.go = asyncio.Event()

        @tool
        async def look(q: str, *, idempotency_key: str) -> str:
            if q == "b":
                self.waiting.set()
                await self.go.wait()
            return q

        self.agent = Agent(name="looker", instructions="look", tools=[look])

    def __call__(self, messages: Sequence[Message]) -> ModelReply:
        self.calls += 1
        if self.calls < 3:
            q = "ab"[self.calls - 1]
            return reply("", ToolCall(call_id=q, tool="look", args={"q": q}))
        return reply("done")


class OnceOnly(ContinuationPolicy):
    """Carries the first run on after one step, and the run it goes on as never."""

    def due(self, frontier: Frontier, *, history_bytes: int = 0) -> bool:
        return frontier.run_id == RUN and super().due(frontier, history_bytes=history_bytes)


@pytest_asyncio.fixture
async def backends(tmp_path: Path) -> AsyncIterator[Backends]:
    settings = Settings.model_validate(
        {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "chain.db")}
    )
    async with open_backends(settings) as opened:
        yield opened


@pytest.mark.parametrize("named", ["the_run_it_goes_on_as", "the_run_it_was_launched_for"])
async def test_a_cancel_of_the_run_a_task_was_carried_into_stops_it_at_its_next_boundary(
    backends: Backends, named: str
) -> None:
    """The worker's task was launched for ``r`` and drives ``r~c1``, in a tool call, when a
    cancel comes naming either: the call finishes, no model call follows, and ``r~c1`` ends
    cancelled. One naming ``r~c1`` let the task make its next model call and complete the
    run: only the lease's ask reached it, and not before that answer."""
    model = Gated()
    agent = model.agent
    worker = Worker(backends, ScriptedProvider(model), {agent.name: agent}, backoff_s=0.01)
    worker.runner.continuation = OnceOnly(max_steps=2)
    worker.submit(StartRun(run_id=RUN, tenant=TENANT, agent=agent.name, input="go"))
    await asyncio.wait_for(model.waiting.wait(), 5)
    new = successor_id(RUN)
    assert (await worker.runner.inspect(RUN, tenant=TENANT)).continued_to == new

    cancelled = new if named == "the_run_it_goes_on_as" else RUN
    cancel = asyncio.ensure_future(
        worker.handle(CancelRun(run_id=cancelled, tenant=TENANT, by="ops", why="not wanted"))
    )
    # The cancel heard here (`Worker.stopping_run`) while the tool call is in flight.
    await until(lambda: worker.stopping(cancelled), f"the cancel of {cancelled} heard", within_s=5)
    model.go.set()
    assert await asyncio.wait_for(cancel, 5)
    await asyncio.wait_for(worker.drained(), 5)

    ended = await worker.runner.inspect(new, tenant=TENANT)
    assert (ended.status, ended.output) == ("cancelled", None)
    assert model.calls == 2  # the tool call in flight finished; no model call after it
