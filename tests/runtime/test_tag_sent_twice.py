"""A tag sent twice to a fleet: a rebalance delivers a `TagRun` again to the partition's next
owner (the first owner wrote it and did not commit), or an application's submit whose
acknowledgement was lost is tried again.

The first is written. The second finds the label on that event already: nothing is written, as
a start, an answer or a cancel delivered twice writes nothing, so the run's tags (kept on its
frontier, and bounded) are not spent on copies.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from onward.eventlog import Tagged, ToolCall
from onward.runtime import runner as runner_module
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.fleet.requests import StartRun, TagRun
from onward.runtime.fleet.worker import Worker
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.settings import Settings
from onward.runtime.tools import tool

TENANT = "acme"


@tool(requires_approval=True)
async def pay(n: int, *, idempotency_key: str) -> str:
    return f"paid {n}"


PAYER = Agent(name="payer", instructions="pay", tools=[pay])


@pytest_asyncio.fixture
async def backends(tmp_path: Path) -> AsyncIterator[Backends]:
    settings = Settings.model_validate(
        {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "tags.db")}
    )
    async with open_backends(settings) as opened:
        yield opened


async def _waiting_run(backends: Backends) -> Worker:
    """A run that waits on a payment's approval (nobody holds it), and the worker that started
    it."""
    script = [reply("", ToolCall(call_id="c1", tool="pay", args={"n": 5})), reply("paid")]
    worker = Worker(backends, ScriptedProvider(script), {"payer": PAYER}, backoff_s=0.01)
    assert await worker.handle(StartRun(run_id="r", tenant=TENANT, agent="payer", input="pay"))
    assert (await worker.runner.inspect("r", tenant=TENANT)).status == "waiting"
    return worker


async def _tagged(backends: Backends) -> list[Tagged]:
    return [r.event for r in await backends.log.read_run("r") if isinstance(r.event, Tagged)]


async def test_a_tag_delivered_twice_is_written_once(backends: Backends) -> None:
    worker = await _waiting_run(backends)
    tag = TagRun(run_id="r", tenant=TENANT, label="audited", seq=1, by="ann")
    assert await worker.handle(tag)
    assert await worker.handle(tag)
    assert [(t.target_seq, t.label) for t in await _tagged(backends)] == [(1, "audited")]
    frontier = await worker.runner.inspect("r", tenant=TENANT)
    assert [(t.seq, t.label) for t in frontier.tags] == [(1, "audited")]
    assert worker.stats.failures == 0


async def test_a_tag_of_the_latest_boundary_delivered_twice_is_written_once(
    backends: Backends,
) -> None:
    worker = await _waiting_run(backends)
    tag = TagRun(run_id="r", tenant=TENANT, label="reviewed")
    assert await worker.handle(tag)
    assert await worker.handle(tag)
    assert len(await _tagged(backends)) == 1


async def test_other_labels_and_other_events_are_still_tagged(backends: Backends) -> None:
    worker = await _waiting_run(backends)
    for tag in (
        TagRun(run_id="r", tenant=TENANT, label="audited", seq=1),
        TagRun(run_id="r", tenant=TENANT, label="audited", seq=2),
        TagRun(run_id="r", tenant=TENANT, label="kept", seq=1),
    ):
        assert await worker.handle(tag)
    assert sorted((t.target_seq, t.label) for t in await _tagged(backends)) == [
        (1, "audited"),
        (1, "kept"),
        (2, "audited"),
    ]


async def test_a_tag_delivered_twice_to_a_run_at_its_cap_is_no_refusal(
    backends: Backends, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module, "MAX_TAGS_PER_RUN", 1)
    worker = await _waiting_run(backends)
    tag = TagRun(run_id="r", tenant=TENANT, label="audited", seq=1)
    assert await worker.handle(tag)
    assert await worker.handle(tag)
    assert worker.stats.failures == 0
    assert len(await _tagged(backends)) == 1
