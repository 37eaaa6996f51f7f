"""A `CancelledError` a tool raises while nobody cancelled the run is the tool's failure.

A tool that awaits a task or future something else cancelled (a shared connection's pending
request, closed by its pool) gets `CancelledError` from that await. The run itself was not
cancelled: its call is recorded with that error, as any other exception the tool raises, and
the run goes on, rather than the caller, never cancelled, getting `CancelledError` with the
call left undecided. Cancelling the run mid-call still stops it, with the call undecided.
"""

from __future__ import annotations

import asyncio

import pytest

from onward.eventlog import MemoryEventLog, RunFinished, ToolCall, ToolCompleted
from onward.runtime import Agent, AgentRunner, ScriptedProvider, reply, tool

TENANT = "acme"


def fetching(shared: asyncio.Future[str]) -> Agent:
    @tool
    async def fetch(url: str, *, idempotency_key: str) -> str:
        return await shared

    return Agent(name="fetcher", instructions="fetch", tools=[fetch])


def model() -> ScriptedProvider:
    return ScriptedProvider(
        [reply("", ToolCall(call_id="f", tool="fetch", args={"url": "db.internal"})), reply("ok")]
    )


async def test_a_cancelled_error_from_a_tools_own_await_is_recorded_as_its_error() -> None:
    shared: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(shared.cancel)
    log = MemoryEventLog()

    result = await AgentRunner(provider=model(), log=log).run(
        fetching(shared), "go", tenant=TENANT, run_id="r"
    )

    assert result.status == "completed"
    (completed,) = [s.event for s in await log.read_run("r") if isinstance(s.event, ToolCompleted)]
    assert completed.error is not None
    assert completed.error.type == "ToolCancelledError"
    assert "raised CancelledError" in completed.error.message


async def test_cancelling_the_run_mid_call_still_stops_it_with_the_call_undecided() -> None:
    entered = asyncio.Event()

    @tool
    async def fetch(url: str, *, idempotency_key: str) -> str:
        entered.set()
        await asyncio.sleep(60)
        return "fetched"

    agent = Agent(name="fetcher", instructions="fetch", tools=[fetch])
    log = MemoryEventLog()
    running = asyncio.ensure_future(
        AgentRunner(provider=model(), log=log).run(agent, "go", tenant=TENANT, run_id="r")
    )
    await asyncio.wait_for(entered.wait(), 10)

    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running

    events = [s.event for s in await log.read_run("r")]
    assert not [e for e in events if isinstance(e, ToolCompleted | RunFinished)]
