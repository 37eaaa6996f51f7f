"""One frontier per run, and the one fold every reader uses to compute it.

The projector, resume, audit replay and rebuilds all call :func:`fold`, so they cannot disagree
about a run. The fold applies the seq and fence rules of :func:`onward.eventlog.base.judge`:
a refused event is counted on the frontier and otherwise changes nothing. Folding any prefix of
a run's events gives a valid frontier, because every field describes "what is known so far".

The frontier never carries the conversation: the fold hands each message a counted event adds
to it to the transcript (:mod:`onward.projections.transcript`), and the frontier only counts
them (``messages``, through ``last_seq``: the transcript handle), besides the seq of the last
resume point and the calls of the turn in progress. So its size and the cost of folding one
event do not grow with the run's length.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from sys import intern
from typing import Any, Literal, TypeGuard

import msgspec

from onward.eventlog.base import StoredEvent, judge
from onward.eventlog.events import (
    NOT_CALLED,
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    Event,
    Grant,
    GraphCheckpointed,
    GraphCheckpointsRemoved,
    GraphThreadDeleted,
    GraphWritesSaved,
    HistoryHandle,
    ModelAnswered,
    ResumePlanned,
    RunClaimed,
    RunContinued,
    RunFinished,
    RunStarted,
    Tagged,
    ToolCall,
    ToolCompleted,
    ToolDispatched,
    ToolError,
    ToolResolved,
    TurnSettled,
)

from .transcript import TranscriptRow, speaks, stored_message_of

FRONTIER_FORMAT = 1
"""Version of the frontier payload; a store refuses payloads it does not know."""

RunStatus = Literal["new", "running", "waiting", "completed", "failed", "cancelled", "continued"]
TERMINAL_STATUSES: frozenset[RunStatus] = frozenset(
    {"completed", "failed", "cancelled", "continued"}
)
"""The statuses a run never leaves: nothing more is written to it."""
Boundary = Literal["after_model_call", "after_tool_result", "before_approval"]
CallOutcome = Literal["completed", "error", "never_ran"]

BOUNDARIES: tuple[Boundary, ...] = ("after_model_call", "after_tool_result", "before_approval")


def run_budgets(options: dict[str, Any]) -> tuple[int | None, int | None]:
    """The run's own and its tenant's budget (micros) a run's ``RunStarted.options`` name,
    read as leniently as `run_options`."""
    budgets = (options.get("budget_micros"), options.get("tenant_budget_micros"))
    run, tenant = (b if type(b) is int and b >= 0 else None for b in budgets)
    return run, tenant


def run_options(options: dict[str, Any]) -> tuple[str | None, tuple[Boundary, ...], int | None]:
    """The user, pauses and iteration bound a run's ``RunStarted.options`` name.

    Options are read leniently (a value of the wrong type counts as absent), so a record
    another writer filled in oddly never stops a fold.
    """
    user = options.get("user")
    checkpoints = options.get("checkpoints")
    pause_at: tuple[Boundary, ...] = ()
    if options.get("mode") == "collaborative" and isinstance(checkpoints, list):
        pause_at = tuple(b for b in BOUNDARIES if b in checkpoints)
    limit = options.get("max_iterations")
    return (
        user if isinstance(user, str) else None,
        pause_at,
        limit if type(limit) is int and limit >= 1 else None,
    )


def named_checkpoints(options: dict[str, Any]) -> tuple[Boundary, ...] | None:
    """The boundaries a run's ``RunStarted.options`` name as its checkpoints (the ones its
    stream shows, whatever its mode); ``None`` when they name none (every boundary is one)."""
    named = options.get("checkpoints")
    return tuple(b for b in BOUNDARIES if b in named) if isinstance(named, list) else None


def checkpoint_frequency(options: dict[str, Any]) -> int:
    """Every how many steps a run's checkpoints come (``options["checkpoint_frequency"]``; 1,
    every step, when absent or not a whole number of at least 1: read leniently, as
    `run_options` reads)."""
    every = options.get("checkpoint_frequency")
    return every if type(every) is int and every >= 1 else 1


def counts_at(boundary: Boundary, step: int, every: int) -> bool:
    """Whether a boundary of step ``step`` (the model call it follows or settles, counted from
    the run's first, across a chain of continued runs) is a checkpoint when checkpoints come
    every ``every`` steps: ``after_model_call`` and ``after_tool_result`` only in steps
    ``every``, ``2 * every``, ...; ``before_approval`` in every step, since the run then waits
    on a person, who must find it wherever it stopped. Decided by the run's own events, so the
    worker that resumes a run picks the same checkpoints as the one that started it."""
    return boundary == "before_approval" or every <= 1 or step % every == 0


class CallState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What the log says about one call of the turn in progress."""

    call_id: str
    tool: str
    idempotency_key: str = ""
    args: dict[str, Any] = {}
    requested_seq: int = 0
    dispatched_seq: int | None = None
    dispatched_fence: int | None = None
    dispatched_at: int | None = None
    deadline: int | None = None
    outcome: CallOutcome | None = None
    outcome_seq: int | None = None
    completed_at: int | None = None
    result: Any = None
    error: ToolError | None = None
    resolved_by: str | None = None
    asked_seq: int | None = None
    """The seq of the question (`ApprovalRequested.asked`) its code stopped at, since its
    latest dispatch: it did nothing after it, so it runs again once the run goes on."""
    retry_safe: bool | None = None
    """Whether its latest dispatch said its tool is retry-safe (`ToolDispatched.retry_safe`);
    ``None``: it did not say."""


class RunTag(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A label a person or an application put on one event of the run (``Tagged``)."""

    seq: int
    label: str
    tagged_seq: int


class Frontier(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Everything resume needs about a run, as of ``last_seq`` (and log offset ``through_offset``).

    Attributes:
        resume_seq: The seq of the last boundary event, the run's last resume point.
        calls: The calls of the latest model answer, until its turn settles.
        refused: How many stored events of this run the fold refused (seq or fence rules).
        through_offset: The log offset of the last event folded, counted or refused.
        first_offset: The log offset of the run's first counted event (``RunStarted``), so a
            reader that needs the whole run starts there rather than at the partition's start.
        tags: Every label put on the run's events, in the order they were written; tagged
            events survive compaction.
        messages: How many messages the run's counted events through ``last_seq`` added to
            its conversation: the transcript holds that many rows of the run through
            ``last_seq`` (the handle is ``(run_id, last_seq)``; see
            :mod:`onward.projections.transcript`).
        grants: Who approved each call of ``approved``, and with what value.
        history: For a run carried on from others (``continuation_of``): the transcripts its
            conversation starts from, oldest run first, before its own.
        user_id: The person the run was started for (``RunStarted.options["user"]``).
        pause_at: The boundaries at which a collaborative run waits for a person's answer
            before going on (``options["mode"] == "collaborative"``: the run's
            ``options["checkpoints"]``); empty for an autonomous run.
        max_iterations: The run's own bound on model calls (``options["max_iterations"]``);
            ``None``: the agent's.
        checkpoint_frequency: Every how many steps the run's checkpoints come
            (``options["checkpoint_frequency"]``, `counts_at`): where a collaborative run
            pauses, and which checkpoint messages its stream shows.
        checkpoints: The boundaries the run's options named as its checkpoints
            (``options["checkpoints"]``, `named_checkpoints`), paused at or not: the ones its
            stream shows, so a run carried on from it names them too. ``None`` when they named
            none (every boundary), or for a row stored before this field.
        tools_done: Tool calls with an outcome so far (`done_by`), across the chain as
            ``iteration`` counts model calls: what the run's messages say, carried into the
            run it goes on as. ``None`` for a row stored before this field.
        replays: The run is executed again from its first event whenever it goes on
            (``options["replays"]``, as pydantic-ai runs are), so compaction keeps all of its
            events rather than only its resume points.
        budget_micros: The run's own budget for model calls, in micros
            (``options["budget_micros"]``); ``None``: the agent's.
        tenant_budget_micros: The budget of the run's tenant it was started under
            (``options["tenant_budget_micros"]``); ``None``: the agent's.
        attempts: The claims (`RunClaimed`) counted since the run last made progress (a model
            answer, a tool outcome but a call settled as never run only to be made again
            (`made_again`), a settled turn or an approval): how often a worker took it
            up and got nowhere. A worker's recovery bounds its attempts by it without reading
            the run again. A row stored before this field counts from its own offset on.
        answer_schema: The JSON Schema (as JSON text) the answer to the question the run
            waits on must fit, when a tool's code asked it with one
            (`ApprovalRequested.asked`); ``None`` otherwise.
        output: The output the run ended with, as the log holds it (`RunFinished.output`):
            a claim-check reference when it was moved out of line, wrapped when it only
            looked like one (:mod:`onward.eventlog.references`); readers take it through
            `onward.runtime.blobs.output_of`.
        finished_seq: The seq of the run's `RunFinished`, the event ``output`` came with
            (events may follow it: a tag); 0 until the run ends, or for a row stored before
            this field.
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
    first_offset: int = -1
    tags: tuple[RunTag, ...] = ()
    messages: int = 0
    grants: tuple[Grant, ...] = ()
    history: tuple[HistoryHandle, ...] = ()
    user_id: str | None = None
    pause_at: tuple[Boundary, ...] = ()
    max_iterations: int | None = None
    budget_micros: int | None = None
    tenant_budget_micros: int | None = None
    replays: bool = False
    attempts: int = 0
    answer_schema: str | None = None
    checkpoint_frequency: int = 1
    checkpoints: tuple[Boundary, ...] | None = None
    tools_done: int | None = None
    finished_seq: int = 0

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

    @property
    def finished(self) -> bool:
        """The run ended (or was carried into another run): nothing more is written to it."""
        return self.status in TERMINAL_STATUSES

    @property
    def settled(self) -> bool:
        """Nothing to carry on: the run finished, or it waits on a person not yet answered."""
        return self.finished or (self.status == "waiting" and self.waiting_on is not None)


_replace = msgspec.structs.replace


class FrontierDraft(msgspec.Struct, kw_only=True, gc=False):
    """A run's frontier while events are folded into it: mutable, and private to one folder.

    Folding edits a draft in place and :meth:`frozen` builds the immutable `Frontier` once at
    the end: copying all of a frontier's fields for every event cost more than the rules did.
    The fields are a `Frontier`'s, except ``calls``, which is keyed by call id while folding.
    Not tracked by the garbage collector: a projector holds thousands, and they hold no cycles.
    """

    run_id: str
    tenant: str
    format: int
    agent: str
    revision: str
    continuation_of: str | None
    status: RunStatus
    holder: str | None
    iteration: int
    input_tokens: int
    output_tokens: int
    last_seq: int
    fence: int
    last_boundary: Boundary | None
    resume_seq: int
    waiting_on: str | None
    approved: tuple[str, ...]
    continued_to: str | None
    output: Any
    error: str | None
    refused: int
    last_refusal: str | None
    started_at: int
    updated_at: int
    partition: int
    through_offset: int
    first_offset: int
    tags: tuple[RunTag, ...]
    messages: int
    grants: tuple[Grant, ...]
    history: tuple[HistoryHandle, ...]
    user_id: str | None
    pause_at: tuple[Boundary, ...]
    max_iterations: int | None
    budget_micros: int | None
    tenant_budget_micros: int | None
    replays: bool
    attempts: int
    answer_schema: str | None
    checkpoint_frequency: int
    checkpoints: tuple[Boundary, ...] | None
    tools_done: int | None
    finished_seq: int
    calls: dict[str, CallState]

    @classmethod
    def of(cls, frontier: Frontier) -> FrontierDraft:
        """A draft to fold on from ``frontier``; the names thousands of runs share (tenant,
        agent, revision, worker) are interned, so a projector keeps each once."""
        state = msgspec.structs.asdict(frontier)
        state["calls"] = {call.call_id: call for call in frontier.calls}
        for name in _SHARED_NAMES:
            value = state[name]
            if type(value) is str:
                state[name] = intern(value)
        return cls(**state)

    def frozen(self) -> Frontier:
        """The frontier as folded so far."""
        state = msgspec.structs.asdict(self)
        state["calls"] = tuple(self.calls.values())
        return Frontier(**state)


_SHARED_NAMES = ("tenant", "agent", "revision", "holder")
"""A draft's fields whose values many runs share."""


def fold(frontier: Frontier, stored: StoredEvent) -> Frontier:
    """The frontier after one more stored event of the same run. Pure: nothing is mutated."""
    return fold_all(frontier, (stored,))


def fold_all(frontier: Frontier, stored: Iterable[StoredEvent]) -> Frontier:
    """Fold events in order. Pure: ``frontier`` is not mutated; a new one is returned."""
    draft = FrontierDraft.of(frontier)
    _fold_events(draft, stored, None)
    return draft.frozen()


def fold_run(
    frontier: Frontier,
    stored: Iterable[StoredEvent],
    calls: dict[tuple[str, str], ToolCallRow],
) -> Frontier:
    """Fold one run's events as a projector does, recording the audit row of every call touched.

    See :func:`fold_into`; this is its pure form.
    """
    draft = FrontierDraft.of(frontier)
    fold_into(draft, stored, calls)
    return draft.frozen()


def fold_into(
    draft: FrontierDraft,
    stored: Iterable[StoredEvent],
    calls: dict[tuple[str, str], ToolCallRow],
    said: list[TranscriptRow] | None = None,
) -> None:
    """Fold one run's events into its draft, recording the audit row of every call touched.

    Events at or below the draft's ``through_offset`` were folded before (an overlap after a
    restart) and are skipped. ``calls`` receives, per (run, call), the row as of the last
    counted event about that call; ``said``, if given, the transcript row of every message a
    counted event added.
    """
    touched: dict[str, tuple[CallState, int]] = {}
    _fold_events(draft, stored, touched, said)
    for call_id, (state, through_offset) in touched.items():
        calls[(draft.run_id, call_id)] = _call_row(
            draft.tenant, draft.run_id, state, through_offset
        )


def _fold_events(
    draft: FrontierDraft,
    stored: Iterable[StoredEvent],
    touched: dict[str, tuple[CallState, int]] | None,
    said: list[TranscriptRow] | None = None,
) -> None:
    """The one loop every fold runs: the seq and fence rules, then the event's own rule.

    With ``touched`` (the projector's form), events at or below ``through_offset`` are skipped
    as folded before, and each call an event changed is recorded with the offset it changed
    at. Without it every event is judged, so a repeated one is counted as refused.

    The envelope fields no rule reads (seq, fence, times, offsets) live in locals and are
    written back once: per event, this loop is most of what a projector spends.
    """
    last_seq = draft.last_seq
    fence = draft.fence
    updated_at = draft.updated_at
    through = draft.through_offset
    partition = draft.partition
    rules = _RULES
    try:
        for item in stored:
            position = item.position
            offset = position.offset
            if offset > through:
                through = offset
            elif touched is not None:
                continue
            partition = position.partition
            event = item.event
            # The common case first; anything else is decided by the one rule, `judge`.
            if event.seq != last_seq + 1 or event.fence < fence:
                verdict = judge(last_seq, fence, event)
                if verdict is not None:
                    draft.refused += 1
                    draft.last_refusal = (
                        f"offset {offset} seq {event.seq} fence {event.fence}: {verdict[1]}"
                    )
                    continue
            last_seq += 1
            if last_seq == 1:
                draft.first_offset = offset
            fence = event.fence
            if event.at > updated_at:  # noqa: PLR1730 - no call per event
                updated_at = event.at
            call = rules[type(event)](draft, event)
            if call is not None and touched is not None:
                touched[call.call_id] = (call, through)
            if speaks(event):
                draft.messages += 1
                if said is not None:
                    said.append(_said(draft, last_seq, event))
    finally:
        draft.last_seq = last_seq
        draft.fence = fence
        draft.updated_at = updated_at
        draft.through_offset = through
        draft.partition = partition


def _said(d: FrontierDraft, seq: int, event: Event) -> TranscriptRow:
    message = stored_message_of(event)
    assert message is not None
    return TranscriptRow(tenant=d.tenant, run_id=d.run_id, seq=seq, message=message)


def _started(d: FrontierDraft, e: RunStarted) -> None:
    d.agent = intern(e.agent)
    d.revision = intern(e.revision)
    d.continuation_of = e.continuation_of
    d.status = "running"
    d.started_at = e.at
    d.tools_done = 0
    carried = e.carried
    if carried is not None:
        d.history = tuple(carried.history)
        d.iteration = carried.iteration
        d.tools_done = carried.tools_done
        d.input_tokens = carried.usage.input_tokens
        d.output_tokens = carried.usage.output_tokens
        d.calls = _asked(carried.calls, e.seq)
        d.approved = tuple(carried.approved)
        d.grants = tuple(carried.grants)
    if e.options:
        d.budget_micros, d.tenant_budget_micros = run_budgets(e.options)
        d.user_id, d.pause_at, d.max_iterations = run_options(e.options)
        d.replays = e.options.get("replays") is True
        d.checkpoint_frequency = checkpoint_frequency(e.options)
        d.checkpoints = named_checkpoints(e.options)


def _claimed(d: FrontierDraft, e: RunClaimed) -> None:
    d.holder = intern(e.worker)
    d.attempts += 1


def _answered(d: FrontierDraft, e: ModelAnswered) -> None:
    d.attempts = 0
    d.iteration += 1
    d.input_tokens += e.usage.input_tokens
    d.output_tokens += e.usage.output_tokens
    d.calls = _asked(e.tool_calls, e.seq)
    d.last_boundary = "after_model_call"
    d.resume_seq = e.seq


def _asked(calls: Iterable[ToolCall], seq: int) -> dict[str, CallState]:
    """The turn in progress: the calls asked for at ``seq``, none dispatched yet."""
    return {
        c.call_id: CallState(
            call_id=c.call_id,
            tool=c.tool,
            idempotency_key=c.idempotency_key,
            args=c.args,
            requested_seq=seq,
        )
        for c in calls
    }


def call_after(
    before: CallState | None, e: ToolDispatched | ToolCompleted | ToolResolved
) -> CallState:
    """What the log says about a call after one more of its tool events.

    The fold's rule for tool events, public for readers that keep calls of their own (a graph
    thread's fold, whose calls are not bounded by turns).
    """
    if isinstance(e, ToolDispatched):
        # A new dispatch supersedes whatever was settled before (a call settled as never run
        # is dispatched for the first time): from here only its own outcome counts.
        return CallState(
            call_id=e.call_id,
            tool=before.tool if before is not None else e.tool,
            idempotency_key=e.idempotency_key,
            args=before.args if before is not None else {},
            requested_seq=before.requested_seq if before is not None else 0,
            dispatched_seq=e.seq,
            dispatched_fence=e.fence,
            dispatched_at=e.at,
            deadline=e.deadline,
            retry_safe=e.retry_safe,
        )
    state = before if before is not None else CallState(call_id=e.call_id, tool="")
    outcome: CallOutcome
    if isinstance(e, ToolCompleted):
        outcome, resolved_by = ("error" if e.error is not None else "completed"), None
    else:
        # A call settled as never run did not run, whatever error came with the settlement.
        failed = e.error is not None and e.outcome == "completed"
        outcome, resolved_by = ("error" if failed else e.outcome), e.by or "reconcile"
    return _replace(
        state,
        outcome=outcome,
        outcome_seq=e.seq,
        completed_at=e.at,
        result=e.result,
        error=e.error,
        # A completion keeps whoever resolved the call before.
        resolved_by=resolved_by if resolved_by is not None else state.resolved_by,
    )


def done_by(e: Event) -> TypeGuard[ToolCompleted | ToolResolved]:
    """Whether ``e`` gives a call an outcome, as a run's messages count the tool calls done
    (``tools_done``): a tool's own outcome, or a settlement that it completed."""
    return isinstance(e, ToolCompleted) or (
        isinstance(e, ToolResolved) and e.outcome == "completed"
    )


def made_again(e: Event) -> bool:
    """Whether ``e`` settles a call as never run only for it to be made again: by its status
    check, or by the holder that dispatched it and did not call it (`NOT_CALLED`). No progress
    (`Frontier.attempts`): a call that brings its worker down every time would be carried on
    for ever. A person's settlement is progress, whatever it says."""
    return (
        isinstance(e, ToolResolved)
        and e.outcome == "never_ran"
        and ((e.by or "reconcile") == "reconcile" or e.why == NOT_CALLED)
    )


def _tool_event(d: FrontierDraft, e: ToolDispatched | ToolCompleted | ToolResolved) -> CallState:
    if not isinstance(e, ToolDispatched) and not made_again(e):
        d.attempts = 0  # an outcome is progress; a dispatch alone is not
    if d.tools_done is not None and done_by(e):
        d.tools_done += 1
    state = d.calls[e.call_id] = call_after(d.calls.get(e.call_id), e)
    return state


def _settled(d: FrontierDraft, e: TurnSettled) -> None:
    d.attempts = 0
    d.calls = {}
    d.approved = ()
    d.grants = ()
    d.last_boundary = "after_tool_result"
    d.resume_seq = e.seq


def _approval_requested(d: FrontierDraft, e: ApprovalRequested) -> None:
    d.status = "waiting"
    d.waiting_on = e.request_id
    d.last_boundary = "before_approval"
    d.resume_seq = e.seq
    asked = e.asked
    d.answer_schema = asked.schema if asked is not None else None
    if asked is not None:
        # Only a call dispatched and still without an outcome can have stopped at a question.
        for call_id in asked.suspended:
            state = d.calls.get(call_id)
            if state is not None and state.dispatched_seq is not None and state.outcome is None:
                d.calls[call_id] = _replace(state, asked_seq=e.seq)


def _approval_granted(d: FrontierDraft, e: ApprovalGranted) -> None:
    d.attempts = 0
    if d.waiting_on == e.request_id:
        d.status = "running"
        d.waiting_on = None
        d.answer_schema = None
        d.approved = (*d.approved, e.request_id)
        d.grants = (*d.grants, Grant(request_id=e.request_id, by=e.by, value=e.value))


def _approval_denied(d: FrontierDraft, e: ApprovalDenied) -> None:
    if d.waiting_on == e.request_id:
        d.status = "running"
        d.waiting_on = None
        d.answer_schema = None


def _tagged(d: FrontierDraft, e: Tagged) -> None:
    d.tags = (*d.tags, RunTag(seq=e.target_seq, label=e.label, tagged_seq=e.seq))


def _continued(d: FrontierDraft, e: RunContinued) -> None:
    d.status = "continued"
    d.continued_to = e.new_run_id


def _finished(d: FrontierDraft, e: RunFinished) -> None:
    d.status = e.status
    d.output = e.output
    d.finished_seq = e.seq
    d.error = e.error
    # An ended run waits on nobody: an answer written after its end (a cancel that won the
    # race with it) must not make it ``running`` again (`_approval_granted`).
    d.waiting_on = None
    d.answer_schema = None


def _unchanged(d: FrontierDraft, e: Event) -> None:
    return None


def _graph_step(d: FrontierDraft, e: Event) -> None:
    # A graph thread (no `RunStarted`: the framework drives it, not the runner) is only ever
    # waiting (an interrupt) or not; once its interrupt is answered it goes back to "new", so
    # nobody mistakes a thread between invocations for an interrupted agent run. A cancel
    # ends one invocation of a thread, not the thread: the next one's first write opens it
    # again, so a thread is never collected or cut as an ended run.
    if d.agent:
        return
    if d.status == "cancelled":
        d.error = None
        d.status = "new"
    elif d.status == "running":
        d.status = "new"


def _thread_deleted(d: FrontierDraft, e: GraphThreadDeleted) -> None:
    # The thread's past is forgotten, the tool calls it made included.
    _graph_step(d, e)
    d.calls = {}


# Each event kind's rule edits the draft; a rule that changes a call returns its new state.
_RULES: dict[type[Event], Callable[[FrontierDraft, Any], CallState | None]] = {
    RunStarted: _started,
    RunClaimed: _claimed,
    ResumePlanned: _unchanged,
    ModelAnswered: _answered,
    ToolDispatched: _tool_event,
    ToolCompleted: _tool_event,
    ToolResolved: _tool_event,
    TurnSettled: _settled,
    ApprovalRequested: _approval_requested,
    ApprovalGranted: _approval_granted,
    ApprovalDenied: _approval_denied,
    Tagged: _tagged,
    RunContinued: _continued,
    RunFinished: _finished,
    GraphCheckpointed: _graph_step,
    GraphWritesSaved: _graph_step,
    GraphThreadDeleted: _thread_deleted,
    GraphCheckpointsRemoved: _graph_step,
}


class ToolCallRow(msgspec.Struct, frozen=True, kw_only=True, gc=False):
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
    return _call_row(frontier.tenant, frontier.run_id, state, frontier.through_offset)


def _call_row(tenant: str, run_id: str, state: CallState, through_offset: int) -> ToolCallRow:
    latency = None
    if state.dispatched_at is not None and state.completed_at is not None:
        latency = state.completed_at - state.dispatched_at
    return ToolCallRow(
        tenant=tenant,
        run_id=run_id,
        call_id=state.call_id,
        tool=state.tool,
        idempotency_key=state.idempotency_key,
        fence=state.dispatched_fence,
        dispatched_at=state.dispatched_at,
        completed_at=state.completed_at,
        outcome=state.outcome,
        latency_us=latency,
        through_offset=through_offset,
    )
