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

from onward.errors import HistoryUnavailableError
from onward.eventlog import MemoryEventLog, Message, SqliteEventLog, ToolCall
from onward.projections.sqlite import SqliteFrontierStore
from onward.projections.transcript import LoggedMessage, TranscriptRow
from onward.runtime.agent import Agent
from onward.runtime.blobs import ClaimCheck, MemoryBlobStore, SqliteBlobStore, digest_of
from onward.runtime.conversation import restored
from onward.runtime.leases import SqliteLeaseStore
from onward.runtime.providers import ModelReply, ScriptedProvider, reply
from onward.runtime.runner import AgentRunner
from onward.runtime.tools import Tool, tool

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


LARGE = {"text": "z" * (300 * 1024)}
"""A call's arguments over the claim check's threshold: the log holds them out of line."""


@tool
async def write(text: str, *, idempotency_key: str) -> str:
    """A short answer to large arguments; to short ones, an answer over the threshold."""
    return text[:3] if len(text) > 10 else "z" * (300 * 1024)


WRITER = Agent(name="writer", instructions="write", tools=[write])


def _asked(messages: Sequence[Message]) -> list[Any]:
    """The arguments of every call the assistant messages of a conversation asked for."""
    return [
        call["arguments"]
        for message in messages
        if message.role == "assistant" and isinstance(message.content, list)
        for part in message.content
        if isinstance(part, dict) and part.get("type") == "tool_calls"
        for call in part["tool_calls"]
    ]


@pytest.mark.parametrize(
    ("said", "args"),
    [
        ("", LARGE),  # large arguments
        ("y" * (300 * 1024), LARGE),  # a large text and large arguments
        ("y" * (300 * 1024), {"text": "short"}),  # a large text; a large result
    ],
    ids=["arguments", "text-and-arguments", "text-and-result"],
)
async def test_large_bodies_reach_the_model_as_given_when_resumed_from_the_transcript(
    embedded: Embedded, said: str, args: dict[str, Any]
) -> None:
    """A past call whose arguments the claim check moved out of line had been shown to the
    model, after a resume from the stored transcript, as the reference it was stored as: the
    model saw another conversation than the run it was resuming had. It sees the one the run
    would have sent it had it not stopped."""
    script = [reply(said, ToolCall(call_id="w-1", tool="write", args=args)), reply("done")]
    whole = Recording(script)
    await embedded.runner(whole).run(WRITER, "write it", tenant="a", run_id="whole")
    crashing = embedded.runner(ScriptedProvider(script), observer=CrashAt("turn.settled"))
    with pytest.raises(Crash):
        await crashing.run(WRITER, "write it", tenant="a", run_id="w")

    provider = Recording(script)
    result = await embedded.runner(provider).resume(WRITER, "w", tenant="a")

    assert result.status == "completed"
    assert _asked(provider.calls[0]) == [args]
    assert provider.calls[0] == whole.calls[1]


def a_keeper() -> tuple[Tool, list[dict[str, Any]]]:
    """A ``keep`` tool taking any arguments, and the arguments of each of its calls."""
    kept: list[dict[str, Any]] = []

    async def keep(*, idempotency_key: str, **args: Any) -> str:
        kept.append(args)
        return "kept"

    return Tool(name="keep", description="keep", parameters={"type": "object"}, fn=keep), kept


@pytest.mark.parametrize("beside", [LARGE, None], ids=["beside-large", "alone"])
@pytest.mark.parametrize(
    "args", [FORGED, {"$literal": FORGED}, {"$literal": "kept"}], ids=["ref", "wrapped", "literal"]
)
async def test_arguments_shaped_like_a_reference_are_given_as_they_are_and_never_fetched(
    embedded: Embedded, args: dict[str, Any], beside: dict[str, Any] | None
) -> None:
    """A model's arguments shaped like a reference (to another tenant's body), or like the
    wrapping of one: the tool is called with them as the model gave them, and after a resume
    from the stored transcript the model is shown them so, whether the claim check moved them
    out of line beside large ones or kept them in line. The body they name is never fetched."""
    await embedded.runner(Recording([reply("noted")])).run(AGENT, SECRET, tenant="a", run_id="a-1")
    body = msgspec.json.encode(SECRET)
    if args == FORGED:
        args = {"$blob": digest_of(body), "size": len(body)}  # tenant A's body
    keep, kept = a_keeper()
    calls = [ToolCall(call_id="k-1", tool="keep", args=args)]
    if beside is not None:
        calls.insert(0, ToolCall(call_id="w-1", tool="write", args=beside))
    script = [reply("", *calls), reply("done")]
    agent = Agent(name="keeper", instructions="keep", tools=[write, keep])
    crashing = embedded.runner(Recording(script), observer=CrashAt("turn.settled"))
    with pytest.raises(Crash):
        await crashing.run(agent, "keep it", tenant="b", run_id="b-1")

    provider = Recording(script)
    result = await embedded.runner(provider).resume(agent, "b-1", tenant="b")

    assert result.status == "completed"
    assert kept == [args]
    assert _asked(provider.calls[0]) == [c.args for c in calls]
    assert "A-CONFIDENTIAL" not in str(provider.calls[0])


async def test_a_row_stored_before_arguments_were_kept_as_logged_is_read_as_stored() -> None:
    """A transcript row written before the mark held a look-alike unwrapped, as like a reference
    as one the claim check made: its arguments are read as stored, never fetched. A marked row's
    reference is fetched, and without a blob store the resume stops rather than show it."""
    blobs = MemoryBlobStore()
    given = {"text": "written"}
    reference = {"$blob": await blobs.put(msgspec.json.encode(given)), "size": 20}
    part = {
        "type": "tool_calls",
        "tool_calls": [{"id": "c", "name": "write", "arguments": reference}],
    }
    old = TranscriptRow(
        tenant="b", run_id="r", seq=2, message=Message(role="assistant", content=[part])
    )
    marked = msgspec.structs.replace(
        old, message=LoggedMessage(role="assistant", content=[part], as_logged=True)
    )
    claim_check = ClaimCheck(blobs)

    assert await restored(old, claim_check) == old.message
    assert _asked([await restored(marked, claim_check)]) == [given]
    assert type(await restored(marked, claim_check)) is Message
    with pytest.raises(HistoryUnavailableError, match="configure blobs="):
        await restored(marked, None)


async def test_a_final_answer_shaped_like_a_reference_is_not_fetched_when_resumed(
    embedded: Embedded,
) -> None:
    """A model's final answer whose one part has a reference's shape (naming a body that is
    not there): resuming the finished run gives its result, not a hole in its history."""
    answer = ModelReply(message=Message(role="assistant", content=[dict(FORGED)]))
    done = await embedded.runner(Recording([answer])).run(AGENT, "go", tenant="b", run_id="b-1")
    assert done.status == "completed"

    again = await embedded.runner(Recording([])).resume(AGENT, "b-1", tenant="b")

    assert again.status == "completed"
    assert again.output == [FORGED]


BIG_WRAPPED = {"$literal": "w" * (300 * 1024)}
"""A body shaped like the wrapping of a look-alike, and over the claim check's threshold."""


@tool
async def wrap_big(key: str, *, idempotency_key: str) -> dict[str, Any]:
    return dict(BIG_WRAPPED)


async def test_a_large_body_shaped_like_the_wrapping_is_given_back_as_it_was(
    embedded: Embedded,
) -> None:
    """A run input and a tool result shaped like the wrapping of a look-alike, large enough
    to be moved out of line (wrapped as written): after a resume from the stored transcript
    the model reads them as the run it resumes did, not wrapped once more."""
    agent = Agent(name="reader", instructions="read", tools=[wrap_big])
    script = [
        reply("", ToolCall(call_id="c-1", tool="wrap_big", args={"key": "k"})),
        reply("done"),
    ]
    whole = Recording(script)
    await embedded.runner(whole).run(agent, BIG_WRAPPED, tenant="a", run_id="whole")
    crashing = embedded.runner(ScriptedProvider(script), observer=CrashAt("turn.settled"))
    with pytest.raises(Crash):
        await crashing.run(agent, BIG_WRAPPED, tenant="a", run_id="r-1")

    provider = Recording(script)
    result = await embedded.runner(provider).resume(agent, "r-1", tenant="a")

    assert result.status == "completed"
    user, tool_message = provider.calls[0][1], provider.calls[0][-1]
    assert msgspec.json.decode(str(user.content)) == BIG_WRAPPED
    assert msgspec.json.decode(str(tool_message.content)) == BIG_WRAPPED
    assert provider.calls[0] == whole.calls[1]
