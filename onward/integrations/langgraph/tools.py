"""LangGraph tools with Onward's dispatch semantics: written ahead, never re-run on a guess.

`OnwardToolMiddleware` wraps every tool call of a LangGraph thread (``create_agent``'s
middleware, or ``ToolNode``'s ``wrap_tool_call``/``awrap_tool_call`` in a hand-built graph).
A call is known by its thread (the run) and its tool call id. Before the tool runs, the
middleware takes the thread's lease if the saver does not hold it yet (claiming the thread,
so nobody else's later write counts) and decides from the thread's recorded events, with the
same rules as any resumed run (:func:`onward.runtime.planning.classify_call`):

- an outcome is recorded (`ToolCompleted`, or `ToolResolved` as completed): it is returned
  as the tool's answer, and the tool is not called;
- nothing was dispatched (or it was settled as never run): `ToolDispatched` is appended and
  acknowledged, then the tool runs, then its outcome is appended as `ToolCompleted` (a result
  too large for the log is recorded, and answered, as the call's ``PayloadTooLarge`` error). A
  dispatch appended whose lease could not then be confirmed is recorded as never run, the tool
  not called, so the next invocation makes it;
- it was dispatched and no outcome is recorded (the process died, or the run was cancelled,
  while the tool ran): nobody knows whether it took effect, so it is never run again on its
  own. The call is put to a person through LangGraph's ``interrupt()``; the answer, one of
  ``{"decision": "completed", "result": ...}``, ``{"decision": "failed", "error": "..."}`` or
  ``{"decision": "retry"}`` (each with optional ``"by"`` and ``"why"``, and ``"tool_call_id"``
  naming the call it is for), is recorded as `ToolResolved` and acted on: the result is
  returned, the error is returned as an error message, or the tool runs again.

LangGraph hands a task's answers to its ``interrupt()`` calls by their order, and gives every
answer back each time it runs the task again. A ``ToolNode`` runs all calls of a step in one
task, so with two of them undecided an answer can reach the other call's question: an answer
that names another call (``"tool_call_id"``) is not taken for this one, which asks again (the
answer reaches its call when that call asks), so with more than one undecided call in a step
each answer must name its call. A ``retry`` the call was already sent again for is an answer
given back, not a new one: it is passed over, so a call whose new attempt is left undecided
too is put to the person again rather than run a third time, and taken before the tool runs
again, so that the tool's own ``interrupt()`` gets its own answer. A call met again while this
saver still runs it (a ``ToolNode`` ends its step at one call's question without waiting for
the others) waits for it, and is not taken for one cut off.

Tools named in ``retry_safe`` (reads, searches) run again when undecided. A call's
idempotency key is derived once, ``onward.runtime.idempotency_key(thread_id, tool_call_id)``,
when the thread's log has never seen the call, and recorded with its dispatch; every later
dispatch of the call (a retry-safe call run again, one a person sent to run again) carries the
recorded key, never a recomputed one, so a service that deduplicates by it still does after
the derivation changes. While the tool runs, `current_idempotency_key` is that key, for the
tool to send on. Tool call ids must be unique within a thread, as every major model
provider's are.

While a tool runs, `current_fence` is the fencing token of the thread's lease its call was
dispatched under (the ``fence`` of its `ToolDispatched`: it rises with every claim of the
thread) and `current_lease_expires_at` when that lease lapses (seconds since the epoch, the
lease store's clock), as an Onward tool's ``fence`` and ``lease_expires_at`` keywords are. A
service that remembers the highest fence it has seen for a key and refuses a call with a lower
one cannot be reached by a process that was paused past its lease and carried on afterwards.
All three are context variables: they reach a sync tool run in a worker thread too, and
are ``None`` outside a call.

What is recorded as a call's outcome: a `ToolMessage`'s content (an error message's as a
`ToolError`), or, for any other return (a ``Command``, a message with an artifact), the value
in the saver's serializer, so it comes back exactly as the tool returned it. Every event is
appended through the saver, whose redactor (``OnwardSaver(redactor=...)``) masks the secrets in
a message's content and in error text first, as a runner masks its tools' results; a value in
the serializer is its bytes (base64), stored as they are, like the graph's checkpoints.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import logging
from collections.abc import Awaitable, Callable, Collection, Iterator
from typing import Any, NamedTuple

import msgspec
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage
from langgraph.errors import GraphBubbleUp, ParentCommand
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command, interrupt

from onward.errors import FencedError, InvalidInputError, OnwardError, PayloadTooLargeError
from onward.eventlog import Event, ToolCompleted, ToolDispatched, ToolError, ToolResolved
from onward.projections.frontier import CallState
from onward.runtime.dispatch import NOT_CALLED, write_ahead
from onward.runtime.leases import RunLease
from onward.runtime.limits import check_name, check_note
from onward.runtime.planning import PlannedCall, ToolDisposition, classify_call
from onward.runtime.redaction import Redactor
from onward.runtime.tools import cancelled_as_failure, idempotency_key, tool_error

from .saver import OnwardSaver
from .thread import SENT_AGAIN, ThreadState

ToolOutput = ToolMessage | Command[Any]
"""What a tool call comes back as in a LangGraph graph."""

QUESTION = "onward.indeterminate_tool_call"
"""The ``kind`` of the value an undecided call interrupts with."""

DECISIONS = ("completed", "failed", "retry")
"""The answers a person may give to an undecided call."""

_Recorded = tuple[type[ToolCompleted] | type[ToolResolved], dict[str, Any]]
"""An event to record: its kind and its fields."""

_log = logging.getLogger(__name__)

_ERROR_MESSAGE = "ToolMessage"
"""The error type recorded for a tool that answered with an error message."""

_RAISED = "raised"
"""Marks a recorded command the tool raised (`ParentCommand`) rather than returned."""


class _Dispatched(NamedTuple):
    """The tool call running in this context: the key and the lease it was dispatched with."""

    key: str
    lease: RunLease


_running: contextvars.ContextVar[_Dispatched | None] = contextvars.ContextVar(
    "onward_langgraph_running_call", default=None
)


def current_idempotency_key() -> str | None:
    """The idempotency key of the tool call running in this context, if one is.

    It is the key recorded with the call's dispatch, the same on every attempt of the call: a
    tool with side effects sends it on (a request header, a row key) so that the system it
    changes can tell a repeated call from a new one.
    """
    running = _running.get()
    return None if running is None else running.key


def current_fence() -> int | None:
    """The fencing token the tool call running in this context was dispatched under, if one is.

    A tool with side effects sends it with its idempotency key, so that a system which refuses
    a lower fence than the highest it has seen for the key is safe from a paused process.
    """
    running = _running.get()
    return None if running is None else running.lease.fence


def current_lease_expires_at() -> float | None:
    """When the lease of the tool call running in this context lapses (seconds since the
    epoch, the lease store's clock), if one is running: a call that would outlast it can stop."""
    running = _running.get()
    return None if running is None else running.lease.expires_at


class _Call(NamedTuple):
    """One tool call of one thread, as the middleware knows it."""

    thread_id: str
    call_id: str
    tool: str
    args: dict[str, Any]


class OnwardToolMiddleware(AgentMiddleware[Any, Any, Any]):
    """Gives a LangGraph agent's tool calls Onward's write-ahead dispatch (see the module).

    With ``create_agent``: ``create_agent(model, tools, middleware=[OnwardToolMiddleware(saver)],
    checkpointer=saver)``. In a hand-built graph: ``ToolNode(tools,
    wrap_tool_call=mw.wrap_tool_call, awrap_tool_call=mw.awrap_tool_call)``. The graph's
    checkpointer must be the same `OnwardSaver`: the calls are events of its threads, under
    the lease its writes take.

    Args:
        saver: The saver whose threads the calls belong to; its redactor masks what is
            recorded of each call (results, error text) before it is written.
        retry_safe: Names of tools that may run again when nobody knows whether they ran.
    """

    def __init__(self, saver: OnwardSaver, *, retry_safe: Collection[str] = ()) -> None:
        super().__init__()
        self.saver = saver
        self.retry_safe = frozenset(retry_safe)

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolOutput]],
    ) -> ToolOutput:
        call = _call_of(request)
        async with self.saver._call_turn(call.thread_id, call.call_id):
            return await self._handle(call, request, handler)

    async def _handle(
        self,
        call: _Call,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolOutput]],
    ) -> ToolOutput:
        """Replay, ask about, or dispatch and run one call, by what the thread's log says."""
        state = await self.saver.aclaim(call.thread_id)
        planned = self._plan(call, state)
        if planned.disposition is ToolDisposition.COMPLETED:
            return self._replay(call, planned.call)
        key = _dispatch_key(call, planned.call)
        if planned.disposition is ToolDisposition.NEVER_RAN and state.sent_again.get(call.call_id):
            # Its tool runs again in a task that handed this call answers before: those come
            # first, so that the tool's own interrupt() gets its own answer, not a retry.
            _pass_given_back(call, _question(call, planned, key), state)
        if planned.disposition is ToolDisposition.INDETERMINATE and not planned.dispatch_again:
            settled = _ask(call, planned, key, state)
            await self.saver.arecord(call.thread_id, ToolResolved, **settled)
            if settled["outcome"] == "completed":
                return self._replay(call, _resolved(call, settled))

        async def confirmed() -> RunLease:
            # The saver confirms the lease after each append: the fence that append carried.
            lease = self.saver.lease(call.thread_id)
            if lease is None:
                raise FencedError(
                    f"thread {call.thread_id!r}: the lease was lost once {call.call_id!r} "
                    f"({call.tool}) was dispatched; the tool was not called",
                    run_id=call.thread_id,
                    holder=self.saver.holder,
                )
            return lease

        dispatched = {"call_id": call.call_id, "tool": call.tool, "idempotency_key": key}
        lease = await write_ahead(
            lambda: self.saver.arecord(call.thread_id, ToolDispatched, **dispatched),
            confirmed,
            lambda: self._not_called(call),
        )
        # Until its outcome is recorded, a cancel the saver hears does not end the graph run
        # under it (a checkpoint LangGraph writes meanwhile): the call would be left undecided.
        with self.saver._running_call(call.thread_id):
            return await self._run(call, request, handler, _Dispatched(key, lease))

    async def _run(
        self,
        call: _Call,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolOutput]],
        dispatched: _Dispatched,
    ) -> ToolOutput:
        """Run a dispatched call's tool and record its outcome."""
        token = _running.set(dispatched)
        try:
            output = await cancelled_as_failure(handler(request))
        except ParentCommand as exc:
            # The tool finished by handing its graph a command (a subgraph's Command.PARENT):
            # its effect is done, so it is recorded as its outcome, and raised on as LangGraph
            # does; a replay raises it again rather than run the tool.
            handed = self._outcome(call, exc.args[0])
            await self.saver.arecord(
                call.thread_id,
                ToolCompleted,
                **{**handed, "result": {**handed["result"], _RAISED: True}},
            )
            raise
        except BaseException as exc:
            outcome = _unfinished(call, exc, self.saver.redactor)
            if outcome is not None:
                await self.saver.arecord(call.thread_id, outcome[0], **outcome[1])
            raise
        finally:
            _running.reset(token)
        try:
            await self.saver.arecord(call.thread_id, ToolCompleted, **self._outcome(call, output))
        except PayloadTooLargeError as exc:
            return await self._too_large(call, exc)
        return output

    async def _too_large(self, call: _Call, refused: PayloadTooLargeError) -> ToolMessage:
        """Record a result the log refused as too large as the call's error, and answer with
        it, as its replay does: the tool returned, so its effect is done, and left without an
        outcome the call would go to a person (or, retry-safe, be made again and refused again).
        """
        message = (
            f"{call.tool} returned a value too large to record ({refused}); it was not recorded: "
            "return less"
        )
        error = ToolError(type="PayloadTooLarge", message=self.saver.redactor.redact_text(message))
        await self.saver.arecord(call.thread_id, ToolCompleted, call_id=call.call_id, error=error)
        return _message(call, _said(error), status="error")

    async def _not_called(self, call: _Call) -> None:
        """Record a call whose dispatch this saver wrote and whose lease it then could not
        confirm (the store did not answer) as never ran, if the log has that dispatch, while
        the lease still lets it write: left open, the next invocation would put the call to a
        person as one that may have run. A write refused is logged, the call then left open."""
        lease = self.saver.lease(call.thread_id)
        if lease is None:
            return  # lost: a write would be refused, and the next holder reads the log

        def resolved(state: ThreadState) -> list[tuple[type[Event], dict[str, Any]]]:
            recorded = state.calls.get(call.call_id)
            if (
                recorded is None
                or recorded.dispatched_seq is None
                or recorded.dispatched_fence != lease.fence
                or recorded.outcome is not None
            ):
                return []  # the dispatch did not land (or is settled): nothing to undo
            fields = {
                "call_id": call.call_id,
                "outcome": "never_ran",
                "by": self.saver.holder,
                "why": NOT_CALLED,
            }
            return [(ToolResolved, fields)]

        try:
            await self.saver._write(call.thread_id, resolved)
        except OnwardError as exc:
            _log.warning(
                "thread %r: %s (%s) was dispatched and not called (the lease could not be "
                "confirmed); that could not be recorded, so it is left undecided: %s",
                call.thread_id,
                call.call_id,
                call.tool,
                exc,
            )

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolOutput],
    ) -> ToolOutput:
        """The same, for LangGraph's sync API (``invoke``, ``stream``).

        Runs :meth:`awrap_tool_call` on the saver's event loop in this call's context (so
        ``interrupt()`` works), the tool itself in a worker thread. Like the saver's sync
        methods, it must be called from a thread other than the saver's loop.
        """
        context = contextvars.copy_context()

        async def run(req: ToolCallRequest) -> ToolOutput:
            return await asyncio.to_thread(handler, req)

        return self.saver._sync(self.awrap_tool_call(request, run), context=context)

    # -- deciding --------------------------------------------------------------------------

    def _plan(self, call: _Call, state: ThreadState) -> PlannedCall:
        recorded = state.calls.get(call.call_id)
        if recorded is None:
            recorded = CallState(call_id=call.call_id, tool=call.tool)
        elif recorded.tool and recorded.tool != call.tool:
            raise InvalidInputError(
                f"thread {call.thread_id!r}: tool call {call.call_id!r} is recorded as a call "
                f"of {recorded.tool!r}, not {call.tool!r}; tool call ids must be unique within "
                "a thread",
                run_id=call.thread_id,
            )
        return classify_call(recorded, retry_safe=call.tool in self.retry_safe)

    # -- outcomes --------------------------------------------------------------------------

    def _outcome(self, call: _Call, output: ToolOutput) -> dict[str, Any]:
        """The fields of the `ToolCompleted` that records what the tool returned."""
        if isinstance(output, ToolMessage) and output.artifact is None:
            if output.status == "error" and isinstance(output.content, str):
                error = ToolError(type=_ERROR_MESSAGE, message=output.content)
                return {"call_id": call.call_id, "error": error}
            if output.status != "error":
                return {"call_id": call.call_id, "result": output.content}
        kind, data = self.saver.serde.dumps_typed(output)
        serialized = {"type": kind, "data": base64.b64encode(data).decode()}
        return {"call_id": call.call_id, "result": serialized}

    def _replay(self, call: _Call, recorded: CallState) -> ToolOutput:
        """The tool's answer as recorded (by the tool, or by a person)."""
        if recorded.error is not None:
            error = recorded.error
            content = error.message if error.type == _ERROR_MESSAGE else _said(error)
            return _message(call, content, status="error")
        result = recorded.result
        if isinstance(result, dict):  # message content is never a mapping: serialized
            data = base64.b64decode(result["data"])
            output: ToolOutput = self.saver.serde.loads_typed((result["type"], data))
            if result.get(_RAISED) and isinstance(output, Command):
                raise ParentCommand(output)
            return output
        return _message(call, result)


def _dispatch_key(call: _Call, recorded: CallState) -> str:
    """The idempotency key to dispatch the call with: the one its log records, if any.

    Only a call the thread's log has never dispatched with a key gets one derived now, so the
    derivation is never part of what a deduplicating service sees of an old call.
    """
    return recorded.idempotency_key or idempotency_key(call.thread_id, call.call_id)


def _call_of(request: ToolCallRequest) -> _Call:
    call = request.tool_call
    runtime = request.runtime
    thread_id = (
        (runtime.config or {}).get("configurable", {}).get("thread_id")
        if runtime is not None
        else None
    )
    if thread_id is None:
        raise InvalidInputError(
            "OnwardToolMiddleware runs tools of a graph thread: invoke the graph with "
            "configurable.thread_id and an OnwardSaver as its checkpointer"
        )
    if not call.get("id"):
        raise InvalidInputError(
            f"thread {thread_id!r}: a call of {call['name']!r} has no tool call id; "
            "OnwardToolMiddleware knows calls by their ids",
            run_id=str(thread_id),
        )
    return _Call(str(thread_id), str(call["id"]), call["name"], dict(call.get("args") or {}))


def _unfinished(call: _Call, exc: BaseException, redactor: Redactor) -> _Recorded | None:
    """What to record when the tool did not return: nothing when nobody knows whether it
    took effect (cancelled, interrupted from outside), else the event that says what happened.
    """
    if isinstance(exc, GraphBubbleUp):
        # The tool called interrupt(): LangGraph runs it again from its start when answered.
        return ToolResolved, {
            "call_id": call.call_id,
            "outcome": "never_ran",
            "by": "langgraph",
            "why": "the tool stopped at interrupt(); it runs again from its start when resumed",
        }
    if isinstance(exc, Exception):
        return ToolCompleted, {"call_id": call.call_id, "error": tool_error(exc, redactor)}
    return None


def _ask(call: _Call, planned: PlannedCall, key: str, state: ThreadState) -> dict[str, Any]:
    """Put an undecided call to a person until the answer is one we can act on.

    ``key`` is the idempotency key the call was dispatched with, for the person to look it up
    in the service it called. LangGraph hands back, in order, every answer the task was given
    before a new one: those for another call (``"tool_call_id"``) and the ``retry`` answers the
    call was already sent again for (``state.sent_again``) are passed over. Returns the fields
    of the `ToolResolved` that records it.
    """
    given_back = state.sent_again.get(call.call_id, 0)
    for settled in _answers(call, _question(call, planned, key), state):
        if settled["outcome"] != "never_ran" or not given_back:
            return settled
        given_back -= 1  # a retry acted on before, given back: not about this attempt
    raise AssertionError("unreachable: _answers asks until interrupted")


def _pass_given_back(call: _Call, question: dict[str, Any], state: ThreadState) -> None:
    """Take the ``retry`` answers the call was already sent again for back from LangGraph
    (see `_ask`), asking ``question`` should one not come back."""
    given_back = state.sent_again.get(call.call_id, 0)
    for settled in _answers(call, question, state):
        if settled["outcome"] == "never_ran":
            given_back -= 1
            if not given_back:
                return


def _question(call: _Call, planned: PlannedCall, key: str) -> dict[str, Any]:
    """What a person is asked about an undecided call."""
    return {
        "kind": QUESTION,
        "thread_id": call.thread_id,
        "tool_call_id": call.call_id,
        "tool": call.tool,
        "args": call.args,
        "idempotency_key": key,
        "why": planned.reason,
        "decisions": list(DECISIONS),
    }


def _answers(call: _Call, question: dict[str, Any], state: ThreadState) -> Iterator[dict[str, Any]]:
    """The `ToolResolved` fields of each answer to ``question`` about this call, in the order
    LangGraph hands them out; an answer that is none of the forms is asked again, saying why,
    and one naming another call (``"tool_call_id"``) is that call's, not this one's."""
    asked = question
    while True:
        answer = interrupt(asked)
        named = answer.get("tool_call_id") if isinstance(answer, dict) else None
        if named is not None and named != call.call_id:
            if not isinstance(named, str) or named not in state.calls:
                asked = {
                    **question,
                    "invalid_answer": f"the answer names tool call {named!r}, which this "
                    f"thread has not made; this question is about {call.call_id!r}",
                }
            continue  # another call's answer: it is that call's when that call asks
        try:
            settled = _settlement(call, answer)
        except InvalidInputError as exc:
            asked = {**question, "invalid_answer": str(exc)}
            continue
        asked = question
        yield settled


def _settlement(call: _Call, answer: Any) -> dict[str, Any]:
    """The `ToolResolved` fields a person's answer makes.

    Raises:
        InvalidInputError: The answer is not one of the three forms, naming what is wrong.
    """
    decision = answer.get("decision") if isinstance(answer, dict) else None
    if decision not in DECISIONS:
        raise InvalidInputError(
            f"tool call {call.call_id!r} ({call.tool}) needs an answer like "
            '{"decision": "completed", "result": ...}, {"decision": "failed", "error": "..."} '
            f'or {{"decision": "retry"}}; got {answer!r}',
            run_id=call.thread_id,
        )
    if decision == "completed" and "result" not in answer:
        raise InvalidInputError(
            f'tool call {call.call_id!r}: "completed" needs the "result" the tool gave',
            run_id=call.thread_id,
        )
    # Held to the limits `onward resolve` holds a person's name and note to.
    fields: dict[str, Any] = {
        "call_id": call.call_id,
        "by": check_name("by", str(answer.get("by") or "person"), run_id=call.thread_id),
        "why": check_note(
            "why", str(answer.get("why") or f"a person decided {decision}"), run_id=call.thread_id
        ),
    }
    if decision == "retry":
        return {**fields, "outcome": "never_ran", "result": dict(SENT_AGAIN)}
    if decision == "failed":
        said = str(answer.get("error", ""))
        if said:
            # A note the person leaves, as their ``why`` is: held to the same limits.
            check_note("error", said, run_id=call.thread_id)
        error = ToolError(type="SettledAsFailed", message=said)
        return {**fields, "outcome": "completed", "error": error}
    return {**fields, "outcome": "completed", "result": _content(answer["result"])}


def _resolved(call: _Call, settled: dict[str, Any]) -> CallState:
    return CallState(
        call_id=call.call_id,
        tool=call.tool,
        outcome="error" if settled.get("error") is not None else "completed",
        result=settled.get("result"),
        error=settled.get("error"),
        resolved_by=settled["by"],
    )


def _content(result: Any) -> str | list[Any]:
    """A person's result as message content: text and lists as they are, the rest as JSON."""
    if isinstance(result, str | list):
        return result
    return msgspec.json.encode(result).decode()


def _said(error: ToolError) -> str:
    return f"{error.type}: {error.message}" if error.message else error.type


def _message(call: _Call, content: Any, *, status: str = "success") -> ToolMessage:
    return ToolMessage(content=content, tool_call_id=call.call_id, name=call.tool, status=status)


__all__ = [
    "DECISIONS",
    "QUESTION",
    "OnwardToolMiddleware",
    "current_fence",
    "current_idempotency_key",
    "current_lease_expires_at",
]
