"""Deciding, for every call outstanding when a run stopped, whether it ran.

`plan_resume` decides and does not act. It reads the run's frontier, folded through the new
holder's claim, and sorts each call of the turn in progress:

=============== ========================================================= ====================
disposition     what the log says                                          resume
=============== ========================================================= ====================
completed       an outcome is recorded (tool result, typed error, or a      replays it
                person's or the tool's own settlement)
never_ran       no dispatch was recorded, or it was settled as not run, or  dispatches it
                its code stopped at a question (`ask`) since its dispatch   again
indeterminate   dispatched under an earlier fence, no outcome               nothing; unsafe
=============== ========================================================= ====================

A ``retry_safe`` tool's indeterminate calls are dispatched again. A dispatched call without an
idempotency key is indeterminate whatever its tool: without a key nothing guarantees a second
call is harmless. `refuse_if_undecidable` turns an unsafe plan into
`IndeterminateToolCallError`, which is never retryable: the answer comes from the tool's own
status check or from a person (`onward resolve`), never from asking again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from onward.errors import IndeterminateToolCallError
from onward.projections.frontier import CallState, Frontier

from .agent import Agent


class ToolDisposition(Enum):
    """What resume does with one outstanding call."""

    COMPLETED = "completed"
    NEVER_RAN = "never_ran"
    INDETERMINATE = "indeterminate"


@dataclass(frozen=True, slots=True)
class PlannedCall:
    """One call and what resume decided for it, with the reason in words."""

    call: CallState
    disposition: ToolDisposition
    reason: str
    dispatch_again: bool = False


@dataclass(frozen=True, slots=True)
class ResumePlan:
    """What resume will do for each call of the turn in progress.

    Attributes:
        completed: Calls whose recorded outcome is replayed.
        to_dispatch: Calls dispatched now: never ran, or indeterminate but retry-safe.
        indeterminate: Calls nobody can decide; while any remain the plan is not safe.
    """

    run_id: str
    calls: tuple[PlannedCall, ...]

    @property
    def completed(self) -> list[CallState]:
        return [p.call for p in self.calls if p.disposition is ToolDisposition.COMPLETED]

    @property
    def to_dispatch(self) -> list[CallState]:
        return [
            p.call
            for p in self.calls
            if p.disposition is ToolDisposition.NEVER_RAN or p.dispatch_again
        ]

    @property
    def indeterminate(self) -> list[CallState]:
        return [
            p.call
            for p in self.calls
            if p.disposition is ToolDisposition.INDETERMINATE and not p.dispatch_again
        ]

    @property
    def safe(self) -> bool:
        """Whether resume can carry on without guessing."""
        return not self.indeterminate

    def recorded(self) -> dict[str, Any]:
        """The fields of the ``ResumePlanned`` event that records this plan in the log."""
        return {
            "replayed": outstanding_ids(self.completed),
            "dispatched": outstanding_ids(self.to_dispatch),
            "undecided": outstanding_ids(self.indeterminate),
            "reason": "; ".join(self.describe()),
        }

    def describe(self) -> list[str]:
        """One line per call, for people and for the `ResumePlanned` event."""
        return [
            f"{p.call.call_id} ({p.call.tool}): {p.disposition.value}"
            f"{', dispatched again' if p.dispatch_again else ''}: {p.reason}"
            for p in self.calls
        ]


def plan_resume(frontier: Frontier, agent: Agent) -> ResumePlan:
    """Sort every call of the turn in progress by what the log says about it.

    Every dispatch the frontier records without an outcome was made by a holder that is gone
    (the caller holds the run now), so it is a question, not work in progress.

    Args:
        frontier: The run folded through the resuming worker's claim.
        agent: The agent resuming it, for its tools' ``retry_safe`` flags.
    """
    return ResumePlan(frontier.run_id, tuple(_classify(call, agent) for call in frontier.calls))


def _classify(call: CallState, agent: Agent) -> PlannedCall:
    """Retry-safe only if nothing says otherwise: the agent's tool of that name, and what its
    dispatch recorded (`CallState.retry_safe`). A tool called by a name only its run context
    gives (a pydantic-ai tool its ``prepare`` renames) is not found by that name, and the
    recorded word alone decides; one the agent now marks unsafe is never dispatched again on
    an older dispatch's word."""
    tool = agent.tool(call.tool)
    if tool is None:
        return classify_call(call, retry_safe=call.retry_safe is True)
    return classify_call(call, retry_safe=tool.retry_safe and call.retry_safe is not False)


def classify_call(call: CallState, *, retry_safe: bool = False) -> PlannedCall:
    """What resume does with one call, by what the log says about it (see the module's table).

    Args:
        call: The call as folded through the resuming holder's claim.
        retry_safe: Calling its tool twice is harmless, so an undecided call is dispatched
            again (a call dispatched without an idempotency key never is).
    """
    if call.outcome in ("completed", "error"):
        how = f"settled by {call.resolved_by}" if call.resolved_by else "outcome recorded"
        return PlannedCall(call, ToolDisposition.COMPLETED, how)
    if call.outcome == "never_ran":
        return PlannedCall(
            call, ToolDisposition.NEVER_RAN, f"settled as not run by {call.resolved_by}"
        )
    if call.dispatched_seq is None:
        return PlannedCall(call, ToolDisposition.NEVER_RAN, "no dispatch recorded")
    if call.asked_seq is not None:
        # Its code stopped at `ask` and did nothing after: it runs again from its start and
        # gets the recorded answers where it asked.
        return PlannedCall(
            call,
            ToolDisposition.NEVER_RAN,
            f"its code stopped at the question at seq {call.asked_seq}; it runs again with "
            "the answers",
        )
    if not call.idempotency_key:
        return PlannedCall(
            call,
            ToolDisposition.INDETERMINATE,
            "dispatched without an idempotency key, no outcome recorded",
        )
    return PlannedCall(
        call,
        ToolDisposition.INDETERMINATE,
        f"dispatched under fence {call.dispatched_fence}, no outcome recorded"
        + ("; the tool is retry-safe" if retry_safe else ""),
        dispatch_again=retry_safe,
    )


def refuse_if_undecidable(plan: ResumePlan) -> None:
    """Raise `IndeterminateToolCallError` naming every undecided call, if there is one."""
    undecided = plan.indeterminate
    if not undecided:
        return
    names = ", ".join(
        f"{c.call_id} ({c.tool}, key {c.idempotency_key or 'none'})" for c in undecided
    )
    raise IndeterminateToolCallError(
        f"run {plan.run_id!r}: cannot tell whether these calls ran: {names}. Check with the "
        "tool's owner, then settle each with `onward resolve` (completed or never ran); "
        "resuming again will not decide it",
        run_id=plan.run_id,
        calls=tuple(undecided),
    )


def outstanding_ids(calls: Sequence[CallState]) -> list[str]:
    """The call ids of some calls, for events."""
    return [c.call_id for c in calls]
