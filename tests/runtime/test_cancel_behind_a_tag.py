"""A cancel of a run another worker drives, sent to the worker that owns its requests while a
tag of the same run waits there for that holder to let go.

The owner's cancel stops the run's tasks here first (`Worker.others_stopped`), and the tag
asks again until the run is free: without asking the holder to end the run, the cancel waited
on the tag, the tag on the holder, and the run went on as if nobody had cancelled it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import timedelta
from pathlib import Path

import pytest_asyncio
from support.fault_runs import until

from onward.errors import NothingToResumeError
from onward.eventlog.events import Message, ToolCall
from onward.projections.frontier import Frontier
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.fleet.requests import CancelRun, StartRun, TagRun
from onward.runtime.fleet.worker import Worker
from onward.runtime.leases.base import LeasePolicy
from onward.runtime.providers import ModelReply, reply
from onward.runtime.settings import Settings
from onward.runtime.tools import tool

TENANT = "acme"


@tool
async def note(*, idempotency_key: str) -> str:
    return "noted"


AGENT = Agent(name="looper", instructions="loop", tools=[note], max_iterations=10_000)


class Endless:
    """A model that asks for one more note every tenth of a second: a run that goes on."""

    def __init__(self) -> None:
        self._ids = itertools.count()

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        await asyncio.sleep(0.1)
        return reply("", ToolCall(call_id=f"n{next(self._ids)}", tool="note", args={}))


@pytest_asyncio.fixture
async def backends(tmp_path: Path) -> AsyncIterator[Backends]:
    settings = Settings.model_validate(
        {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "cancel.db")}
    )
    async with open_backends(settings) as opened:
        yield opened


def worker(backends: Backends, name: str) -> Worker:
    policy = LeasePolicy(ttl=timedelta(seconds=2))
    return Worker(
        backends, Endless(), {"looper": AGENT}, name=name, backoff_s=0.1, lease_policy=policy
    )


async def eventually(check: Callable[[], Awaitable[bool]], what: str, within_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.1)


async def test_a_cancel_behind_a_tag_waiting_for_the_holder_ends_the_run(
    backends: Backends,
) -> None:
    driver, owner = worker(backends, "driver"), worker(backends, "owner")

    async def started() -> bool:
        return await backends.frontiers.get("r") is not None

    async def ended() -> bool:
        return (await owner.runner.inspect("r", tenant=TENANT)).finished

    driver.submit(StartRun(run_id="r", tenant=TENANT, agent="looper", input="go"))
    try:
        await eventually(started, "the start", 15)
        owner.submit(TagRun(run_id="r", tenant=TENANT, label="seen"))
        await until(lambda: owner.stats.conflicts >= 2, "the tag waiting for the driver")
        owner.submit(CancelRun(run_id="r", tenant=TENANT, by="ops", why="not wanted"))
        await eventually(ended, "the run went on, uncancelled", 15)
        await asyncio.wait_for(owner.drained(), 15)
    finally:
        driver.drain()
        owner.drain()
        await asyncio.wait_for(asyncio.gather(driver.drained(), owner.drained()), 30)
    frontier = await owner.runner.inspect("r", tenant=TENANT)
    assert frontier.status == "cancelled"
    assert "seen" in [t.label for t in frontier.tags]


async def test_a_cancel_right_behind_its_start_is_not_taken_for_another_tenant_s(
    backends: Backends,
) -> None:
    """A run's start and its cancel, taken together (one poll of the topic), are acted on side
    by side. The cancel read the run before the start wrote it and found it in the log right
    after: it took the run for another tenant's and was refused for good, and the run went on,
    uncancelled. It reads the run again and ends it."""
    owner = worker(backends, "owner")
    inspect = owner.runner.inspect
    raced = False

    async def read_as_the_start_writes(run_id: str, *, tenant: str) -> Frontier:
        nonlocal raced
        try:
            return await inspect(run_id, tenant=tenant)
        except NothingToResumeError:
            if raced:
                raise
            raced = True  # the start, in flight here, writes the run right after this read
            await eventually(lambda: owner.runner.resumer.exists(run_id), "the start", 15)
            raise

    owner.runner.inspect = read_as_the_start_writes  # type: ignore[method-assign]

    async def ended() -> bool:
        return (
            await owner.runner.resumer.exists("r") and (await inspect("r", tenant=TENANT)).finished
        )

    owner.submit(StartRun(run_id="r", tenant=TENANT, agent="looper", input="go"))
    owner.submit(CancelRun(run_id="r", tenant=TENANT, by="ops", why="not wanted"))
    try:
        await eventually(ended, "the run went on, uncancelled", 15)
    finally:
        owner.drain()
        await asyncio.wait_for(owner.drained(), 30)
    assert raced
    assert (await inspect("r", tenant=TENANT)).status == "cancelled"
    assert owner.stats.failures == 0
