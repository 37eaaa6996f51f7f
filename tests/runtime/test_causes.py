"""Causes are facts (issue 19, item 4): a run out of attempts ends with the error its last
attempt failed with."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest_asyncio

from onward.eventlog import Message
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.providers import ModelReply, ScriptedProvider
from onward.runtime.requests import ResumeRun, StartRun
from onward.runtime.settings import Settings
from onward.runtime.worker import Worker

TENANT = "acme"
SECRET = "Bearer abcdefghijklmnopqrstuvwxyz0123"


@pytest_asyncio.fixture
async def backends(tmp_path: Path) -> AsyncIterator[Backends]:
    settings = Settings.model_validate(
        {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "causes.db")}
    )
    async with open_backends(settings) as opened:
        yield opened


class UpstreamDown(ScriptedProvider):
    """A model whose every call fails as an upstream 503 does, with a secret in the message."""

    def __init__(self) -> None:
        super().__init__([])

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        raise RuntimeError(f"upstream 503 Service Unavailable (sent {SECRET})")


async def test_a_run_out_of_attempts_records_its_last_cause_masked(
    backends: Backends,
) -> None:
    """A provider raising on every call: started, then claimed three times by the worker; the
    third attempt, the last the run has, ends it at once ``failed`` with the provider's error
    (type and masked message) in its final event, so inspect, replay and the stream's error
    message show it."""
    worker = Worker(
        backends, UpstreamDown(), {"writer": Agent(name="writer", instructions="w")}, backoff_s=0
    )
    worker.submit(StartRun(run_id="r", tenant=TENANT, agent="writer"))
    await worker.drained()
    for _ in range(worker.max_attempts):
        worker.submit(ResumeRun(run_id="r", tenant=TENANT))
        await worker.drained()
    frontier = await worker.runner.inspect("r", tenant=TENANT)
    assert frontier.status == "failed"
    assert frontier.error is not None
    assert frontier.error.startswith("gave up: 3 attempts to carry it on made no progress")
    assert "RuntimeError: upstream 503 Service Unavailable" in frontier.error
    assert "abcdefghijklmnopqrstuvwxyz0123" not in frontier.error
    finished = [s.event for s in await backends.log.read_run("r")][-1]
    assert getattr(finished, "error", None) == frontier.error
    assert worker.stats.gave_up == 1

