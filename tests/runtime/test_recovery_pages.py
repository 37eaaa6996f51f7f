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
from support.pg import SchemaFactory

from onward.eventlog import Message
from onward.projections.base import RunSummary
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.fleet import recovery
from onward.runtime.fleet.worker import Worker
from onward.runtime.providers import ModelReply, ScriptedProvider, reply
from onward.runtime.settings import Settings

TENANT = "acme"
PAGE = 4
RUN_IDS = ["b#2", "B~1", "a~1", "A#3", "é~9", "e#0", "Z", "z~z", "ß#1", "~", "#", "run-7"]


@pytest_asyncio.fixture(params=["sqlite", "postgres"])
async def backends(
    request: pytest.FixtureRequest, tmp_path: Path, database_url: str, new_pg_schema: SchemaFactory
) -> AsyncIterator[Backends]:
    if request.param == "sqlite":
        env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "pages.db")}
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


async def test_lapsed_runs_are_listed_and_carried_on_a_page_at_a_time(
    backends: Backends, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = Agent(name="writer", instructions="write")
    for run_id in RUN_IDS:
        await _interrupted(backends, agent, run_id)
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
