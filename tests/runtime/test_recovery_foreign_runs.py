"""Runs recovery cannot carry on here: a lapsed run of an agent this worker does not carry, or
of another revision of it (a rolling deploy: the run is pinned to the revision it started with),
is another worker's. Each pass of recovery passes it over, said once, rather than take a slot
for it, be refused, and log the refusal again every ``recheck_s`` for as long as it lapses."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
import pytest_asyncio

from onward.eventlog import Message
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.fleet.worker import Worker
from onward.runtime.providers import ModelReply, ScriptedProvider, reply
from onward.runtime.settings import Settings

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
