"""A start for an agent the worker does not carry, whose run's lease is in the way.

Such a start ends its run ``failed`` at once, saying why, so that whoever follows the run reads
the cause. A lease left by a starter that died before writing `RunStarted` must not turn that
into silence: the start waits for the lease to lapse as any start does, then ends the run
failed; a zombie holder that renews the lease for ever gets the start refused, saying so, so
that an application's stream of the run ends with the cause instead of waiting for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.fleet.requests import StartRun
from onward.runtime.fleet.worker import Worker
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.settings import Settings

TENANT = "acme"
AGENT = Agent(name="writer", instructions="w")


@pytest_asyncio.fixture
async def backends(tmp_path: Path) -> AsyncIterator[Backends]:
    settings = Settings.model_validate(
        {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "starts.db")}
    )
    async with open_backends(settings) as opened:
        yield opened


def worker_of(backends: Backends) -> Worker:
    """A worker carrying only ``writer``, whose tries at a start (10, about 1.3 s of backoff)
    end well before a lease of a few seconds lapses."""
    provider = ScriptedProvider([reply("done")])
    return Worker(backends, provider, {"writer": AGENT}, max_attempts=1, backoff_s=0.02)


async def test_a_start_for_an_unknown_agent_ends_failed_once_a_dead_starters_lease_lapses(
    backends: Backends,
) -> None:
    await backends.leases.acquire("r", tenant=TENANT, holder="died-starting", ttl_s=3)
    worker = worker_of(backends)
    worker.submit(StartRun(run_id="r", tenant=TENANT, agent="reader", input="go"))
    await asyncio.wait_for(worker.drained(), 30)
    assert await backends.frontiers.get("r") is not None, "the start was dropped: no run, no cause"
    frontier = await worker.runner.inspect("r", tenant=TENANT)
    assert frontier.status == "failed"
    assert "no agent 'reader'" in (frontier.error or "")
    assert worker.refused_start("r") is None
    assert worker.stats.failures == 1


async def test_a_start_for_an_unknown_agent_a_zombie_lease_holds_off_is_refused_saying_so(
    backends: Backends,
) -> None:
    lease = await backends.leases.acquire("r", tenant=TENANT, holder="zombie", ttl_s=2)

    async def renewing() -> None:
        nonlocal lease
        while True:
            await asyncio.sleep(0.05)
            lease = await backends.leases.renew(lease, ttl_s=2)

    renewals = asyncio.create_task(renewing())
    try:
        worker = worker_of(backends)
        worker.submit(StartRun(run_id="r", tenant=TENANT, agent="reader", input="go"))
        await asyncio.wait_for(worker.drained(), 30)
    finally:
        renewals.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewals
    cause = worker.refused_start("r")
    assert cause is not None, "the start was dropped without a word"
    assert "never free to start" in cause
    assert "'zombie'" in cause
    assert worker.stats.failures == 1
