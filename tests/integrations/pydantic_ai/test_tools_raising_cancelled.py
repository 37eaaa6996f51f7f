"""A `CancelledError` a tool raises while nobody cancelled its run is the tool's failure.

A tool that awaits a task or future something else cancelled (a shared connection's pending
request, closed by its pool) gets `CancelledError` from that await. The run was not cancelled:
the call is recorded with that error and the run fails as with any other error a tool raises,
rather than the caller, never cancelled, getting `CancelledError` with the call left for a
person to settle. Cancelling the run mid-call still stops it, with the call undecided.
"""

from __future__ import annotations

import asyncio

import pytest
from pydantic_ai import Agent
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.tools import DeferredToolRequests
from support.stores import Stores

from integrations.pydantic_ai.world import Script, durability_on
from onward.eventlog import RunFinished, ToolCompleted
from onward.integrations.pydantic_ai import OnwardDurability

RUN = "r-cancelled"


def fetching(
    durability: OnwardDurability[None], awaited: asyncio.Future[str] | None
) -> tuple[Agent[None, str | DeferredToolRequests], asyncio.Event]:
    """An agent whose one tool awaits ``awaited`` (``None``: an hour)."""
    entered = asyncio.Event()
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(Script().answer),
        name="booker",
        capabilities=[durability],
        output_type=[str, DeferredToolRequests],
    )

    @agent.tool_plain
    async def book(seat: str) -> str:
        """Book a seat."""
        entered.set()
        if awaited is None:
            await asyncio.sleep(3600)
            return "booked"
        return await awaited

    return agent, entered


async def test_a_cancelled_error_from_a_tools_own_await_fails_the_run_with_it_recorded(
    stores: Stores,
) -> None:
    durability = durability_on(stores, worker="here")
    shared: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(shared.cancel)
    agent, _ = fetching(durability, shared)

    with pytest.raises(Exception, match="raised CancelledError"):
        await durability.run(agent, "book seat 3A", run_id=RUN)

    recorded = [stored.event for stored in await stores.log.read_run(RUN)]
    (completed,) = [e for e in recorded if isinstance(e, ToolCompleted)]
    assert completed.error is not None
    assert completed.error.type == "ToolCancelledError"
    finished = recorded[-1]
    assert isinstance(finished, RunFinished), type(finished).__name__
    assert finished.status == "failed"


async def test_cancelling_the_run_mid_call_still_stops_it_with_the_call_undecided(
    stores: Stores,
) -> None:
    durability = durability_on(stores, worker="here")
    agent, entered = fetching(durability, None)
    running = asyncio.ensure_future(durability.run(agent, "book seat 3A", run_id=RUN))
    await asyncio.wait_for(entered.wait(), 10)

    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running

    recorded = [stored.event for stored in await stores.log.read_run(RUN)]
    assert not [e for e in recorded if isinstance(e, ToolCompleted | RunFinished)]
