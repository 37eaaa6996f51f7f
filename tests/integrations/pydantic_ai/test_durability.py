"""OnwardDurability in one process, on embedded SQLite: what is recorded, replayed and asked.

A crash here is a `Crash` (a BaseException) raised at a point of the run; the stores stay as the
crash left them and the run's lease is let go, so the test resumes at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic_ai import Agent, FunctionToolset, ModelRetry, TextOutput, ToolOutput
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolDenied
from pydantic_ai.usage import RequestUsage
from pydantic_core import PydanticSerializationError
from support.failing_ends import EndFails
from support.stores import Stores

from integrations.pydantic_ai.world import (
    TENANT,
    Crash,
    Faults,
    Script,
    booking_agent,
    durability_on,
)
from onward.errors import (
    BackendUnavailableError,
    ConfigurationError,
    InvalidInputError,
    PayloadTooLargeError,
    ResumeConflictError,
    RevisionMismatchError,
)
from onward.eventlog import (
    Event,
    ModelAnswered,
    Position,
    ResumePlanned,
    RunFinished,
    RunStarted,
    ToolCompleted,
    ToolDispatched,
    ToolResolved,
    kind_of,
)
from onward.eventlog.archive import DirectoryArchive
from onward.eventlog.base import EventLog
from onward.integrations.pydantic_ai import (
    DurableRunResult,
    OnwardDurability,
    current_fence,
    current_idempotency_key,
    current_lease_expires_at,
)
from onward.projections.compaction import embedded_compaction
from onward.runtime.blobs import DEFAULT_THRESHOLD, SqliteBlobStore
from onward.runtime.compaction import CheckpointCompactor
from onward.runtime.demo_ledger import Ledger
from onward.runtime.leases import LeasePolicy, RunLease
from onward.runtime.runner import AgentRunner
from onward.testing.eventlog import WrappedEventLog

RUN = "r-1"


@pytest.fixture
def durability(stores: Stores) -> OnwardDurability[None]:
    return durability_on(stores, worker="here")


async def events(stores: Stores) -> list[Event]:
    return [stored.event for stored in await stores.log.read_run(RUN)]


async def crash(durability: OnwardDurability[None], agent: Agent[None, object]) -> None:
    with pytest.raises(Crash):
        await durability.run(agent, "book seat 3A", run_id=RUN)


async def test_a_run_is_recorded_answer_by_answer_and_call_by_call(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> None:
    result = await durability.run(booking_agent(durability, ledger), "book seat 3A", run_id=RUN)

    assert result.status == "completed"
    assert result.output == "done: seat 3A booked"
    recorded = await events(stores)
    assert [kind_of(type(e)) for e in recorded] == [
        "run.started",
        "model.answered",
        "tool.dispatched",
        "tool.completed",
        "turn.settled",
        "model.answered",
        "run.finished",
    ]
    answered = recorded[1]
    assert isinstance(answered, ModelAnswered)
    assert answered.response["parts"][1]["tool_name"] == "book"
    dispatched = recorded[2]
    assert isinstance(dispatched, ToolDispatched)
    assert dispatched.idempotency_key == answered.tool_calls[0].idempotency_key
    assert ledger.entries() == [{"tool": "book", "key": dispatched.idempotency_key, "seat": "3A"}]
    assert len({e.fence for e in recorded}) == 1


async def test_recorded_answers_and_outcomes_are_replayed_not_asked_again(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> None:
    script = Script(faults=Faults({"second_answer"}))
    await crash(durability, booking_agent(durability, ledger, script))
    assert script.asked == 2

    result = await durability.resume(booking_agent(durability, ledger, script), RUN)

    assert result.status == "completed"
    assert script.asked == 3  # only the answer that was never recorded
    assert len(ledger.entries()) == 1
    assert result.plan is not None
    assert result.plan.safe


async def test_a_large_answer_goes_out_of_line_and_is_replayed_whole(
    stores: Stores, ledger: Ledger, tmp_path: Path
) -> None:
    preamble = "booking " * (DEFAULT_THRESHOLD // 4)
    script = Script(faults=Faults({"second_answer"}), preamble=preamble)
    async with SqliteBlobStore(tmp_path / "onward.db") as blobs:
        durability = durability_on(stores, worker="here", blobs=blobs)
        await crash(durability, booking_agent(durability, ledger, script))
        done = await durability.resume(booking_agent(durability, ledger, script), RUN)

    assert done.status == "completed"
    assert done.result is not None
    first_answer = done.result.all_messages()[1]
    assert first_answer.parts[0].content == preamble
    stored = next(e for e in await events(stores) if isinstance(e, ModelAnswered))
    assert set(stored.response) == {"$blob", "size"}
    assert len(ledger.entries()) == 1


async def test_a_call_whose_outcome_was_lost_comes_back_for_approval_never_run_again(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> None:
    script = Script(faults=Faults({"after_effect"}))
    await crash(durability, booking_agent(durability, ledger, script))

    waiting = await durability.resume(booking_agent(durability, ledger, script), RUN)
    again = await durability.resume(booking_agent(durability, ledger, script), RUN)

    assert waiting.status == again.status == "waiting"
    assert isinstance(waiting.output, DeferredToolRequests)
    assert [c.tool_call_id for c in waiting.output.approvals] == ["b1"]
    assert waiting.output.metadata["b1"]["onward"]["dispatched_fence"] == 1
    pending = await durability.pending(RUN)
    assert pending.request_id == waiting.waiting_on
    assert pending.requests == waiting.output
    assert len(ledger.entries()) == 1


async def lost_then(
    decision: DeferredToolResults, durability: OnwardDurability[None], ledger: Ledger
) -> DurableRunResult:
    """Crash after the booking's side effect, resume, decide, and resume again."""
    script = Script(faults=Faults({"after_effect"}))
    await crash(durability, booking_agent(durability, ledger, script))
    await durability.resume(booking_agent(durability, ledger, script), RUN)
    await durability.decide(RUN, decision, by="alice")
    return await durability.resume(booking_agent(durability, ledger, script), RUN)


async def test_approving_a_lost_call_runs_it_again_with_the_same_key(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> None:
    done = await lost_then(DeferredToolResults(approvals={"b1": True}), durability, ledger)

    assert done.status == "completed"
    assert done.output == "done: seat 3A booked"
    first, second = ledger.entries()
    assert first["key"] == second["key"]
    settled = [e for e in await events(stores) if isinstance(e, ToolResolved)]
    assert [(e.call_id, e.outcome, e.by) for e in settled] == [("b1", "never_ran", "alice")]


async def test_each_attempt_of_a_call_reads_the_fence_it_was_dispatched_under(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> None:
    """The attempt run again after a resume reads the resume's higher fence, as recorded."""
    seen: list[tuple[int | None, float | None]] = []
    script = Script(faults=Faults({"after_effect"}))
    await crash(durability, booking_agent(durability, ledger, script, leases_seen=seen))
    await durability.resume(booking_agent(durability, ledger, script, leases_seen=seen), RUN)
    await durability.decide(RUN, DeferredToolResults(approvals={"b1": True}), by="alice")
    before = time.time()
    done = await durability.resume(booking_agent(durability, ledger, script, leases_seen=seen), RUN)

    assert done.status == "completed"
    dispatched = [e.fence for e in await events(stores) if isinstance(e, ToolDispatched)]
    assert [fence for fence, _ in seen] == dispatched
    assert dispatched[0] < dispatched[1]  # claimed again (resumes, the decision) in between
    expires = seen[-1][1]
    ttl = LeasePolicy().ttl_s
    assert expires is not None
    assert before + ttl - 1 < expires < time.time() + ttl + 1
    assert (current_fence(), current_lease_expires_at()) == (None, None)  # outside a call


async def test_denying_a_lost_call_tells_the_model_and_settles_it(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> None:
    decision = DeferredToolResults(approvals={"b1": ToolDenied("it went through")})
    done = await lost_then(decision, durability, ledger)

    assert done.output == "done: it went through"
    assert len(ledger.entries()) == 1
    settled = [e for e in await events(stores) if isinstance(e, ToolResolved)]
    assert [(e.outcome, e.result, e.by) for e in settled] == [
        ("completed", {"denied": "it went through"}, "alice")
    ]


@pytest.mark.parametrize(
    "message", ["no: " + "x" * 10_000, "it went through\r\nseat 3A is yours"], ids=["long", "CRLF"]
)
async def test_a_denial_message_a_note_cannot_hold_is_given_to_the_model_whole(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger, message: str
) -> None:
    """A person's denial of a lost call says more than a note holds (or holds a carriage
    return): the decision is taken, not refused naming a ``why`` they never gave, and the
    model reads the message whole."""
    decision = DeferredToolResults(approvals={"b1": ToolDenied(message)})
    done = await lost_then(decision, durability, ledger)

    assert done.status == "completed"
    assert done.output == f"done: {message}"
    assert len(ledger.entries()) == 1
    (settled,) = [e for e in await events(stores) if isinstance(e, ToolResolved)]
    assert (settled.outcome, settled.result) == ("completed", {"denied": message})


@pytest.mark.parametrize(
    "model_call_id", ["b" * 300, "b\nb", "b\x00b"], ids=["too long", "newline", "NUL"]
)
async def test_a_lost_call_the_model_gave_an_id_no_name_can_be_is_still_decided(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger, model_call_id: str
) -> None:
    """The model's call id is too long or holds a control character: the lost call is put
    to a person, their decision is taken (not refused naming the id, the run waiting for
    ever), and the call runs again with its key."""
    script = Script(
        ToolCallPart("book", {"seat": "3A"}, tool_call_id=model_call_id),
        faults=Faults({"after_effect"}),
    )
    await crash(durability, booking_agent(durability, ledger, script))
    waiting = await durability.resume(booking_agent(durability, ledger, script), RUN)
    assert waiting.status == "waiting"
    assert isinstance(waiting.output, DeferredToolRequests)
    assert [c.tool_call_id for c in waiting.output.approvals] == [model_call_id]

    decision = DeferredToolResults(approvals={model_call_id: True})
    await durability.decide(RUN, decision, by="alice")
    done = await durability.resume(booking_agent(durability, ledger, script), RUN)

    assert (done.status, done.output) == ("completed", "done: seat 3A booked")
    first, second = ledger.entries()
    assert first["key"] == second["key"]
    assert script.asked == 2


async def test_a_call_of_a_tool_named_with_a_nul_is_recorded_and_the_model_told(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> None:
    """The model names a tool with a NUL in it, which no event may hold: the answer is
    recorded with the name escaped, pydantic-ai tells the model there is no such tool, and
    the run goes on, rather than the (paid) model asked again at every resume."""
    script = Script(ToolCallPart("bo\x00ok", {"seat": "3A"}, tool_call_id="b1"))
    done = await durability.run(booking_agent(durability, ledger, script), "go", run_id=RUN)

    assert done.status == "completed"
    assert script.asked == 2
    assert ledger.entries() == []
    answered = [e for e in await events(stores) if isinstance(e, ModelAnswered)]
    assert [c.tool for c in answered[0].tool_calls] == ["bo\\x00ok"]


async def test_a_retry_safe_tool_is_dispatched_again_without_asking(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> None:
    script = Script(faults=Faults({"after_effect"}))
    options = {"retry_safe": True}
    await crash(durability, booking_agent(durability, ledger, script, book_options=options))

    done = await durability.resume(
        booking_agent(durability, ledger, script, book_options=options), RUN
    )

    assert done.status == "completed"
    assert done.plan is not None
    assert [c.call_id for c in done.plan.to_dispatch] == ["b1"]
    assert len(ledger.entries()) == 2
    dispatches = [e for e in await events(stores) if isinstance(e, ToolDispatched)]
    assert [e.fence for e in dispatches] == [1, 2]


def unconfirmed_after_the_dispatch(stores: Stores, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease store does not answer the one renewal asked for right after the first
    dispatch is written (the write-ahead's confirmation of the lease)."""
    armed = [False, True]  # now, and once still to come
    renew, append = stores.leases.renew, stores.log.append

    async def unanswered(lease: RunLease, *, ttl_s: float) -> RunLease:
        if armed[0]:
            armed[0] = False
            raise BackendUnavailableError("the lease store did not answer")
        return await renew(lease, ttl_s=ttl_s)

    async def arming(batch: Sequence[Event]) -> list[Position]:
        positions = await append(batch)
        if armed[1] and any(isinstance(e, ToolDispatched) for e in batch):
            armed[:] = [True, False]
        return positions

    monkeypatch.setattr(stores.leases, "renew", unanswered)
    monkeypatch.setattr(stores.log, "append", arming)


async def test_a_call_dispatched_under_a_lease_that_could_not_be_confirmed_is_made_on_resume(
    durability: OnwardDurability[None],
    stores: Stores,
    ledger: Ledger,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The dispatch is durable and the lease store does not answer the confirmation before
    the call: the tool is not called and the run stops retryably. The log says the call never
    ran, so the resume makes it, once, rather than hand it to a person as one that may have."""
    unconfirmed_after_the_dispatch(stores, monkeypatch)
    script = Script()
    with pytest.raises(BackendUnavailableError):
        await durability.run(booking_agent(durability, ledger, script), "book seat 3A", run_id=RUN)
    assert ledger.entries() == []

    done = await durability.resume(booking_agent(durability, ledger, script), RUN)

    assert done.status == "completed"
    assert done.output == "done: seat 3A booked"
    assert len(ledger.entries()) == 1
    again = await durability.resume(booking_agent(durability, ledger, script), RUN)
    assert again.status == "completed"
    assert len(ledger.entries()) == 1


def silent_after_the_dispatch(stores: Stores, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """The lease store never answers the one renewal asked for right after the first dispatch
    is written; the event returned is set once it is asked."""
    armed = [False, True]  # now, and once still to come
    asked = asyncio.Event()
    renew, append = stores.leases.renew, stores.log.append

    async def silent(lease: RunLease, *, ttl_s: float) -> RunLease:
        if armed[0]:
            armed[0] = False
            asked.set()
            await asyncio.Event().wait()
        return await renew(lease, ttl_s=ttl_s)

    async def arming(batch: Sequence[Event]) -> list[Position]:
        positions = await append(batch)
        if armed[1] and any(isinstance(e, ToolDispatched) for e in batch):
            armed[:] = [True, False]
        return positions

    monkeypatch.setattr(stores.leases, "renew", silent)
    monkeypatch.setattr(stores.log, "append", arming)
    return asked


async def test_a_call_whose_lease_confirmation_was_cancelled_is_made_on_resume(
    durability: OnwardDurability[None],
    stores: Stores,
    ledger: Ledger,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run is cancelled (its caller gave up, the process shuts down) while the lease is
    confirmed after a dispatch: the tool was not called, and the log says so, so the resume
    makes the call rather than hand it to a person as one that may have run."""
    asked = silent_after_the_dispatch(stores, monkeypatch)
    script = Script()
    running = asyncio.ensure_future(
        durability.run(booking_agent(durability, ledger, script), "book seat 3A", run_id=RUN)
    )
    await asyncio.wait_for(asked.wait(), 5)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert ledger.entries() == []

    done = await durability.resume(booking_agent(durability, ledger, script), RUN)

    assert done.status == "completed"
    assert done.output == "done: seat 3A booked"
    assert len(ledger.entries()) == 1


async def test_a_decision_must_answer_every_call_asked_and_no_other(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> None:
    calls = (
        ToolCallPart("book", {"seat": "3A"}, tool_call_id="b1"),
        ToolCallPart("book", {"seat": "3B"}, tool_call_id="b2"),
    )
    script = Script(*calls)
    agent = booking_agent(durability, ledger, script, requires_approval=True)
    await durability.run(agent, "book two seats", run_id=RUN)
    written = len(await events(stores))

    with pytest.raises(InvalidInputError, match="leaves b2 undecided"):
        await durability.decide(RUN, DeferredToolResults(approvals={"b1": True}), by="alice")
    with pytest.raises(InvalidInputError, match="b9"):
        await durability.decide(
            RUN, DeferredToolResults(approvals={"b1": True, "b2": True, "b9": True}), by="alice"
        )

    assert len(await events(stores)) == written


async def test_an_approval_that_does_not_decide_the_calls_asks_again_not_fails_the_run(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> None:
    """``onward approve RUN REQUEST`` with no value answers the wait, but decides no call."""
    agent = booking_agent(durability, ledger, requires_approval=True)
    waiting = await durability.run(agent, "book seat 3A", run_id=RUN)
    assert waiting.waiting_on is not None
    runner = durability._runs.runner
    await runner.approve(RUN, waiting.waiting_on, tenant=TENANT, by="ops")

    again = await durability.resume(agent, RUN)

    assert again.status == "waiting"
    assert again.waiting_on != waiting.waiting_on
    assert isinstance(again.output, DeferredToolRequests)
    assert ledger.entries() == []
    await durability.decide(RUN, DeferredToolResults(approvals={"b1": True}), by="alice")
    done = await durability.resume(agent, RUN)
    assert (done.status, done.output) == ("completed", "done: seat 3A booked")
    assert len(ledger.entries()) == 1


async def test_a_tool_that_needs_approval_waits_and_runs_once_approved(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> None:
    agent = booking_agent(durability, ledger, requires_approval=True)

    waiting = await durability.run(agent, "book seat 3A", run_id=RUN)
    assert waiting.status == "waiting"
    assert ledger.entries() == []

    await durability.decide(RUN, DeferredToolResults(approvals={"b1": True}), by="alice")
    done = await durability.resume(agent, RUN)

    assert done.output == "done: seat 3A booked"
    assert len(ledger.entries()) == 1


async def test_a_denied_approval_never_runs_the_tool(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> None:
    agent = booking_agent(durability, ledger, requires_approval=True)
    await durability.run(agent, "book seat 3A", run_id=RUN)

    decision = DeferredToolResults(approvals={"b1": ToolDenied("not today")})
    await durability.decide(RUN, decision, by="alice")
    done = await durability.resume(agent, RUN)

    assert done.output == "done: not today"
    assert ledger.entries() == []


async def test_deciding_for_a_run_that_waits_on_nothing_is_refused(
    durability: OnwardDurability[None], ledger: Ledger
) -> None:
    await durability.run(booking_agent(durability, ledger), "book seat 3A", run_id=RUN)

    with pytest.raises(InvalidInputError, match="completed and waits on nothing"):
        await durability.decide(RUN, DeferredToolResults(approvals={"b1": True}), by="alice")


async def test_a_finished_run_is_returned_as_it_stands(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> None:
    script = Script()
    await durability.run(booking_agent(durability, ledger, script), "book seat 3A", run_id=RUN)
    written = len(await events(stores))

    again = await durability.resume(booking_agent(durability, ledger, script), RUN)

    assert again.status == "completed"
    assert again.output == "done: seat 3A booked"
    assert script.asked == 2
    assert len(await events(stores)) == written


async def test_a_tool_that_raises_fails_the_run(
    durability: OnwardDurability[None], stores: Stores
) -> None:
    agent = booking_agent(durability, Ledger("/nonexistent/dir/ledger.jsonl"))

    with pytest.raises(FileNotFoundError):
        await durability.run(agent, "book seat 3A", run_id=RUN)

    recorded = await events(stores)
    completed = [e for e in recorded if isinstance(e, ToolCompleted)]
    assert completed[0].error is not None
    assert completed[0].error.type == "FileNotFoundError"
    finished = recorded[-1]
    assert isinstance(finished, RunFinished)
    assert finished.status == "failed"
    assert (await durability.resume(agent, RUN)).status == "failed"


async def test_a_failure_with_a_long_message_fails_the_run_once_with_it_cut(
    durability: OnwardDurability[None], stores: Stores
) -> None:
    """An exception whose message is larger than a log record (a model's error quoting a
    whole response) still ends the run: its error is cut, as a tool's is, rather than the
    end refused and the run executed again at every resume."""
    asked: list[int] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked.append(1)
        raise RuntimeError("the model broke: " + "z" * 1_500_000)

    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(answer),
        name="talker",
        capabilities=[durability],
        output_type=[str, DeferredToolRequests],
    )
    with pytest.raises(RuntimeError, match="the model broke"):
        await durability.run(agent, "go", run_id=RUN)
    again = await durability.resume(agent, RUN)

    assert again.status == "failed"
    assert again.error is not None
    assert again.error.startswith("RuntimeError: the model broke: zzz")
    assert len(again.error) < 10_000
    assert len(asked) == 1


async def test_a_result_too_large_for_the_log_fails_the_run_once_not_left_undecided(
    durability: OnwardDurability[None], stores: Stores
) -> None:
    """Without a blob store, a result over the log's limit cannot be recorded. The tool
    returned, so its effect is done: the refusal is the call's outcome and the run fails
    saying why, rather than the call left for a person (or, retry-safe, made again at every
    resume and refused again)."""
    fetched: list[str] = []
    script = Script(ToolCallPart("fetch", {}, tool_call_id="f1"))
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(script.answer),
        name="fetcher",
        capabilities=[durability],
        output_type=[str, DeferredToolRequests],
    )

    @agent.tool_plain(metadata={"onward": {"retry_safe": True}})
    async def fetch() -> str:
        """Fetch a page."""
        fetched.append(current_idempotency_key() or "")
        return "x" * 1_500_000

    with pytest.raises(PayloadTooLargeError, match="fetch returned a value too large"):
        await durability.run(agent, "fetch it", run_id=RUN)
    again = await durability.resume(agent, RUN)

    assert again.status == "failed"
    assert again.error is not None
    assert "PayloadTooLarge" in again.error
    assert len(fetched) == 1
    (completed,) = [e for e in await events(stores) if isinstance(e, ToolCompleted)]
    assert completed.error is not None
    assert completed.error.type == "PayloadTooLarge"


async def test_an_agent_whose_tools_changed_is_refused_on_resume(
    durability: OnwardDurability[None], ledger: Ledger
) -> None:
    script = Script(faults=Faults({"after_effect"}))
    await crash(durability, booking_agent(durability, ledger, script))
    changed = booking_agent(durability, ledger, script)

    @changed.tool_plain
    async def cancel(seat: str) -> str:
        return seat

    with pytest.raises(RevisionMismatchError):
        await durability.resume(changed, RUN)


async def test_toolsets_with_a_tool_of_the_same_name_under_prefixes_run(
    durability: OnwardDurability[None],
) -> None:
    """pydantic-ai lets toolsets keep their names under a prefix; the revision tells them apart."""

    def search(toolset: str) -> Any:
        async def search(q: str) -> str:
            return f"{toolset}: {q}"

        return search

    flights, hotels = FunctionToolset(id="flights"), FunctionToolset(id="hotels")
    flights.add_function(search("flights"), name="search")
    hotels.add_function(search("hotels"), name="search")
    calls = [ToolCallPart("hotels_search", {"q": "Rome"}, tool_call_id="s1")]
    agent = Agent(
        FunctionModel(Script(*calls).answer),
        name="searcher",
        capabilities=[durability],
        output_type=[str, DeferredToolRequests],
        toolsets=[flights.prefixed("flights"), hotels.prefixed("hotels")],
    )

    done = await durability.run(agent, "find a hotel", run_id=RUN)

    assert (done.status, done.output) == ("completed", "done: hotels: Rome")


async def test_a_tool_with_an_argument_named_like_onward_s_key_runs(
    durability: OnwardDurability[None],
) -> None:
    """pydantic-ai calls its tools itself: an argument named ``idempotency_key`` is the
    model's, and the agent runs durably (Onward's own tools refuse one)."""
    calls = [ToolCallPart("pay", {"amount": 5, "idempotency_key": "k-1"}, tool_call_id="p1")]
    agent = Agent(
        FunctionModel(Script(*calls).answer),
        name="payer",
        capabilities=[durability],
        output_type=[str, DeferredToolRequests],
    )

    @agent.tool_plain
    async def pay(amount: int, idempotency_key: str) -> str:
        """Pay."""
        return f"paid {amount} under {idempotency_key}"

    done = await durability.run(agent, "pay", run_id=RUN)

    assert (done.status, done.output) == ("completed", "done: paid 5 under k-1")


async def test_a_run_another_worker_holds_is_refused(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> None:
    script = Script(faults=Faults({"after_effect"}))
    await crash(durability, booking_agent(durability, ledger, script))
    await stores.leases.acquire(RUN, tenant=TENANT, holder="elsewhere", ttl_s=60)

    with pytest.raises(ResumeConflictError):
        await durability.resume(booking_agent(durability, ledger, script), RUN)


async def test_a_run_id_in_use_is_refused(
    durability: OnwardDurability[None], ledger: Ledger
) -> None:
    agent = booking_agent(durability, ledger)
    await durability.run(agent, "book seat 3A", run_id=RUN)

    with pytest.raises(InvalidInputError, match="already exists"):
        await durability.run(agent, "book seat 3A", run_id=RUN)


async def test_an_agent_without_the_capability_is_refused(
    durability: OnwardDurability[None], stores: Stores
) -> None:
    with pytest.raises(ConfigurationError, match="has no OnwardDurability"):
        await durability.run(Agent("test", name="plain"), "hi", run_id=RUN)
    assert await events(stores) == []


@pytest.mark.parametrize("output_type", [str, [str, int]], ids=["one type", "a list without it"])
async def test_an_agent_that_cannot_hand_a_call_back_is_refused(
    durability: OnwardDurability[None], stores: Stores, output_type: Any
) -> None:
    agent = Agent("test", name="rigid", capabilities=[durability], output_type=output_type)
    with pytest.raises(ConfigurationError, match="DeferredToolRequests among its output types"):
        await durability.run(agent, "hi", run_id=RUN)
    assert await events(stores) == []


async def test_a_run_may_allow_deferred_calls_through_its_own_output_type(
    durability: OnwardDurability[None], stores: Stores
) -> None:
    agent = Agent("test", name="per-run", capabilities=[durability], output_type=str)
    result = await durability.run(agent, "hi", run_id=RUN, output_type=[str, DeferredToolRequests])
    assert result.status == "completed"
    assert isinstance((await events(stores))[0], RunStarted)


async def test_a_prompt_that_is_not_text_is_refused(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> None:
    with pytest.raises(InvalidInputError, match="prompt is text"):
        await durability.run(booking_agent(durability, ledger), ["book"], run_id=RUN)  # type: ignore[arg-type]
    assert await events(stores) == []


async def test_an_empty_run_id_is_refused_not_replaced_by_a_fresh_one(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> None:
    """``run_id=""`` (an id read from an unset variable) is a mistake, refused as
    `Options` refuses it: a fresh id in its place starts a run the caller cannot find again
    (a failed run raises before its result names it). Omitting it still picks a fresh one."""
    with pytest.raises(InvalidInputError, match="run_id must not be empty"):
        await durability.run(booking_agent(durability, ledger), "book seat 3A", run_id="")
    assert await events(stores) == []


async def test_a_waiting_run_goes_on_after_its_partition_is_cut(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger, tmp_path: Path
) -> None:
    """A pydantic-ai run is executed again from its first event: compaction keeps every event
    of it before the cut (other runs keep only what they need), so it still goes on."""
    waiting = booking_agent(durability, ledger, requires_approval=True)
    assert (await durability.run(waiting, "book seat 3A", run_id=RUN)).status == "waiting"
    for n in range(10):
        other = booking_agent(durability, ledger)
        assert (await durability.run(other, "book seat 3A", run_id=f"other-{n}")).output
    store = embedded_compaction(stores.log)
    assert store is not None
    compactor = CheckpointCompactor(
        stores.log, stores.frontiers, store, archive=DirectoryArchive(tmp_path / "archive")
    )
    report = await compactor.compact()
    assert report.partitions[0].cut
    assert (await store.truncations([RUN]))[RUN].whole
    assert not await stores.log.read_run(RUN)

    await durability.decide(RUN, DeferredToolResults(approvals={"b1": True}), by="alice")
    done = await durability.resume(waiting, RUN)

    assert done.output == "done: seat 3A booked"
    assert len(ledger.entries()) == 11


async def test_a_run_asked_to_cancel_ends_cancelled_before_its_next_model_request(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> None:
    """Someone asks the run's holder to cancel it while its third call runs (`onward cancel
    --wait` from another process does this): the holder hears it at the next call's dispatch
    and ends the run before the model request after that call, every call made once. Without
    the ask the model would stop by itself after ten calls."""

    def looping(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(isinstance(m, ModelResponse) for m in messages)
        if done == 10:
            return ModelResponse(parts=[TextPart("stopped by itself")])
        call = ToolCallPart("tick", {"n": done + 1}, tool_call_id=f"t{done + 1}")
        return ModelResponse(parts=[TextPart(f"tick {done + 1}"), call])

    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(looping),
        name="looper",
        capabilities=[durability],
        output_type=[str, DeferredToolRequests],
    )

    @agent.tool_plain
    async def tick(n: int) -> str:
        """One turn of a run that goes on."""
        ledger.record("tick", current_idempotency_key() or "", n=n)
        if n == 3:
            asked = await stores.leases.ask_to_cancel(RUN, tenant=TENANT, by="ops", why="runaway")
            assert asked is not None
        return f"ticked {n}"

    result = await durability.run(agent, "loop", run_id=RUN)

    assert (result.status, result.error) == ("cancelled", "cancelled by ops: runaway")
    assert [e["n"] for e in ledger.entries()] == [1, 2, 3, 4]
    recorded = await events(stores)
    assert sum(isinstance(e, ModelAnswered) for e in recorded) == 4
    finished = recorded[-1]
    assert isinstance(finished, RunFinished)
    assert (finished.status, finished.error) == ("cancelled", "cancelled by ops: runaway")
    assert await stores.leases.current(RUN) is None
    again = await durability.resume(agent, RUN)
    assert (again.status, again.error) == ("cancelled", "cancelled by ops: runaway")


@pytest.mark.parametrize("landing", [1, 0], ids=["landed", "lost"])
async def test_an_asked_for_end_whose_append_failed_is_written_once(
    stores: Stores, ledger: Ledger, landing: int
) -> None:
    """The end the ask wants fails to append: ``landed``, the log stored it and the answer was
    lost (a broker's lost acknowledgement), and the holder finds it by reading the log back;
    ``lost``, it was not stored, and the holder writes it again after the read-back. Either
    way the run ends cancelled, with one end in the log."""
    log = EndFails(stores.log, failures=1, landing=landing)
    durability = durability_on(dataclasses.replace(stores, log=log), worker="here")

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        n = sum(isinstance(m, ModelResponse) for m in messages) + 1
        return ModelResponse(parts=[ToolCallPart("tick", {"n": n}, tool_call_id=f"t{n}")])

    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(answer),
        name="looper",
        capabilities=[durability],
        output_type=[str, DeferredToolRequests],
    )

    @agent.tool_plain
    async def tick(n: int) -> str:
        """One turn of a run that goes on until it is asked to stop."""
        ledger.record("tick", current_idempotency_key() or "", n=n)
        await stores.leases.ask_to_cancel(RUN, tenant=TENANT, by="ops", why="runaway")
        return f"ticked {n}"

    result = await asyncio.wait_for(durability.run(agent, "loop", run_id=RUN), 30)

    assert (result.status, result.error) == ("cancelled", "cancelled by ops: runaway")
    assert log.ends_tried == 2 - landing
    assert [e.error for e in await events(stores) if isinstance(e, RunFinished)] == [
        "cancelled by ops: runaway"
    ]
    assert [e["n"] for e in ledger.entries()] == [1, 2]  # heard at the second call's dispatch
    assert await stores.leases.current(RUN) is None


async def test_a_model_request_in_flight_is_abandoned_when_the_ask_is_heard(
    stores: Stores, ledger: Ledger
) -> None:
    """The run's second model request would take an hour; the holder hears the ask with its
    next lease renewal (a third of the 3 s ttl) and abandons the request."""
    durability = durability_on(
        stores, worker="here", lease_policy=LeasePolicy(ttl=timedelta(seconds=3))
    )
    abandoned = asyncio.Event()

    async def slow(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if sum(isinstance(m, ModelResponse) for m in messages) == 1:
            asked = await stores.leases.ask_to_cancel(RUN, tenant=TENANT, by="ops", why="slow")
            assert asked is not None
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                abandoned.set()
                raise
        return ModelResponse(parts=[ToolCallPart("tick", {"n": 1}, tool_call_id="t1")])

    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(slow),
        name="slow",
        capabilities=[durability],
        output_type=[str, DeferredToolRequests],
    )

    @agent.tool_plain
    async def tick(n: int) -> str:
        """One call before the slow request."""
        ledger.record("tick", current_idempotency_key() or "", n=n)
        return f"ticked {n}"

    result = await asyncio.wait_for(durability.run(agent, "loop", run_id=RUN), 30)

    assert abandoned.is_set()
    assert (result.status, result.error) == ("cancelled", "cancelled by ops: slow")
    recorded = await events(stores)
    assert sum(isinstance(e, ModelAnswered) for e in recorded) == 1
    assert [e.error for e in recorded if isinstance(e, RunFinished)] == [result.error]
    assert [e["n"] for e in ledger.entries()] == [1]
    assert await stores.leases.current(RUN) is None


class _AsksUntilAnswered:
    """A model that asks for ``book`` again under a new call id while told to retry."""

    def __init__(self) -> None:
        self.asked = 0

    def answer(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.asked += 1
        last = messages[-1].parts if messages else []
        told_to_retry = any(
            isinstance(p, RetryPromptPart) or "timed out" in str(getattr(p, "content", "")).lower()
            for p in last
        )
        if self.asked == 1 or told_to_retry:
            call = ToolCallPart("book", {"seat": "3A"}, tool_call_id=f"b{self.asked}")
            return ModelResponse(parts=[call])
        return ModelResponse(parts=[TextPart("done")])


def _slow_booking_agent(
    durability: OnwardDurability[None], booked: list[str], *, retry_safe: bool
) -> Agent[None, str | DeferredToolRequests]:
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(_AsksUntilAnswered().answer),
        name="booker",
        capabilities=[durability],
        output_type=[str, DeferredToolRequests],
    )

    @agent.tool_plain(timeout=0.05, metadata={"onward": {"retry_safe": retry_safe}})
    async def book(seat: str) -> str:
        """Book a seat: the booking takes effect, then the reply is slow."""
        booked.append(current_idempotency_key() or "")
        await asyncio.sleep(1 if len(booked) == 1 else 0)
        return f"seat {seat} booked"

    return agent


async def test_a_tool_cut_off_by_its_timeout_is_not_made_again_unasked(
    durability: OnwardDurability[None], stores: Stores
) -> None:
    """pydantic-ai turns a tool cut off by its ``timeout`` into a retry prompt; a call that
    may have taken effect before it was cut off is not the model's to make again: the run
    hands it to a person, as for a crash mid-call."""
    booked: list[str] = []
    agent = _slow_booking_agent(durability, booked, retry_safe=False)

    result = await durability.run(agent, "book seat 3A", run_id=RUN)

    assert len(booked) == 1
    assert result.status == "waiting"
    assert isinstance(result.output, DeferredToolRequests)
    assert [c.tool_name for c in result.output.approvals] == ["book"]
    assert not [e for e in await events(stores) if isinstance(e, ToolCompleted)]
    again = await durability.resume(agent, RUN)
    assert again.status == "waiting"
    assert len(booked) == 1

    await durability.decide(RUN, DeferredToolResults(approvals={"b1": True}), by="ops")
    approved = await durability.resume(agent, RUN)
    assert approved.status == "completed"
    assert booked == [booked[0], booked[0]]  # made again as approved, under the same key


async def test_a_retry_safe_tool_cut_off_by_its_timeout_is_retried_by_the_model(
    durability: OnwardDurability[None],
) -> None:
    """A tool that says a second call is harmless keeps pydantic-ai's retry of its cut-off."""
    booked: list[str] = []
    agent = _slow_booking_agent(durability, booked, retry_safe=True)

    result = await durability.run(agent, "book seat 3A", run_id=RUN)

    assert result.status == "completed"
    assert len(booked) == 2


def a_large_write(durability: OnwardDurability[None], script: Script, written: list[int]) -> Any:
    """An agent whose model asks ``write`` to write a large file."""
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(script.answer),
        name="writer",
        capabilities=[durability],
        output_type=[str, DeferredToolRequests],
    )

    @agent.tool_plain
    async def write(text: str) -> int:
        """Write a file."""
        written.append(len(text))
        return len(text)

    return agent


async def test_large_tool_arguments_go_out_of_line(stores: Stores, tmp_path: Path) -> None:
    script = Script(ToolCallPart("write", {"text": "z" * 1_000_000}, tool_call_id="w"))
    written: list[int] = []
    async with SqliteBlobStore(tmp_path / "onward.db") as blobs:
        durability = durability_on(stores, worker="here", blobs=blobs)
        result = await durability.run(a_large_write(durability, script, written), "go", run_id=RUN)

    assert result.status == "completed"
    assert written == [1_000_000]


async def test_an_answer_too_large_for_the_log_fails_the_run_once(
    durability: OnwardDurability[None], stores: Stores
) -> None:
    """Without a blob store, a model answer over the log's limit cannot be recorded: the run
    ends failed saying why, rather than the (paid) model asked again at every resume."""
    script = Script(ToolCallPart("write", {"text": "z" * 1_000_000}, tool_call_id="w"))
    written: list[int] = []
    agent = a_large_write(durability, script, written)

    with pytest.raises(PayloadTooLargeError):
        await durability.run(agent, "go", run_id=RUN)
    again = await durability.resume(agent, RUN)

    assert again.status == "failed"
    assert again.error is not None
    assert "too large" in again.error
    assert script.asked == 1
    assert written == []


async def test_an_output_too_large_for_one_record_goes_out_of_line_and_is_given_back(
    stores: Stores, tmp_path: Path
) -> None:
    """The run's output goes out of line with its end, as the model's answer does: the run
    completes with it, and a resume of the ended run gives it back whole, never its
    reference."""
    asked: list[int] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked.append(1)
        return ModelResponse(parts=[TextPart("y" * 1_500_000)])

    async with SqliteBlobStore(tmp_path / "onward.db") as blobs:
        durability = durability_on(stores, worker="here", blobs=blobs)
        agent: Agent[None, str | DeferredToolRequests] = Agent(
            FunctionModel(answer),
            name="talker",
            capabilities=[durability],
            output_type=[str, DeferredToolRequests],
        )
        result = await durability.run(agent, "say a lot", run_id=RUN)
        again = await durability.resume(agent, RUN)

    assert (result.status, result.output) == ("completed", "y" * 1_500_000)
    assert (again.status, again.output) == ("completed", "y" * 1_500_000)
    assert len(asked) == 1


def _said_at_length(text: str) -> str:
    return text * 1_500_000


def _parsed(text: str) -> Any:
    return json.loads(text)


async def test_an_output_too_large_for_the_log_fails_the_run_once(
    durability: OnwardDurability[None], stores: Stores
) -> None:
    """Without a blob store, an output over the log's limit cannot be recorded: the run ends
    failed saying why, rather than left running, executed again and refused again at every
    resume."""
    asked: list[int] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked.append(1)
        return ModelResponse(parts=[TextPart("y")])

    agent: Agent[None, str] = Agent(
        FunctionModel(answer),
        name="talker",
        capabilities=[durability],
        output_type=[TextOutput(_said_at_length), DeferredToolRequests],
    )
    with pytest.raises(PayloadTooLargeError, match="output is too large"):
        await durability.run(agent, "say a lot", run_id=RUN)
    again = await durability.resume(agent, RUN)

    assert again.status == "failed"
    assert again.error is not None
    assert "output is too large" in again.error
    assert "blob store" in again.error
    assert len(asked) == 1
    (finished,) = [e for e in await events(stores) if isinstance(e, RunFinished)]
    assert finished.status == "failed"


@pytest.mark.parametrize("count", [-3, 2**41], ids=["negative", "past TOKENS_MAX"])
async def test_a_token_count_no_model_call_has_does_not_fail_the_answer(
    durability: OnwardDurability[None], stores: Stores, count: int
) -> None:
    """A model (or its server) reporting a token count the log cannot keep: the answer is
    recorded, the count as zero, rather than refused at every resume after the (paid) model
    is asked again and answers alike."""
    asked: list[int] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked.append(1)
        return ModelResponse(parts=[TextPart("hi")], usage=RequestUsage(input_tokens=count))

    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(answer),
        name="talker",
        capabilities=[durability],
        output_type=[str, DeferredToolRequests],
    )
    result = await durability.run(agent, "say hi", run_id=RUN)

    assert (result.status, result.output) == ("completed", "hi")
    assert len(asked) == 1
    (answered,) = [e for e in await events(stores) if isinstance(e, ModelAnswered)]
    assert answered.usage.input_tokens == 0


async def test_a_tool_failure_with_a_message_too_long_for_the_log_ends_the_run_with_it(
    durability: OnwardDurability[None], stores: Stores
) -> None:
    """A tool raises with a message of megabytes: the run ends failed with the tool's error,
    cut as a tool's error is, and the caller gets that error, not the log's refusal of it."""
    script = Script(ToolCallPart("write", {"text": "z"}, tool_call_id="w"))
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(script.answer),
        name="writer",
        capabilities=[durability],
        output_type=[str, DeferredToolRequests],
    )

    @agent.tool_plain
    async def write(text: str) -> int:
        """Write a file."""
        raise ValueError("disk full " + "x" * 2_000_000)

    with pytest.raises(ValueError, match="disk full"):
        await durability.run(agent, "go", run_id=RUN)
    (finished,) = [e for e in await events(stores) if isinstance(e, RunFinished)]
    assert finished.status == "failed"
    assert finished.error is not None
    assert finished.error.startswith("ValueError: disk full")
    assert len(finished.error) < 3_000


async def test_an_output_shaped_like_a_reference_is_given_back_as_it_was(
    stores: Stores, tmp_path: Path
) -> None:
    """Only the claim check makes references: a structured output that merely looks like one
    (naming a body in the blob store, which every tenant shares) is the run's output as the
    agent gave it, never that body."""
    async with SqliteBlobStore(tmp_path / "onward.db") as blobs:
        secret = await blobs.put(b'"another tenant\'s"')
        forged = {"$blob": secret, "size": 3}

        def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            return ModelResponse(parts=[TextPart(json.dumps(forged))])

        durability = durability_on(stores, worker="here", blobs=blobs)
        agent: Agent[None, Any] = Agent(
            FunctionModel(answer),
            name="talker",
            capabilities=[durability],
            output_type=[TextOutput(_parsed), DeferredToolRequests],
        )
        result = await durability.run(agent, "answer", run_id=RUN)
        again = await durability.resume(agent, RUN)

    assert (result.status, result.output) == ("completed", forged)
    assert (again.status, again.output) == ("completed", forged)


async def test_a_large_output_shaped_like_a_wrapping_is_given_back_as_it_was(
    stores: Stores, tmp_path: Path
) -> None:
    """A structured output shaped like the wrapping of a look-alike, and too large for one log
    record, goes out of line wrapped as written: read back, it is the output the agent gave,
    not wrapped once more."""
    given = {"$literal": "y" * 1_500_000}

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart(json.dumps(given))])

    async with SqliteBlobStore(tmp_path / "onward.db") as blobs:
        durability = durability_on(stores, worker="here", blobs=blobs)
        agent: Agent[None, Any] = Agent(
            FunctionModel(answer),
            name="talker",
            capabilities=[durability],
            output_type=[TextOutput(_parsed), DeferredToolRequests],
        )
        result = await durability.run(agent, "answer", run_id=RUN)
        again = await durability.resume(agent, RUN)

    assert (result.status, result.output) == ("completed", given)
    assert again.status == "completed"
    assert again.output == given, f"given back as {str(again.output)[:40]}..."


class _NoModel:
    """The provider of a runner that only settles calls, as ``onward resolve`` builds it."""

    async def complete(self, agent: Any, messages: Any) -> Any:
        raise AssertionError("settling a call asks no model")


async def settle(stores: Stores, outcome: Literal["completed", "never_ran"], result: Any) -> None:
    """Settle the lost booking ``b1`` as ``onward resolve`` does, before the run is resumed."""
    ops = AgentRunner(
        provider=_NoModel(),
        log=stores.log,
        leases=stores.leases,
        frontiers=stores.frontiers,
        checkpoint_inline=stores.embedded,
        worker="ops",
    )
    await ops.resolve(
        RUN, "b1", tenant=TENANT, outcome=outcome, by="ops", why="checked", result=result
    )


async def test_a_lost_call_settled_as_completed_with_onward_resolve_is_not_asked_about_again(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> None:
    """A person who settled a lost call with ``onward resolve`` said how it ended: the resumed
    run carries on with the result they gave, as its resume plan says, not asking again."""
    script = Script(faults=Faults({"after_effect"}))
    await crash(durability, booking_agent(durability, ledger, script))
    await settle(stores, "completed", "seat 3A held")

    done = await durability.resume(booking_agent(durability, ledger, script), RUN)

    assert (done.status, done.output) == ("completed", "done: seat 3A held")
    assert len(ledger.entries()) == 1


async def test_a_lost_call_settled_as_never_ran_with_onward_resolve_is_made_again(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> None:
    """Settled as never ran, the call is made again, with its key, without asking again."""
    script = Script(faults=Faults({"after_effect"}))
    await crash(durability, booking_agent(durability, ledger, script))
    await settle(stores, "never_ran", None)

    done = await durability.resume(booking_agent(durability, ledger, script), RUN)

    assert (done.status, done.output) == ("completed", "done: seat 3A booked")
    first, second = ledger.entries()
    assert first["key"] == second["key"]


@pytest.mark.parametrize(
    "timed_out",
    [
        "Request 'tools/call' timed out",
        "Timed out after 5.0s waiting for 'tools/call'",
        "Timed out while waiting for response to ClientRequest. Waited 300.0 seconds.",
    ],
    ids=["mcp-session", "mcp-in-memory", "mcp-1.x"],
)
async def test_an_mcp_tool_call_that_timed_out_is_not_made_again_unasked(
    durability: OnwardDurability[None], stores: Stores, timed_out: str
) -> None:
    """pydantic-ai's MCP toolset turns a call the MCP session stopped waiting for (its
    ``read_timeout``) into a retry prompt with the SDK's message; the server may have acted
    on it, so the run hands it to a person as for a tool cut off at its own timeout. The tool
    here fails as pydantic-ai's ``MCPToolset`` does (``ModelRetry(str(error))``): fastmcp,
    which that toolset needs, is not a test dependency, and the `mcp` SDK is not installed where
    the tests run against the lowest pydantic-ai."""
    booked: list[str] = []
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(_AsksUntilAnswered().answer),
        name="booker",
        capabilities=[durability],
        output_type=[str, DeferredToolRequests],
    )

    @agent.tool_plain
    async def book(seat: str) -> str:
        """Book a seat on a server that takes effect, then answers too late."""
        booked.append(current_idempotency_key() or "")
        if len(booked) == 1:
            raise ModelRetry(timed_out)  # str() of the SDK's MCPError: its message
        return f"seat {seat} booked"

    result = await durability.run(agent, "book seat 3A", run_id=RUN)

    assert len(booked) == 1
    assert result.status == "waiting"
    assert isinstance(result.output, DeferredToolRequests)
    assert [c.tool_name for c in result.output.approvals] == ["book"]
    assert not [e for e in await events(stores) if isinstance(e, ToolCompleted)]


async def test_resuming_a_run_still_waiting_returns_the_calls_it_waits_on(
    durability: OnwardDurability[None], ledger: Ledger
) -> None:
    """A run still waiting on a decision is returned as it stands, its output the calls to
    decide, as when it began to wait: another process resuming it sees what to decide."""
    agent = booking_agent(durability, ledger, requires_approval=True)
    waiting = await durability.run(agent, "book seat 3A", run_id=RUN)

    again = await durability.resume(agent, RUN)

    assert (again.status, again.waiting_on) == ("waiting", waiting.waiting_on)
    assert isinstance(again.output, DeferredToolRequests)
    assert again.output == waiting.output


class _Receipt:
    """What an output function returns that is not JSON."""

    def __init__(self, to: str) -> None:
        self.to = to


async def test_an_output_that_is_not_json_fails_the_run_once(
    durability: OnwardDurability[None], stores: Stores
) -> None:
    """The run's output is recorded as JSON with its end: one that cannot be ends the run
    failed saying why, rather than left running, executed again (its output function too)
    and refused again at every resume."""
    sent: list[str] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        output_tool = info.output_tools[0].name
        return ModelResponse(parts=[ToolCallPart(output_tool, {"to": "ann"}, tool_call_id="o1")])

    def send(to: str) -> object:
        """Send the mail and hand back its receipt."""
        sent.append(to)
        return _Receipt(to)

    agent: Agent[None, object] = Agent(
        FunctionModel(answer),
        name="mailer",
        capabilities=[durability],
        output_type=[ToolOutput(send), DeferredToolRequests],
    )
    with pytest.raises(PydanticSerializationError):
        await durability.run(agent, "mail ann", run_id=RUN)
    again = await durability.resume(agent, RUN)

    assert again.status == "failed"
    assert again.error is not None
    assert "_Receipt" in again.error
    assert sent == ["ann"]
    (finished,) = [e for e in await events(stores) if isinstance(e, RunFinished)]
    assert finished.status == "failed"


class _DispatchFails(WrappedEventLog):
    """Refuses the first dispatch of a call, as a log that went away between the model's
    answer and the call's write-ahead."""

    def __init__(self, inner: EventLog) -> None:
        super().__init__(inner)
        self.failed = False

    async def append(self, events: Sequence[Event]) -> list[Position]:
        if not self.failed and any(isinstance(e, ToolDispatched) for e in events):
            self.failed = True
            raise BackendUnavailableError("the log is not there")
        return await super().append(events)


async def test_a_call_never_dispatched_settled_as_completed_is_not_made(
    stores: Stores, ledger: Ledger
) -> None:
    """A call whose dispatch was never written, settled as completed with ``onward resolve``
    (a person made it by hand), is not made by the resumed run: it reads the result given."""
    failing = durability_on(
        dataclasses.replace(stores, log=_DispatchFails(stores.log)), worker="here"
    )
    agent = booking_agent(failing, ledger)
    with pytest.raises(BackendUnavailableError):
        await failing.run(agent, "book seat 3A", run_id=RUN)
    await settle(stores, "completed", "seat 3A booked by hand")

    durability = durability_on(stores, worker="here")
    done = await durability.resume(booking_agent(durability, ledger), RUN)

    assert (done.status, done.output) == ("completed", "done: seat 3A booked by hand")
    assert ledger.entries() == []


async def test_an_approved_call_lost_again_and_settled_with_onward_resolve_is_not_asked_again(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> None:
    """A decision settled the call's first attempt; the attempt it approved, lost too and
    settled with ``onward resolve``, stands as settled like any other."""
    await crash(
        durability, booking_agent(durability, ledger, Script(faults=Faults({"after_effect"})))
    )
    await durability.resume(booking_agent(durability, ledger), RUN)
    await durability.decide(RUN, DeferredToolResults(approvals={"b1": True}), by="alice")
    lost_again = booking_agent(durability, ledger, Script(faults=Faults({"after_effect"})))
    with pytest.raises(Crash):
        await durability.resume(lost_again, RUN)
    await settle(stores, "completed", "seat 3A held")

    done = await durability.resume(booking_agent(durability, ledger), RUN)

    assert (done.status, done.output) == ("completed", "done: seat 3A held")
    assert len(ledger.entries()) == 2


async def test_the_output_tool_call_is_not_recorded_as_a_call_still_to_make(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> None:
    """The model ends the run by calling its output tool, beside a tool call, and the worker
    dies before the end is written. The output tool call is pydantic-ai's output, never a
    dispatch of Onward's: the resume's plan and the finished run show the tool call made and
    nothing for ``final_result`` (which they listed as a call never dispatched, to make)."""
    state = {"crash": True}

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("book", {"seat": "3A"}, tool_call_id="b1")])
        output_tool = info.output_tools[0].name
        return ModelResponse(parts=[ToolCallPart(output_tool, {"to": "ann"}, tool_call_id="o1")])

    def send(to: str) -> str:
        if state.pop("crash", False):
            raise Crash("before the end was written")
        return f"sent to {to}"

    agent: Agent[None, object] = Agent(
        FunctionModel(answer),
        name="mailer",
        capabilities=[durability],
        output_type=[ToolOutput(send), DeferredToolRequests],
    )

    @agent.tool_plain
    async def book(seat: str) -> str:
        ledger.record("book", current_idempotency_key() or "", seat=seat)
        return f"booked {seat}"

    await crash(durability, agent)
    done = await durability.resume(agent, RUN)

    assert (done.status, done.output) == ("completed", "sent to ann")
    (planned,) = [e for e in await events(stores) if isinstance(e, ResumePlanned)]
    assert (planned.dispatched, planned.undecided) == ([], [])
    assert "final_result" not in planned.reason
    frontier = await durability._runs.runner.inspect(RUN, tenant=TENANT)
    assert "final_result" not in [c.tool for c in frontier.calls]
    assert len(ledger.entries()) == 1


@pytest.mark.parametrize("heard", [True, False], ids=["heard", "not_yet_heard"])
async def test_a_run_asked_to_cancel_ends_cancelled_where_it_would_wait_on_a_person(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger, heard: bool
) -> None:
    """Someone asks the run's holder to cancel it while its first call runs; the model's next
    answer asks for a booking that needs approval, so the run would wait on a person.
    ``heard``: a call beside the booking hears the ask at its dispatch; ``not_yet_heard``: no
    renewal heard it yet. Either way the run ends cancelled there, as asked, rather than
    wait for a decision that would carry it on (and book)."""

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[ToolCallPart("tick", {"n": 1}, tool_call_id="t1")])
        if sum(isinstance(m, ModelResponse) for m in messages) > 1:
            return ModelResponse(parts=[TextPart("done")])
        book = ToolCallPart("book", {"seat": "3A"}, tool_call_id="b1")
        tick = ToolCallPart("tick", {"n": 2}, tool_call_id="t2")
        return ModelResponse(parts=[tick, book] if heard else [book])

    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(answer),
        name="asker",
        capabilities=[durability],
        output_type=[str, DeferredToolRequests],
    )

    @agent.tool_plain
    async def tick(n: int) -> str:
        """One turn of work."""
        ledger.record("tick", current_idempotency_key() or "", n=n)
        if n == 1:
            asked = await stores.leases.ask_to_cancel(RUN, tenant=TENANT, by="ops", why="stop")
            assert asked is not None
        return f"ticked {n}"

    @agent.tool_plain(requires_approval=True)
    async def book(seat: str) -> str:
        """Book a seat, once a person approves."""
        ledger.record("book", current_idempotency_key() or "", seat=seat)
        return f"seat {seat} booked"

    result = await durability.run(agent, "book", run_id=RUN)

    assert (result.status, result.error) == ("cancelled", "cancelled by ops: stop")
    assert [e.error for e in await events(stores) if isinstance(e, RunFinished)] == [
        "cancelled by ops: stop"
    ]
    assert await stores.leases.current(RUN) is None
    with pytest.raises(InvalidInputError, match="cancelled"):
        await durability.decide(RUN, DeferredToolResults(approvals={"b1": True}), by="ana")
    again = await durability.resume(agent, RUN)
    assert (again.status, again.error) == ("cancelled", "cancelled by ops: stop")
    assert [e for e in ledger.entries() if e["tool"] == "book"] == []


async def test_a_run_whose_holder_died_after_an_ask_ends_before_its_next_call_on_resume(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> None:
    """The run's holder is asked to cancel it while a retry-safe booking runs, and dies before
    the booking's outcome is recorded (the ask is kept with the lease). The next holder hears
    the ask as it takes the run and ends it cancelled before anything else: the booking,
    which a resume would otherwise make again, is not."""
    script = Script()
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(script.answer),
        name="booker",
        capabilities=[durability],
        output_type=[str, DeferredToolRequests],
    )
    dies = [True]

    @agent.tool_plain(metadata={"onward": {"retry_safe": True}})
    async def book(seat: str) -> str:
        """Book a seat (booking twice is harmless)."""
        ledger.record("book", current_idempotency_key() or "", seat=seat)
        if dies.pop() if dies else False:
            asked = await stores.leases.ask_to_cancel(RUN, tenant=TENANT, by="ops", why="stop")
            assert asked is not None
            raise Crash("after_effect")
        return f"seat {seat} booked"

    with pytest.raises(Crash):
        await durability.run(agent, "book seat 3A", run_id=RUN)
    assert len(ledger.entries()) == 1

    result = await durability.resume(agent, RUN)

    assert (result.status, result.error) == ("cancelled", "cancelled by ops: stop")
    assert len(ledger.entries()) == 1, "the next holder made a call of a run asked to cancel"
    assert script.asked == 1
    assert await stores.leases.current(RUN) is None


async def test_a_waiting_run_asked_while_a_resume_holds_it_ends_cancelled(
    durability: OnwardDurability[None], stores: Stores, ledger: Ledger
) -> None:
    """A resume holds a run that waits on a decision (nothing to carry on) as Ops asks its
    holder to cancel it: told the run ends, it must end, not go on waiting and book once a
    person approves."""
    agent = booking_agent(durability, ledger, requires_approval=True)
    waiting = await durability.run(agent, "book seat 3A", run_id=RUN)
    assert waiting.status == "waiting"
    resumer = durability._runs.runner.resumer
    claim = resumer.claim

    async def claimed_then_asked(*args: Any, **kwargs: Any) -> Any:
        carried = await claim(*args, **kwargs)
        asked = await stores.leases.ask_to_cancel(RUN, tenant=TENANT, by="ops", why="stop")
        assert asked is not None
        return carried

    resumer.claim = claimed_then_asked  # type: ignore[method-assign]
    first = await durability.resume(agent, RUN)
    resumer.claim = claim  # type: ignore[method-assign]
    # Resumed again before anyone decides: its holder hears the ask at its acquisition.
    again = await durability.resume(agent, RUN)
    with contextlib.suppress(InvalidInputError):
        await durability.decide(RUN, DeferredToolResults(approvals={"b1": True}), by="ana")
    last = await durability.resume(agent, RUN)

    assert ledger.entries() == [], "a run asked to cancel booked once approved"
    assert (first.status, first.error) == ("cancelled", "cancelled by ops: stop")
    assert (again.status, last.status) == ("cancelled", "cancelled")
    assert await stores.leases.current(RUN) is None
