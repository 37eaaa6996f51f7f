"""A tool that raises one of Onward's own errors (from Onward code it calls) fails the run like
any other error a tool raises: the run's end is recorded, not left running to be resumed."""

from __future__ import annotations

import pytest
from pydantic_ai import Agent
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.tools import DeferredToolRequests
from support.stores import Stores

from integrations.pydantic_ai.world import TENANT, Script, durability_on
from onward.errors import InvalidInputError
from onward.eventlog import RunFinished, ToolCompleted

RUN = "r-onward-error"


async def test_a_tool_raising_an_onward_error_ends_the_run_failed(stores: Stores) -> None:
    durability = durability_on(stores, worker="here")
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(Script().answer),
        name="booker",
        capabilities=[durability],
        output_type=[str, DeferredToolRequests],
    )

    @agent.tool_plain
    async def book(seat: str) -> str:
        """Book a seat."""
        raise InvalidInputError(f"seat {seat!r} does not exist")

    with pytest.raises(InvalidInputError):
        await durability.run(agent, "book seat 3A", run_id=RUN)

    recorded = [stored.event for stored in await stores.log.read_run(RUN)]
    completed = [e for e in recorded if isinstance(e, ToolCompleted)]
    assert completed[0].error is not None
    assert completed[0].error.type == "InvalidInputError"
    finished = recorded[-1]
    assert isinstance(finished, RunFinished), type(finished).__name__
    assert finished.status == "failed"
    frontier = await durability._runs.runner.inspect(RUN, tenant=TENANT)
    assert frontier.status == "failed"
