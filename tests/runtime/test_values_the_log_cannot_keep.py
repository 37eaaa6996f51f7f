"""Values a model or a person gives that the log cannot keep as they are: refused, naming the
value and the path to what is at fault, never written changed (``nan`` as ``null``) and never
refused with a remedy that does not apply."""

from __future__ import annotations

import math
from typing import Any

import pytest

from onward.errors import PayloadTooLargeError
from onward.eventlog import MemoryEventLog, ToolCall
from onward.eventlog.events import Message, ToolCompleted, Usage
from onward.runtime.agent import Agent
from onward.runtime.blobs import MemoryBlobStore
from onward.runtime.providers import ModelReply, ScriptedProvider, reply
from onward.runtime.runner import AgentRunner
from onward.runtime.tools import Tool, tool

TENANT = "acme"


def a_scale_tool(*, requires_approval: bool = False) -> tuple[Tool, list[Any]]:
    """A ``scale`` tool and the factors it was called with."""
    seen: list[Any] = []

    @tool(requires_approval=requires_approval)
    async def scale(factor: Any, *, idempotency_key: str) -> str:
        seen.append(factor)
        return "scaled"

    return scale, seen


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
async def test_a_model_argument_that_is_not_a_finite_number_never_reaches_the_tool_as_null(
    value: float,
) -> None:
    """A user-written provider's call with ``nan`` in its arguments: the tool is not called
    with ``null`` in its place (nor, after a resume, with something else than before); the
    call ends with an error naming the path, which the model is told, and the run goes on."""
    log = MemoryEventLog()
    scale, seen = a_scale_tool()
    call = ToolCall(call_id="c1", tool="scale", args={"factor": value})
    provider = ScriptedProvider([reply("", call), reply("done")])
    runner = AgentRunner(provider=provider, log=log, worker="w")
    result = await runner.run(
        Agent(name="scaler", instructions="scale", tools=[scale]), "go", tenant=TENANT, run_id="r"
    )
    assert (result.status, result.output) == ("completed", "done")
    assert seen == []
    [completed] = [s.event for s in await log.read_run("r") if isinstance(s.event, ToolCompleted)]
    assert completed.error is not None
    assert completed.error.type == "UnencodableArguments"
    assert "`$.factor` is not a finite number" in completed.error.message


async def test_a_model_message_holding_a_non_finite_number_fails_the_run_once_naming_it() -> None:
    """A provider's message whose parts hold ``inf`` is not written as ``null``: the run
    ends failed, its error naming the path, and the (paid) model is asked once."""
    log = MemoryEventLog()
    answer = ModelReply(message=Message(role="assistant", content=[{"score": math.inf}]))
    provider = ScriptedProvider([answer])
    runner = AgentRunner(provider=provider, log=log, worker="w")
    result = await runner.run(
        Agent(name="scorer", instructions="score"), "go", tenant=TENANT, run_id="r"
    )
    assert result.status == "failed"
    assert result.error is not None
    assert "`$[0].score` is not a finite number" in result.error
    assert provider.calls == 1


async def test_an_integer_too_long_to_write_is_named_as_such() -> None:
    """An argument of more digits than Python writes as text is named for what it is, not as
    text that is not UTF-8."""
    log = MemoryEventLog()
    scale, seen = a_scale_tool()
    call = ToolCall(call_id="c1", tool="scale", args={"factor": 10**5000})
    provider = ScriptedProvider([reply("", call), reply("done")])
    runner = AgentRunner(provider=provider, log=log, worker="w")
    await runner.run(
        Agent(name="scaler", instructions="scale", tools=[scale]), "go", tenant=TENANT, run_id="r"
    )
    [completed] = [s.event for s in await log.read_run("r") if isinstance(s.event, ToolCompleted)]
    assert completed.error is not None
    assert "UTF-8" not in completed.error.message
    assert "digits" in completed.error.message
    assert seen == []


@pytest.mark.parametrize("blobs", [None, MemoryBlobStore()], ids=["no blobs", "blobs"])
async def test_an_approval_value_too_large_for_the_log_is_refused_naming_the_value(
    blobs: MemoryBlobStore | None,
) -> None:
    """Approval values are always written in line: one over the log's limit is refused saying
    so, not with a hint to store bodies out of line (a blob store does not take it), and the
    run still waits."""
    log = MemoryEventLog()
    approved, _ = a_scale_tool(requires_approval=True)
    call = ToolCall(call_id="c1", tool="scale", args={"factor": 2})
    provider = ScriptedProvider([reply("", call), reply("done")])
    runner = AgentRunner(provider=provider, log=log, worker="w", blobs=blobs)
    agent = Agent(name="scaler", instructions="scale", tools=[approved])
    waiting = await runner.run(agent, "go", tenant=TENANT, run_id="r")
    assert waiting.status == "waiting"
    with pytest.raises(PayloadTooLargeError) as refused:
        await runner.approve("r", "c1", tenant=TENANT, by="ann", value="v" * 1_100_000)
    assert "out of line" not in str(refused.value)
    assert "value" in str(refused.value)
    assert (await runner.inspect("r", tenant=TENANT)).status == "waiting"


@pytest.mark.parametrize(
    ("answer", "field"),
    [
        (
            ModelReply(
                message=Message(role="assistant", content="x"), usage=Usage(input_tokens=-1)
            ),
            "$.usage.input_tokens",
        ),
        (
            ModelReply(
                message=Message(role="assistant", content="x"),
                usage=Usage(output_tokens=2.5),  # type: ignore[arg-type]
            ),
            "$.usage.output_tokens",
        ),
        (
            ModelReply(
                message=Message(role="assistant"),
                tool_calls=[ToolCall(call_id="c1", tool="scale", args="2")],  # type: ignore[arg-type]
            ),
            "$.tool_calls[0].args",
        ),
    ],
    ids=["negative tokens", "fractional tokens", "args not a dict"],
)
async def test_a_provider_answer_the_log_cannot_keep_fails_the_run_once_naming_the_field(
    answer: ModelReply, field: str
) -> None:
    """A user-written provider's answer that is not what a `ModelReply` holds (a Struct is not
    checked when built): the run ends failed, its error naming the field, and a resume does
    not ask the (paid) model again to be refused again."""
    log = MemoryEventLog()
    scale, seen = a_scale_tool()
    provider = ScriptedProvider([answer, reply("done")])
    runner = AgentRunner(provider=provider, log=log, worker="w")
    agent = Agent(name="scaler", instructions="scale", tools=[scale])
    result = await runner.run(agent, "go", tenant=TENANT, run_id="r")
    assert result.status == "failed"
    assert result.error is not None
    assert field in result.error
    resumed = await runner.resume(agent, "r", tenant=TENANT)
    assert resumed.status == "failed"
    assert (provider.calls, seen) == (1, [])
