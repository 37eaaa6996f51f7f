"""The attempts of a run's tool calls, as the log records them.

pydantic-ai invokes one call once, and once more if a person approves it after it asked for
approval; each invocation is one attempt. A ``ToolDispatched`` starts an attempt (or, for an
attempt with no outcome yet, dispatches it again: a retry-safe tool after a crash);
``ToolCompleted`` or ``ToolResolved`` ends it. The k-th invocation of a call in a re-executed
run is its k-th attempt in the log. An attempt keeps the idempotency key it was dispatched
with: that is the key a person deciding on it is shown. A dispatch its holder recorded as not
called (`NOT_CALLED`: the lease could not be confirmed after it was written) is no attempt: the
invocation it was for is still to be made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from onward.eventlog import ToolCompleted, ToolDispatched, ToolResolved
from onward.runtime.dispatch import NOT_CALLED

APPROVED_AGAIN = "approved to run again"
"""The ``why`` of the `ToolResolved` (never ran) the journal records for an attempt that may
have run when pydantic-ai runs its call again, approved: the approval's own record."""


@dataclass
class Attempt:
    """One invocation of a call: its dispatches and how it ended.

    Attributes:
        dispatched_fence: The fence of its last ``ToolDispatched``.
        idempotency_key: The key its last ``ToolDispatched`` went out with.
        completed: The tool's recorded outcome.
        resolved: A person's (or a status check's) settlement of an attempt that had none.
        settled: ``resolved`` was made outside any decision the run asked for (``onward
            resolve``): it says how the attempt ended, so it is not asked about again.
    """

    dispatched_fence: int
    idempotency_key: str
    completed: ToolCompleted | None = None
    resolved: ToolResolved | None = None
    settled: bool = False

    @property
    def open(self) -> bool:
        """Dispatched, and nothing recorded about how it ended."""
        return self.completed is None and self.resolved is None


@dataclass
class CallAttempts:
    """Every attempt of every call of one run, by the run's call id."""

    by_call: dict[str, list[Attempt]] = field(default_factory=dict)
    asked: set[str] = field(default_factory=set)
    """The calls whose last attempt a wait of the run handed to a person: their settlements
    are their decisions."""

    def of(self, call_id: str) -> list[Attempt]:
        """The attempts of one call, oldest first."""
        return self.by_call.setdefault(call_id, [])

    def learn(self, event: ToolDispatched | ToolCompleted | ToolResolved) -> None:
        """A dispatch starts an attempt (or dispatches an open one again); an outcome ends it.

        A settlement of a call no wait asked about (``onward resolve``) stands as recorded:
        never ran, the attempt is no attempt (the invocation makes the call afresh, with its
        key); completed, its result is the call's, dispatched or not. One a decision made is
        pydantic-ai's to apply, as the wait's answer.
        """
        attempts = self.of(event.call_id)
        last = attempts[-1] if attempts and attempts[-1].open else None
        if isinstance(event, ToolDispatched):
            if last is None:
                attempts.append(Attempt(event.fence, event.idempotency_key))
                self.asked.discard(event.call_id)  # no wait has asked about this attempt yet
            else:
                last.dispatched_fence = event.fence
                last.idempotency_key = event.idempotency_key
        elif last is not None and isinstance(event, ToolCompleted):
            last.completed = event
        elif isinstance(event, ToolResolved):
            settled = event.call_id not in self.asked and event.why != APPROVED_AGAIN
            if last is None:
                if not attempts and settled and event.outcome == "completed":
                    # Never dispatched, and a person says it took effect (made by hand).
                    attempts.append(Attempt(event.fence, "", resolved=event, settled=True))
                return
            if _not_called(event, last) or (settled and event.outcome == "never_ran"):
                attempts.pop()  # never made: the invocation it was for makes it afresh
            else:
                last.resolved = event
                last.settled = settled


def _not_called(event: ToolResolved, attempt: Attempt) -> bool:
    """Whether ``event`` is the holder that dispatched ``attempt`` saying it did not call it."""
    return (
        event.outcome == "never_ran"
        and event.why == NOT_CALLED
        and event.fence == attempt.dispatched_fence
    )


def undecided(
    run_id: str, call_id: str, tool: str, attempt: Attempt, *, cut_off: bool = False
) -> dict[str, Any]:
    """What pydantic-ai's approval request carries about a call nobody can decide
    (``cut_off``: pydantic-ai cut the tool off at its ``timeout`` before it returned)."""
    settled = attempt.resolved
    stopped = (
        "pydantic-ai cut it off at its timeout before it returned"
        if cut_off
        else "the run stopped before its outcome was recorded"
    )
    return {
        "onward": {
            "run_id": run_id,
            "call_id": call_id,
            "tool": tool,
            "idempotency_key": attempt.idempotency_key,
            "dispatched_fence": attempt.dispatched_fence,
            "reason": (
                f"{tool} was dispatched under fence {attempt.dispatched_fence} and "
                f"{stopped}: it may or may not have taken effect. "
                "Approve only if it did not (it runs again, with the same idempotency key); "
                "deny with a message saying what happened otherwise"
            ),
            "settled": (
                None
                if settled is None
                else {"outcome": settled.outcome, "by": settled.by, "why": settled.why}
            ),
        }
    }
