"""An agent run inside a tool (agent delegation) is the tool's business, not the run's.

The tool's outcome is what the run records; whatever the tool does inside, another durable
agent's model requests and tool calls included, is not one of the run's units. Recorded as if
it were, it would be replayed to the run's own requests when the run is executed again.
"""

from __future__ import annotations

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults
from support.stores import Stores

from integrations.pydantic_ai.world import durability_on
from onward.eventlog import Event, ModelAnswered, ToolCompleted, ToolDispatched, TurnSettled
from onward.integrations.pydantic_ai import OnwardDurability
from onward.runtime.demo_ledger import Ledger

RUN = "r-delegates"


def booker_answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Asks its helper for a seat, then books it (with approval), then ends."""
    answered = sum(isinstance(m, ModelResponse) for m in messages)
    if answered == 0:
        return ModelResponse(parts=[ToolCallPart("find", {"want": "aisle"}, tool_call_id="f1")])
    if answered == 1:
        return ModelResponse(parts=[ToolCallPart("book", {"seat": "3A"}, tool_call_id="b1")])
    return ModelResponse(parts=[TextPart("booked 3A")])


def helper_answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[TextPart("3A")])


def delegating_agent(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> Agent[None, str | DeferredToolRequests]:
    """A booking agent whose ``find`` tool asks a helper agent, itself a durable agent."""
    helper: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(helper_answer),
        name="helper",
        capabilities=[durability_on(stores, worker="here")],
        output_type=[str, DeferredToolRequests],
    )
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(booker_answer),
        name="booker",
        capabilities=[durability],
        output_type=[str, DeferredToolRequests],
    )

    @agent.tool_plain
    async def find(want: str) -> str:
        """Find a seat."""
        found = await helper.run(f"a {want} seat")
        return str(found.output)

    @agent.tool_plain(requires_approval=True)
    async def book(seat: str) -> str:
        """Book a seat."""
        ledger.record("book", "", seat=seat)
        return f"seat {seat} booked"

    return agent


async def events(stores: Stores) -> list[Event]:
    return [stored.event for stored in await stores.log.read_run(RUN)]


async def test_a_helper_agent_run_in_a_tool_is_not_recorded_as_the_runs_own(
    stores: Stores, ledger: Ledger
) -> None:
    durability = durability_on(stores, worker="here")
    agent = delegating_agent(durability, stores, ledger)

    waiting = await durability.run(agent, "book an aisle seat", run_id=RUN)

    assert waiting.status == "waiting"
    recorded = await events(stores)
    answers = [e for e in recorded if isinstance(e, ModelAnswered)]
    assert [[c.tool for c in a.tool_calls] for a in answers] == [["find"], ["book"]]
    dispatched = next(i for i, e in enumerate(recorded) if isinstance(e, ToolDispatched))
    assert isinstance(recorded[dispatched + 1], ToolCompleted)  # nothing of the helper in between
    assert sum(isinstance(e, TurnSettled) for e in recorded) == 1


async def test_a_resumed_run_that_delegated_replays_its_own_answers_and_acts_on_the_decision(
    stores: Stores, ledger: Ledger
) -> None:
    durability = durability_on(stores, worker="here")
    agent = delegating_agent(durability, stores, ledger)
    await durability.run(agent, "book an aisle seat", run_id=RUN)
    await durability.decide(RUN, DeferredToolResults(approvals={"b1": True}), by="alice")

    done = await durability.resume(agent, RUN)

    assert done.status == "completed"
    assert done.output == "booked 3A"
    assert ledger.entries() == [{"tool": "book", "key": "", "seat": "3A"}]
