"""Budgets: a run stops before a model call that would take its spend, or its tenant's, past
what it may spend.

Before each model call the runner estimates the call's cost and holds it in the ledger if what
the run (and its tenant) spent and holds so far, plus that estimate, is within the budget: the
check and the hold are one atomic step (`SpendLedger.hold`), so calls of one tenant made at the
same moment cannot all pass its budget. Over it, the run ends ``failed`` and the runner raises
`BudgetExceededError`; the model is not called. A
failed run stays failed: a person who wants it to go on with more money starts a new run with a
higher budget (a budget is a bound on what is spent without anyone looking, not a question).

The estimate, not a worst case: no provider says how many tokens a prompt holds before it is
sent, and only ``max_tokens`` bounds an answer. Input tokens are the larger of the
conversation's size (its JSON and the tools' schemas, `CHARS_PER_TOKEN` bytes to a token) and
the run's mean input tokens per call so far (a conversation only grows); output tokens are the
agent's ``max_tokens`` (or ``max_completion_tokens``) when its ``model_settings`` set one, a
true bound, else the run's mean output tokens per call so far. So a run can pass its budget by
at most the error of one call's estimate; set ``max_tokens`` to bound the output side.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from onward.errors import BudgetExceededError
from onward.eventlog.events import Message, Usage
from onward.projections.frontier import Frontier
from onward.runtime.tools import Tool, canonical

from .base import PriceTable, Spend


class Agent(Protocol):
    """What a budget reads of an agent (`onward.runtime.agent.Agent`, which the settings it
    declares toolsets with depend on, so this module cannot import it)."""

    @property
    def budget_micros(self) -> int | None: ...

    @property
    def tenant_budget_micros(self) -> int | None: ...

    @property
    def model_settings(self) -> Mapping[str, Any]: ...

    @property
    def tools(self) -> Sequence[Tool]: ...


CHARS_PER_TOKEN = 4
"""Bytes of a conversation's JSON taken for one input token in a call's estimate: about what
English text comes to in the common tokenizers, so rather more tokens than fewer for JSON."""

_OUTPUT_BOUNDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def _lower(*bounds: int | None) -> int | None:
    given = [b for b in bounds if b is not None]
    return min(given) if given else None


@dataclass(frozen=True, slots=True)
class Budgets:
    """What a run may spend, in micros: the run alone, and its tenant's runs together.

    Each is the lower of the agent's and the run's options' (``Options.budget_micros``,
    ``Options.tenant_budget_micros``, recorded in its `RunStarted`): the agent's is a ceiling
    whoever starts a run can lower, never raise. ``None``: no bound.
    """

    run_micros: int | None = None
    tenant_micros: int | None = None

    @classmethod
    def of(cls, agent: Agent, run_micros: int | None, tenant_micros: int | None) -> Budgets:
        """The budgets in force for a run of ``agent`` whose options name these (``None``:
        they name none)."""
        return cls(
            run_micros=_lower(agent.budget_micros, run_micros),
            tenant_micros=_lower(agent.tenant_budget_micros, tenant_micros),
        )

    @classmethod
    def of_run(cls, agent: Agent, frontier: Frontier) -> Budgets:
        """The budgets in force for a run of ``agent``, its options' as its frontier has them."""
        return cls.of(agent, frontier.budget_micros, frontier.tenant_budget_micros)

    @property
    def bounded(self) -> bool:
        """Whether any budget is set."""
        return self.run_micros is not None or self.tenant_micros is not None


def output_bound(agent: Agent) -> int | None:
    """The most output tokens the agent's ``model_settings`` allow one answer, if they say."""
    for name in _OUTPUT_BOUNDS:
        value = agent.model_settings.get(name)
        if type(value) is int and value >= 0:
            return value
    return None


def estimate_usage(agent: Agent, messages: Sequence[Message], spent: Spend) -> Usage:
    """The tokens the next model call of a run is expected to take (see the module's text)."""
    size = len(msgspec.json.encode(list(messages)))
    if agent.tools:
        size += len(canonical([tool.fingerprint() for tool in agent.tools]))
    input_tokens = math.ceil(size / CHARS_PER_TOKEN)
    output_tokens = output_bound(agent)
    if spent.calls:
        input_tokens = max(input_tokens, math.ceil(spent.input_tokens / spent.calls))
        if output_tokens is None:
            output_tokens = math.ceil(spent.output_tokens / spent.calls)
    return Usage(input_tokens=input_tokens, output_tokens=output_tokens or 0)


def over_budget(
    budgets: Budgets,
    *,
    run_id: str,
    tenant: str,
    model: str,
    estimate: Usage,
    prices: PriceTable,
    run_spent: Spend,
    tenant_spent: Spend,
) -> BudgetExceededError | None:
    """The error a run stops with if its next call, as estimated, would pass a budget; else
    ``None``. The run's budget is looked at first."""
    cost = prices.cost(model, estimate)
    checks = (
        ("run", budgets.run_micros, run_spent.micros),
        ("tenant", budgets.tenant_micros, tenant_spent.micros),
    )
    for scope, budget, spent in checks:
        if budget is None or spent + cost <= budget:
            continue
        whose = f"run {run_id!r}" if scope == "run" else f"tenant {tenant!r}"
        return BudgetExceededError(
            f"{whose} has spent or holds {spent} of its budget of {budget} micros, and the "
            f"next model call is estimated at {cost} micros ({estimate.input_tokens} in, "
            f"{estimate.output_tokens} out of {model}); the model was not called",
            run_id=run_id,
            scope=scope,
            budget_micros=budget,
            spent_micros=spent,
            estimate_micros=cost,
        )
    return None


__all__ = [
    "CHARS_PER_TOKEN",
    "Budgets",
    "estimate_usage",
    "output_bound",
    "over_budget",
]
