"""The Python entry points that name an existing run take its exact id and tenant.

A producer writing to the log directly can store a run named out of a new name's bounds (a
control character, more than 200 characters; the log refuses only NUL). `AgentRunner` and
`App` still inspect, resume, resolve and cancel it, and a fleet's requests about it are sent;
a new run under such a name is still refused, and so is what no stored name holds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from support.appapi import agents, provider

import onward
from onward.errors import IndeterminateToolCallError, InvalidInputError
from onward.eventlog import (
    Event,
    MemoryEventLog,
    Message,
    ModelAnswered,
    RunStarted,
    ToolCall,
    ToolDispatched,
)
from onward.projections.memory import MemoryFrontierStore
from onward.runtime.agent import Agent
from onward.runtime.fleet.requests import (
    AnswerRequest,
    CancelRun,
    ResumeRun,
    StartRun,
    TagRun,
    decode_request,
    encode_request,
)
from onward.runtime.providers import ScriptedProvider
from onward.runtime.runner import AgentRunner
from onward.runtime.settings import Settings
from onward.testing.eventlog import Envelope

RUN = "run\x1b[2J" + "x" * 200
TENANT = "ac\x07me"
AGENT = "book\x7fer"
BOOKER = Agent(name=AGENT, instructions="")


def undecided(run_id: str = RUN, tenant: str = TENANT, call_id: str = "c1") -> list[Event]:
    """A run whose call ``call_id`` was dispatched and never settled, as a producer wrote it."""

    def env(seq: int) -> Envelope:
        return Envelope(run_id=run_id, tenant=tenant, seq=seq, fence=1, at=seq)

    call = ToolCall(call_id=call_id, tool="book")
    return [
        RunStarted(**env(1), agent=AGENT, revision=BOOKER.revision, input="hi"),
        ModelAnswered(**env(2), message=Message(role="assistant", content=""), tool_calls=[call]),
        ToolDispatched(**env(3), call_id=call_id, tool="book", idempotency_key="k"),
    ]


async def test_the_runner_inspects_resumes_resolves_and_cancels_the_run() -> None:
    log = MemoryEventLog(partitions=2)
    runner = AgentRunner(
        provider=ScriptedProvider([]),
        log=log,
        frontiers=MemoryFrontierStore(),
        checkpoint_inline=True,
    )
    await log.append(undecided())
    assert (await runner.inspect(RUN, tenant=TENANT)).agent == AGENT
    with pytest.raises(IndeterminateToolCallError):
        await runner.resume(BOOKER, RUN, tenant=TENANT)
    await runner.resolve(RUN, "c1", tenant=TENANT, outcome="never_ran", by="ops", why="checked")
    ended = await runner.cancel(RUN, tenant=TENANT, by="ops")
    assert ended.status == "cancelled"
    with pytest.raises(InvalidInputError, match="run_id is 209 characters long"):
        await runner.run(BOOKER, "hi", tenant="acme", run_id=RUN + "-2")


async def test_a_call_the_producer_named_out_of_bounds_is_settled_by_its_exact_id() -> None:
    """The run's resume refuses to guess about the call and names it; settled as named, the
    run is no longer stuck on it."""
    call_id = "c1\x1b[8m" + "y" * 200
    log = MemoryEventLog(partitions=2)
    runner = AgentRunner(
        provider=ScriptedProvider([]),
        log=log,
        frontiers=MemoryFrontierStore(),
        checkpoint_inline=True,
    )
    await log.append(undecided("r1", "acme", call_id))
    with pytest.raises(IndeterminateToolCallError) as undecidable:
        await runner.resume(BOOKER, "r1", tenant="acme")
    assert [call.call_id for call in undecidable.value.calls] == [call_id]
    await runner.resolve("r1", call_id, tenant="acme", outcome="never_ran", by="ops", why="seen")
    call = (await runner.inspect("r1", tenant="acme")).call(call_id)
    assert call is not None
    assert call.outcome is not None


@pytest.mark.parametrize(
    ("run_id", "tenant", "said"),
    [
        ("run\x00x", TENANT, "run_id holds a NUL character"),
        (RUN, "", "tenant must not be empty"),
        ("\udfff", TENANT, r"run_id holds '\\udfff' at position 0, a lone surrogate"),
    ],
)
async def test_what_no_stored_name_holds_is_refused_and_nothing_written(
    run_id: str, tenant: str, said: str
) -> None:
    log = MemoryEventLog(partitions=2)
    runner = AgentRunner(provider=ScriptedProvider([]), log=log, frontiers=MemoryFrontierStore())
    await log.append(undecided())
    with pytest.raises(InvalidInputError, match=said):
        await runner.cancel(run_id, tenant=tenant, by="ops")
    assert len(await log.read_run(RUN)) == 3


@pytest_asyncio.fixture
async def app(tmp_path: Path) -> AsyncIterator[onward.App]:
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")
    async with onward.open(settings, agents=agents, provider=provider(), tenant="acme") as opened:
        yield opened


async def test_the_app_shows_and_cancels_the_run(app: onward.App) -> None:
    await app.backends.log.append(undecided())
    state = await app.get_session_state(RUN, tenant=TENANT)
    assert state is not None
    assert state.agent == AGENT
    await app.cancel(RUN, by="ops", tenant=TENANT)
    state = await app.get_session_state(RUN, tenant=TENANT)
    assert state is not None
    assert state.status == "cancelled"


@pytest.mark.parametrize(
    "request_",
    [
        ResumeRun(run_id=RUN, tenant=TENANT, agent=AGENT),
        AnswerRequest(
            run_id=RUN, tenant=TENANT, request_id="c1\x1b[8m", approve=True, by="ops", agent=AGENT
        ),
        TagRun(run_id=RUN, tenant=TENANT, label="seen"),
        CancelRun(run_id=RUN, tenant=TENANT, by="ops"),
    ],
)
def test_a_request_about_the_run_is_sent_and_read_back(request_: Any) -> None:
    assert decode_request(encode_request(request_)) == request_


def test_a_start_under_such_a_name_is_still_refused() -> None:
    with pytest.raises(InvalidInputError, match=r"StartRun\.run_id is 207 characters long"):
        decode_request(encode_request(StartRun(run_id=RUN, tenant="acme", agent="payer")))
