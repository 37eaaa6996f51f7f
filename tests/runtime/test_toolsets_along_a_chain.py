"""A fleet worker carrying on a run that was carried into another: each run of the chain gets
its agent's toolsets bound to it, as a toolset that keeps state per run (an MCP server's
schemas, cached under the run's id) needs, not to the run the worker was asked for."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import pytest_asyncio
from support.crashes import Crash, CrashAt

from onward.eventlog import Message, ToolCall
from onward.runtime import AgentRunner
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.continuation import ContinuationPolicy, successor_id
from onward.runtime.fleet.requests import ResumeRun, StartRun
from onward.runtime.fleet.worker import Worker
from onward.runtime.providers import ModelReply, ScriptedProvider, reply
from onward.runtime.settings import Settings
from onward.runtime.tools import Tool, tool
from onward.runtime.toolsets import agent_for_run

TENANT = "acme"
RUN = "r"


class _PerRun:
    """A toolset whose tool says which run its view was bound to, as a per-run cache would
    key what it keeps: ``calls`` holds (run bound to, what was looked up)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    @asynccontextmanager
    async def run_tools(
        self, run_id: str, *, tenant: str | None, settings: Settings
    ) -> AsyncIterator[Sequence[Tool]]:
        async def look(q: str, *, idempotency_key: str) -> str:
            """Look something up."""
            self.calls.append((run_id, q))
            return q

        yield [tool(look)]

    async def close(self) -> None:
        return None


@pytest_asyncio.fixture
async def backends(tmp_path: Path) -> AsyncIterator[Backends]:
    settings = Settings.model_validate(
        {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "chain.db")}
    )
    async with open_backends(settings) as opened:
        yield opened


def _looking(*what: str) -> list[ModelReply]:
    return [reply("", ToolCall(call_id=q, tool="look", args={"q": q})) for q in what]


async def test_a_run_carried_on_into_another_has_its_toolsets_bound_to_the_new_run(
    backends: Backends,
) -> None:
    toolset = _PerRun()
    agent = Agent(name="looker", instructions="look", toolsets=[toolset])

    def down_after_two(messages: Sequence[Message]) -> ModelReply:
        turn = sum(1 for m in messages if m.role == "assistant")
        if turn < 2:
            return _looking("a", "b")[turn]
        raise ConnectionError("the model went away")

    async with agent_for_run(agent, RUN, tenant=TENANT, settings=backends.settings) as bound:
        first = AgentRunner(
            provider=ScriptedProvider(down_after_two),
            log=backends.log,
            frontiers=backends.frontiers,
            leases=backends.leases,
            checkpoint_inline=True,
        )
        with pytest.raises(ConnectionError):
            await first.run(bound, "go", tenant=TENANT, run_id=RUN)
        # Carried into the next run, and dead before the old run was ended into it.
        carrying = AgentRunner(
            provider=ScriptedProvider([]),
            log=backends.log,
            frontiers=backends.frontiers,
            leases=backends.leases,
            checkpoint_inline=True,
            continuation=ContinuationPolicy(max_steps=2),
            observer=CrashAt("run.started"),
        )
        with pytest.raises(Crash):
            await carrying.resume(bound, RUN, tenant=TENANT)
    assert toolset.calls == [(RUN, "a"), (RUN, "b")]

    worker = Worker(
        backends,
        ScriptedProvider([*_looking("a", "b", "c"), reply("done")]),
        {agent.name: agent},
        backoff_s=0,
    )
    assert await worker.handle(ResumeRun(run_id=RUN, tenant=TENANT))
    await worker.drained()

    new = successor_id(RUN)
    done = await worker.runner.inspect(new, tenant=TENANT)
    assert (done.status, done.output) == ("completed", "done")
    assert toolset.calls[2:] == [(new, "c")]


async def test_a_run_a_worker_started_and_carried_on_has_its_toolsets_bound_to_the_new_run(
    backends: Backends,
) -> None:
    toolset = _PerRun()
    agent = Agent(name="looker", instructions="look", toolsets=[toolset])
    worker = Worker(
        backends,
        ScriptedProvider([*_looking("a", "b", "c"), reply("done")]),
        {agent.name: agent},
        backoff_s=0,
    )
    worker.runner.continuation = ContinuationPolicy(max_steps=2)
    assert await worker.handle(StartRun(run_id=RUN, tenant=TENANT, agent=agent.name, input="go"))
    await worker.drained()

    new = successor_id(RUN)
    assert (await worker.runner.inspect(RUN, tenant=TENANT)).continued_to == new
    assert toolset.calls == [(RUN, "a"), (new, "b"), (successor_id(new), "c")]
