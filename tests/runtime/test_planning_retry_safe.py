"""Which word decides a call's retry-safety at resume: the agent's tool, and its dispatch's."""

from __future__ import annotations

import pytest

from onward.projections.frontier import CallState, Frontier
from onward.runtime.agent import Agent
from onward.runtime.planning import plan_resume
from onward.runtime.tools import tool


@tool(name="lookup", retry_safe=True)
async def lookup_safe(*, idempotency_key: str) -> str:
    return idempotency_key


@tool(name="lookup")
async def lookup_unsafe(*, idempotency_key: str) -> str:
    return idempotency_key


def _dispatched(recorded: bool | None) -> Frontier:
    call = CallState(
        call_id="c1",
        tool="lookup",
        dispatched_seq=3,
        dispatched_fence=1,
        idempotency_key="k1",
        retry_safe=recorded,
    )
    return Frontier(run_id="r", tenant="t", calls=(call,))


@pytest.mark.parametrize(
    ("agent_says", "dispatch_said", "dispatched_again"),
    [
        (True, None, True),
        (False, None, False),
        (True, True, True),
        (True, False, False),
        # The agent now marks the tool unsafe: an older dispatch's word does not send it again.
        (False, True, False),
        # No tool of that name (renamed by a run's own context): the dispatch's word decides.
        (None, True, True),
        (None, False, False),
        (None, None, False),
    ],
)
def test_a_call_is_dispatched_again_only_when_nothing_says_it_is_unsafe(
    agent_says: bool | None, dispatch_said: bool | None, dispatched_again: bool
) -> None:
    tools = [] if agent_says is None else [lookup_safe if agent_says else lookup_unsafe]
    agent = Agent(name="a", instructions="", tools=tools)
    plan = plan_resume(_dispatched(dispatch_said), agent)
    assert [c.call_id for c in plan.to_dispatch] == (["c1"] if dispatched_again else [])
