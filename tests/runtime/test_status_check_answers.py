"""What a tool's status check may answer: `Reconciled` or ``None``, and nothing else.

Resume records the answer as the call's settlement, so an answer of another shape is refused
with an error naming the tool, never a crash deep in the runner or a write the log refuses.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from support.crash_world import search_and_book
from support.crashes import Crash, CrashAt

from onward.errors import BackendUnavailableError, ConfigurationError
from onward.eventlog import MemoryEventLog, ToolResolved
from onward.runtime.agent import Agent
from onward.runtime.leases.base import LeasePolicy
from onward.runtime.runner import AgentRunner
from onward.runtime.tools import Reconciled, Tool, tool

TENANT = "acme"


def booker(answer: Any, booked: list[str]) -> list[Tool]:
    """The booker's tools, whose ``book`` status check answers ``answer``."""

    @tool(retry_safe=True)
    async def search(query: str, *, idempotency_key: str) -> str:
        return f"found {query}"

    async def status(key: str) -> Any:
        return answer

    @tool(reconcile=status)
    async def book(seat: str, *, idempotency_key: str) -> dict[str, Any]:
        booked.append(idempotency_key)
        return {"seat": seat}

    return [search, book]


@pytest.mark.parametrize(
    "answer",
    [
        {"outcome": "completed", "result": {"seat": "3A"}},
        "completed",
        True,
        Reconciled("done"),  # type: ignore[arg-type]
    ],
    ids=["a-dict", "a-word", "a-bool", "an-unknown-outcome"],
)
async def test_a_status_check_answer_of_another_shape_is_refused_naming_the_tool(
    answer: Any,
) -> None:
    log, booked = MemoryEventLog(), list[str]()
    tools = booker(answer, booked)
    agent = Agent(name="booker", instructions="book", tools=tools)
    crashing = AgentRunner(
        log=log,
        worker="w",
        provider=search_and_book("on it", "done"),
        observer=CrashAt("tool.returned", "b"),
    )
    with pytest.raises(Crash):
        await crashing.run(agent, "go", tenant=TENANT, run_id="r")
    resuming = AgentRunner(log=log, worker="w", provider=search_and_book("on it", "done"))
    with pytest.raises(ConfigurationError, match="book's status check answered"):
        await resuming.resume(agent, "r", tenant=TENANT)
    assert len(booked) == 1


async def test_a_status_check_that_never_answers_stops_the_resume_in_bounded_time() -> None:
    """The status check's service went silent: the resume is given the lease's ttl, then stops
    with a retryable error naming the call, rather than hold the run, and its lease, for ever.
    Nothing is settled, and the booking is not made again."""
    log, booked = MemoryEventLog(), list[str]()
    search, _ = booker(None, booked)

    async def silent(key: str) -> Reconciled | None:
        await asyncio.Event().wait()
        return None

    @tool(reconcile=silent)
    async def book(seat: str, *, idempotency_key: str) -> dict[str, Any]:
        booked.append(idempotency_key)
        return {"seat": seat}

    agent = Agent(name="booker", instructions="book", tools=[search, book])
    crashing = AgentRunner(
        log=log,
        worker="w",
        provider=search_and_book("on it", "done"),
        observer=CrashAt("tool.returned", "b"),
    )
    with pytest.raises(Crash):
        await crashing.run(agent, "go", tenant=TENANT, run_id="r")
    resuming = AgentRunner(
        log=log,
        worker="w",
        provider=search_and_book("on it", "done"),
        lease_policy=LeasePolicy(ttl=timedelta(seconds=1)),
    )
    with pytest.raises(BackendUnavailableError, match=r"status check of b \(book\) did not answer"):
        await asyncio.wait_for(resuming.resume(agent, "r", tenant=TENANT), 10)
    assert len(booked) == 1


async def test_a_status_check_answer_too_large_for_the_log_is_the_calls_error() -> None:
    """The status check says the call completed, with a result over the log's limit and no
    blob store to take it: the call did complete, so the refusal is its outcome and the run
    goes on, rather than every resume asking the check again and failing on the write."""
    log, booked = MemoryEventLog(), list[str]()
    tools = booker(Reconciled("completed", "x" * 3_000_000), booked)
    agent = Agent(name="booker", instructions="book", tools=tools)
    crashing = AgentRunner(
        log=log,
        worker="w",
        provider=search_and_book("on it", "done"),
        observer=CrashAt("tool.dispatched"),
    )
    with pytest.raises(Crash):
        await crashing.run(agent, "go", tenant=TENANT, run_id="r")
    resuming = AgentRunner(log=log, worker="w", provider=search_and_book("on it", "done"))
    result = await resuming.resume(agent, "r", tenant=TENANT)
    assert result.status == "completed", result.error
    assert result.reconciled == ("b",)
    assert booked == []
    (resolved,) = [s.event for s in await log.read_run("r") if isinstance(s.event, ToolResolved)]
    assert (resolved.outcome, resolved.result) == ("completed", None)
    assert resolved.error is not None
    assert resolved.error.type == "PayloadTooLarge"
