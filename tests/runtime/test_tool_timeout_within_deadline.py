"""What a call of a tool with a deadline (``max_call_s``) raises is told apart by whether the
deadline passed, not by its type.

A `TimeoutError` of the tool's own, long before its deadline (a connection that timed out, its
own ``asyncio.timeout``), is its failure: recorded as it is for the same tool without a
deadline, not as a cut-off at ``max_call_s``. And whatever a call raises once it was cut off is
the cut-off: it may have taken effect.

A call whose deadline passed before it could start is not started, and its error is recorded:
it certainly did not take effect. A cut-off call's status check is given the lease's ttl, and
one that does not answer, or fails, leaves the call for a person without keeping the run
waiting or stopping the turn's other calls.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

import pytest

from onward.errors import IndeterminateToolCallError
from onward.eventlog import Event, MemoryEventLog, ToolCall, ToolCompleted, ToolDispatched
from onward.runtime import Agent, AgentRunner, ScriptedProvider, reply, tool
from onward.runtime.leases.base import LeasePolicy
from onward.runtime.tools import Reconciled, Tool

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


class SlowDispatch:
    """A log that acknowledges a batch of dispatches only after ``delay_s`` (under load)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    async def appended(self, events: Sequence[Event]) -> None:
        if any(isinstance(e, ToolDispatched) for e in events):
            await asyncio.sleep(self.delay_s)

    async def tool_returned(self, call_id: str) -> None:
        return None

    async def before_model_call(self) -> None:
        return None


async def test_a_call_whose_deadline_passed_before_it_could_start_is_not_made() -> None:
    """The dispatch's write took longer than the call's max_call_s: the call is not started
    (not even up to its first await), and as it certainly did not take effect, its
    ``DeadlineExceeded`` error is recorded for the model rather than the run left for a
    person over a call that never ran."""
    entered: list[str] = []
    effects: list[str] = []

    @tool(max_call_s=0.2)
    async def book(seat: str, *, idempotency_key: str) -> str:
        entered.append(idempotency_key)
        await asyncio.sleep(0)
        effects.append(idempotency_key)
        return "booked"

    agent = Agent(name="booker", instructions="book", tools=[book])
    log = MemoryEventLog()
    model = ScriptedProvider(
        [reply("", ToolCall(call_id="b", tool="book", args={"seat": "3A"})), reply("not booked")]
    )
    runner = AgentRunner(provider=model, log=log, observer=SlowDispatch(0.4))

    result = await runner.run(agent, "go", tenant=TENANT, run_id="r")

    assert (entered, effects) == ([], [])
    assert result.status == "completed"
    (completed,) = [s.event for s in await log.read_run("r") if isinstance(s.event, ToolCompleted)]
    assert completed.error is not None
    assert completed.error.type == "DeadlineExceeded"
    assert "it was not called" in completed.error.message


def cut_off_book(status: Callable[[str], Awaitable[Reconciled | None]]) -> Tool:
    @tool(max_call_s=0.2, reconcile=status)
    async def book(seat: str, *, idempotency_key: str) -> str:
        await asyncio.sleep(5)
        return "too late"

    return book


async def test_a_status_check_that_never_answers_after_a_cut_off_leaves_the_call_to_a_person(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Cut off at max_call_s, the call's status check hangs (its service went silent): it is
    given the lease's ttl, and the call is left for a person, saying why, rather than the run
    waiting for ever under its lease."""

    async def hangs(key: str) -> Reconciled | None:
        await asyncio.Event().wait()
        return None

    agent = Agent(name="booker", instructions="book", tools=[cut_off_book(hangs)])
    model = ScriptedProvider(
        [reply("", ToolCall(call_id="b", tool="book", args={"seat": "3A"})), reply("booked")]
    )
    runner = AgentRunner(
        provider=model, log=MemoryEventLog(), lease_policy=LeasePolicy(ttl=timedelta(seconds=1))
    )
    with (
        caplog.at_level(logging.WARNING, logger="onward.runner"),
        pytest.raises(IndeterminateToolCallError, match=r"b \(book\)"),
    ):
        await asyncio.wait_for(runner.run(agent, "go", tenant=TENANT, run_id="r"), 5)
    assert "the status check of b (book) gave no answer" in caplog.text
    assert "did not answer within 1s" in caplog.text


async def test_a_status_check_that_fails_after_a_cut_off_stops_no_other_call_of_the_turn() -> None:
    """One call is cut off and its status check fails (the service is down); the turn's other
    call, still running, is not stopped mid-call: its outcome is recorded, and only the cut
    call is left for a person."""

    async def unreachable(key: str) -> Reconciled | None:
        raise ConnectionError("bookings.example: connection refused")

    sent: list[str] = []

    @tool
    async def send(to: str, *, idempotency_key: str) -> str:
        await asyncio.sleep(0.5)
        sent.append(idempotency_key)
        return f"sent to {to}"

    agent = Agent(name="booker", instructions="book", tools=[cut_off_book(unreachable), send])
    log = MemoryEventLog()
    model = ScriptedProvider(
        [
            reply(
                "",
                ToolCall(call_id="b", tool="book", args={"seat": "3A"}),
                ToolCall(call_id="s", tool="send", args={"to": "ann"}),
            ),
            reply("done"),
        ]
    )
    runner = AgentRunner(provider=model, log=log)
    with pytest.raises(IndeterminateToolCallError) as raised:
        await runner.run(agent, "go", tenant=TENANT, run_id="r")
    assert [c.call_id for c in raised.value.calls] == ["b"]
    assert len(sent) == 1
    completed = [s.event for s in await log.read_run("r") if isinstance(s.event, ToolCompleted)]
    assert [(c.call_id, c.result) for c in completed] == [("s", "sent to ann")]
