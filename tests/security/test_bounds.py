"""Bounds at every entry point (security review #10, #12, #16, #17, #18, #19): names without
control characters and of bounded length, values of bounded depth, refused requests that leave
no lease state behind, and refusals that tell another tenant nothing about a run."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from onward.errors import InvalidInputError
from onward.eventlog import MemoryEventLog, ToolCall
from onward.projections.memory import MemoryFrontierStore
from onward.runtime.agent import Agent
from onward.runtime.options import Options
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.requests import AnswerRequest, StartRun, TagRun, decode_request, encode_request
from onward.runtime.runner import AgentRunner
from onward.runtime.tools import tool

TENANT = "acme"
LONG = "x" * 201


@tool(requires_approval=True)
async def pay(amount: int, *, idempotency_key: str) -> dict[str, Any]:
    return {"paid": amount}


def payer() -> Agent:
    return Agent(name="payer", instructions="pay", tools=[pay])


def paying_model() -> ScriptedProvider:
    return ScriptedProvider(
        [reply("paying", ToolCall(call_id="c1", tool="pay", args={"amount": 5})), reply("paid")]
    )


def memory_runner(log: MemoryEventLog | None = None) -> AgentRunner:
    return AgentRunner(
        provider=paying_model(),
        log=log or MemoryEventLog(partitions=2),
        frontiers=MemoryFrontierStore(),
        checkpoint_inline=True,
    )


async def waiting_run(runner: AgentRunner, run_id: str = "r1") -> str:
    """A run of ``TENANT`` waiting on a person's approval of call ``c1``."""
    result = await runner.run(payer(), "pay 5", tenant=TENANT, run_id=run_id)
    assert (result.status, result.waiting_on) == ("waiting", "c1")
    return run_id


async def log_size(runner: AgentRunner) -> int:
    sizes = [(await runner.log.bounds(p)).end for p in range(runner.log.partitions)]
    return sum(sizes)


Entry = Callable[[AgentRunner, str], Awaitable[object]]

ENTRIES: dict[str, tuple[Entry, str]] = {
    "run: NUL in the run id": (
        lambda r, _: r.run(payer(), "go", tenant=TENANT, run_id="a\x00b"),
        "run_id",
    ),
    "run: escape in the tenant": (
        lambda r, _: r.run(payer(), "go", tenant="ac\x1bme", run_id="new"),
        "tenant",
    ),
    "run: NUL in options.user": (
        lambda r, _: r.run(payer(), "go", tenant=TENANT, run_id="new", options={"user": "a\x00"}),
        "options.user",
    ),
    "run: a run id over 200 characters": (
        lambda r, _: r.run(payer(), "go", tenant=TENANT, run_id=LONG),
        "run_id",
    ),
    "approve: NUL in by": (
        lambda r, run: r.approve(run, "c1", tenant=TENANT, by="ann\x00"),
        "by",
    ),
    "approve: by over 200 characters": (
        lambda r, run: r.approve(run, "c1", tenant=TENANT, by=LONG),
        "by",
    ),
    "deny: newline in by": (
        lambda r, run: r.deny(run, "c1", tenant=TENANT, by="ann\nroot"),
        "by",
    ),
    "resolve: NUL in the call id": (
        lambda r, run: r.resolve(
            run, "c\x00", tenant=TENANT, outcome="never_ran", by="ann", why="checked"
        ),
        "call_id",
    ),
    "resolve: NUL in why": (
        lambda r, run: r.resolve(
            run, "c1", tenant=TENANT, outcome="never_ran", by="ann", why="checked\x00"
        ),
        "why",
    ),
    "tag: newline in the label": (
        lambda r, run: r.tag(run, "ok\nFAKE LOG LINE", tenant=TENANT),
        "label",
    ),
    "tag: a label over 200 characters": (lambda r, run: r.tag(run, LONG, tenant=TENANT), "label"),
    "tag: NUL in by": (lambda r, run: r.tag(run, "ok", tenant=TENANT, by="a\x00"), "by"),
}


@pytest.mark.parametrize("case", sorted(ENTRIES))
async def test_every_entry_point_refuses_a_name_out_of_bounds_and_writes_nothing(
    case: str,
) -> None:
    """security review #10/#12: NUL and other control characters, and names over 200
    characters, are refused at runner.run/approve/deny/resolve/tag with `InvalidInputError`
    naming the field; nothing is written."""
    call, field = ENTRIES[case]
    runner = memory_runner()
    run = await waiting_run(runner)
    before = await log_size(runner)
    with pytest.raises(InvalidInputError, match=field):
        await call(runner, run)
    assert await log_size(runner) == before


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"user": "ann\x00"}, "user"),
        ({"tenant": "ac\x07me"}, "tenant"),
        ({"run_id": "r\x00"}, "run_id"),
        ({"agent": "a" * 201}, "agent"),
    ],
)
def test_options_refuse_control_characters_and_long_names(
    fields: dict[str, str], named: str
) -> None:
    """security review #12: `Options` refuses control characters in its names (it already
    capped their length, now the agent's too), naming the field."""
    with pytest.raises(InvalidInputError, match=named):
        Options.of(fields)


@pytest.mark.parametrize(
    ("request_", "named"),
    [
        (StartRun(run_id="r", tenant="a\x00", agent="payer"), "StartRun.tenant"),
        (StartRun(run_id=LONG, tenant=TENANT, agent="payer"), "StartRun.run_id"),
        (
            AnswerRequest(run_id="r", tenant=TENANT, request_id="c1", approve=True, by="\x00"),
            "AnswerRequest.by",
        ),
        (TagRun(run_id="r", tenant=TENANT, label="x" * 201), "TagRun.label"),
        (TagRun(run_id="r", tenant=TENANT, label="ok", by="a\rb"), "TagRun.by"),
    ],
)
def test_requests_out_of_bounds_are_refused_when_decoded(request_: Any, named: str) -> None:
    """security review #10/#12: a request off the topic is held to the same bounds as a call
    of the runner, and refused naming the field."""
    with pytest.raises(InvalidInputError, match=named):
        decode_request(encode_request(request_))
