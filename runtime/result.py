"""`RunResult`: where a run stands when `AgentRunner.run` or `resume` returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from onward.projections.frontier import Frontier

from .planning import ResumePlan


@dataclass(frozen=True, slots=True)
class RunResult:
    """Where a run stands after `run` or `resume` returns.

    Attributes:
        status: ``completed``, ``failed``, ``cancelled``, ``waiting`` (on a person), or
            ``continued``.
        plan: What resume decided, when this came from a resume that carried on.
        continued_to: The run this one was carried into (status ``continued``). `run` and
            `resume` carry on with it, so they only return such a result when that run
            cannot be carried on by this worker now.
        spend_micros: What the run's model calls cost, as the runner's spend ledger has it
            when the result was made; ``None`` without a ledger, or when the ledger did not
            answer after the run's end was written (logged; the run's end stands).
    """

    run_id: str
    tenant: str
    status: str
    output: Any = None
    error: str | None = None
    iteration: int = 0
    fence: int = 0
    waiting_on: str | None = None
    plan: ResumePlan | None = None
    reconciled: tuple[str, ...] = ()
    continued_to: str | None = None
    spend_micros: int | None = None

    @classmethod
    def of(cls, frontier: Frontier) -> RunResult:
        """The result a frontier describes."""
        return cls(
            run_id=frontier.run_id,
            tenant=frontier.tenant,
            status=frontier.status,
            output=frontier.output,
            error=frontier.error,
            iteration=frontier.iteration,
            fence=frontier.fence,
            waiting_on=frontier.waiting_on,
            continued_to=frontier.continued_to,
        )
