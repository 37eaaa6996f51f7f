"""An answer sent twice to a fleet: an application whose submit was cut off after it landed
tries the opening again, and a second `AnswerRequest` of the same request reaches the worker.

The first is written and the run goes on. The second finds the run no longer waiting on that
request: it is dropped at once, said as such (not counted as a refused request), never written,
and never kept waiting, holding a slot and the partition's commits, for as long as someone
drives the run on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
import pytest_asyncio

from onward.errors import BackendUnavailableError, ConfigurationError
from onward.eventlog import ApprovalGranted, Event, Message, ToolCall, ToolDispatched
from onward.eventlog.base import EventLog, Position
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.fleet.requests import AnswerRequest, ResumeRun, StartRun
from onward.runtime.fleet.worker import Worker
from onward.runtime.providers import ModelReply, ScriptedProvider, reply
from onward.runtime.settings import Settings
from onward.runtime.tools import tool
from onward.testing.eventlog import WrappedEventLog

TENANT = "acme"


@tool(requires_approval=True)
async def pay(n: int, *, idempotency_key: str) -> str:
    return f"paid {n}"


PAYER = Agent(name="payer", instructions="pay", tools=[pay])


@pytest_asyncio.fixture
async def backends(tmp_path: Path) -> AsyncIterator[Backends]:
    settings = Settings.model_validate(
        {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "answers.db")}
    )
    async with open_backends(settings) as opened:
        yield opened


async def _answered_once(backends: Backends, worker: Worker) -> AnswerRequest:
    """A run that waited on a payment's approval, approved through the worker and carried on."""
    await worker.handle(StartRun(run_id="r", tenant=TENANT, agent="payer", input="pay"))
    asked = (await worker.runner.inspect("r", tenant=TENANT)).waiting_on
    assert asked is not None
    answer = AnswerRequest(run_id="r", tenant=TENANT, request_id=asked, approve=True, by="ann")
    assert await worker.handle(answer)
    return answer


def _worker(backends: Backends) -> Worker:
    script = [reply("", ToolCall(call_id="c1", tool="pay", args={"n": 5})), reply("paid")]
    return Worker(backends, ScriptedProvider(script), {"payer": PAYER}, backoff_s=0.01)


async def test_an_answer_sent_again_while_the_run_is_driven_is_dropped_at_once(
    backends: Backends,
) -> None:
    worker = _worker(backends)
    answer = await _answered_once(backends, worker)
    # Driven on by another holder (the first answer's worker, after a rebalance): the second
    # answer does not wait for it to let go.
    lease = await backends.leases.acquire("r", tenant=TENANT, holder="elsewhere", ttl_s=600)
    try:
        assert await asyncio.wait_for(worker.handle(answer), 5)
    finally:
        await backends.leases.release(lease)
    records = await backends.log.read_run("r")
    assert sum(isinstance(r.event, ApprovalGranted) for r in records) == 1
    assert worker.stats.failures == 0


async def test_an_answer_sent_again_once_the_run_went_on_is_no_refusal(
    backends: Backends, caplog: pytest.LogCaptureFixture
) -> None:
    worker = _worker(backends)
    answer = await _answered_once(backends, worker)
    with caplog.at_level(logging.INFO, logger="onward.worker"):
        assert await worker.handle(answer)
    records = await backends.log.read_run("r")
    assert sum(isinstance(r.event, ApprovalGranted) for r in records) == 1
    assert (await worker.runner.inspect("r", tenant=TENANT)).status == "completed"
    assert worker.stats.failures == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("answered already" in r.getMessage() for r in caplog.records)


class GrantAnswerLost(WrappedEventLog):
    """Stores the first `ApprovalGranted` and loses the answer to its append (a broker that
    took the batch and timed out), as a real server's does."""

    def __init__(self, inner: EventLog) -> None:
        super().__init__(inner)
        self.lost = False

    async def append(self, events: Sequence[Event]) -> list[Position]:
        positions = await super().append(events)
        if not self.lost and any(isinstance(e, ApprovalGranted) for e in events):
            self.lost = True
            raise BackendUnavailableError("the answer to the append was lost")
        return positions


async def test_an_approval_whose_append_lost_its_answer_carries_the_run_on(
    backends: Backends,
) -> None:
    # The worker tries the answer again, and finds the run no longer waiting on it: it was
    # this answer that landed, and the run goes on now, not at some later recovery pass.
    log = GrantAnswerLost(backends.log)
    worker = _worker(dataclasses.replace(backends, log=log))
    await worker.handle(StartRun(run_id="r", tenant=TENANT, agent="payer", input="pay"))
    asked = (await worker.runner.inspect("r", tenant=TENANT)).waiting_on
    assert asked is not None
    answer = AnswerRequest(run_id="r", tenant=TENANT, request_id=asked, approve=True, by="ann")
    assert await asyncio.wait_for(worker.handle(answer), 5)
    assert log.lost
    assert (await worker.runner.inspect("r", tenant=TENANT)).status == "completed"
    records = await backends.log.read_run("r")
    assert sum(isinstance(r.event, ApprovalGranted) for r in records) == 1
    assert sum(isinstance(r.event, ToolDispatched) for r in records) == 1


async def asking_then_revoked(backends: Backends) -> tuple[Worker, str]:
    """A worker whose model asks to pay (the run waits for an approval), and fails at every
    call after: its key revoked meanwhile. The worker, and the request the run waits on."""
    turns = 0

    def revoked_after_the_ask(messages: Sequence[Message]) -> ModelReply:
        nonlocal turns
        turns += 1
        if turns == 1:
            return reply("", ToolCall(call_id="c1", tool="pay", args={"n": 5}))
        raise ConfigurationError("the model's key was revoked")

    worker = Worker(
        backends, ScriptedProvider(revoked_after_the_ask), {"payer": PAYER}, backoff_s=0.01
    )
    await worker.handle(StartRun(run_id="r", tenant=TENANT, agent="payer", input="pay"))
    asked = (await worker.runner.inspect("r", tenant=TENANT)).waiting_on
    assert asked is not None
    return worker, asked


async def test_an_approval_whose_run_fails_carrying_on_is_not_logged_refused(
    backends: Backends, caplog: pytest.LogCaptureFixture
) -> None:
    """The approval is recorded, and the model fails as the worker carries the run on from it
    (its key revoked meanwhile). The worker said "AnswerRequest refused for good", the words a
    waiting stream sends its reader to look for: a person would take the answer for lost and
    give it again (to be dropped as answered already). It now says the run was answered and
    that carrying it on failed."""
    worker, asked = await asking_then_revoked(backends)
    answer = AnswerRequest(run_id="r", tenant=TENANT, request_id=asked, approve=True, by="ann")
    with caplog.at_level(logging.WARNING, logger="onward.worker"):
        assert await asyncio.wait_for(worker.handle(answer), 5)
    records = await backends.log.read_run("r")
    assert sum(isinstance(r.event, ApprovalGranted) for r in records) == 1
    said = [r.getMessage() for r in caplog.records if "key was revoked" in r.getMessage()]
    assert said, caplog.text
    assert not any("refused" in line for line in said), said
    assert any("run r" in line and "answered" in line for line in said), said


async def test_a_resume_whose_run_fails_carrying_on_is_not_logged_refused(
    backends: Backends, caplog: pytest.LogCaptureFixture
) -> None:
    """An application approves the payment itself and sends the fleet a `ResumeRun`; the model
    fails as the worker carries the run on (its key revoked meanwhile). The worker said
    "ResumeRun refused for good", the words a waiting stream sends its reader to look for,
    though the run exists and is recovery's: it now says carrying it on failed."""
    worker, asked = await asking_then_revoked(backends)
    await worker.runner.approve("r", asked, tenant=TENANT, by="ann")
    with caplog.at_level(logging.WARNING, logger="onward.worker"):
        assert await asyncio.wait_for(worker.handle(ResumeRun(run_id="r", tenant=TENANT)), 5)
    said = [r.getMessage() for r in caplog.records if "key was revoked" in r.getMessage()]
    assert said, caplog.text
    assert not any("refused" in line for line in said), said
    assert any("run r" in line and "carrying it on failed" in line for line in said), said
    # Another tenant's resume names no run of its own: still refused, and said so.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="onward.worker"):
        assert await worker.handle(ResumeRun(run_id="r", tenant="intruder"))
    assert "ResumeRun refused for good" in caplog.text
