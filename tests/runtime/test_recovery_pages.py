"""A recovery pass lists the lapsed runs a page at a time, by run id, and carries each page's on
before it reads the next: after an outage that left very many runs lapsed, the first is carried
on at once, the pass holds one page of them, and none is skipped or taken twice (ids in mixed
case, past ASCII, and with the ``~`` and ``#`` run ids hold, on each store)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from support.paging import PAGE, RUN_IDS, TENANT, interrupted, paging_backends
from support.pg import SchemaFactory

from onward.projections.base import RunSummary
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends
from onward.runtime.fleet import recovery
from onward.runtime.fleet.worker import Worker
from onward.runtime.leases.base import RunLease
from onward.runtime.providers import ScriptedProvider, reply


@pytest_asyncio.fixture(params=["sqlite", "postgres"])
async def backends(
    request: pytest.FixtureRequest, tmp_path: Path, database_url: str, new_pg_schema: SchemaFactory
) -> AsyncIterator[Backends]:
    async with paging_backends(request.param, tmp_path, database_url, new_pg_schema) as opened:
        yield opened


async def test_lapsed_runs_are_listed_and_carried_on_a_page_at_a_time(
    backends: Backends, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = Agent(name="writer", instructions="write")
    for run_id in RUN_IDS:
        await interrupted(backends, agent, run_id)
    monkeypatch.setattr(recovery, "_LISTED_AT_ONCE", PAGE, raising=False)
    frontiers = backends.frontiers
    listing = frontiers.runs
    listed: list[int] = []
    launched_before: list[int] = []  # runs launched before each listing
    worker = Worker(
        backends, ScriptedProvider([reply("done")] * len(RUN_IDS)), {"writer": agent}, backoff_s=0
    )
    launched: list[str] = []
    launch = worker.launch

    def counted_launch(run_id: str, work: Any) -> None:
        launched.append(run_id)
        launch(run_id, work)

    async def paged(**kwargs: Any) -> list[RunSummary]:
        launched_before.append(len(launched))
        rows = await listing(**kwargs)
        listed.append(len(rows))
        return rows

    monkeypatch.setattr(frontiers, "runs", paged)
    monkeypatch.setattr(worker, "launch", counted_launch)
    assert await worker.recover(range(backends.log.partitions)) == len(RUN_IDS)
    await worker.drained()
    assert max(listed) <= PAGE, listed
    assert launched_before[1] > 0, "the first page was not carried on before the next was read"
    assert sorted(launched) == sorted(RUN_IDS)  # each once
    for run_id in RUN_IDS:
        assert (await worker.runner.inspect(run_id, tenant=TENANT)).status == "completed"
    assert worker.stats.recovered == len(RUN_IDS)


async def test_a_recovery_pass_asks_whether_a_page_s_runs_lapsed_in_one_read(
    backends: Backends, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pass reads the leases of a page's runs together (`LeaseStore.current_many`: one
    query, one pipeline), not one round trip per run, and carries on every lapsed run."""
    agent = Agent(name="writer", instructions="write")
    for run_id in RUN_IDS:
        await interrupted(backends, agent, run_id)
    monkeypatch.setattr(recovery, "_LISTED_AT_ONCE", PAGE, raising=False)
    leases = backends.leases
    assert leases is not None
    asked: list[list[str]] = []
    read_many = leases.current_many

    async def counted(run_ids: Sequence[str]) -> dict[str, RunLease]:
        asked.append(list(run_ids))
        return await read_many(run_ids)

    monkeypatch.setattr(leases, "current_many", counted)
    worker = Worker(
        backends, ScriptedProvider([reply("done")] * len(RUN_IDS)), {"writer": agent}, backoff_s=0
    )
    assert await worker.recover(range(backends.log.partitions)) == len(RUN_IDS)
    await worker.drained()
    assert sorted(run_id for read in asked for run_id in read) == sorted(RUN_IDS)
    assert len(asked) == -(-len(RUN_IDS) // PAGE), [len(read) for read in asked]
