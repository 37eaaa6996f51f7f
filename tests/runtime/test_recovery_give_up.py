"""What recovery leaves behind when it cannot carry a run on: a run whose plan is not safe is
left for a person even when it holds all the tags a run may hold, and a run out of attempts
ends ``failed`` with the cause its last attempt failed with, not with an outage met while
ending it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
import pytest_asyncio
from support.crashes import Crash, CrashAt

from onward.errors import BackendUnavailableError
from onward.eventlog import Event, Message, RunFinished, ToolCall
from onward.runtime import runner as runner_module
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.fleet.requests import ResumeRun, StartRun
from onward.runtime.fleet.worker import Worker
from onward.runtime.manager import ExecutionManager, needs_person
from onward.runtime.providers import ModelReply, ScriptedProvider, reply
from onward.runtime.settings import Settings
from onward.runtime.tools import tool

TENANT = "acme"


@pytest_asyncio.fixture
async def backends(tmp_path: Path) -> AsyncIterator[Backends]:
    settings = Settings.model_validate(
        {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "recovery.db")}
    )
    async with open_backends(settings) as opened:
        yield opened


@tool
async def charge(amount: int, *, idempotency_key: str) -> str:
    return f"charged {amount}"


CHARGER = Agent(name="charger", instructions="charge", tools=[charge])


def charging() -> ScriptedProvider:
    return ScriptedProvider(
        [reply("", ToolCall(call_id="c1", tool="charge", args={"amount": 5})), reply("charged")]
    )


async def test_a_run_holding_all_its_tags_is_still_left_for_a_person(
    backends: Backends, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its process died right after dispatching a charge with no status check, and the run
    already holds the most tags a run may: the worker still tags it ``needs-person`` and
    leaves it, rather than claiming it again until it is out of attempts and ending it
    ``failed`` over a charge that may have gone through."""
    monkeypatch.setattr(runner_module, "MAX_TAGS_PER_RUN", 2)
    with pytest.raises(Crash):
        await backends.runner(charging(), observer=CrashAt("tool.dispatched")).run(
            CHARGER, "charge 5", tenant=TENANT, run_id="r"
        )
    tagger = backends.runner(charging())
    for label in ("billing", "q3"):
        await tagger.tag("r", label, tenant=TENANT, seq=1)
    worker = Worker(backends, charging(), {"charger": CHARGER}, backoff_s=0)
    for _ in range(worker.max_attempts + 1):
        worker.submit(ResumeRun(run_id="r", tenant=TENANT))
        await worker.drained()
    frontier = await worker.runner.inspect("r", tenant=TENANT)
    assert frontier.status == "running", frontier.error
    assert needs_person(frontier)
    assert worker.stats.needs_person == 1
    (pending,) = await ExecutionManager(backends.frontiers, backends.leases).list_pending(
        tenant=TENANT
    )
    assert pending.attention == "needs_person"


class UpstreamDown(ScriptedProvider):
    """A model whose every call fails as an upstream 503 does."""

    def __init__(self) -> None:
        super().__init__([])

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        raise RuntimeError("upstream 503 Service Unavailable")


def log_down_for_endings(
    backends: Backends, monkeypatch: pytest.MonkeyPatch, times: int
) -> list[int]:
    """The log refuses the next ``times`` appends of a `RunFinished` as an unreachable store
    does; the list counts the ones refused."""
    refused: list[int] = []
    append = backends.log.append

    async def failing(events: Sequence[Event]) -> object:
        if len(refused) < times and any(isinstance(e, RunFinished) for e in events):
            refused.append(1)
            raise BackendUnavailableError("the log did not answer")
        return await append(events)

    monkeypatch.setattr(backends.log, "append", failing)
    return refused


@pytest.mark.parametrize("outage", [1, 2])
async def test_a_run_whose_ending_met_an_outage_gives_up_with_its_last_attempt_s_cause(
    backends: Backends, monkeypatch: pytest.MonkeyPatch, outage: int
) -> None:
    """The last attempt fails with the model's error and the worker's write of the run's end
    meets an outage (``outage`` 1); with 2, so does the next pass's. The pass after ends the
    run with the model's error as the cause: not without one (the cause dropped before the
    write was durable), nor with the outage's (no attempt of the run failed with it)."""
    worker = Worker(
        backends, UpstreamDown(), {"writer": Agent(name="writer", instructions="w")}, backoff_s=0
    )
    worker.submit(StartRun(run_id="r", tenant=TENANT, agent="writer"))
    await worker.drained()
    refused = log_down_for_endings(backends, monkeypatch, outage)
    for _ in range(worker.max_attempts + outage):
        worker.submit(ResumeRun(run_id="r", tenant=TENANT))
        await worker.drained()
    assert len(refused) == outage
    frontier = await worker.runner.inspect("r", tenant=TENANT)
    assert frontier.status == "failed"
    assert frontier.error == (
        "gave up: 3 attempts to carry it on made no progress; the last one failed with "
        "RuntimeError: upstream 503 Service Unavailable"
    )


async def test_an_outage_before_the_claim_is_not_the_cause_a_run_gives_up_with(
    backends: Backends, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two attempts fail with the model's error; the next pass finds the lease store down
    before it claims the run (no attempt); the third attempt's process dies. Out of attempts,
    the run ends with the model's error as its last known cause, not the lease store's."""
    agent = Agent(name="writer", instructions="w")
    worker = Worker(backends, UpstreamDown(), {"writer": agent}, backoff_s=0)
    worker.submit(StartRun(run_id="r", tenant=TENANT, agent="writer"))
    await worker.drained()
    for _ in range(worker.max_attempts - 1):
        worker.submit(ResumeRun(run_id="r", tenant=TENANT))
        await worker.drained()
    acquire = backends.leases.acquire

    async def down(run_id: str, **kwargs: object) -> object:
        raise BackendUnavailableError("the lease store did not answer")

    monkeypatch.setattr(backends.leases, "acquire", down)
    assert await worker.recover(range(backends.log.partitions)) == 1
    await worker.drained()
    monkeypatch.setattr(backends.leases, "acquire", acquire)
    with pytest.raises(Crash):
        await backends.runner(UpstreamDown(), observer=CrashAt("model.call")).resume(
            agent, "r", tenant=TENANT
        )
    worker.submit(ResumeRun(run_id="r", tenant=TENANT))
    await worker.drained()
    frontier = await worker.runner.inspect("r", tenant=TENANT)
    assert frontier.status == "failed"
    assert frontier.error == (
        "gave up: 3 attempts to carry it on made no progress; the last one failed with "
        "RuntimeError: upstream 503 Service Unavailable"
    )


class DownAsAnnAsks(ScriptedProvider):
    """A model whose every call fails as an upstream 503 does; during the last call a worker
    makes of it, Ann asks the run's holder to cancel it (after the holder's last renewal)."""

    def __init__(self, backends: Backends, last: int) -> None:
        super().__init__([])
        self.backends, self.last, self.calls = backends, last, 0

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        self.calls += 1
        if self.calls == self.last:
            asked = await self.backends.leases.ask_to_cancel("r", tenant=TENANT, by="ann")
            assert asked is not None
        raise RuntimeError("upstream 503 Service Unavailable")


async def test_a_run_asked_to_cancel_as_its_last_attempt_fails_ends_cancelled(
    backends: Backends,
) -> None:
    """Ann asks the run's holder to cancel it during its last attempt, whose model call then
    fails (the ask kept with the lease, unheard). The worker gives up on the run, hearing the
    ask as it takes the lease: the run must end ``cancelled`` as she asked (``onward cancel
    --wait`` reports it so), not ``failed``, with the ask dropped."""
    agent = Agent(name="writer", instructions="w")
    worker = Worker(backends, UpstreamDown(), {"writer": agent}, backoff_s=0)
    worker.submit(StartRun(run_id="r", tenant=TENANT, agent="writer"))
    await worker.drained()
    attempts = (await worker.runner.inspect("r", tenant=TENANT)).attempts
    worker.runner.provider = DownAsAnnAsks(backends, worker.max_attempts - attempts)
    for _ in range(worker.max_attempts - attempts):
        worker.submit(ResumeRun(run_id="r", tenant=TENANT))
        await worker.drained()

    frontier = await worker.runner.inspect("r", tenant=TENANT)
    assert (frontier.status, frontier.error) == ("cancelled", "cancelled by ann")
    assert worker.stats.statuses.get("cancelled") == 1
