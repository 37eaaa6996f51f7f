"""One frontier per run, and the one fold every reader uses to compute it.

The projector, resume, audit replay and rebuilds all call :func:`fold`, so they cannot disagree
about a run. The fold applies the seq and fence rules of :func:`onward.eventlog.base.judge`:
a refused event is counted on the frontier and otherwise changes nothing. Folding any prefix of
a run's events gives a valid frontier, because every field describes "what is known so far".

The frontier never carries the conversation: it holds the seq of the last resume point (the
handle into the run's history) and the calls of the turn in progress, so its size and the cost
of folding one event do not grow with the run's length.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

import msgspec

from onward.eventlog.base import StoredEvent, judge
from onward.eventlog.events import (
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    Event,
    ModelAnswered,
    ResumePlanned,
    RunClaimed,
    RunContinued,
    RunFinished,
    RunStarted,
    Tagged,
    ToolCompleted,
    ToolDispatched,
    ToolError,
    ToolResolved,
    TurnSettled,
)

FRONTIER_FORMAT = 1
"""Version of the frontier payload; a store refuses payloads it does not know."""

RunStatus = Literal["new", "running", "waiting", "completed", "failed", "cancelled", "continued"]
Boundary = Literal["after_model_call", "after_tool_result", "before_approval"]
CallOutcome = Literal["completed", "error", "never_ran"]


class CallState(msgspec.Struct, frozen=True, kw_only=True):
    """What the log says about one call of the turn in progress."""

    call_id: str
    tool: str
    idempotency_key: str = ""
    args: dict[str, Any] = {}
    requested_seq: int = 0
    dispatched_seq: int | None = None
    dispatched_fence: int | None = None
    dispatched_at: int | None = None
    outcome: CallOutcome | None = None
    outcome_seq: int | None = None
    completed_at: int | None = None
    result: Any = None
    error: ToolError | None = None
    resolved_by: str | None = None


class Frontier(msgspec.Struct, frozen=True, kw_only=True):
    """Everything resume needs about a run, as of ``last_seq`` (and log offset ``through_offset``).

    Attributes:
        resume_seq: The seq of the last boundary event: the run's history through this seq is
            the conversation a resume continues (the history handle is ``(run_id, resume_seq)``).
        calls: The calls of the latest model answer, until its turn settles.
        refused: How many stored events of this run the fold refused (seq or fence rules).
        through_offset: The log offset of the last event folded, counted or refused.
    """

    run_id: str
    tenant: str
    format: int = FRONTIER_FORMAT
    agent: str = ""
    revision: str = ""
    continuation_of: str | None = None
    status: RunStatus = "new"
    holder: str | None = None
    iteration: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    last_seq: int = 0
    fence: int = 0
    last_boundary: Boundary | None = None
    resume_seq: int = 0
    calls: tuple[CallState, ...] = ()
    waiting_on: str | None = None
    approved: tuple[str, ...] = ()
    continued_to: str | None = None
    output: Any = None
    error: str | None = None
    refused: int = 0
    last_refusal: str | None = None
    started_at: int = 0
    updated_at: int = 0
    partition: int = -1
    through_offset: int = -1

    @classmethod
    def empty(cls, run_id: str, tenant: str) -> Frontier:
        """The frontier of a run nothing is known about yet."""
        return cls(run_id=run_id, tenant=tenant)

    def call(self, call_id: str) -> CallState | None:
        """The state of one call of the turn in progress."""
        for state in self.calls:
            if state.call_id == call_id:
                return state
        return None


_replace = msgspec.structs.replace


def fold(frontier: Frontier, stored: StoredEvent) -> Frontier:
    """The frontier after one more stored event of the same run. Pure: nothing is mutated."""
    event = stored.event
    position = stored.position
    verdict = judge(frontier.last_seq, frontier.fence, event)
    if verdict is not None:
        _, detail = verdict
        return _replace(
            frontier,
            refused=frontier.refused + 1,
            last_refusal=f"offset {position.offset} seq {event.seq} fence {event.fence}: {detail}",
            partition=position.partition,
            through_offset=max(frontier.through_offset, position.offset),
        )
    return _replace(
        frontier,
        last_seq=frontier.last_seq + 1,
        fence=event.fence,
        updated_at=max(frontier.updated_at, event.at),
        partition=position.partition,
        through_offset=max(frontier.through_offset, position.offset),
        **_RULES[type(event)](frontier, event),
    )


def fold_all(frontier: Frontier, stored: Iterable[StoredEvent]) -> Frontier:
    """Fold events in order."""
    for item in stored:
        frontier = fold(frontier, item)
    return frontier


def fold_run(
    frontier: Frontier,
    stored: Iterable[StoredEvent],
    calls: dict[tuple[str, str], ToolCallRow],
) -> Frontier:
    """Fold one run's events as a projector does, recording the audit row of every call touched.

    Events at or below the frontier's ``through_offset`` were folded before (an overlap after a
    restart) and are skipped. ``calls`` receives, per (run, call), the row as of the last
    counted event about that call.
    """
    for item in stored:
        if item.position.offset <= frontier.through_offset:
            continue
        seq_before = frontier.last_seq
        frontier = fold(frontier, item)
        call_id = call_id_of(item.event)
        if call_id is not None and frontier.last_seq != seq_before:
            row = tool_call_row(frontier, call_id)
            if row is not None:
                calls[(frontier.run_id, call_id)] = row
    return frontier


Changes = dict[str, Any]
"""The fields a counted event changes; `fold` applies them with the envelope's in one copy."""


def _with_call(frontier: Frontier, call_id: str, tool: str, **changes: Any) -> Changes:
    calls = list(frontier.calls)
    for index, state in enumerate(calls):
        if state.call_id == call_id:
            calls[index] = _replace(state, **changes)
            break
    else:
        calls.append(CallState(call_id=call_id, tool=tool, **changes))
    return {"calls": tuple(calls)}


def _started(f: Frontier, e: RunStarted) -> Changes:
    return {
        "agent": e.agent,
        "revision": e.revision,
        "continuation_of": e.continuation_of,
        "status": "running",
        "started_at": e.at,
    }


def _claimed(f: Frontier, e: RunClaimed) -> Changes:
    return {"holder": e.worker}


def _answered(f: Frontier, e: ModelAnswered) -> Changes:
    calls = tuple(
        CallState(
            call_id=c.call_id,
            tool=c.tool,
            idempotency_key=c.idempotency_key,
            args=c.args,
            requested_seq=e.seq,
        )
        for c in e.tool_calls
    )
    return {
        "iteration": f.iteration + 1,
        "input_tokens": f.input_tokens + e.usage.input_tokens,
        "output_tokens": f.output_tokens + e.usage.output_tokens,
        "calls": calls,
        "last_boundary": "after_model_call",
        "resume_seq": e.seq,
    }


def _dispatched(f: Frontier, e: ToolDispatched) -> Changes:
    # A new dispatch supersedes whatever was settled before (a call settled as never run is
    # dispatched for the first time): from here only its own outcome counts.
    return _with_call(
        f,
        e.call_id,
        e.tool,
        idempotency_key=e.idempotency_key,
        dispatched_seq=e.seq,
        dispatched_fence=e.fence,
        dispatched_at=e.at,
        outcome=None,
        outcome_seq=None,
        completed_at=None,
        result=None,
        error=None,
        resolved_by=None,
    )


def _completed(f: Frontier, e: ToolCompleted) -> Changes:
    state = f.call(e.call_id)
    return _with_call(
        f,
        e.call_id,
        state.tool if state else "",
        outcome="error" if e.error is not None else "completed",
        outcome_seq=e.seq,
        completed_at=e.at,
        result=e.result,
        error=e.error,
    )


def _resolved(f: Frontier, e: ToolResolved) -> Changes:
    state = f.call(e.call_id)
    return _with_call(
        f,
        e.call_id,
        state.tool if state else "",
        outcome=e.outcome if e.error is None else "error",
        outcome_seq=e.seq,
        completed_at=e.at,
        result=e.result,
        error=e.error,
        resolved_by=e.by or "reconcile",
    )


def _settled(f: Frontier, e: TurnSettled) -> Changes:
    return {
        "calls": (),
        "approved": (),
        "last_boundary": "after_tool_result",
        "resume_seq": e.seq,
    }


def _approval_requested(f: Frontier, e: ApprovalRequested) -> Changes:
    return {
        "status": "waiting",
        "waiting_on": e.request_id,
        "last_boundary": "before_approval",
        "resume_seq": e.seq,
    }


def _approval_granted(f: Frontier, e: ApprovalGranted) -> Changes:
    if f.waiting_on != e.request_id:
        return {}
    return {"status": "running", "waiting_on": None, "approved": (*f.approved, e.request_id)}


def _approval_denied(f: Frontier, e: ApprovalDenied) -> Changes:
    if f.waiting_on != e.request_id:
        return {}
    return {"status": "running", "waiting_on": None}


def _continued(f: Frontier, e: RunContinued) -> Changes:
    return {"status": "continued", "continued_to": e.new_run_id}


def _finished(f: Frontier, e: RunFinished) -> Changes:
    return {"status": e.status, "output": e.output, "error": e.error}


def _unchanged(f: Frontier, e: Event) -> Changes:
    return {}


_RULES: dict[type[Event], Callable[[Frontier, Any], Changes]] = {
    RunStarted: _started,
    RunClaimed: _claimed,
    ResumePlanned: _unchanged,
    ModelAnswered: _answered,
    ToolDispatched: _dispatched,
    ToolCompleted: _completed,
    ToolResolved: _resolved,
    TurnSettled: _settled,
    ApprovalRequested: _approval_requested,
    ApprovalGranted: _approval_granted,
    ApprovalDenied: _approval_denied,
    Tagged: _unchanged,
    RunContinued: _continued,
    RunFinished: _finished,
}


class ToolCallRow(msgspec.Struct, frozen=True, kw_only=True):
    """One row of the ``tool_calls`` projection: one call, for audit."""

    tenant: str
    run_id: str
    call_id: str
    tool: str
    idempotency_key: str
    fence: int | None
    dispatched_at: int | None
    completed_at: int | None
    outcome: CallOutcome | None
    latency_us: int | None
    through_offset: int


def tool_call_row(frontier: Frontier, call_id: str) -> ToolCallRow | None:
    """The audit row of one call as the frontier knows it, or ``None`` if it is not in the turn."""
    state = frontier.call(call_id)
    if state is None:
        return None
    latency = None
    if state.dispatched_at is not None and state.completed_at is not None:
        latency = state.completed_at - state.dispatched_at
    return ToolCallRow(
        tenant=frontier.tenant,
        run_id=frontier.run_id,
        call_id=call_id,
        tool=state.tool,
        idempotency_key=state.idempotency_key,
        fence=state.dispatched_fence,
        dispatched_at=state.dispatched_at,
        completed_at=state.completed_at,
        outcome=state.outcome,
        latency_us=latency,
        through_offset=frontier.through_offset,
    )


_CALL_EVENTS = (ToolDispatched, ToolCompleted, ToolResolved)


def call_id_of(event: Event) -> str | None:
    """The call an event is about, for the events that change a call's audit row."""
    if isinstance(event, _CALL_EVENTS):
        return event.call_id
    return None
