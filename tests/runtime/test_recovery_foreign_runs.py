"""Runs recovery cannot carry on here: a lapsed run of an agent this worker does not carry, or
of another revision of it (a rolling deploy: the run is pinned to the revision it started with),
is another worker's. Each pass of recovery passes it over, said once, rather than take a slot
for it, be refused, and log the refusal again every ``recheck_s`` for as long as it lapses."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import pytest_asyncio

from onward.eventlog import Message
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.fleet.worker import Worker
from onward.runtime.providers import ModelReply, ScriptedProvider, reply
from onward.runtime.settings import Settings
from onward.runtime.tools import Tool, tool
from onward.runtime.toolsets import agent_for_run

TENANT = "acme"


@pytest_asyncio.fixture
async def backends(tmp_path: Path) -> AsyncIterator[Backends]:
    settings = Settings.model_validate(
        {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "foreign.db")}
    )
    async with open_backends(settings) as opened:
        yield opened


async def _interrupted(backends: Backends, agent: Agent, run_id: str) -> None:
    """A run of ``agent`` whose first model call failed: running, nobody holding it."""

    def down(messages: Sequence[Message]) -> ModelReply:
        raise ConnectionError("the model went away")

    with pytest.raises(ConnectionError):
        await backends.runner(ScriptedProvider(down)).run(agent, "go", tenant=TENANT, run_id=run_id)


@pytest.mark.parametrize(
    "here",
    [
        Agent(name="writer", instructions="write, the new way"),
        Agent(name="reader", instructions="read"),
    ],
    ids=["another-revision", "another-agent"],
)
async def test_a_lapsed_run_this_worker_cannot_carry_is_passed_over_and_said_once(
    backends: Backends, here: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    started = Agent(name="writer", instructions="write")
    await _interrupted(backends, started, "r")
    worker = Worker(backends, ScriptedProvider([reply("done")]), {here.name: here}, backoff_s=0)
    partitions = range(backends.log.partitions)
    with caplog.at_level(logging.INFO, logger="onward.worker"):
        launched = []
        for _ in range(3):
            launched.append(await worker.recover(partitions))
            while worker.in_flight:
                await worker.wait_for_slot(0.1)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("run r:")]
    assert launched == [0, 0, 0]
    assert len(said) == 1, said
    assert "writer" in said[0]
    assert worker.stats.failures == worker.stats.conflicts == 0
    # Left as it was for the worker that carries its revision, which carries it on.
    owner = Worker(backends, ScriptedProvider([reply("done")]), {"writer": started}, name="w2")
    assert await owner.recover(partitions) == 1
    await owner.drained()
    assert (await owner.runner.inspect("r", tenant=TENANT)).status == "completed"


class _OneTool:
    """A toolset whose tool is built per run, as an MCP server's is: the run's revision covers
    it, the agent's own (no tools) does not."""

    @asynccontextmanager
    async def run_tools(
        self, run_id: str, *, tenant: str | None, settings: Settings
    ) -> AsyncIterator[Sequence[Tool]]:
        async def look(q: str, *, idempotency_key: str) -> str:
            """Look something up."""
            return q

        yield [tool(look)]

    async def close(self) -> None:
        return None


async def test_a_lapsed_run_of_an_agent_with_toolsets_is_carried_on(backends: Backends) -> None:
    """An agent whose tools are built per run pins its runs to a revision its own, before the
    tools are built, never equals: recovery cannot tell a foreign revision from the row, and
    leaves that to the resume, which builds the tools."""
    agent = Agent(name="looker", instructions="look", toolsets=[_OneTool()])
    async with agent_for_run(agent, "r", tenant=TENANT, settings=backends.settings) as bound:
        await _interrupted(backends, bound, "r")
    assert (await backends.runner(ScriptedProvider([])).inspect("r", tenant=TENANT)).revision != (
        agent.revision
    )
    worker = Worker(backends, ScriptedProvider([reply("done")]), {agent.name: agent}, backoff_s=0)
    assert await worker.recover(range(backends.log.partitions)) == 1
    await worker.drained()
    assert (await worker.runner.inspect("r", tenant=TENANT)).status == "completed"
