"""The fold: one pure function every reader applies to a run's stored events."""

from __future__ import annotations

import random
from typing import cast

import msgspec
import pytest
from support.histories import RunScript

from onward.eventlog import (
    EVENT_TYPES,
    AnyEvent,
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    Event,
    Message,
    ModelAnswered,
    Position,
    RunClaimed,
    RunFinished,
    RunStarted,
    StoredEvent,
    ToolCall,
    ToolCompleted,
    ToolDispatched,
    ToolError,
    ToolResolved,
    TurnSettled,
)
from onward.projections import frontier as frontier_module
from onward.projections.frontier import Frontier, ToolCallRow, fold, fold_all, fold_run
from onward.projections.transcript import checkpoint_of, checkpoint_request, message_of
from onward.runtime.options import approval_value
from onward.testing.eventlog import Envelope


def stored(events: list[Event]) -> list[StoredEvent]:
    return [
        StoredEvent(Position(0, offset), cast("AnyEvent", e)) for offset, e in enumerate(events)
    ]


def env(seq: int, fence: int = 1, at: int = 0) -> Envelope:
    return Envelope(run_id="r", tenant="t", seq=seq, fence=fence, at=at or seq * 10)


def start() -> Frontier:
    return Frontier.empty("r", "t")


def test_every_event_kind_has_a_fold_rule() -> None:
    assert set(frontier_module._RULES) == set(EVENT_TYPES)


def test_a_model_answer_opens_a_turn_and_is_a_boundary() -> None:
    events: list[Event] = [
        RunStarted(**env(1), agent="a", revision="r1"),
        ModelAnswered(
            **env(2),
            message=Message(role="assistant"),
            tool_calls=[ToolCall(call_id="c1", tool="book", idempotency_key="k1")],
        ),
    ]
    f = fold_all(start(), stored(events))
    assert (f.status, f.iteration, f.last_boundary, f.resume_seq, f.last_seq) == (
        "running",
        1,
        "after_model_call",
        2,
        2,
    )
    assert [(c.call_id, c.dispatched_seq, c.outcome) for c in f.calls] == [("c1", None, None)]


def test_dispatch_and_completion_are_recorded_then_the_turn_settles() -> None:
    events: list[Event] = [
        RunStarted(**env(1), agent="a", revision="r1"),
        ModelAnswered(
            **env(2),
            message=Message(role="assistant"),
            tool_calls=[ToolCall(call_id="c1", tool="b")],
        ),
        ToolDispatched(**env(3, at=100), call_id="c1", tool="b", idempotency_key="k"),
        ToolCompleted(**env(4, at=175), call_id="c1", result={"seat": "3A"}),
    ]
    f = fold_all(start(), stored(events))
    call = f.call("c1")
    assert call is not None
    assert (call.dispatched_seq, call.dispatched_fence, call.outcome, call.result) == (
        3,
        1,
        "completed",
        {"seat": "3A"},
    )
    settled = fold(f, StoredEvent(Position(0, 4), TurnSettled(**env(5), iteration=1)))
    assert (settled.calls, settled.last_boundary, settled.resume_seq) == (
        (),
        "after_tool_result",
        5,
    )


def test_a_person_settling_a_call_is_recorded() -> None:
    events: list[Event] = [
        ModelAnswered(
            **env(1), message=Message(role="a"), tool_calls=[ToolCall(call_id="c", tool="pay")]
        ),
        ToolDispatched(**env(2), call_id="c", tool="pay", idempotency_key="k"),
        ToolResolved(**env(3), call_id="c", outcome="never_ran", by="ops@acme", why="no charge"),
    ]
    call = fold_all(start(), stored(events)).call("c")
    assert call is not None
    assert (call.outcome, call.resolved_by) == ("never_ran", "ops@acme")


def test_a_call_settled_as_never_run_with_an_error_never_ran() -> None:
    """A status check's ``never_ran`` recorded with an error (what an earlier runner made of a
    result that came with it) had folded to an ``error`` outcome: resume replayed the call as
    made, and the model was never told of it. It never ran, so it is dispatched again; a
    ``completed`` settlement with an error is that error."""
    calls = [ToolCall(call_id="c", tool="pay"), ToolCall(call_id="d", tool="pay")]
    error = ToolError(type="UnencodableResult", message="an object of type Receipt")
    events: list[Event] = [
        ModelAnswered(**env(1), message=Message(role="a"), tool_calls=calls),
        ToolDispatched(**env(2), call_id="c", tool="pay", idempotency_key="k"),
        ToolDispatched(**env(3), call_id="d", tool="pay", idempotency_key="l"),
        ToolResolved(**env(4), call_id="c", outcome="never_ran", error=error, by="reconcile"),
        ToolResolved(**env(5), call_id="d", outcome="completed", error=error, by="reconcile"),
    ]
    f = fold_all(start(), stored(events))
    never, failed = f.call("c"), f.call("d")
    assert never is not None
    assert failed is not None
    assert (never.outcome, failed.outcome) == ("never_ran", "error")


def test_approval_waits_and_an_answer_to_another_request_changes_nothing() -> None:
    waiting = fold_all(start(), stored([ApprovalRequested(**env(1), request_id="a1")]))
    assert (waiting.status, waiting.waiting_on, waiting.last_boundary) == (
        "waiting",
        "a1",
        "before_approval",
    )
    other = fold(
        waiting, StoredEvent(Position(0, 1), ApprovalDenied(**env(2), request_id="zz", by="x"))
    )
    assert (other.status, other.waiting_on, other.last_seq) == ("waiting", "a1", 2)
    answered = fold(
        waiting, StoredEvent(Position(0, 1), ApprovalDenied(**env(2), request_id="a1", by="x"))
    )
    assert (answered.status, answered.waiting_on) == ("running", None)


def test_a_superseded_fence_is_counted_and_changes_nothing_else() -> None:
    before = fold_all(
        start(),
        stored(
            [
                RunStarted(**env(1), agent="a", revision="r"),
                RunClaimed(**env(2, fence=2), worker="b"),
            ]
        ),
    )
    zombie = StoredEvent(Position(0, 9), RunFinished(**env(3, fence=1), status="failed"))
    after = fold(before, zombie)
    assert msgspec.structs.replace(after, refused=0, last_refusal=None, through_offset=1) == before
    assert (after.refused, after.through_offset, after.status) == (1, 9, "running")
    assert after.last_refusal is not None
    assert "fence 1 is below fence 2" in after.last_refusal


def test_a_duplicate_seq_is_refused() -> None:
    f = fold_all(
        start(),
        stored(
            [RunStarted(**env(1), agent="a", revision="r"), RunFinished(**env(1), status="failed")]
        ),
    )
    assert (f.status, f.refused, f.last_seq) == ("running", 1, 1)


def test_folding_is_pure() -> None:
    f = start()
    event = StoredEvent(Position(0, 0), RunStarted(**env(1), agent="a", revision="r"))
    fold(f, event)
    assert f == start()


def test_every_prefix_of_a_history_folds_to_a_valid_frontier(rng: random.Random) -> None:
    for _ in range(30):
        script = RunScript(rng, zombie=rng.random() < 0.5)
        events = stored([e for step in script.steps() for e in step])
        incremental = Frontier.empty(script.run_id, "acme")
        for cut in range(len(events) + 1):
            prefix = fold_all(Frontier.empty(script.run_id, "acme"), events[:cut])
            assert prefix == incremental
            assert prefix.last_seq + prefix.refused == cut
            assert prefix.through_offset == cut - 1
            assert all(c.requested_seq <= prefix.last_seq for c in prefix.calls)
            assert prefix.resume_seq <= prefix.last_seq
            if cut < len(events):
                incremental = fold(incremental, events[cut])


def test_overlapping_batches_fold_nothing_twice(rng: random.Random) -> None:
    script = RunScript(rng)
    events = stored([e for step in script.steps() for e in step])
    once: dict[tuple[str, str], ToolCallRow] = {}
    whole = fold_run(Frontier.empty(script.run_id, "acme"), events, once)
    twice: dict[tuple[str, str], ToolCallRow] = {}
    half = fold_run(Frontier.empty(script.run_id, "acme"), events[: len(events) // 2], twice)
    again = fold_run(half, events, twice)
    assert again == whole
    assert twice == once


@pytest.mark.parametrize("outcome", ["result", "error"])
def test_call_rows_carry_latency_and_outcome(outcome: str) -> None:
    completion = (
        ToolCompleted(**env(3, at=450), call_id="c", result=1)
        if outcome == "result"
        else ToolCompleted(**env(3, at=450), call_id="c", error=ToolError(type="Timeout"))
    )
    events: list[Event] = [
        ModelAnswered(
            **env(1), message=Message(role="a"), tool_calls=[ToolCall(call_id="c", tool="t")]
        ),
        ToolDispatched(**env(2, at=400), call_id="c", tool="t", idempotency_key="k"),
        completion,
    ]
    rows: dict[tuple[str, str], ToolCallRow] = {}
    fold_run(start(), stored(events), rows)
    row = rows[("r", "c")]
    assert (row.latency_us, row.outcome, row.fence, row.idempotency_key) == (
        50,
        "completed" if outcome == "result" else "error",
        1,
        "k",
    )


def test_run_options_give_the_user_pauses_and_bound() -> None:
    options = {
        "user": "ann",
        "mode": "collaborative",
        "checkpoints": ["after_tool_result", "after_model_call"],
        "max_iterations": 7,
    }
    folded = fold_all(
        start(), stored([RunStarted(**env(1), agent="a", revision="r1", options=options)])
    )
    assert folded.user_id == "ann"
    assert folded.pause_at == ("after_model_call", "after_tool_result")
    assert folded.max_iterations == 7


@pytest.mark.parametrize(
    "options",
    [
        {"user": 3, "mode": "collaborative", "checkpoints": "all", "max_iterations": "7"},
        {"mode": "autonomous", "checkpoints": ["after_tool_result"], "max_iterations": 0},
        {"max_iterations": True, "user": None},
    ],
)
def test_odd_run_options_count_as_absent(options: dict[str, object]) -> None:
    folded = fold_all(
        start(), stored([RunStarted(**env(1), agent="a", revision="r1", options=options)])
    )
    assert (folded.user_id, folded.pause_at, folded.max_iterations) == (None, (), None)


def test_an_approval_value_reaches_the_call_it_approved_through_its_dispatch() -> None:
    events: list[Event] = [
        RunStarted(**env(1), agent="a", revision="r1"),
        ModelAnswered(
            **env(2),
            message=Message(role="assistant"),
            tool_calls=[ToolCall(call_id="p", tool="pay"), ToolCall(call_id="q", tool="pay")],
        ),
        ApprovalRequested(**env(3), request_id="p"),
        ApprovalGranted(**env(4), request_id="p", by="ann", value={"limit": 5}),
        ToolDispatched(**env(5), call_id="p", tool="pay", idempotency_key="k"),
    ]
    folded = fold_all(start(), stored(events))
    values = [approval_value(folded, c.call_id) for c in folded.calls]
    assert values == [{"limit": 5}, None]


def test_a_checkpoint_answer_after_a_model_call_reaches_every_call_of_the_turn() -> None:
    request = checkpoint_request("after_model_call", 2)
    events: list[Event] = [
        RunStarted(**env(1), agent="a", revision="r1"),
        ModelAnswered(
            **env(2),
            message=Message(role="assistant"),
            tool_calls=[ToolCall(call_id="p", tool="pay"), ToolCall(call_id="q", tool="pay")],
        ),
        ApprovalRequested(**env(3), request_id=request),
        ApprovalGranted(**env(4), request_id=request, by="ann", value="go"),
    ]
    folded = fold_all(start(), stored(events))
    assert [approval_value(folded, c.call_id) for c in folded.calls] == ["go", "go"]
    assert folded.messages == 2  # the input and the model's answer; the model is not told
    settled = fold_all(folded, stored([TurnSettled(**env(5), iteration=1, call_ids=["p", "q"])]))
    assert approval_value(settled, "p") is None  # a grant lasts the turn it was given in


def test_a_checkpoint_answer_after_a_settled_turn_is_said_to_the_model() -> None:
    request = checkpoint_request("after_tool_result", 3)
    granted = ApprovalGranted(**env(5), request_id=request, by="ann", value="mind the budget")
    assert checkpoint_of(request) == ("after_tool_result", 3)
    assert checkpoint_of("call-1") is None
    assert message_of(granted) == Message(role="user", content="mind the budget")
    assert message_of(msgspec.structs.replace(granted, value=None)) is None
    assert message_of(msgspec.structs.replace(granted, request_id="call-1")) is None
