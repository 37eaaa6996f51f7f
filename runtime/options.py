"""`Options`: what an application asks of one run, and what of it the run's log records.

The options that outlive the process are recorded in the run's `RunStarted` (`Options.recorded`),
so every worker that later carries the run on reads them from the log (the fold keeps them on
the frontier): the person the run is for, the execution mode, which boundaries are checkpoints
and every how many steps, and the run's bound on model calls.

Execution modes: ``autonomous`` runs go on by themselves and only stop for a tool that needs a
person; ``collaborative`` runs also wait at every checkpoint their policy picks, until someone
answers (`onward.runtime.application.messages.RunMessage.respond`). An answer at a checkpoint
after a model call reaches that turn's tool calls (as their ``approval`` value); one after a
settled turn reaches the model, as a user message before its next call.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from onward.errors import InvalidInputError
from onward.projections.frontier import BOUNDARIES, Boundary, Frontier, counts_at
from onward.projections.transcript import checkpoint_of, checkpoint_request

from .agent import Agent
from .checkpoint import MAX_CHECKPOINT_FREQUENCY, CheckpointPolicy, check_frequency
from .limits import MAX_NAME_LENGTH, check_optional_name


class ExecutionMode(StrEnum):
    """Whether a run waits for a person at its checkpoints."""

    AUTONOMOUS = "autonomous"
    COLLABORATIVE = "collaborative"


class Options(BaseModel):
    """What an application asks of one run (`onward.query`).

    Attributes:
        run_id: The run's id; a fresh one when not given. Use your own to find it again.
        tenant: The tenant that owns the run.
        user: The person the run is for: `ExecutionManager.list_pending(user=...)` finds it.
        agent: The agent's name; may be left out when the application has exactly one.
        checkpoints: Which boundaries are checkpoints (streamed as checkpoint messages; the
            ones a collaborative run waits at).
        checkpoint_frequency: A checkpoint every N steps (a step: one model call and the tool
            calls it asked for): only the chosen boundaries of steps N, 2N, ... are streamed
            as checkpoints and, collaborative, waited at; ``before_approval`` in every step
            (`CheckpointPolicy`). The same as ``checkpoints``' own ``checkpoint_frequency``
            (give one, or both the same). Recorded in `RunStarted`, so a worker that resumes
            the run keeps to it. A whole number of at least 1, else `InvalidInputError`.
        max_iterations: Most model calls of this run; the agent's own bound when not given.
            The agent's ``max_iterations`` is a ceiling: a run's bound is the lower of the two
            (`recorded_options`), so whoever starts a run can lower it, never raise it. An
            agent that lets its callers choose up to N opts in by setting its own
            ``max_iterations`` to N.
        mode: ``autonomous`` or ``collaborative``.
        budget_micros: Most this run may spend on model calls, in micros; the lower of this
            and the agent's ``budget_micros`` holds (`onward.runtime.spend.budget`).
        tenant_budget_micros: Most the run's tenant may have spent, all its runs together,
            before this run makes another model call; the lower of this and the agent's holds.

    The names (``run_id``, ``tenant``, ``user``, ``agent``) are at most 200 characters and hold
    no control character (`onward.runtime.limits`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_LENGTH)
    tenant: str = Field(default="default", min_length=1, max_length=MAX_NAME_LENGTH)
    user: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_LENGTH)
    agent: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_LENGTH)
    checkpoints: CheckpointPolicy = CheckpointPolicy()
    checkpoint_frequency: StrictInt | None = Field(default=None, ge=1, le=MAX_CHECKPOINT_FREQUENCY)
    max_iterations: int | None = Field(default=None, ge=1, le=100_000)
    mode: ExecutionMode = ExecutionMode.AUTONOMOUS
    budget_micros: int | None = Field(default=None, ge=0)
    tenant_budget_micros: int | None = Field(default=None, ge=0)

    def __init__(self, **fields: Any) -> None:
        """Options from their fields.

        Raises:
            InvalidInputError: A field has a value it cannot take (the field is named).
        """
        try:
            super().__init__(**fields)
        except ValidationError as exc:
            raise _invalid(exc) from exc

    @field_validator("checkpoints", mode="before")
    @classmethod
    def _whole_frequency(cls, value: Any) -> Any:
        """A policy given as a mapping takes only a whole number of steps (2.0 is refused, as
        it is from Python), before pydantic would turn it into one."""
        if isinstance(value, Mapping) and "checkpoint_frequency" in value:
            check_frequency(value["checkpoint_frequency"])
        return value

    @model_validator(mode="after")
    def _one_frequency(self) -> Options:
        policy = self.checkpoints.checkpoint_frequency
        given = self.checkpoint_frequency
        if given is not None and policy not in (1, given):
            raise ValueError(
                f"checkpoint_frequency={given} and checkpoints.checkpoint_frequency={policy} "
                "disagree; give one of them"
            )
        return self

    @property
    def every(self) -> int:
        """Every how many steps the run's checkpoints come."""
        return self.checkpoint_frequency or self.checkpoints.checkpoint_frequency

    @field_validator("run_id", "tenant", "user", "agent")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        """No control character in a name: PostgreSQL refuses NUL, and names are printed."""
        try:
            return check_optional_name("the name", value)
        except InvalidInputError as exc:
            raise ValueError(str(exc).removeprefix("the name ")) from None

    @classmethod
    def of(cls, value: Options | Mapping[str, Any] | None) -> Options:
        """Options from an instance, a mapping of its fields, or nothing (the defaults).

        Raises:
            InvalidInputError: A field has a value it cannot take (the field is named).
        """
        if isinstance(value, Options):
            return value
        if value is not None and not isinstance(value, Mapping):
            raise InvalidInputError(
                f"options must be a mapping of option names to values (or Options), got "
                f"{type(value).__name__}"
            )
        try:
            return cls.model_validate(dict(value or {}))
        except ValidationError as exc:
            raise _invalid(exc) from exc

    def new_run_id(self) -> str:
        """The run id: the one given, or a fresh one."""
        return self.run_id or f"run-{uuid.uuid4().hex}"

    def recorded(self) -> dict[str, Any]:
        """What of these options the run's `RunStarted` records (read back by the fold)."""
        recorded: dict[str, Any] = {
            "mode": self.mode.value,
            "checkpoints": [b for b in BOUNDARIES if getattr(self.checkpoints, b)],
        }
        for budget in ("budget_micros", "tenant_budget_micros"):
            if getattr(self, budget) is not None:
                recorded[budget] = getattr(self, budget)
        if self.user is not None:
            recorded["user"] = self.user
        if self.max_iterations is not None:
            recorded["max_iterations"] = self.max_iterations
        if self.every > 1:
            recorded["checkpoint_frequency"] = self.every
        return recorded


DEFAULT_TENANT: str = Options.model_fields["tenant"].default
"""The tenant of runs whose options name none, and of an app given none."""


def _invalid(exc: ValidationError) -> InvalidInputError:
    """The one error of options that cannot be taken, naming each field at fault."""
    # Field names cut short: a request's options may come from anyone on the topic.
    problems = "; ".join(
        f"{'.'.join(str(p)[:40] for p in e['loc'])}: {str(e['msg']).removeprefix('Value error, ')}"
        for e in exc.errors()[:5]
    )
    return InvalidInputError(f"invalid options: {problems}")


def recorded_options(options: Mapping[str, Any] | None, agent: Agent) -> dict[str, Any]:
    """A run's options as its `RunStarted` records them: given ones name the bound on model
    calls in force, so a reader of the log knows it. That bound is the lower of the options'
    and the agent's own: the agent's ``max_iterations`` is a ceiling no caller raises (an
    agent opts in to higher bounds by raising its own)."""
    if not options:
        return {}
    asked = options.get("max_iterations")
    limit = agent.max_iterations
    if isinstance(asked, int) and not isinstance(asked, bool) and asked >= 1:
        limit = min(asked, limit)
    return {**options, "max_iterations": limit}


def checked_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Options in the form a `StartRun` request carries them (`Options.recorded`: the
    checkpoints as a list of boundaries), validated through `Options` and given back in that
    form; empty stays empty.

    Raises:
        InvalidInputError: A field `Options` does not take, or a value it refuses (named).
    """
    if not options:
        return {}
    fields = dict(options)
    checkpoints = fields.get("checkpoints")
    if isinstance(checkpoints, list):
        unknown = [b for b in checkpoints if b not in BOUNDARIES]
        if unknown:
            raise InvalidInputError(
                f"invalid options: checkpoints: {len(unknown)} of them name no boundary "
                f"(each is one of {', '.join(BOUNDARIES)})"
            )
        fields["checkpoints"] = {b: b in checkpoints for b in BOUNDARIES}
    return Options.of(fields).recorded()


def approval_value(frontier: Frontier, call_id: str) -> Any:
    """The value a call of the turn in progress was approved with: its own approval's, else
    that of the turn's checkpoint after its model call (a collaborative pause); ``None``."""
    for grant in reversed(frontier.grants):
        if grant.request_id == call_id:
            return grant.value
    for grant in reversed(frontier.grants):
        paused = checkpoint_of(grant.request_id)
        if paused is not None and paused[0] == "after_model_call":
            return grant.value
    return None


def pause_request(frontier: Frontier, boundary: Boundary) -> dict[str, Any] | None:
    """The `ApprovalRequested` fields a collaborative run waits on right after ``boundary``,
    or ``None`` when it goes on.

    It waits when it pauses at that boundary and its last boundary is that one: once answered,
    its last boundary is the request (``before_approval``), so it waits once per checkpoint,
    also when a crash came between the boundary and the request. After a model call, only
    until the turn's first dispatch.
    """
    if boundary not in frontier.pause_at or frontier.last_boundary != boundary:
        return None
    if not counts_at(boundary, frontier.iteration, frontier.checkpoint_frequency):
        return None
    if any(call.dispatched_seq is not None for call in frontier.calls):
        return None
    seq = frontier.resume_seq
    return {
        "request_id": checkpoint_request(boundary, seq),
        "prompt": f"checkpoint {boundary} at seq {seq}: go on?",
        "details": {"checkpoint": boundary, "seq": seq},
    }


__all__ = [
    "ExecutionMode",
    "Options",
    "approval_value",
    "checked_options",
    "pause_request",
    "recorded_options",
]
