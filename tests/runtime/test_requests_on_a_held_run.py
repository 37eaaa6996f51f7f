"""A request for a run another holds is asked again until the run is free, however long.

A tag (or an answer) for a run that another worker drives waits for it: the worker asks again
after each backoff. A run may be driven for a long while (an agent working for an hour), so the
asking must not grow with the wait: the tag lands once the run is free, not lost on the way.
Meanwhile the request holds a slot and keeps its partition's offsets from being committed, so
the worker's log says what it waits on, once, not once per ask.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from support.fault_runs import until

from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.fleet.requests import StartRun, TagRun
from onward.runtime.fleet.worker import Worker
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.settings import Settings

TENANT = "acme"
ASKS = 1_500
"""More asks than a retry that nested one call per ask could make (Python's recursion limit)."""


@pytest_asyncio.fixture
async def backends(tmp_path: Path) -> AsyncIterator[Backends]:
    settings = Settings.model_validate(
        {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "held.db")}
    )
    async with open_backends(settings) as opened:
        yield opened


async def test_a_tag_for_a_run_held_through_many_asks_lands_once_it_is_free(
    backends: Backends,
) -> None:
    agent = Agent(name="writer", instructions="w")
    worker = Worker(backends, ScriptedProvider([reply("done")]), {"writer": agent}, backoff_s=0)
    worker.submit(StartRun(run_id="r", tenant=TENANT, agent="writer"))
    await worker.drained()
    lease = await backends.leases.acquire("r", tenant=TENANT, holder="elsewhere", ttl_s=600)
    worker.submit(TagRun(run_id="r", tenant=TENANT, label="phase-2"))
    await until(lambda: worker.stats.conflicts >= ASKS or not worker.in_flight, "the asks")
    await backends.leases.release(lease)
    await asyncio.wait_for(worker.drained(), 30)
    frontier = await worker.runner.inspect("r", tenant=TENANT)
    assert [t.label for t in frontier.tags] == ["phase-2"]
    assert worker.stats.failures == 0


async def test_a_tag_waiting_for_a_held_run_says_what_it_waits_on_once(
    backends: Backends, caplog: pytest.LogCaptureFixture
) -> None:
    agent = Agent(name="writer", instructions="w")
    worker = Worker(backends, ScriptedProvider([reply("done")]), {"writer": agent}, backoff_s=0)
    worker.submit(StartRun(run_id="r", tenant=TENANT, agent="writer"))
    await worker.drained()
    lease = await backends.leases.acquire("r", tenant=TENANT, holder="elsewhere", ttl_s=600)
    with caplog.at_level(logging.INFO, logger="onward.worker"):
        worker.submit(TagRun(run_id="r", tenant=TENANT, label="phase-2"))
        await until(lambda: worker.stats.conflicts >= 50 or not worker.in_flight, "the asks")
        await backends.leases.release(lease)
        await asyncio.wait_for(worker.drained(), 30)
    waits = [r.getMessage() for r in caplog.records if "elsewhere" in r.getMessage()]
    assert len(waits) == 1, f"the wait said what it waits on {len(waits)} times: {waits}"
    assert "TagRun of run r waits until the run is free" in waits[0]
