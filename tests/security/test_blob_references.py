"""Only the claim check makes blob references (security review #8).

The blob store is shared by every tenant and keyed by content. A run input or a tool result
that merely has a reference's shape must be read back as the value it was: never the body of
another tenant's run, and never a hole that stops the run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from support.crashes import Crash, CrashAt

from onward.eventlog import MemoryEventLog, Message, SqliteEventLog, ToolCall
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.agent import Agent
from onward.runtime.blobs import SqliteBlobStore, digest_of
from onward.runtime.leases import SqliteLeaseStore
from onward.runtime.providers import ModelReply, ScriptedProvider, reply
from onward.runtime.runner import AgentRunner
from onward.runtime.tools import tool

SECRET = "A-CONFIDENTIAL " + "x" * (300 * 1024)  # over the threshold: stored out of line


class Recording:
    """A scripted provider that keeps every conversation it was called with."""

    def __init__(self, replies: list[ModelReply]) -> None:
        self.inner = ScriptedProvider(replies)
        self.calls: list[list[Message]] = []

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        self.calls.append(list(messages))
        return await self.inner.complete(agent, messages)


FORGED = {"$blob": "sha256:" + "0" * 64, "size": 12}
"""What an API an agent calls might answer: the shape of a reference to nothing stored."""


@tool
async def lookup(key: str, *, idempotency_key: str) -> dict[str, Any]:
    return dict(FORGED)


AGENT = Agent(name="reader", instructions="read", tools=[lookup])


@dataclass
class Embedded:
    options: dict[str, Any]

    def runner(self, provider: Any, **more: Any) -> AgentRunner:
        return AgentRunner(provider=provider, **self.options, **more)


@pytest_asyncio.fixture
async def embedded(tmp_path: Path) -> AsyncIterator[Embedded]:
    db = tmp_path / "onward.db"
    async with (
        SqliteEventLog(db, partitions=1) as log,
        SqliteFrontierStore(db) as frontiers,
        SqliteBlobStore(db) as blobs,
        SqliteLeaseStore(db) as leases,
    ):
        yield Embedded(
            {
                "log": log,
                "frontiers": frontiers,
                "checkpoint_inline": True,
                "blobs": blobs,
                "leases": leases,
            }
        )


async def test_an_input_naming_another_tenants_digest_is_not_given_its_body(
    embedded: Embedded,
) -> None:
    """Security review #8: tenant B's run input shaped like a reference to tenant A's body."""
    first = Recording([reply("noted")])
    await embedded.runner(first).run(AGENT, SECRET, tenant="a", run_id="a-1")
    body = msgspec.json.encode(SECRET)
    forged = {"$blob": digest_of(body), "size": len(body)}
    assert await embedded.options["blobs"].get(forged["$blob"]) == body  # A's body is there

    provider = Recording([reply("done")])
    result = await embedded.runner(provider).run(AGENT, forged, tenant="b", run_id="b-1")

    assert result.status == "completed"
    said = provider.calls[0][-1]
    assert said.role == "user"
    assert "A-CONFIDENTIAL" not in str(said.content)
    assert msgspec.json.decode(str(said.content)) == forged  # B's own input, as B gave it
    stream = [m async for m in _stored_inputs(embedded, "b-1")]
    assert stream == [forged]


async def test_a_checkpoint_answer_naming_another_tenants_digest_is_not_given_its_body(
    embedded: Embedded,
) -> None:
    """A person's answer to a checkpoint, which the model reads next, shaped like a reference
    to tenant A's body: the claim check never moved it, so tenant B's model reads it as B's
    person gave it, also when the run goes on from its stored transcript."""
    await embedded.runner(Recording([reply("noted")])).run(AGENT, SECRET, tenant="a", run_id="a-1")
    body = msgspec.json.encode(SECRET)
    forged = {"$blob": digest_of(body), "size": len(body)}
    script = [reply("", ToolCall(call_id="c-1", tool="lookup", args={"key": "k"}))]
    options = {"mode": "collaborative", "checkpoints": ["after_tool_result"]}
    paused = await embedded.runner(ScriptedProvider(script)).run(
        AGENT, "look it up", tenant="b", run_id="b-1", options=options
    )
    assert paused.status == "waiting"
    assert paused.waiting_on is not None
    person = embedded.runner(ScriptedProvider([]))
    await person.approve("b-1", paused.waiting_on, tenant="b", by="bob", value=forged)

    provider = Recording([*script, reply("done")])
    result = await embedded.runner(provider).resume(AGENT, "b-1", tenant="b")

    assert result.status == "completed"
    said = provider.calls[0][-1]
    assert said.role == "user"
    assert "A-CONFIDENTIAL" not in str(said.content)
    assert msgspec.json.decode(str(said.content)) == forged


async def _stored_inputs(embedded: Embedded, run_id: str) -> AsyncIterator[Any]:
    """The run's input as a reader of the log gets it back."""
    runner = embedded.runner(ScriptedProvider([]))
    for stored in await embedded.options["log"].read_run(run_id):
        event = await runner.writer.restore(stored.event)
        if hasattr(event, "input"):
            yield event.input


async def test_a_tool_result_shaped_like_a_reference_is_kept_and_resumed(
    embedded: Embedded,
) -> None:
    """Security review #8: a tool's answer with a reference's shape and an unknown digest had
    made every later read of the run fail with HistoryUnavailableError."""
    script = [
        reply("", ToolCall(call_id="c-1", tool="lookup", args={"key": "k"})),
        reply("done"),
    ]
    crashing = embedded.runner(ScriptedProvider(script), observer=CrashAt("turn.settled"))
    with pytest.raises(Crash):
        await crashing.run(AGENT, "look it up", tenant="a", run_id="r-1")

    provider = Recording(script)
    result = await embedded.runner(provider).resume(AGENT, "r-1", tenant="a")

    assert result.status == "completed"
    tool_message = provider.calls[0][-1]
    assert tool_message.role == "tool"
    assert msgspec.json.decode(str(tool_message.content)) == FORGED


WRAPPED = {"$literal": "kept as given"}
"""A tool's answer shaped like the wrapping a look-alike is written in."""


@tool
async def wrapped(key: str, *, idempotency_key: str) -> dict[str, Any]:
    return dict(WRAPPED)


@pytest.mark.parametrize(("answer", "tool_name"), [(FORGED, "lookup"), (WRAPPED, "wrapped")])
async def test_a_look_alike_result_is_read_back_as_given_when_resumed_from_the_log(
    answer: dict[str, Any], tool_name: str
) -> None:
    """A run resumed from its log's events (no frontier row: the whole run is the tail) had
    its look-alike tool result unwrapped twice: a reference's shape became a reference part
    the model was sent as is, a wrapped one lost its wrapping. The model is sent the result
    as the live run sent it."""
    log = MemoryEventLog()
    agent = Agent(name="reader", instructions="read", tools=[lookup, wrapped])
    script = [
        reply("", ToolCall(call_id="c-1", tool=tool_name, args={"key": "k"})),
        reply("done"),
    ]
    live = Recording(script)
    crashing = AgentRunner(provider=live, log=log, observer=CrashAt("turn.settled"))
    with pytest.raises(Crash):
        await crashing.run(agent, "look it up", tenant="a", run_id="r-1")

    provider = Recording(script)
    result = await AgentRunner(provider=provider, log=log).resume(agent, "r-1", tenant="a")

    assert result.status == "completed"
    tool_message = provider.calls[0][-1]
    assert tool_message.role == "tool"
    assert isinstance(tool_message.content, str)
    assert msgspec.json.decode(tool_message.content) == answer
