"""A start whose run's lease is in the way when the worker takes the request.

A worker that died between taking a run's lease and writing its `RunStarted` leaves the lease
until its ttl is over; the next owner of the start request meets it on every try meanwhile. The
start waits for it however long it was taken for (with the defaults, 30 tries of a backoff of
1 s doubled up to 8 s come to under 4 minutes: a lease ttl of 5 minutes would outlast them), and
then starts the run: it is not dropped, its request committed, for a run that never comes.

A holder that keeps renewing the lease and never writes the run is a zombie: the start is
refused, saying so, so that an application's stream of the run ends with the cause instead of
waiting for it for ever.

A start for an agent the worker does not carry (which ends its run ``failed`` at once, saying
why) meets the lease the same way: it waits for it, then ends the run failed, or is refused.

A holder that renews the lease because it drives the run (its `RunStarted` is on the log) is no
zombie, though the run's row may not show it yet (a projector behind): the start is left to it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from onward.eventlog import RunStarted
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
    """A worker whose tries at a start (10, about 1.3 s of backoff) end well before a lease
    of a few seconds lapses."""
    provider = ScriptedProvider([reply("done")])
    return Worker(backends, provider, {"writer": AGENT}, max_attempts=1, backoff_s=0.02)


async def test_a_start_waits_for_the_lease_its_dead_starter_left(backends: Backends) -> None:
    await backends.leases.acquire("r", tenant=TENANT, holder="died-starting", ttl_s=3)
    worker = worker_of(backends)
    worker.submit(StartRun(run_id="r", tenant=TENANT, agent="writer", input="go"))
    await asyncio.wait_for(worker.drained(), 30)
    frontier = await worker.runner.inspect("r", tenant=TENANT)
    assert frontier.status == "completed"
    assert worker.refused_start("r", tenant=TENANT) is None
    assert worker.stats.failures == 0


@pytest.mark.parametrize("agent", ["writer", "reader"], ids=["carried", "not-carried"])
async def test_a_start_a_zombie_lease_holds_off_is_refused_saying_so(
    backends: Backends, agent: str
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
        worker.submit(StartRun(run_id="r", tenant=TENANT, agent=agent, input="go"))
        await asyncio.wait_for(worker.drained(), 30)
    finally:
        renewals.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewals
    cause = worker.refused_start("r", tenant=TENANT)
    assert cause is not None, "the start was dropped without a word"
    assert "never free to start" in cause
    assert "'zombie'" in cause
    assert worker.stats.failures == 1


async def test_a_start_held_off_by_the_run_s_driver_is_not_refused_though_no_row_shows_it(
    backends: Backends,
) -> None:
    """Another worker took the start first and drives the run, renewing its lease; the log has
    its `RunStarted`, the frontier row none yet (the projector is behind or down)."""
    lease = await backends.leases.acquire("r", tenant=TENANT, holder="driver", ttl_s=2)
    started = RunStarted(
        run_id="r", tenant=TENANT, seq=1, fence=lease.fence, at=1, agent="writer", revision="r1"
    )
    await backends.log.append([started])

    async def renewing() -> None:
        nonlocal lease
        while True:
            await asyncio.sleep(0.05)
            lease = await backends.leases.renew(lease, ttl_s=2)

    renewals = asyncio.create_task(renewing())
    try:
        worker = worker_of(backends)
        worker.submit(StartRun(run_id="r", tenant=TENANT, agent="writer", input="go"))
        await asyncio.wait_for(worker.drained(), 30)
    finally:
        renewals.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewals
    assert await backends.frontiers.get("r") is None, "the row shows the run: nothing tested"
    assert worker.refused_start("r", tenant=TENANT) is None, (
        "a run being driven was refused as never started"
    )
    assert worker.stats.failures == 0


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
    assert worker.refused_start("r", tenant=TENANT) is None
    assert worker.stats.failures == 1


async def test_a_start_racing_another_tenants_start_of_its_run_id_is_refused_saying_so(
    backends: Backends,
) -> None:
    """Two tenants' starts of one run id taken side by side: the first one's `RunStarted` was
    taken for the second start's (the starts were kept by run id alone), so the second, refused
    as its id is taken, was said to have begun and failed, "carried on as a lapsed run", and no
    refusal was kept for its stream. It is refused for good, saying the id exists."""
    worker = worker_of(backends)
    worker.submit(StartRun(run_id="r", tenant="evil", agent="writer", input="go"))
    worker.submit(StartRun(run_id="r", tenant=TENANT, agent="writer", input="go"))
    await asyncio.wait_for(worker.drained(), 30)
    assert (await worker.runner.inspect("r", tenant="evil")).status == "completed"
    cause = worker.refused_start("r", tenant=TENANT)
    assert cause is not None, "the start was dropped without a word"
    assert "already exists" in cause
    assert "evil" not in cause
    assert worker.refused_start("r", tenant="evil") is None


async def test_a_refusal_is_kept_when_another_tenant_starts_the_run_id_again(
    backends: Backends,
) -> None:
    """A tenant's start refused as its run id is taken stays refused for that tenant's streams
    when the tenant whose run has the id sends its start again: the refusal was kept by run id
    alone, so that start cleared it and the refused tenant's stream waited for a run that never
    comes."""
    worker = await _refused_as_taken(backends)

    worker.submit(StartRun(run_id="r", tenant="evil", agent="writer", input="go"))
    await asyncio.wait_for(worker.drained(), 30)

    cause = worker.refused_start("r", tenant=TENANT)
    assert cause is not None, "another tenant's start cleared this tenant's refusal"
    assert "already exists" in cause
    assert worker.refused_start("r", tenant="evil") is None


async def test_a_refused_start_is_told_to_its_own_tenant_only(backends: Backends) -> None:
    """A start refused for one tenant (its run id is another tenant's run) is that tenant's
    to be told. Asked without a tenant, the worker answered with whichever tenant's refusal it
    held: the other tenant's caller read this tenant's cause. The tenant must be named."""
    worker = await _refused_as_taken(backends)
    assert worker.refused_start("r", tenant="evil") is None
    with pytest.raises(TypeError, match="tenant"):
        worker.refused_start("r")  # type: ignore[call-arg]


async def test_a_start_for_an_unknown_agent_under_another_tenants_run_id_is_refused_saying_so(
    backends: Backends,
) -> None:
    """A start this worker would end failed (no such agent) whose run id another tenant's run
    has: it was dropped, only logged as not ended failed, and its stream waited for a run that
    never comes. It is refused for good in the words every tenant gets."""
    worker = worker_of(backends)
    worker.submit(StartRun(run_id="r", tenant="evil", agent="writer", input="go"))
    await asyncio.wait_for(worker.drained(), 30)

    worker.submit(StartRun(run_id="r", tenant=TENANT, agent="reader", input="go"))
    await asyncio.wait_for(worker.drained(), 30)

    cause = worker.refused_start("r", tenant=TENANT)
    assert cause is not None, "the start was dropped without a word"
    assert "already exists" in cause
    assert "evil" not in cause
    assert (await worker.runner.inspect("r", tenant="evil")).status == "completed"


async def test_a_start_racing_its_tenants_start_of_its_run_id_for_another_agent_is_refused(
    backends: Backends,
) -> None:
    """One tenant's two starts of one run id, for two agents, taken side by side: the first
    one's `RunStarted` was taken for the second start's (the starts were kept by run id and
    tenant), so the second, refused as its id is taken, was said to have begun and no refusal
    was kept for its stream. It is refused for good, saying the id exists."""
    worker = Worker(
        backends,
        ScriptedProvider([reply("done")]),
        {"writer": AGENT, "reader": Agent(name="reader", instructions="r")},
        max_attempts=1,
        backoff_s=0.02,
    )
    worker.submit(StartRun(run_id="r", tenant=TENANT, agent="writer", input="go"))
    worker.submit(StartRun(run_id="r", tenant=TENANT, agent="reader", input="go"))
    await asyncio.wait_for(worker.drained(), 30)

    assert (await worker.runner.inspect("r", tenant=TENANT)).agent == "writer"
    cause = worker.refused_start("r", tenant=TENANT)
    assert cause is not None, "the start was dropped without a word"
    assert "already exists" in cause


async def _refused_as_taken(backends: Backends) -> Worker:
    """A worker that started tenant "evil"'s run "r", then refused ``TENANT``'s start of the
    same id."""
    worker = worker_of(backends)
    worker.submit(StartRun(run_id="r", tenant="evil", agent="writer", input="go"))
    await asyncio.wait_for(worker.drained(), 30)
    worker.submit(StartRun(run_id="r", tenant=TENANT, agent="writer", input="go"))
    await asyncio.wait_for(worker.drained(), 30)
    assert worker.refused_start("r", tenant=TENANT) is not None
    return worker
