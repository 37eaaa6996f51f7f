"""`ExecutionManager.list_pending` reads the runs a page at a time, by run id: a deployment with
very many runs going holds one page of their summaries, and no run is skipped or listed twice
(ids in mixed case, past ASCII, and with the ``~`` and ``#`` run ids hold, on each store)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from support.paging import PAGE, RUN_IDS, TENANT, interrupted, paging_backends
from support.pg import SchemaFactory

from onward.projections.base import RunSummary
from onward.runtime import manager as manager_module
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends
from onward.runtime.leases.base import LeaseStore, RunLease
from onward.runtime.manager import ExecutionManager, pending_ids
from onward.testing.leases import WrappedLeaseStore

HELD = ["a~1", "Z", "~"]


@pytest_asyncio.fixture(params=["sqlite", "postgres"])
async def backends(
    request: pytest.FixtureRequest, tmp_path: Path, database_url: str, new_pg_schema: SchemaFactory
) -> AsyncIterator[Backends]:
    async with paging_backends(request.param, tmp_path, database_url, new_pg_schema) as opened:
        yield opened


async def _interrupted_some_held(backends: Backends, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run of ``RUN_IDS`` interrupted, those of ``HELD`` held by a live worker, and
    listings made a page of ``PAGE`` runs at a time."""
    agent = Agent(name="writer", instructions="write")
    for run_id in RUN_IDS:
        await interrupted(backends, agent, run_id)
    assert backends.leases is not None
    for run_id in HELD:
        await backends.leases.acquire(run_id, tenant=TENANT, holder="w9", ttl_s=60)
    monkeypatch.setattr(manager_module, "_LISTED_AT_ONCE", PAGE, raising=False)


async def test_pending_runs_are_listed_a_page_at_a_time(
    backends: Backends, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _interrupted_some_held(backends, monkeypatch)
    frontiers = backends.frontiers
    listing = frontiers.runs
    listed: list[int] = []

    async def paged(**kwargs: Any) -> list[RunSummary]:
        rows = await listing(**kwargs)
        listed.append(len(rows))
        return rows

    monkeypatch.setattr(frontiers, "runs", paged)
    pending = await ExecutionManager(frontiers, backends.leases).list_pending(tenant=TENANT)
    assert max(listed) <= PAGE, listed
    ids = pending_ids(pending)
    assert sorted(ids) == sorted(set(RUN_IDS) - set(HELD))  # each once
    assert {s.attention for s in pending} == {"interrupted"}


class CountedReads(WrappedLeaseStore):
    """A lease store that counts the reads asked of it, each a round trip to the server."""

    def __init__(self, inner: LeaseStore) -> None:
        super().__init__(inner)
        self.reads: list[int] = []  # how many runs each read asked about

    async def current(self, run_id: str) -> RunLease | None:
        self.reads.append(1)
        return await super().current(run_id)

    async def current_many(self, run_ids: Sequence[str]) -> dict[str, RunLease]:
        self.reads.append(len(run_ids))
        return await super().current_many(run_ids)


async def test_pending_runs_read_their_leases_once_a_page(
    backends: Backends, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listing asks the lease store once per page of runs, not once per run, and sees the
    held runs as held all the same."""
    await _interrupted_some_held(backends, monkeypatch)
    counted = CountedReads(backends.leases)
    pending = await ExecutionManager(backends.frontiers, counted).list_pending(tenant=TENANT)
    pages = -(-len(RUN_IDS) // PAGE)
    assert counted.reads == [PAGE] * pages, counted.reads
    assert sorted(pending_ids(pending)) == sorted(set(RUN_IDS) - set(HELD))


class WithoutReadOfMany:
    """A lease store of one's own written before `LeaseStore.current_many`: it reads one run's
    lease at a time, and subclasses nothing."""

    def __init__(self, inner: LeaseStore) -> None:
        self.inner = inner
        self.reads = 0

    async def current(self, run_id: str) -> RunLease | None:
        self.reads += 1
        return await self.inner.current(run_id)


async def test_a_store_without_a_read_of_many_is_asked_run_by_run(
    backends: Backends, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that predates `current_many` lists the same pending runs, read with `current`."""
    await _interrupted_some_held(backends, monkeypatch)
    assert backends.leases is not None
    old = WithoutReadOfMany(backends.leases)
    manager = ExecutionManager(backends.frontiers, old)  # type: ignore[arg-type]
    pending = await manager.list_pending(tenant=TENANT)
    assert sorted(pending_ids(pending)) == sorted(set(RUN_IDS) - set(HELD))
    assert old.reads == len(RUN_IDS)
