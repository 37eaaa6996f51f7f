"""Tools of a prefixed toolset (or renamed by their own ``prepare``) keep their Onward options:
resume planning reads them under the name the model calls them by."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic_ai import Agent, FunctionToolset, RunContext
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.tools import DeferredToolRequests, ToolDefinition
from support.stores import Stores

from integrations.pydantic_ai.world import Crash, Faults, Script, durability_on
from onward.eventlog import ResumePlanned
from onward.integrations.pydantic_ai import OnwardDurability

RUN = "r-prefixed"


def searching_agent(
    stores: Stores, script: Script, searched: list[str]
) -> tuple[Agent[None, str | DeferredToolRequests], OnwardDurability[None]]:
    """An agent whose one tool, retry-safe, is in a toolset prefixed ``hotels``."""
    durability = durability_on(stores, worker="here")
    hotels = FunctionToolset(id="hotels")

    async def search(q: str) -> str:
        searched.append(q)
        script.faults.reach("after_effect")
        return f"hotels: {q}"

    hotels.add_function(search, name="search", metadata={"onward": {"retry_safe": True}})
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(script.answer),
        name="searcher",
        capabilities=[durability],
        output_type=[str, DeferredToolRequests],
        toolsets=[hotels.prefixed("hotels")],
    )
    return agent, durability


async def test_a_retry_safe_tool_under_a_prefix_is_planned_to_be_dispatched_again(
    stores: Stores,
) -> None:
    searched: list[str] = []
    call = ToolCallPart("hotels_search", {"q": "Rome"}, tool_call_id="s1")
    script = Script(call, faults=Faults({"after_effect"}))
    agent, durability = searching_agent(stores, script, searched)
    with pytest.raises(Crash):
        await durability.run(agent, "find a hotel", run_id=RUN)

    done = await durability.resume(agent, RUN)

    assert (done.status, done.output) == ("completed", "done: hotels: Rome")
    assert searched == ["Rome", "Rome"]
    assert done.plan is not None
    assert [c.call_id for c in done.plan.to_dispatch] == ["s1"]
    assert done.plan.indeterminate == []
    planned = [
        stored.event
        for stored in await stores.log.read_run(RUN)
        if isinstance(stored.event, ResumePlanned)
    ]
    assert (planned[0].dispatched, planned[0].undecided) == (["s1"], [])


async def test_a_toolset_marked_retry_safe_with_metadata_is_planned_to_be_dispatched_again(
    stores: Stores,
) -> None:
    """``toolset.with_metadata(onward=...)`` marks every tool of a toolset retry-safe, as the
    journal reads it when it runs the call: resume planning reads it the same."""
    searched: list[str] = []
    call = ToolCallPart("search", {"q": "Rome"}, tool_call_id="s1")
    script = Script(call, faults=Faults({"after_effect"}))
    durability = durability_on(stores, worker="here")
    hotels = FunctionToolset(id="hotels")

    async def search(q: str) -> str:
        searched.append(q)
        script.faults.reach("after_effect")
        return f"hotels: {q}"

    hotels.add_function(search, name="search")
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(script.answer),
        name="searcher",
        capabilities=[durability],
        output_type=[str, DeferredToolRequests],
        toolsets=[hotels.with_metadata(onward={"retry_safe": True})],
    )
    with pytest.raises(Crash):
        await durability.run(agent, "find a hotel", run_id=RUN)

    done = await durability.resume(agent, RUN)

    assert (done.status, done.output) == ("completed", "done: hotels: Rome")
    assert searched == ["Rome", "Rome"]
    assert done.plan is not None
    assert [c.call_id for c in done.plan.to_dispatch] == ["s1"]
    assert done.plan.indeterminate == []


async def test_a_retry_safe_tool_its_prepare_renames_is_planned_to_be_dispatched_again(
    stores: Stores,
) -> None:
    """A tool whose own ``prepare`` gives it another name is called by that name, which only
    a run context tells: resume planning reads its retry-safety as the journal dispatched it."""
    searched: list[str] = []
    call = ToolCallPart("find_hotels", {"q": "Rome"}, tool_call_id="s1")
    script = Script(call, faults=Faults({"after_effect"}))
    durability = durability_on(stores, worker="here")
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(script.answer),
        name="searcher",
        capabilities=[durability],
        output_type=[str, DeferredToolRequests],
    )

    async def renamed(ctx: RunContext[None], tool_def: ToolDefinition) -> ToolDefinition:
        return dataclasses.replace(tool_def, name="find_hotels")

    @agent.tool_plain(prepare=renamed, metadata={"onward": {"retry_safe": True}})
    async def search(q: str) -> str:
        searched.append(q)
        script.faults.reach("after_effect")
        return f"hotels: {q}"

    with pytest.raises(Crash):
        await durability.run(agent, "find a hotel", run_id=RUN)

    done = await durability.resume(agent, RUN)

    assert (done.status, done.output) == ("completed", "done: hotels: Rome")
    assert searched == ["Rome", "Rome"]
    assert done.plan is not None
    assert [c.call_id for c in done.plan.to_dispatch] == ["s1"]
    assert done.plan.indeterminate == []
    planned = [
        stored.event
        for stored in await stores.log.read_run(RUN)
        if isinstance(stored.event, ResumePlanned)
    ]
    assert (planned[0].dispatched, planned[0].undecided) == (["s1"], [])
