"""A run left for a person stops needing one once its calls are settled, for good.

A worker that cannot tell whether a call ran tags the run ``needs-person`` and leaves it; a
person settles the call (`onward resolve`) and the run goes on. The tag stays on the run (tags
are kept), so it must say nothing about the run's later calls: a later turn's call left
without an outcome (its worker died mid-call, a retry-safe search any resume makes again) is an
ordinary interruption, and the run is carried on, not shown as waiting on a person for ever.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from support.crashes import Crash, CrashAt

import onward
from onward.eventlog import ToolCall
from onward.runtime.agent import Agent
from onward.runtime.ask import ask
from onward.runtime.manager import ExecutionManager
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.settings import Settings
from onward.runtime.tools import tool

TENANT = "acme"


@tool
async def charge(amount: int, *, idempotency_key: str) -> str:
    return f"charged {amount}"


@tool(retry_safe=True)
async def search(query: str, *, idempotency_key: str) -> str:
    return f"found {query}"


@tool
async def mail(*, idempotency_key: str) -> str:
    return f"mailed to {ask('mail the receipt to whom?', schema=str)}"


AGENT = Agent(name="charger", instructions="charge", tools=[charge, search, mail])


def model(then: str = "search") -> ScriptedProvider:
    args = {"query": "receipt"} if then == "search" else {}
    return ScriptedProvider(
        [
            reply("", ToolCall(call_id="c1", tool="charge", args={"amount": 5})),
            reply("", ToolCall(call_id="s1", tool=then, args=args)),
            reply("charged"),
        ]
    )


@pytest.fixture(params=["sqlite", "memory"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    return Settings(backend=request.param, sqlite_path=tmp_path / "onward.db")


@pytest_asyncio.fixture(params=["search", "mail"])
async def app(settings: Settings, request: pytest.FixtureRequest) -> AsyncIterator[onward.App]:
    provider = model(request.param)
    async with onward.open(settings, agents=[AGENT], provider=provider, recheck_s=0.2) as app:
        yield app


async def left_and_settled(app: onward.App) -> onward.RunMessage:
    """Run ``r``, left for a person over its charge and settled by Ann; its needs_person
    message."""
    # Its process dies right after dispatching the charge: nobody can tell if it went through.
    dying = app.backends.runner(model(), observer=CrashAt("tool.dispatched"))
    with pytest.raises(Crash):
        await dying.run(AGENT, "charge 5", tenant=TENANT, run_id="r")
    (*_, left) = await asyncio.wait_for(app.resume("r", tenant=TENANT).collect(), 10)
    assert left.type == "needs_person"
    await app.backends.runner(model()).resolve(
        "r", "c1", tenant=TENANT, outcome="completed", by="ann", why="the bank says so"
    )
    return left


@pytest.mark.parametrize("app", ["search"], indirect=True)
async def test_a_settled_run_that_is_interrupted_later_is_carried_on(app: onward.App) -> None:
    left = await left_and_settled(app)
    # Carried on, and its next process dies right after dispatching the (retry-safe) search.
    dying = app.backends.runner(model(), observer=CrashAt("tool.dispatched"))
    with pytest.raises(Crash):
        await dying.resume(AGENT, "r", tenant=TENANT)

    state = await app.get_session_state("r", tenant=TENANT)
    assert state is not None
    assert state.status == "interrupted"
    (pending,) = await ExecutionManager(app.backends.frontiers, app.backends.leases).list_pending(
        tenant=TENANT
    )
    assert pending.attention == "interrupted"
    # Nothing needs a person: the search is made again and the run ends.
    (*_, last) = await asyncio.wait_for(
        app.resume("r", tenant=TENANT, after=left.position).collect(), 10
    )
    assert (last.is_result, last.status) == (True, "completed")


@pytest.mark.parametrize("app", ["mail"], indirect=True)
async def test_a_settled_run_whose_later_question_is_answered_is_carried_on(
    app: onward.App,
) -> None:
    left = await left_and_settled(app)
    (*_, asked) = await asyncio.wait_for(
        app.resume("r", tenant=TENANT, after=left.position, follow_waits=False).collect(), 10
    )
    assert asked.is_hil_request
    (*_, last) = await asyncio.wait_for(
        app.resume("r", "ann@example.com", tenant=TENANT, after=asked.position).collect(), 10
    )
    assert (last.is_result, last.status) == (True, "completed")
