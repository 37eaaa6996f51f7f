"""What a call of a tool with a deadline (``max_call_s``) raises is told apart by whether the
deadline passed, not by its type.

A `TimeoutError` of the tool's own, long before its deadline (a connection that timed out, its
own ``asyncio.timeout``), is its failure: recorded as it is for the same tool without a
deadline, not as a cut-off at ``max_call_s``. And whatever a call raises once it was cut off is
the cut-off: it may have taken effect.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from onward.errors import IndeterminateToolCallError
from onward.eventlog import MemoryEventLog, ToolCall, ToolCompleted
from onward.runtime import Agent, AgentRunner, ScriptedProvider, reply, tool

TENANT = "acme"


def timing_out(max_call_s: float | None, *, retry_safe: bool) -> Agent:
    @tool(max_call_s=max_call_s, retry_safe=retry_safe)
    async def fetch(url: str, *, idempotency_key: str) -> str:
        raise TimeoutError(f"connecting to {url} timed out")

    return Agent(name="fetcher", instructions="fetch", tools=[fetch])


async def recorded_error(agent: Agent) -> tuple[str, Any]:
    log = MemoryEventLog()
    model = ScriptedProvider(
        [reply("", ToolCall(call_id="f", tool="fetch", args={"url": "db.internal"})), reply("ok")]
    )
    result = await AgentRunner(provider=model, log=log).run(agent, "go", tenant=TENANT)
    (completed,) = [
        s.event for s in await log.read_run(result.run_id) if isinstance(s.event, ToolCompleted)
    ]
    assert completed.error is not None
    return result.status, (completed.error.type, completed.error.message)


@pytest.mark.parametrize("retry_safe", [True, False])
async def test_a_tools_own_timeout_is_its_error_not_a_cut_off_at_its_deadline(
    retry_safe: bool,
) -> None:
    without = await recorded_error(timing_out(None, retry_safe=retry_safe))
    assert without == ("completed", ("TimeoutError", "connecting to db.internal timed out"))

    assert await recorded_error(timing_out(10, retry_safe=retry_safe)) == without


async def test_a_call_whose_clean_up_fails_once_cut_off_is_still_cut_off() -> None:
    """Cut off at its deadline, the call's own clean-up raises (a connection closed mid-request
    refusing to close): the call may have taken effect all the same, so it is not recorded as
    an error the model may answer by asking again; nothing can decide it, so a person must."""
    calls: list[str] = []

    @tool(max_call_s=0.2)
    async def book(seat: str, *, idempotency_key: str) -> str:
        calls.append(idempotency_key)
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            raise ConnectionError("connection reset while closing") from None
        return "booked"

    agent = Agent(name="booker", instructions="book", tools=[book])
    log = MemoryEventLog()
    model = ScriptedProvider(
        [reply("", ToolCall(call_id="b", tool="book", args={"seat": "3A"})), reply("booked")]
    )

    with pytest.raises(IndeterminateToolCallError, match="cut off at their deadline"):
        await AgentRunner(provider=model, log=log).run(agent, "go", tenant=TENANT, run_id="r")

    assert len(calls) == 1
    assert not [s for s in await log.read_run("r") if isinstance(s.event, ToolCompleted)]
