"""Causes are facts (issue 19, item 4): a run out of attempts ends with the error its last
attempt failed with, and a tool result that cannot be recorded is the call's typed error."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from support.crashes import Crash, CrashAt

from onward.errors import InvalidInputError
from onward.eventlog import Message, RunStarted, ToolCall, ToolCompleted, ToolResolved
from onward.eventlog.codec import encode
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.fleet.requests import ResumeRun, StartRun
from onward.runtime.fleet.worker import Worker
from onward.runtime.providers import ModelReply, ScriptedProvider, reply
from onward.runtime.settings import Settings
from onward.runtime.tools import Reconciled, tool

TENANT = "acme"
SECRET = "Bearer abcdefghijklmnopqrstuvwxyz0123"


@pytest_asyncio.fixture
async def backends(tmp_path: Path) -> AsyncIterator[Backends]:
    settings = Settings.model_validate(
        {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "causes.db")}
    )
    async with open_backends(settings) as opened:
        yield opened


class UpstreamDown(ScriptedProvider):
    """A model whose every call fails as an upstream 503 does, with a secret in the message."""

    def __init__(self) -> None:
        super().__init__([])

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        raise RuntimeError(f"upstream 503 Service Unavailable (sent {SECRET})")


async def test_a_run_out_of_attempts_records_its_last_cause_masked(
    backends: Backends,
) -> None:
    """A provider raising on every call: started, then claimed three times by the worker; the
    third attempt, the last the run has, ends it at once ``failed`` with the provider's error
    (type and masked message) in its final event, so inspect, replay and the stream's error
    message show it."""
    worker = Worker(
        backends, UpstreamDown(), {"writer": Agent(name="writer", instructions="w")}, backoff_s=0
    )
    worker.submit(StartRun(run_id="r", tenant=TENANT, agent="writer"))
    await worker.drained()
    for _ in range(worker.max_attempts):
        worker.submit(ResumeRun(run_id="r", tenant=TENANT))
        await worker.drained()
    frontier = await worker.runner.inspect("r", tenant=TENANT)
    assert frontier.status == "failed"
    assert frontier.error is not None
    assert frontier.error.startswith("gave up: 3 attempts to carry it on made no progress")
    assert "RuntimeError: upstream 503 Service Unavailable" in frontier.error
    assert "abcdefghijklmnopqrstuvwxyz0123" not in frontier.error
    finished = [s.event for s in await backends.log.read_run("r")][-1]
    assert getattr(finished, "error", None) == frontier.error
    assert worker.stats.gave_up == 1


async def test_another_tenant_s_refused_resume_is_not_the_cause_a_run_gives_up_with(
    backends: Backends,
) -> None:
    """Workers that died mid-attempt used up the run's attempts, leaving no cause; a resume
    naming another tenant is refused, and is no attempt of the run: the run gives up with no
    cause rather than with that refusal (and that tenant's name) as its last one's."""
    agent = Agent(name="writer", instructions="w")
    worker = Worker(backends, ScriptedProvider([]), {"writer": agent}, backoff_s=0)
    with pytest.raises(Crash):
        await backends.runner(ScriptedProvider([]), observer=CrashAt("model.call")).run(
            agent, "go", tenant=TENANT, run_id="r"
        )
    for _ in range(worker.max_attempts):
        with pytest.raises(Crash):
            await backends.runner(ScriptedProvider([]), observer=CrashAt("model.call")).resume(
                agent, "r", tenant=TENANT
            )
    worker.submit(ResumeRun(run_id="r", tenant="intruder"))
    await worker.drained()
    assert worker.stats.failures == 1  # refused for good
    worker.submit(ResumeRun(run_id="r", tenant=TENANT))
    await worker.drained()
    frontier = await worker.runner.inspect("r", tenant=TENANT)
    assert (frontier.status, worker.stats.gave_up) == ("failed", 1)
    assert frontier.error == "gave up: 3 attempts to carry it on made no progress"


class Receipt:
    """What a client library returns: an object JSON has no form for."""

    def __init__(self, number: int) -> None:
        self.number = number


RETURNED: dict[str, Any] = {
    "receipt": Receipt(7),
    "rows": {"rows": [1.5, 2.5, float("nan")]},
    "total": {"total": float("inf")},
}


@tool
async def fetch(what: str, *, idempotency_key: str) -> Any:
    return RETURNED[what]


@tool(requires_approval=True)
async def pay(amount: int, *, idempotency_key: str) -> int:
    return amount


def calling(tool_name: str, args: dict[str, Any]) -> ScriptedProvider:
    """A model that calls one tool once, then answers with the text of what it saw."""

    def script(messages: Sequence[Message]) -> ModelReply:
        if any(m.role == "tool" for m in messages):
            return reply(f"saw: {messages[-1].content}")
        return reply("calling", ToolCall(call_id="c1", tool=tool_name, args=args))

    return ScriptedProvider(script)


AGENT = Agent(name="clerk", instructions="c", tools=[fetch, pay])


@pytest.mark.parametrize(
    ("what", "said"),
    [
        ("receipt", "an object of type Receipt at `$`"),
        ("rows", "nan at `$.rows[2]` is not a finite number"),
        ("total", "inf at `$.total` is not a finite number"),
    ],
)
async def test_a_tool_result_that_cannot_be_recorded_is_the_call_s_typed_error(
    backends: Backends, what: str, said: str
) -> None:
    """The tool returned, so the call is settled: its outcome is an ``UnencodableResult``
    error naming the path, the model is told, and the run goes on to complete, rather than
    the call left undecided for a person (or ``nan`` stored as ``null``)."""
    runner = backends.runner(calling("fetch", {"what": what}))
    result = await runner.run(AGENT, "go", tenant=TENANT, run_id="r")
    assert result.status == "completed", result.error
    (completed,) = [
        s.event for s in await backends.log.read_run("r") if isinstance(s.event, ToolCompleted)
    ]
    assert completed.result is None
    assert completed.error is not None
    assert completed.error.type == "UnencodableResult"
    assert said in completed.error.message
    assert said in str(result.output)


async def test_a_run_input_with_a_non_finite_float_is_refused_before_anything_is_written(
    backends: Backends,
) -> None:
    """Stored as ``null``, the input would not be what the caller gave: refused, named by its
    path, with no event and no lease left behind."""
    runner = backends.runner(calling("fetch", {"what": "rows"}))
    with pytest.raises(InvalidInputError, match=r"input cannot be recorded: nan at `\$.rows\[2\]`"):
        await runner.run(AGENT, {"rows": [1, 2, float("nan")]}, tenant=TENANT, run_id="r")
    assert await backends.log.read_run("r") == []
    assert await backends.leases.current("r") is None


async def test_an_approval_value_with_a_non_finite_float_is_refused_and_the_run_waits(
    backends: Backends,
) -> None:
    """A person's answer holding ``-inf`` is refused before it is written: the run still
    waits on the request, for an answer that can be kept as given."""
    runner = backends.runner(calling("pay", {"amount": 5}))
    waiting = await runner.run(AGENT, "go", tenant=TENANT, run_id="r")
    assert waiting.status == "waiting"
    before = len(await backends.log.read_run("r"))
    with pytest.raises(InvalidInputError, match=r"value cannot be recorded: -inf at `\$.limit`"):
        await runner.approve("r", "c1", tenant=TENANT, by="ann", value={"limit": float("-inf")})
    assert len(await backends.log.read_run("r")) == before
    assert (await runner.inspect("r", tenant=TENANT)).waiting_on == "c1"


def test_an_event_that_cannot_be_encoded_is_refused_naming_run_seq_and_path() -> None:
    """The codec's last word for what got past the entry points: the run, the seq and the
    path, not the encoder's bare ``TypeError``."""
    started = RunStarted(
        run_id="r",
        tenant=TENANT,
        seq=1,
        fence=1,
        at=1,
        agent="a",
        revision="1",
        input={"r": [Receipt(1)]},
    )
    with pytest.raises(
        InvalidInputError,
        match=r"run 'r' seq 1: run.started cannot be written: .*`\$.input.r\[0\]`",
    ):
        encode(started)


async def _whats_booked(key: str) -> Reconciled:
    """A status check that says the call completed, with a result no store can keep."""
    return Reconciled("completed", RETURNED["receipt"])


@tool(reconcile=_whats_booked)
async def book(seat: str, *, idempotency_key: str) -> str:
    return f"booked {seat}"


async def test_a_status_check_answer_that_cannot_be_recorded_is_the_call_s_typed_error(
    backends: Backends,
) -> None:
    """The status check says the call completed, so it did: a result that cannot be recorded
    becomes the call's ``UnencodableResult`` error and the run goes on, rather than the
    resume failing on the write every time it is tried."""
    agent = Agent(name="booker", instructions="b", tools=[book])
    dying = backends.runner(calling("book", {"seat": "3A"}), observer=CrashAt("tool.dispatched"))
    with pytest.raises(Crash):
        await dying.run(agent, "go", tenant=TENANT, run_id="r2")
    result = await backends.runner(calling("book", {"seat": "3A"})).resume(
        agent, "r2", tenant=TENANT
    )
    assert result.status == "completed", result.error
    assert result.reconciled == ("c1",)
    (resolved,) = [
        s.event for s in await backends.log.read_run("r2") if isinstance(s.event, ToolResolved)
    ]
    assert (resolved.outcome, resolved.result) == ("completed", None)
    assert resolved.error is not None
    assert resolved.error.type == "UnencodableResult"
    assert "an object of type Receipt at `$`" in resolved.error.message


async def test_the_model_is_told_a_status_check_answer_could_not_be_recorded(
    backends: Backends,
) -> None:
    """The call's outcome is the ``UnencodableResult`` error, and the model reads that error as
    the call's result, as it reads a tool's own error: it had read ``null``, as if the call had
    returned nothing."""
    agent = Agent(name="booker", instructions="b", tools=[book])
    dying = backends.runner(calling("book", {"seat": "3A"}), observer=CrashAt("tool.dispatched"))
    with pytest.raises(Crash):
        await dying.run(agent, "go", tenant=TENANT, run_id="r3")
    result = await backends.runner(calling("book", {"seat": "3A"})).resume(
        agent, "r3", tenant=TENANT
    )
    assert result.status == "completed", result.error
    assert "UnencodableResult" in str(result.output)


MADE: list[str] = []


async def _not_held(key: str) -> Reconciled:
    """A status check that says the call never ran, handing back the object it looked at."""
    return Reconciled("never_ran", Receipt(0))


@tool(reconcile=_not_held)
async def hold(seat: str, *, idempotency_key: str) -> str:
    MADE.append(seat)
    return f"held {seat}"


async def test_a_call_its_status_check_says_never_ran_is_made_whatever_result_came_with(
    backends: Backends,
) -> None:
    """A status check answering ``never_ran`` with a result no store can keep: the call never
    ran, so it is made on resume. The result had been recorded as the call's error, which
    settled the call as made with that error: it was not made, the model was sent its call
    with no outcome, and asked for it again."""
    MADE.clear()
    agent = Agent(name="holder", instructions="h", tools=[hold])
    dying = backends.runner(calling("hold", {"seat": "3A"}), observer=CrashAt("tool.dispatched"))
    with pytest.raises(Crash):
        await dying.run(agent, "go", tenant=TENANT, run_id="r4")
    result = await backends.runner(calling("hold", {"seat": "3A"})).resume(
        agent, "r4", tenant=TENANT
    )
    assert result.status == "completed", result.error
    assert result.plan is not None
    assert [c.call_id for c in result.plan.to_dispatch] == ["c1"]
    assert MADE == ["3A"]
    assert result.output == "saw: held 3A"
    assert result.iteration == 2  # the model read c1's outcome: it did not ask for it again
