"""What an application sees of a run: messages derived from the run's counted events.

One mapping (`MessageMapper`), fed a run's counted events in order from its first, gives the
same messages whoever drives the run (the application's own process or a fleet of workers) and
however often they are read again: a message's `position` (the seq of the event it came from,
and its place among that event's messages) is stable, so a reader that stopped can go on after
the last position it saw and get every later message once.

* `ModelAnswered`: ``text`` (what the model said, if anything), and a ``checkpoint`` when it
  asked for tools (``after_model_call``);
* `ToolCompleted`, `ToolResolved` (completed): ``progress``;
* `TurnSettled`: ``checkpoint`` (``after_tool_result``);
* `ApprovalRequested`: ``checkpoint`` (``before_approval``), then ``approval_request`` (a
  tool's approval, or a question its code asked: ``metadata["question"]`` and
  ``metadata["schema"]``); for a collaborative pause, one ``checkpoint`` that waits for an
  answer;
* `RunFinished`: ``result`` when completed, else ``error``; `RunContinued`: ``result``;
* `Tagged` ``needs-person``, while a call it names is still undecided: ``needs_person`` (the
  calls nobody can decide, and the command that settles each), once the reader has caught up.

Checkpoint messages come only for the boundaries the run's checkpoint policy picks, in the steps
its ``checkpoint_frequency`` picks (`onward.projections.frontier.counts_at`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from onward.errors import InvalidInputError
from onward.eventlog.events import (
    ApprovalRequested,
    Event,
    ModelAnswered,
    RunContinued,
    RunFinished,
    RunStarted,
    Tagged,
    ToolCompleted,
    ToolDispatched,
    ToolResolved,
    TurnSettled,
)
from onward.eventlog.parts import TextPart, parts_of
from onward.projections.audit import shell_word
from onward.projections.frontier import (
    BOUNDARIES,
    Boundary,
    checkpoint_frequency,
    counts_at,
    done_by,
    named_checkpoints,
    run_options,
)
from onward.projections.transcript import as_text, checkpoint_of
from onward.runtime.ask import recorded_schema
from onward.runtime.limits import NEEDS_PERSON

MessageType = Literal[
    "text", "checkpoint", "approval_request", "progress", "result", "error", "needs_person"
]


class Answers(Protocol):
    """Where a message's `respond` and `tag` go: the application that streamed it."""

    async def answer(self, message: RunMessage, value: Any, *, approve: bool, by: str) -> None:
        """Answer the request ``message`` waits on; the run goes on (or ends, denied)."""
        ...

    async def tag(self, message: RunMessage, label: str, *, by: str) -> None:
        """Put ``label`` on the event ``message`` came from."""
        ...


class _Is:
    """A message's ``is_<type>`` flag: whether its type is ``kind``."""

    def __init__(self, kind: MessageType) -> None:
        self.kind = kind

    def __get__(self, message: RunMessage | None, owner: type[RunMessage]) -> bool:
        return message is not None and message.type == self.kind


@dataclass(frozen=True, slots=True, kw_only=True)
class RunMessage:
    """One message of a run's stream.

    Attributes:
        type: ``text``, ``checkpoint``, ``approval_request``, ``progress``, ``result``,
            ``error``, or ``needs_person`` (a call nobody can decide waits for a person to
            settle it: ``content`` names each and the command that settles it).
        seq: The seq of the event it came from; with ``part``, its `position`.
        content: Text: what the model said; approval request: what is asked; result: the
            output as text; error: why the run ended.
        boundary: Checkpoint: which boundary (``after_model_call``, ``after_tool_result``,
            ``before_approval``).
        metadata: Checkpoint: the checkpoint's data (`checkpoint_data`): ``boundary``,
            ``seq`` (the boundary event's, the run's resume point), ``iteration``,
            ``tools_done``, ``input_tokens``, ``output_tokens`` and, after a model call, the
            ``tool_calls`` it asked for (``call_id``, ``tool``, ``args``); for a collaborative
            pause also ``waiting`` and ``after_seq`` (the seq of the boundary event it pauses
            after). Approval request: ``tool_name``, ``args``, and for a question a tool's code
            asked (`ask`) ``question`` and ``schema`` (the JSON Schema an answer must fit, or
            ``None``).
        request_id: The request the run waits on (approval requests, collaborative pauses).
        tool_name: Approval request: the tool that needs a person.
        args: Approval request: the arguments it would be called with.
        progress_percent: Progress: model calls made out of the run's bound, in percent.
        iteration: Model calls made so far.
        tools_done: Tool calls with an outcome so far.
        output: Result: the run's final output.
        status: Result or error: how the run ended.
    """

    type: MessageType
    run_id: str
    tenant: str
    seq: int
    part: int = 0
    content: str = ""
    boundary: Boundary | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    request_id: str | None = None
    tool_name: str | None = None
    args: Mapping[str, Any] | None = None
    progress_percent: float | None = None
    iteration: int = 0
    tools_done: int = 0
    output: Any = None
    status: str | None = None
    answers: Answers | None = field(default=None, repr=False, compare=False)

    @property
    def position(self) -> tuple[int, int]:
        """Where the message stands in the run's stream: ``resume(..., after=position)``."""
        return (self.seq, self.part)

    is_text = _Is("text")
    is_checkpoint = _Is("checkpoint")
    is_hil_request = _Is("approval_request")
    """The run waits on a person's answer to this message (`respond`)."""
    is_result = _Is("result")

    @property
    def waits(self) -> bool:
        """The run waited on an answer to this message when it was written."""
        return self.request_id is not None

    async def respond(self, value: Any = None, *, approve: bool = True, by: str = "app") -> None:
        """Answer the approval request or collaborative checkpoint; the run goes on with
        ``value`` (recorded in the log; a tool taking ``approval`` or the model gets it).
        ``approve=False`` denies it: the run ends, cancelled.

        Raises:
            InvalidInputError: The message does not wait on an answer, or was answered already.
        """
        if self.request_id is None:
            raise InvalidInputError(
                f"run {self.run_id!r}: this {self.type} message (seq {self.seq}) waits on no "
                "answer; only approval requests and collaborative checkpoints do",
                run_id=self.run_id,
            )
        await self._answers().answer(self, value, approve=approve, by=by)

    async def tag(self, label: str, *, by: str = "app") -> None:
        """Tag the event this message came from (a `Tagged` event; tagged checkpoints survive
        compaction)."""
        await self._answers().tag(self, label, by=by)

    def _answers(self) -> Answers:
        if self.answers is None:
            raise InvalidInputError(
                f"run {self.run_id!r}: this message was not streamed by an application",
                run_id=self.run_id,
            )
        return self.answers


class MessageMapper:
    """Turns one run's counted events, in order from its first, into its messages.

    Args:
        answers: Set on every message, for `RunMessage.respond` and `RunMessage.tag`.
    """

    def __init__(self, answers: Answers | None = None) -> None:
        self._answers = answers
        self._checkpoints: tuple[Boundary, ...] = BOUNDARIES
        self._pause_at: tuple[Boundary, ...] = ()
        self._every = 1
        self._max_iterations: int | None = None
        self.iteration = 0
        self.tools_done = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self._asked_for: list[dict[str, Any]] = []
        """The tool calls of the latest model answer, as checkpoint data shows them."""
        self._open_calls: dict[str, str] = {}
        self._left_for_person: Tagged | None = None
        """The run's latest ``needs-person`` tag while a call is still undecided."""

    def messages(self, event: Event) -> list[RunMessage]:
        """The messages of one more counted event."""
        out: list[dict[str, Any]] = []
        self._follow_calls(event)
        if isinstance(event, RunStarted):
            self._started(event)
        elif isinstance(event, ModelAnswered):
            self.iteration += 1
            self.input_tokens += event.usage.input_tokens
            self.output_tokens += event.usage.output_tokens
            self._asked_for = [
                {"call_id": c.call_id, "tool": c.tool, "args": c.args} for c in event.tool_calls
            ]
            said = _text(event.message.content)
            if said:
                out.append({"type": "text", "content": said})
            if event.tool_calls:
                out.extend(self._checkpoint("after_model_call", event.seq))
        elif done_by(event):
            self.tools_done += 1
            out.append({"type": "progress", "progress_percent": self._percent()})
        elif isinstance(event, TurnSettled):
            out.extend(self._checkpoint("after_tool_result", event.seq))
        elif isinstance(event, ApprovalRequested):
            out.extend(self._asked(event))
        elif isinstance(event, RunFinished):
            out.append(_finished(event))
        elif isinstance(event, RunContinued):
            out.append(
                {"type": "result", "status": "continued", "metadata": {"new_run": event.new_run_id}}
            )
        where: dict[str, Any] = {"run_id": event.run_id, "tenant": event.tenant, "seq": event.seq}
        done: dict[str, Any] = {"iteration": self.iteration, "tools_done": self.tools_done}
        return [
            RunMessage(part=part, answers=self._answers, **where, **done, **fields)
            for part, fields in enumerate(out)
        ]

    def _follow_calls(self, event: Event) -> None:
        """Keep the calls dispatched without an outcome, and whether a worker left the run
        for a person over them."""
        if isinstance(event, ToolDispatched):
            self._open_calls[event.call_id] = event.tool
        elif isinstance(event, ToolCompleted | ToolResolved):
            self._open_calls.pop(event.call_id, None)
        elif isinstance(event, TurnSettled | RunFinished | RunContinued):
            self._open_calls.clear()
        elif isinstance(event, Tagged) and event.label.startswith(NEEDS_PERSON):
            self._left_for_person = event
        if not self._open_calls:
            self._left_for_person = None

    def left_for_person(self) -> RunMessage | None:
        """A ``needs_person`` message if, as of the events read so far, a worker left the run
        for a person over calls still undecided; ``None`` otherwise."""
        tag = self._left_for_person
        if tag is None:
            return None
        run_id, tenant = shell_word(tag.run_id), shell_word(tag.tenant)
        settle: list[str] = []
        for call_id, tool in self._open_calls.items():
            # One whole command a line: `completed|never_ran` pasted was a pipe into a command.
            base = f"onward resolve {run_id} {shell_word(call_id)} --tenant {tenant}"
            settle += [
                f"  {call_id} ({tool}):",
                f"    {base} --outcome completed --result JSON --by NAME --why REASON",
                f"    {base} --outcome never_ran --by NAME --why REASON",
            ]
        return RunMessage(
            type="needs_person",
            run_id=tag.run_id,
            tenant=tag.tenant,
            seq=tag.seq,
            status="needs_person",
            content="a worker cannot tell whether these calls took effect; find out, then "
            "settle each with one of its commands:\n" + "\n".join(settle),
            metadata={"calls": dict(self._open_calls)},
            iteration=self.iteration,
            tools_done=self.tools_done,
            answers=self._answers,
        )

    def resume_counts(
        self,
        *,
        iteration: int,
        tools_done: int,
        input_tokens: int,
        output_tokens: int,
        pause_at: tuple[Boundary, ...],
        max_iterations: int | None,
        checkpoints: tuple[Boundary, ...] | None = None,
        every: int = 1,
    ) -> None:
        """Go on from where the run stood before its first event this mapper is fed (its
        `RunStarted` was cut from the log): the counts then, and the pauses, iteration bound,
        checkpoints and their frequency its options named (as its row keeps them). A row that
        keeps no checkpoints (stored before it did) has a collaborative run's pauses taken
        for them."""
        self.iteration = iteration
        self.tools_done = tools_done
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self._pause_at = pause_at
        if checkpoints is not None:
            self._checkpoints = checkpoints
        elif pause_at:
            self._checkpoints = pause_at
        self._every = every
        self._max_iterations = max_iterations

    def _started(self, event: RunStarted) -> None:
        if event.carried is not None:
            self.iteration = event.carried.iteration
            self.tools_done = event.carried.tools_done
            self.input_tokens = event.carried.usage.input_tokens
            self.output_tokens = event.carried.usage.output_tokens
        _, self._pause_at, self._max_iterations = run_options(event.options)
        self._every = checkpoint_frequency(event.options)
        named = named_checkpoints(event.options)
        if named is not None:
            self._checkpoints = named

    def _percent(self) -> float | None:
        if self._max_iterations is None:
            return None
        return round(min(100.0, 100.0 * self.iteration / self._max_iterations), 1)

    def _checkpoint(self, boundary: Boundary, seq: int) -> list[dict[str, Any]]:
        """A checkpoint message, unless the policy skips it or a pause request will carry it."""
        if boundary not in self._checkpoints or boundary in self._pause_at:
            return []
        if not counts_at(boundary, self.iteration, self._every):
            return []
        metadata = self.checkpoint_data(boundary, seq)
        return [{"type": "checkpoint", "boundary": boundary, "metadata": metadata}]

    def checkpoint_data(self, boundary: Boundary, seq: int) -> dict[str, Any]:
        """What a checkpoint message carries in ``metadata``: where the run stands at the
        boundary event ``seq``, from the run's events alone (so every reader says the same)."""
        data: dict[str, Any] = {
            "boundary": boundary,
            "seq": seq,
            "iteration": self.iteration,
            "tools_done": self.tools_done,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
        }
        if boundary == "after_model_call":
            data["tool_calls"] = list(self._asked_for)
        return data

    def _asked(self, event: ApprovalRequested) -> list[dict[str, Any]]:
        paused = checkpoint_of(event.request_id)
        if paused is not None:
            boundary, after_seq = paused
            known = boundary if boundary in BOUNDARIES else None
            metadata = {
                **(self.checkpoint_data(known, after_seq) if known is not None else {}),
                "iteration": self.iteration,
                "waiting": True,
                "after_seq": after_seq,
            }
            return [
                {
                    "type": "checkpoint",
                    "boundary": known,
                    "metadata": metadata,
                    "request_id": event.request_id,
                    "content": event.prompt,
                }
            ]
        details = event.details if isinstance(event.details, dict) else {}
        tool_name = details.get("tool")
        args = details.get("args")
        shown: dict[str, Any] = {"tool_name": tool_name, "args": args}
        if event.asked is not None:
            # A tool's code asked (`ask`): the question, and what an answer must fit.
            shown |= {"question": event.prompt, "schema": recorded_schema(event.asked.schema)}
        asked = {
            "type": "approval_request",
            "request_id": event.request_id,
            "content": event.prompt,
            "tool_name": tool_name if isinstance(tool_name, str) else None,
            "args": args if isinstance(args, dict) else None,
            "metadata": shown,
        }
        return [*self._checkpoint("before_approval", event.seq), asked]


def _finished(event: RunFinished) -> dict[str, Any]:
    if event.status == "completed":
        text = event.output if isinstance(event.output, str) else as_text(event.output)
        return {
            "type": "result",
            "status": "completed",
            "output": event.output,
            "content": text,
            "progress_percent": 100.0,
        }
    return {"type": "error", "status": event.status, "content": event.error or event.status}


def _text(content: str | list[Any]) -> str:
    """What a model's message says, its text parts joined."""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in parts_of(content) if isinstance(part, TextPart))


__all__ = ["Answers", "MessageMapper", "MessageType", "RunMessage"]
