"""`ExecutionManager.list_pending` reads the runs a page at a time, by run id: a deployment with
very many runs going holds one page of their summaries, and no run is skipped or listed twice
(ids in mixed case, past ASCII, and with the ``~`` and ``#`` run ids hold, on each store)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from support.pg import SchemaFactory

from onward.eventlog import Message
from onward.projections.base import RunSummary
from onward.runtime import manager as manager_module
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.manager import ExecutionManager, pending_ids
from onward.runtime.providers import ModelReply, ScriptedProvider
from onward.runtime.settings import Settings

TENANT = "acme"
PAGE = 4
RUN_IDS = ["b#2", "B~1", "a~1", "A#3", "é~9", "e#0", "Z", "z~z", "ß#1", "~", "#", "run-7"]
HELD = ["a~1", "Z", "~"]


@pytest_asyncio.fixture(params=["sqlite", "postgres"])
async def backends(
    request: pytest.FixtureRequest, tmp_path: Path, database_url: str, new_pg_schema: SchemaFactory
) -> AsyncIterator[Backends]:
    if request.param == "sqlite":
        env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "pending.db")}
    else:
        env = {
            "ONWARD_BACKEND": "postgres",
            "DATABASE_URL": database_url,
            "ONWARD_DATABASE_SCHEMA": await new_pg_schema(),
        }
    async with open_backends(Settings.model_validate(env)) as opened:
        yield opened


async def _interrupted(backends: Backends, agent: Agent, run_id: str) -> None:
    """A run whose first model call failed: running, nobody holding it."""

    def down(messages: Sequence[Message]) -> ModelReply:
        raise ConnectionError("the model went away")

    with pytest.raises(ConnectionError):
        await backends.runner(ScriptedProvider(down)).run(agent, "go", tenant=TENANT, run_id=run_id)


async def test_pending_runs_are_listed_a_page_at_a_time(
    backends: Backends, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = Agent(name="writer", instructions="write")
    for run_id in RUN_IDS:
        await _interrupted(backends, agent, run_id)
    assert backends.leases is not None
    for run_id in HELD:
        await backends.leases.acquire(run_id, tenant=TENANT, holder="w9", ttl_s=60)
    monkeypatch.setattr(manager_module, "_LISTED_AT_ONCE", PAGE, raising=False)
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
