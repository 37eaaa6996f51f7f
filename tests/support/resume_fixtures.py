"""What the recorded resume histories (tests/fixtures/resume) are classified with and as."""

from __future__ import annotations

from typing import Any

from onward.runtime.agent import Agent
from onward.runtime.planning import ResumePlan
from onward.runtime.tools import tool


def fixture_agent() -> Agent:
    """The agent of every recorded history: a retry-safe search and a plain booking."""

    @tool(retry_safe=True)
    async def search(query: str, *, idempotency_key: str) -> str:
        return query

    @tool
    async def book(seat: str, *, idempotency_key: str) -> str:
        return seat

    return Agent(name="booker", instructions="", tools=[search, book])


def classification(plan: ResumePlan) -> dict[str, Any]:
    """A plan as its ``<name>.expected.json`` records it."""
    return {
        "completed": [c.call_id for c in plan.completed],
        "to_dispatch": [c.call_id for c in plan.to_dispatch],
        "indeterminate": [c.call_id for c in plan.indeterminate],
        "safe": plan.safe,
    }
