"""What a worker does with runs it leaves for a person (tagged ``needs-person``).

It counts a run as left (``onward_worker_runs_left_for_person``) once it tagged it: not when
another worker took the run before the tag was written (that one tags it, and counts it), nor
again on the pass that writes the tag after. Its passes over lapsed runs pass such a run over
until something is written to it (a person settling its call), rather than take a slot for it,
ahead of new requests, on every pass only to read it and leave it again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from support.crashes import Crash, CrashAt

from onward.eventlog import ToolCall
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.fleet.requests import ResumeRun
from onward.runtime.fleet.worker import Worker
from onward.runtime.manager import needs_person
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.settings import Settings
from onward.runtime.tools import tool

TENANT = "acme"


@tool
async def charge(amount: int, *, idempotency_key: str) -> str:
    return f"charged {amount}"


AGENT = Agent(name="charger", instructions="charge", tools=[charge])


def charging() -> ScriptedProvider:
    return ScriptedProvider(
        [reply("", ToolCall(call_id="c1", tool="charge", args={"amount": 5})), reply("charged")]
    )


@pytest_asyncio.fixture
async def backends(tmp_path: Path) -> AsyncIterator[Backends]:
    settings = Settings.model_validate(
        {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "left.db")}
    )
    async with open_backends(settings) as opened:
        yield opened


async def died_mid_charge(backends: Backends) -> None:
    """Run ``r``'s worker died right after dispatching its charge: nobody can tell whether it
    went through."""
    with pytest.raises(Crash):
        await backends.runner(charging(), observer=CrashAt("tool.dispatched")).run(
            AGENT, "charge 5", tenant=TENANT, run_id="r"
        )


async def test_a_run_taken_by_another_before_its_tag_is_not_counted_here(
    backends: Backends, monkeypatch: pytest.MonkeyPatch
) -> None:
    await died_mid_charge(backends)
    worker = Worker(backends, charging(), {"charger": AGENT}, backoff_s=0)
    leave = worker.runner.leave_for_person

    async def taken_first(run_id: str, why: str, *, tenant: str, by: str = "tagger") -> int:
        """Another worker takes the run between this one's refused plan and its tag."""
        lease = await backends.leases.acquire(run_id, tenant=tenant, holder="other", ttl_s=30)
        try:
            return await leave(run_id, why, tenant=tenant, by=by)
        finally:
            await backends.leases.release(lease)

    monkeypatch.setattr(worker.runner, "leave_for_person", taken_first)
    worker.submit(ResumeRun(run_id="r", tenant=TENANT))
    await worker.drained()
    assert not needs_person(await worker.runner.inspect("r", tenant=TENANT))
    assert worker.stats.needs_person == 0

    monkeypatch.setattr(worker.runner, "leave_for_person", leave)
    for _ in range(2):  # the pass that tags it, and one that finds it left
        worker.submit(ResumeRun(run_id="r", tenant=TENANT))
        await worker.drained()
    assert needs_person(await worker.runner.inspect("r", tenant=TENANT))
    assert worker.stats.needs_person == 1


async def test_a_run_left_for_a_person_is_passed_over_until_it_is_settled(
    backends: Backends,
) -> None:
    await died_mid_charge(backends)
    worker = Worker(backends, charging(), {"charger": AGENT}, backoff_s=0)
    everywhere = set(range(backends.log.partitions))
    assert await worker.recover(everywhere) == 1
    await worker.drained()
    assert needs_person(await worker.runner.inspect("r", tenant=TENANT))
    # The pass after the one that left it reads it once more, finds it left, and remembers.
    assert await worker.recover(everywhere) == 1
    await worker.drained()
    for _ in range(3):
        assert await worker.recover(everywhere) == 0
        await worker.drained()

    await worker.runner.resolve(
        "r", "c1", tenant=TENANT, outcome="never_ran", by="ops", why="no charge at the bank"
    )
    assert await worker.recover(everywhere) == 1
    await worker.drained()
    assert (await worker.runner.inspect("r", tenant=TENANT)).status == "completed"
    assert worker.stats.needs_person == 1
