"""One held run's journal: what the log recorded for it, served back to a re-executed agent.

A pydantic-ai run is re-executed from its start after a crash (or after a person's decision):
the agent loop runs again and every durable unit that already happened returns what the log
recorded instead of happening again. The journal is that record for one run this worker holds,
and every append the run makes goes through it (and so through `RunWriter`: the lease check,
redaction, the claim check, the fence check).

- Model requests: the n-th request of the run gets the n-th `ModelAnswered` back (its
  ``response`` is pydantic-ai's own record of the reply); past the last one, the model is asked
  and its answer appended before pydantic-ai sees it.
- Tool calls: Onward's write-ahead dispatch. ``ToolDispatched`` is durable before the tool runs
  and ``ToolCompleted`` records what it returned. Each time pydantic-ai invokes one call (once,
  and once more if a person approves it after it asked for approval) is one *attempt*; the k-th
  invocation of a call in a re-execution is its k-th attempt in the log. An attempt with an
  outcome is replayed. One dispatched without an outcome (the process died in between) is never
  run again: it comes back as pydantic-ai's own approval request, unless the tool says a second
  call is harmless (``metadata={"onward": {"retry_safe": True}}``), which is dispatched again.
  One pydantic-ai cut off at its ``timeout`` (or an MCP call its session stopped waiting for)
  is left the same way (and handed to a person at once), not recorded as the retry pydantic-ai
  makes of it: the model would make it again under a new call and key. A retry-safe tool's
  cut-off stays that retry. One a person settled outside any decision the run asked for
  (``onward resolve``) stands as settled: completed, its result is replayed; never ran, it is
  made afresh, with its key.
  One whose lease could not be confirmed once its dispatch was written is recorded as never run
  (the tool was not called), and made by the next execution.
  Every dispatch carries the idempotency key the log recorded for the call, never one derived
  again: only a call the model asks for now gets a key derived now, so the system a tool changes
  sees one key per call whichever Onward release resumes the run.
- Waits on a person: the n-th wait of the run is the n-th ``ApprovalRequested``; answered, its
  answer is returned; not yet, the run stops (`RunSuspended`) and waits.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
from collections.abc import Awaitable, Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

import msgspec
import pydantic
from pydantic_ai.exceptions import ApprovalRequired
from pydantic_ai.messages import ModelResponse

from onward.errors import (
    BackendError,
    FencedError,
    InvalidInputError,
    OnwardError,
    PayloadTooLargeError,
)
from onward.eventlog import (
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    Message,
    ModelAnswered,
    RunFinished,
    RunStarted,
    ToolCall,
    ToolCompleted,
    ToolDispatched,
    ToolError,
    ToolResolved,
    TurnSettled,
    Usage,
)
from onward.eventlog.events import TOKENS_MAX
from onward.runtime.dispatch import NOT_CALLED, write_ahead
from onward.runtime.leases import CancelAsked, CancelAskHeard, RunLease
from onward.runtime.limits import MAX_NAME_LENGTH, check_name
from onward.runtime.spend.budget import Budgets
from onward.runtime.tools import cancelled_as_failure, idempotency_key, tool_error
from onward.runtime.writer import HeldRun, RunWriter

from .attempts import APPROVED_AGAIN, CallAttempts, undecided

if TYPE_CHECKING:
    from onward.eventlog import Event
    from onward.runtime.runner import AgentRunner
from .compat import unit_completed

_RESPONSE = pydantic.TypeAdapter(ModelResponse)
_log = logging.getLogger("onward.integrations.pydantic_ai")

_current: ContextVar[RunJournal | None] = ContextVar("onward_pydantic_ai_journal", default=None)
_current_key: ContextVar[str | None] = ContextVar("onward_pydantic_ai_key", default=None)
_current_lease: ContextVar[RunLease | None] = ContextVar("onward_pydantic_ai_lease", default=None)


def current_journal() -> RunJournal | None:
    """The journal of the Onward run this task is executing, if any."""
    return _current.get()


def current_idempotency_key() -> str | None:
    """The idempotency key of the tool call running in this task, if one is.

    A tool with side effects passes it on (as a request header, a row key) so that the system
    it changes can tell a repeated call from a new one, the same on every attempt of the call.
    """
    return _current_key.get()


def current_fence() -> int | None:
    """The fencing token the tool call running in this task was dispatched under, if one is.

    It rises with every claim of the run. A tool with side effects sends it with its key, so
    that a system which refuses a lower fence than the highest it has seen for the key cannot
    be reached by a worker that was paused past its lease and carried on afterwards.
    """
    lease = _current_lease.get()
    return None if lease is None else lease.fence


def current_lease_expires_at() -> float | None:
    """When the lease of the tool call running in this task lapses (seconds since the epoch,
    the lease store's clock), if one is running: a call that would outlast it can stop."""
    lease = _current_lease.get()
    return None if lease is None else lease.expires_at


class RunSuspended(Exception):  # noqa: N818 - a control signal, not a failure
    """The run waits on a person: ``ApprovalRequested`` is in the log and nothing more happens.

    Raised through the agent's run so that it stops where it waits; the driver turns it into a
    waiting result. A re-execution after the answer gets the answer at the same place.
    """

    def __init__(self, request_id: str, details: Any = None) -> None:
        super().__init__(f"waiting on {request_id}")
        self.request_id = request_id
        self.details = details


class RunCancelled(Exception):  # noqa: N818 - a control signal, not a failure
    """Someone asked the run's holder to cancel it (`AgentRunner.ask_to_cancel`), and its end,
    ``cancelled``, is in the log: raised through the agent's run where its next model request
    would have gone out, so that it stops there; the driver turns it into a cancelled result."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


class RecordedToolError(Exception):
    """A tool raised when it ran, and the log says so; the re-executed run fails as it did."""


@dataclass
class Wait:
    """One wait on a person: what was asked and, once there is one, the answer."""

    asked: ApprovalRequested
    answer: ApprovalGranted | ApprovalDenied | None = None


@dataclass(frozen=True, slots=True)
class RunSpend:
    """Where a journaled run's model calls are counted, and the budgets they are held against.

    Attributes:
        runner: The runner whose spend ledger and prices count them (`AgentRunner.record_spend`,
            `AgentRunner.hold_model_call`).
        budgets: The run's budgets, as its `RunStarted` recorded them.
    """

    runner: AgentRunner
    budgets: Budgets


@dataclass
class RunJournal:
    """The recorded units of one held run, and the appends of its re-execution.

    Args:
        run: The run as this worker holds it (lease, frontier).
        writer: The write path every append goes through.
        events: The run's counted events so far, in order.
        spend: Where the run's model calls are counted and the budgets they are held
            against, as the runner counts and holds its own; ``None``: not counted.
    """

    run: HeldRun
    writer: RunWriter
    events: Sequence[Event]
    spend: RunSpend | None = None
    answers: list[ModelAnswered] = field(init=False, default_factory=list)
    attempts: CallAttempts = field(init=False, default_factory=CallAttempts)
    waits: list[Wait] = field(init=False, default_factory=list)
    _next_answer: int = field(init=False, default=0)
    _next_wait: int = field(init=False, default=0)
    _invocations: dict[str, int] = field(init=False, default_factory=dict)
    _turn: dict[str, str] = field(init=False, default_factory=dict)
    _used_ids: set[str] = field(init=False, default_factory=set)
    _keys: dict[str, str] = field(init=False, default_factory=dict)
    """The idempotency key recorded for each call, by the run's call id."""
    _segments: int = field(init=False, default=0)
    surfaced: dict[str, dict[str, Any]] = field(init=False, default_factory=dict)
    """What each call handed back for a decision said, by pydantic-ai's call id."""
    _tool_errors: list[Exception] = field(init=False, default_factory=list)
    """What the tools run in this execution raised, their outcome already recorded."""

    def __post_init__(self) -> None:
        for event in self.events:
            self._learn(event)

    @property
    def run_id(self) -> str:
        return self.run.run_id

    def next_segment_id(self) -> str:
        """pydantic-ai's run id for the next of its runs this execution makes: the run's id,
        then numbered, the same on every re-execution."""
        self._segments += 1
        return self.run_id if self._segments == 1 else f"{self.run_id}/{self._segments}"

    @contextmanager
    def executing(self) -> Iterator[RunJournal]:
        """Make this the journal of the units run in the block (in this task and its children)."""
        token = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(token)

    # -- model requests ----------------------------------------------------------------------

    async def model_request(
        self, ask: Callable[[], Awaitable[object]], *, outputs: Collection[str] = ()
    ) -> object:
        """The run's next model answer: the recorded one, or the model's, recorded first.

        ``outputs``: the request's output tools. A call of one is the run's output, which
        pydantic-ai processes and Onward never dispatches: it is not recorded as a call (a
        resume would plan it as one never dispatched, to make).
        """
        if self._next_answer < len(self.answers):
            answered = self.answers[self._next_answer]
            self._next_answer += 1
            self._turn = _turn_of(answered)
            unit_completed(executed=False)
            return answered.response
        await self._settle_turn()
        asked = self.run.held.cancel_asked
        if asked is not None:
            await self._end_as_asked(asked)
        held = await self._hold()
        try:
            # A cancel ask heard meanwhile abandons the request (no effect but its cost).
            async with self.run.held.cancelled_by_ask():
                payload = await ask()
        except CancelAskHeard as heard:
            if held is not None and self.spend is not None:
                await self.spend.runner.release_hold(self.run_id, held)
            await self._end_as_asked(heard.asked)
        except BaseException:
            if held is not None and self.spend is not None:
                await self.spend.runner.release_hold(self.run_id, held)
            raise
        response = _RESPONSE.validate_python(payload)
        calls = [
            self._keyed(part.tool_call_id, part.tool_name, part.args_as_dict())
            for part in response.tool_calls
            if part.tool_name not in outputs
        ]
        answered = self.event(
            ModelAnswered,
            message=Message(role="assistant", content=response.text or ""),
            tool_calls=calls,
            usage=Usage(
                input_tokens=_tokens(response.usage.input_tokens),
                output_tokens=_tokens(response.usage.output_tokens),
            ),
            response=payload,
        )
        if self.spend is not None:
            await self.spend.runner.record_spend(self.run, answered)
        try:
            await self.append(answered)
        except PayloadTooLargeError as exc:
            await self._answer_too_large(answered, exc)
        self._next_answer += 1
        self._turn = _turn_of(answered)
        unit_completed(executed=True)
        return payload

    async def _answer_too_large(
        self, answered: ModelAnswered, refused: PayloadTooLargeError
    ) -> NoReturn:
        """End the run failed when the model's answer is too large for the log (no blob store
        took its bodies), recording the answer without them, for its usage, and raise: left
        to resume, the (paid) model would be asked again, answer alike, be refused again.

        Raises:
            PayloadTooLargeError: Saying so.
        """
        remedy = (
            "ask for less"
            if self.writer.claim_check is not None
            else "give the runner a blob store (blobs=)"
        )
        calls = len(answered.tool_calls)
        unrun = f"; none of its {calls} tool calls was run" if calls else ""
        error = f"the model's answer is too large to record ({refused}){unrun}: {remedy}"
        bare = msgspec.structs.replace(
            answered, message=Message(role=answered.message.role), tool_calls=[], response=None
        )
        await self.append(bare, self.event(RunFinished, 1, status="failed", error=error))
        raise PayloadTooLargeError(
            error, run_id=self.run_id, size=refused.size, limit=refused.limit
        ) from refused

    async def _hold(self) -> int | None:
        """Hold the next model call's estimated cost against the run's budgets (the seq held),
        or end the run ``failed`` and raise if it would pass one. The estimate reads the run's
        prompt and its calls so far: pydantic-ai's request is not seen before it is sent.

        Raises:
            BudgetExceededError: The call would pass a budget; the model is not asked.
        """
        if self.spend is None or not self.spend.budgets.bounded:
            return None
        started = next((e for e in self.events if isinstance(e, RunStarted)), None)
        prompt = started.input if started is not None and isinstance(started.input, str) else ""
        sent = [Message(role="user", content=prompt)]
        return await self.spend.runner.hold_model_call(self.run, self.spend.budgets, sent)

    def _keyed(self, model_call_id: str, tool: str, args: dict[str, Any]) -> ToolCall:
        """A call with an id unique in the run (a model may reuse ids across turns) and its key.

        The id is the model's own while it is a plain name (`_own_id`): one too long or holding
        a control character could not be written (a NUL), or named when a person settles the
        call, so the run would wait on a decision nobody can take."""
        own = _own_id(model_call_id)
        call_id = own
        if call_id in self._used_ids:
            call_id = f"{own}~{len(self.answers) + 1}"
        self._used_ids.add(call_id)
        return ToolCall(
            call_id=call_id,
            tool=_own_tool(tool),
            args=args,
            idempotency_key=idempotency_key(self.run_id, call_id),
        )

    async def _settle_turn(self) -> None:
        """Close the turn in progress before the next model request (the ``after_tool_result``
        boundary), so a resume point lies between turns."""
        frontier = self.run.frontier
        if frontier.calls:
            await self.append(
                self.event(
                    TurnSettled,
                    iteration=frontier.iteration,
                    call_ids=[c.call_id for c in frontier.calls],
                )
            )

    # -- tool calls --------------------------------------------------------------------------

    async def tool_call(
        self,
        model_call_id: str,
        tool: str,
        *,
        retry_safe: bool,
        run: Callable[[], Awaitable[object]],
    ) -> object:
        """One invocation of a call: replayed, dispatched, or surfaced for a decision.

        Raises:
            ApprovalRequired: The call was dispatched before and the log does not say how it
                ended: pydantic-ai asks a person instead of running it again.
            RecordedToolError: The tool raised when it ran; the run fails as it did then.
        """
        call_id = self._turn.get(model_call_id, model_call_id)
        attempt_no = self._invocations.get(call_id, 0)
        self._invocations[call_id] = attempt_no + 1
        attempts = self.attempts.of(call_id)
        if attempt_no < len(attempts):
            attempt = attempts[attempt_no]
            if attempt.completed is not None:
                unit_completed(executed=False)
                return _replayed(attempt.completed)
            if attempt.settled and attempt.resolved is not None:
                unit_completed(executed=False)
                return _settled(attempt.resolved)
            if not attempt.open or not retry_safe:
                metadata = undecided(self.run_id, call_id, tool, attempt)
                self.surfaced[model_call_id] = metadata
                raise ApprovalRequired(metadata=metadata)
            return await self._dispatch(call_id, tool, run, model_call_id, retry_safe=retry_safe)
        if attempts and attempts[-1].open:
            # pydantic-ai runs a call again only once a person approved it: they say the
            # attempt that may have run did not. Recorded, so attempts stay told apart.
            await self.append(
                self.event(
                    ToolResolved,
                    call_id=call_id,
                    outcome="never_ran",
                    by="approval",
                    why=APPROVED_AGAIN,
                )
            )
        return await self._dispatch(call_id, tool, run, model_call_id, retry_safe=retry_safe)

    async def _dispatch(
        self,
        call_id: str,
        tool: str,
        run: Callable[[], Awaitable[object]],
        model_call_id: str,
        *,
        retry_safe: bool,
    ) -> object:
        """Dispatch one attempt (write-ahead), make it, and record its outcome.

        Raises:
            ApprovalRequired: pydantic-ai cut the tool off at its ``timeout`` and it is not
                retry-safe: it may have taken effect, so it is left dispatched without an
                outcome and handed to a person, as after a crash mid-call, rather than
                recorded as a retry the model would make under a new call and key.
        """
        key = self._key_of(call_id)
        dispatched = self.event(
            ToolDispatched, call_id=call_id, tool=tool, idempotency_key=key, retry_safe=retry_safe
        )
        lease = await write_ahead(
            lambda: self.append(dispatched),
            self.run.held.confirm,
            lambda: self._not_called(call_id, tool),
        )
        token = _current_key.set(key)
        leased = _current_lease.set(lease)
        # The tool runs outside the journal: its outcome is the unit recorded, so whatever it
        # does inside (an agent it delegates to, durable too) must not become the run's units.
        outside = _current.set(None)
        try:
            # A CancelledError of the run's own cancel goes on: nobody knows whether the call
            # took effect. One of something the tool awaited is its failure, recorded.
            payload = await cancelled_as_failure(run())
        except Exception as exc:
            await self._failed(call_id, exc)
            raise
        finally:
            _current.reset(outside)
            _current_lease.reset(leased)
            _current_key.reset(token)
        if not retry_safe and _cut_off(payload):
            attempt = self.attempts.of(call_id)[-1]
            metadata = undecided(self.run_id, call_id, tool, attempt, cut_off=True)
            self.surfaced[model_call_id] = metadata
            raise ApprovalRequired(metadata=metadata)
        try:
            await self.append(self.event(ToolCompleted, call_id=call_id, result=payload))
        except PayloadTooLargeError as exc:
            await self._too_large(call_id, tool, exc)
        unit_completed(executed=True)
        return payload

    async def _failed(self, call_id: str, exc: Exception) -> None:
        """Record that the call's tool raised ``exc``; the run then fails with it."""
        error = tool_error(exc, self.writer.redactor)
        await self.append(self.event(ToolCompleted, call_id=call_id, error=error))
        self._tool_errors.append(exc)

    async def _too_large(self, call_id: str, tool: str, refused: PayloadTooLargeError) -> NoReturn:
        """Record a result the log refused as too large as the call's error, and fail the run.

        The tool returned, so its effect is done: left without an outcome, the call would go
        to a person at every resume (or, retry-safe, be made again and refused again). The run
        fails as a tool that raised fails it, and a re-execution fails the same way.

        Raises:
            PayloadTooLargeError: Naming the tool, as the tool's own failure.
        """
        redactor = self.writer.redactor
        failure = PayloadTooLargeError(
            f"{tool} returned a value too large to record ({refused}); it was not recorded: "
            "return less, or give OnwardDurability a blob store (blobs=)",
            run_id=self.run_id,
        )
        error = ToolError(type="PayloadTooLarge", message=tool_error(failure, redactor).message)
        await self.append(self.event(ToolCompleted, call_id=call_id, error=error))
        self._tool_errors.append(failure)
        raise failure from refused

    async def _not_called(self, call_id: str, tool: str) -> None:
        """Record a call this holder dispatched and did not make (its lease could not be
        confirmed after the dispatch was written) as never ran, while the lease still lets it
        write: left open, a resume would hand the call to a person as one that may have run.
        A write refused is logged, the call then left undecided."""
        attempts = self.attempts.of(call_id)
        last = attempts[-1] if attempts else None
        if last is None or not last.open or last.dispatched_fence != self.run.fence:
            return  # its dispatch was not written (or not learnt to be): nothing to undo
        resolved = self.event(
            ToolResolved,
            call_id=call_id,
            outcome="never_ran",
            by=self.run.held.holder,
            why=NOT_CALLED,
        )
        try:
            await self.append(resolved)
        except OnwardError as exc:
            _log.warning(
                "run %s: %s (%s) was dispatched and not called (the lease could not be "
                "confirmed); that could not be recorded, so it is left undecided: %s",
                self.run_id,
                call_id,
                tool,
                exc,
            )

    def raised_by_a_tool(self, exc: BaseException) -> bool:
        """Whether a tool raised ``exc`` (its outcome recorded), rather than Onward's own
        writing of the run: an `OnwardError` a tool raised fails the run like any other."""
        return any(raised is exc for raised in self._tool_errors)

    def _key_of(self, call_id: str) -> str:
        """The idempotency key the log holds for a call (the one it was last dispatched with,
        else the one recorded with the model's answer), derived only for a call it lacks: a
        change in how keys are derived must not give a recorded call a new one."""
        recorded = self._keys.get(call_id)
        return recorded if recorded is not None else idempotency_key(self.run_id, call_id)

    # -- waits on a person -------------------------------------------------------------------

    def next_wait(self, name: str) -> tuple[str, Wait | None]:
        """The wait this point of the re-execution reached: its request id, and the recorded
        wait (``None``: it is a new one, to be opened under that id)."""
        index = self._next_wait
        self._next_wait += 1
        if index < len(self.waits):
            recorded = self.waits[index]
            return recorded.asked.request_id, recorded
        return f"{name}-{index + 1}", None

    async def ask(
        self, request_id: str, prompt: str, details: Any, answer: Any = None, *, by: str = ""
    ) -> None:
        """Record a wait on a person, answered at once when ``answer`` is given."""
        asked = self.event(ApprovalRequested, request_id=request_id, prompt=prompt, details=details)
        batch: list[Event] = [asked]
        if answer is not None:
            batch.append(self.event(ApprovalGranted, 1, request_id=request_id, by=by, value=answer))
        await self.append(*batch)

    # -- the log -----------------------------------------------------------------------------

    async def end_if_asked(self, *, confirm: bool = False) -> None:
        """End the run ``cancelled`` and raise `RunCancelled` if someone asked its holder to, as
        the holding heard it: where the execution starts (an ask a holder that let go never
        answered is heard as the run is taken) and where it would wait on a person, which it
        would not hear until a person answered. ``confirm``: renew first, to hear an ask made
        since the last renewal (a store that cannot say leaves it kept for the next holder)."""
        if confirm:
            with contextlib.suppress(FencedError, BackendError):
                await self.run.held.confirm()
        asked = self.run.held.cancel_asked
        if asked is not None:
            await self._end_as_asked(asked)

    async def _end_as_asked(self, asked: CancelAsked) -> NoReturn:
        """End the run ``cancelled`` as someone asked its holder to, and stop the agent there.

        The ask goes with this holding, so the end is kept trying for as long as the lease
        holds (`RunWriter.append_while_held`) rather than given up on after a failed append.
        """
        finished = self.event(RunFinished, status="cancelled", error=asked.error)
        await self.writer.append_while_held(
            self.run, [finished], what=f"its end, cancelled by {asked.by}"
        )
        self._learn(finished)
        raise RunCancelled(asked.error) from None

    def event(self, kind: type[Any], offset: int = 0, **fields: Any) -> Any:
        """An event of this run, ``offset`` places into the batch it goes out in."""
        return self.writer.event(self.run, kind, offset, **fields)

    async def append(self, *events: Event) -> None:
        """Append a batch of this run (`RunWriter.append`) and learn from it."""
        await self.writer.append(self.run, list(events))
        for event in events:
            self._learn(event)

    def _learn(self, event: Event) -> None:
        """Keep the journal in step with one more counted event of the run."""
        if isinstance(event, ModelAnswered):
            # Every answer, recorded before this execution or appended by it, in order: an
            # answer is appended only once the recorded ones are all replayed.
            self.answers.append(event)
            self._used_ids.update(c.call_id for c in event.tool_calls)
            self._keys.update(
                (c.call_id, c.idempotency_key) for c in event.tool_calls if c.idempotency_key
            )
        elif isinstance(event, ToolDispatched | ToolCompleted | ToolResolved):
            if isinstance(event, ToolDispatched) and event.idempotency_key:
                self._keys[event.call_id] = event.idempotency_key
            self.attempts.learn(event)
        elif isinstance(event, ApprovalRequested):
            self.waits.append(Wait(event))
            self.attempts.asked.update(_asked_about(event.details))
        elif isinstance(event, ApprovalGranted | ApprovalDenied):
            for wait in self.waits:
                if wait.asked.request_id == event.request_id and wait.answer is None:
                    wait.answer = event


def _tokens(count: int) -> int:
    """A token count as recorded: one no model call has (negative, past `TOKENS_MAX`, as a
    model or its server may report) counts as zero, as the OpenAI provider counts it. The log
    refuses such a count, so the answer could not be written and every resume would ask the
    (paid) model again to be refused again."""
    return count if 0 <= count <= TOKENS_MAX else 0


_ROOM_FOR_A_MARK = 16
"""Characters a reused call id's mark (``~<answer>``) may add, within `MAX_NAME_LENGTH`."""


def _own_id(model_call_id: str) -> str:
    """The run's id for a call the model gave ``model_call_id``: that id while it is a plain
    name (`check_name`) with room for a reused id's mark, else ``call-`` and a digest of it,
    the same on every re-execution."""
    if _plain(model_call_id) and len(model_call_id) <= MAX_NAME_LENGTH - _ROOM_FOR_A_MARK:
        return model_call_id
    digest = hashlib.sha256(model_call_id.encode("utf-8", "surrogatepass")).hexdigest()
    return f"call-{digest[:32]}"


def _plain(name: str) -> bool:
    try:
        check_name("name", name)
    except InvalidInputError:
        return False
    return True


def _own_tool(tool: str) -> str:
    """The tool a call names, as recorded: a name that is not a plain one (a NUL in it, which
    no event may hold, would leave the answer unwritten and the model asked again at every
    resume) with its control characters escaped, cut to fit, as the runner records it. No
    tool has such a name: pydantic-ai tells the model so and runs nothing."""
    if _plain(tool):
        return tool
    return tool.encode("unicode_escape").decode("ascii")[:MAX_NAME_LENGTH] or "(empty)"


def _turn_of(answered: ModelAnswered) -> dict[str, str]:
    """pydantic-ai's call ids of an answer, to the run's (they differ when a model reused one).

    The recorded calls are the answer's in order, less its output tool calls (recorded too by
    an earlier release): a part the next recorded call is not of is one of those.
    """
    response = _RESPONSE.validate_python(answered.response)
    recorded = iter(answered.tool_calls)
    call = next(recorded, None)
    turn: dict[str, str] = {}
    for part in response.tool_calls:
        if call is None:
            break
        ours = any(
            call.call_id == own or call.call_id.startswith(f"{own}~")
            for own in (part.tool_call_id, _own_id(part.tool_call_id))
        )
        if call.tool in (part.tool_name, _own_tool(part.tool_name)) and ours:
            turn[part.tool_call_id] = call.call_id
            call = next(recorded, None)
    return turn


_CUT_OFF = re.compile(
    r"Timed out after \S+ seconds\."
    r"|Request 'tools/call' timed out"
    r"|Timed out after \S+s waiting for 'tools/call'"
    r"|Timed out while waiting for response to ClientRequest\. Waited \S+ seconds\."
)
"""The retry message pydantic-ai's function toolset gives a tool it cut off at its timeout,
and the MCP SDK's messages for a call its session stopped waiting for (``read_timeout``),
which pydantic-ai's MCP toolset makes the retry's message: the server may have acted on it."""


def _cut_off(payload: object) -> bool:
    """Whether a tool unit's recorded result is pydantic-ai's retry for a tool cut off at its
    ``timeout``, or for an MCP call that timed out (the unit carries the retry as data: its
    ``kind`` and ``message``)."""
    if isinstance(payload, dict):
        kind, message = payload.get("kind"), payload.get("message")
    else:
        kind, message = getattr(payload, "kind", None), getattr(payload, "message", None)
    return kind == "model_retry" and isinstance(message, str) and bool(_CUT_OFF.fullmatch(message))


def _asked_about(details: Any) -> Iterator[str]:
    """The run's call ids of the calls a wait's details hand to a person (the metadata of
    pydantic-ai's approval requests, or the calls left undecided under another wait)."""
    if not isinstance(details, dict):
        return
    for key in ("metadata", "undecided"):
        surfaced = details.get(key)
        if not isinstance(surfaced, dict):
            continue
        for metadata in surfaced.values():
            onward = metadata.get("onward") if isinstance(metadata, dict) else None
            if isinstance(onward, dict) and isinstance(onward.get("call_id"), str):
                yield onward["call_id"]


def _settled(resolved: ToolResolved) -> object:
    """A call a person settled as completed, as pydantic-ai's record of a tool's return: the
    result they gave is what the tool returned (an error they gave, what it raised)."""
    if resolved.error is not None:
        raise RecordedToolError(f"{resolved.error.type}: {resolved.error.message}")
    return {"kind": "tool_return", "result": resolved.result}


def _replayed(completed: ToolCompleted) -> object:
    if completed.error is not None:
        raise RecordedToolError(f"{completed.error.type}: {completed.error.message}")
    return completed.result


__all__ = [
    "RecordedToolError",
    "RunJournal",
    "RunSuspended",
    "current_fence",
    "current_idempotency_key",
    "current_journal",
    "current_lease_expires_at",
]
