"""A start under the id of a run garbage collection removed, while its events are still in the
log, is refused, saying why, through an application and a fleet worker as through `AgentRunner`
(`test_gc.py`). Once compaction has cut them the id is free (`test_compaction_edges.py`).

Collection leaves the run's events in the log until compaction cuts them, and nothing but its
tombstone says the id was used: a second run under it wrote a second history (seq 1 again, on
SQLite fence 1 again), which anything reading the run whole from the log read with the first.
An application and a fleet worker both started the run again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from support.appapi import agents, provider

import onward
from onward.errors import InvalidInputError
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.fleet.requests import StartRun
from onward.runtime.fleet.worker import Worker
from onward.runtime.gc import GarbageCollector
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.settings import Settings

TENANT = "acme"
AGENT = Agent(name="writer", instructions="w")
LATER_S = 31 * 86_400.0


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")


@pytest_asyncio.fixture
async def backends(settings: Settings) -> AsyncIterator[Backends]:
    async with open_backends(settings) as opened:
        yield opened


async def collect(settings: Settings, run_id: str) -> None:
    done = await GarbageCollector(settings=settings, clock=lambda: time.time() + LATER_S).run()
    assert run_id in done.expired


async def test_a_fleet_start_under_a_collected_run_id_is_refused_saying_why(
    backends: Backends, settings: Settings
) -> None:
    provider = ScriptedProvider([reply("done"), reply("done again")])
    worker = Worker(backends, provider, {"writer": AGENT}, max_attempts=1, backoff_s=0.02)
    worker.submit(StartRun(run_id="r", tenant=TENANT, agent="writer", input="go"))
    await asyncio.wait_for(worker.drained(), 30)
    await collect(settings, "r")

    worker.submit(StartRun(run_id="r", tenant=TENANT, agent="writer", input="go again"))
    await asyncio.wait_for(worker.drained(), 30)
    cause = worker.refused_start("r", tenant=TENANT)
    assert cause is not None
    assert "garbage collection" in cause
    assert "'r'" in cause
    assert await backends.frontiers.get("r") is None  # nothing of a new run was written


async def test_an_app_start_under_a_collected_run_id_is_refused_saying_why(
    settings: Settings,
) -> None:
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        await asyncio.wait_for(app.query("work", {"agent": "stepper", "run_id": "g"}).collect(), 30)
        await collect(settings, "g")
        again = app.query("work", {"agent": "stepper", "run_id": "g"})
        with pytest.raises(InvalidInputError, match=r"garbage collection.*new id"):
            await asyncio.wait_for(again.collect(), 30)
