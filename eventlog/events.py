"""The events of a run: the envelope every event carries and one frozen Struct per kind.

Field names and tags are the wire contract. Rules for changing them (the msgspec schema-evolution
rules): a new field gets a default; nothing is renamed, reordered in meaning or retyped; a breaking
change is a new tag or a new :data:`EVENT_FORMAT` with an upcaster. Unknown fields are ignored on
decode so an older reader can read a newer minor addition.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal, TypeVar

import msgspec

EVENT_FORMAT = 1
"""The event format this code writes and the newest it can read, for every kind but those
:data:`LATER_FORMATS` names."""

INT64_MAX = 2**63 - 1
"""The largest integer every store keeps (a PostgreSQL ``bigint``, an SQLite ``INTEGER``)."""

TOKENS_MAX = 2**40
"""The most tokens one model call may count (about a trillion): a run's sums of them stay far
below `INT64_MAX`."""

Whole = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
"""A seq, fence, time or count: what a record may say is checked on reading, so a forged or
damaged one that no store could keep is set aside as unreadable, not failing a whole batch."""

Signed = Annotated[int, msgspec.Meta(ge=-INT64_MAX - 1, le=INT64_MAX)]
"""An integer a store keeps as it is, negative ones too (a graph write's special indexes)."""

Small = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
"""A count kept in a 32-bit column (the frontier's iteration)."""

Tokens = Annotated[int, msgspec.Meta(ge=0, le=TOKENS_MAX)]


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", gc=False):
    """The envelope shared by every event.

    Attributes:
        run_id: The run this event belongs to; also the Kafka record key.
        tenant: The tenant that owns the run.
        seq: Position in the run's history, gap-free from 1, assigned by the lease holder.
        fence: The lease fence of the writer; readers refuse superseded fences.
        at: Microseconds since the epoch when written. Informational only, never used to decide.
        format: The event format version the writer used.
    """

    run_id: str
    tenant: str
    seq: Whole
    fence: Whole
    at: Whole = 0
    format: Whole = EVENT_FORMAT


class Usage(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Tokens a model call consumed."""

    input_tokens: Tokens = 0
    output_tokens: Tokens = 0


class Message(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One message of the conversation. ``content`` is text or a list of parts (text or binary).

    ``role`` is ``system``, ``user``, ``assistant`` or ``tool``; a tool message names the call it
    answers in ``tool_call_id``.
    """

    role: str
    content: str | list[Any] = ""
    tool_call_id: str | None = None


class ToolCall(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A call the model asked for. The idempotency key is what the tool sees on every attempt."""

    call_id: str
    tool: str
    args: dict[str, Any] = {}
    idempotency_key: str = ""


class ToolError(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A typed error a tool returned instead of a result."""

    type: str
    message: str = ""


class Grant(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A person's yes to an approval request: who said it, and the value they gave with it."""

    request_id: str
    by: str
    value: Any = None


class HistoryHandle(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Where one earlier run's part of a conversation is: its transcript through a seq.

    ``messages`` is how many messages that run's transcript holds through ``through_seq``; a
    reader that finds fewer has a hole in the history.
    """

    run_id: str
    through_seq: Whole
    messages: Whole


class Carried(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What a run carried into a new run brings with it (`RunStarted.carried`).

    Attributes:
        history: The transcripts the conversation starts from, oldest run first; they are
            read where they are, never copied into the new run.
        iteration: Model calls made so far, across the chain (``max_iterations`` spans it).
        usage: Tokens used so far, across the chain.
        tools_done: Tool calls with an outcome so far, across the chain, as the run's
            messages count them.
        calls: The calls of the turn in progress, none dispatched yet, with their idempotency
            keys.
        approved: The calls a person approved that are not yet dispatched.
        grants: Who approved each of them, and with what value.
    """

    history: list[HistoryHandle] = []
    iteration: Small = 0
    usage: Usage = Usage()
    calls: list[ToolCall] = []
    approved: list[str] = []
    grants: list[Grant] = []
    tools_done: Small = 0


class RunStarted(Event, frozen=True, kw_only=True, tag="run.started"):
    """A run begins; a run carried on from another names it and brings what it carried."""

    agent: str
    revision: str
    input: Any = None
    options: dict[str, Any] = {}
    continuation_of: str | None = None
    carried: Carried | None = None


class RunClaimed(Event, frozen=True, kw_only=True, tag="run.claimed"):
    """A worker took the run's lease; the envelope's fence is the lease's fence."""

    worker: str


class ResumePlanned(Event, frozen=True, kw_only=True, tag="resume.planned"):
    """What a resume decided for each call outstanding since the resume point."""

    replayed: list[str] = []
    dispatched: list[str] = []
    undecided: list[str] = []
    reason: str = ""


class ModelAnswered(Event, frozen=True, kw_only=True, tag="model.answered"):
    """The model replied. Boundary ``after_model_call``.

    ``response`` is the reply as the agent framework that asked for it records it (for
    pydantic-ai, its ``ModelResponse`` in JSON form), so that framework gets the very same reply
    back when it runs the run again after a crash; ``None`` when Onward's runner asked.
    """

    message: Message
    tool_calls: list[ToolCall] = []
    usage: Usage = Usage()
    response: Any = None


class ToolDispatched(Event, frozen=True, kw_only=True, tag="tool.dispatched"):
    """Written, and acknowledged by the log, before the tool is called.

    ``deadline`` (microseconds since the epoch, as ``at``): when the call is cut off, for a
    tool with a ``max_call_s``; a status check is asked about the call only after it.
    ``retry_safe``: whether the dispatcher found the tool retry-safe, so resume planning knows
    it where the agent's description cannot find the tool by the name it was called (a
    pydantic-ai tool its own ``prepare`` renames); ``None``: not recorded (the agent's tool
    says).
    """

    call_id: str
    tool: str
    idempotency_key: str
    deadline: Whole | None = None
    retry_safe: bool | None = None


class ToolCompleted(Event, frozen=True, kw_only=True, tag="tool.completed"):
    """The tool returned a result or a typed error."""

    call_id: str
    result: Any = None
    error: ToolError | None = None


class ToolResolved(Event, frozen=True, kw_only=True, tag="tool.resolved"):
    """An indeterminate call was settled by the tool's status check or by a person."""

    call_id: str
    outcome: Literal["completed", "never_ran"]
    result: Any = None
    error: ToolError | None = None
    by: str = ""
    why: str = ""


NOT_CALLED = "its lease could not be confirmed once its dispatch was written; it was not called"
"""The ``why`` of the `ToolResolved` (never ran) its holder records for a call whose dispatch
was written and whose lease `write_ahead` then could not confirm: the tool was not called."""


class TurnSettled(Event, frozen=True, kw_only=True, tag="turn.settled"):
    """Every call of the last model answer has an outcome. Boundary ``after_tool_result``."""

    iteration: Small
    call_ids: list[str] = []


class Asked(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A question a tool's own code asked a person (`onward.runtime.ask.ask`).

    The call stopped at the question and did nothing after it, so once the run goes on it runs
    again from its start and gets the recorded answer where it asked (its ``index``-th
    question, counted from 0) instead of asking again.

    Attributes:
        call_id: The call of the turn in progress that asked.
        index: The question's place among that call's questions.
        schema: The JSON Schema an answer must fit, as JSON text; ``None``: any JSON value.
            Text, not a JSON object, so that the redactor, which masks every value under a key
            that names a secret, leaves a schema that describes a ``password`` whole.
        suspended: Every call of the turn that stopped at a question of its own, this one
            first: each runs again once the run goes on (the others ask theirs then).
    """

    call_id: str
    index: Small = 0
    schema: str | None = None
    suspended: list[str] = []


class ApprovalRequested(Event, frozen=True, kw_only=True, tag="approval.requested"):
    """The run is about to wait on a person. Boundary ``before_approval``.

    ``asked`` is set when a tool's code asked the question (`Asked`); ``None`` for a tool's
    approval and a collaborative pause.
    """

    request_id: str
    prompt: str = ""
    details: Any = None
    asked: Asked | None = None


class ApprovalGranted(Event, frozen=True, kw_only=True, tag="approval.granted"):
    """A person approved a request."""

    request_id: str
    by: str
    value: Any = None


class ApprovalDenied(Event, frozen=True, kw_only=True, tag="approval.denied"):
    """A person denied a request."""

    request_id: str
    by: str
    value: Any = None


class Tagged(Event, frozen=True, kw_only=True, tag="tagged"):
    """A label on an earlier event; tagged events survive compaction."""

    target_seq: Whole
    label: str


class RunContinued(Event, frozen=True, kw_only=True, tag="run.continued"):
    """This run's history was carried into a new run."""

    new_run_id: str


class RunFinished(Event, frozen=True, kw_only=True, tag="run.finished"):
    """The run ended."""

    status: Literal["completed", "failed", "cancelled"]
    output: Any = None
    error: str | None = None


class Serialized(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A value serialized by a framework's own serializer: its type tag and its bytes.

    The bytes travel as base64 in the JSON record; Onward does not interpret them.
    """

    type: str
    data: bytes = b""


class ChannelValue(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One graph channel's value at one version. ``value`` ``None`` and no ``items``: the
    channel is empty.

    A list value is stored item by item in ``items`` (format 2 of `GraphCheckpointed`): the
    whole list when ``base`` is ``None``, else only the items appended to the value of the
    channel's version ``base``, so a list that grows by a few items a step (a conversation)
    stores each item once, not the whole list again at every step.
    """

    channel: str
    version: str
    """The version as its JSON text (``1``, ``"00…1.5"``), so int and str versions never collide."""
    value: Serialized | None = None
    items: list[Serialized] | None = None
    """A list value's items, each serialized on its own (format 2); ``None``: see ``value``."""
    base: str | None = None
    """The version (of the same channel and namespace) whose list ``items`` extend."""


class GraphWrite(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One pending write of a graph task: the channel, its index in the task, the value."""

    channel: str
    idx: Signed
    value: Serialized


class GraphCheckpointed(Event, frozen=True, kw_only=True, tag="graph.checkpointed"):
    """A graph framework (LangGraph) saved a checkpoint of the thread this run stands for.

    ``checkpoint`` is the checkpoint without its channel values; ``values`` holds only the
    channels whose version changed at this step, so a step's record does not grow with the
    thread's whole state, and a list channel that grew only by appends holds only the new
    items (format 2). Format 1 records hold every changed value whole; they read as before.
    Format 2 records are refused by a reader that only knows format 1 (it would take an
    append for the whole list).
    """

    format: Whole = 2
    checkpoint_ns: str = ""
    checkpoint_id: str
    parent_checkpoint_id: str | None = None
    checkpoint: Serialized
    metadata: Serialized
    values: list[ChannelValue] = []


class GraphWritesSaved(Event, frozen=True, kw_only=True, tag="graph.writes"):
    """A graph task's pending writes against one checkpoint of the thread.

    ``usage``: the tokens of the model calls the writes carry, which their writer recorded
    in its spend ledger under this event's seq; ``None`` for writes that carry none, that no
    ledger counted, or that were copied from another thread (whose calls they are). A saver
    taking the thread records from it what the ledger lacks (see `OnwardSaver`).
    """

    checkpoint_ns: str = ""
    checkpoint_id: str
    task_id: str
    task_path: str = ""
    writes: list[GraphWrite] = []
    usage: Usage | None = None


class GraphThreadDeleted(Event, frozen=True, kw_only=True, tag="graph.thread_deleted"):
    """Every checkpoint and write of the thread before this event is to be forgotten.

    The log is append-only, so readers stop at nothing before it; the bytes go when
    compaction cuts the run's prefix.
    """


class GraphCheckpointRef(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One checkpoint of a graph thread, by namespace and id."""

    checkpoint_ns: str = ""
    checkpoint_id: str


class GraphCheckpointsRemoved(Event, frozen=True, kw_only=True, tag="graph.checkpoints_removed"):
    """These checkpoints of the thread, and the pending writes against them, are gone for reads.

    Written by pruning (every checkpoint but the latest per namespace) and by deleting a graph
    framework's runs; ``why`` says which. As with a deleted thread, the bytes go when
    compaction cuts the run's prefix.
    """

    checkpoints: list[GraphCheckpointRef] = []
    why: str = ""


AnyEvent = (
    RunStarted
    | RunClaimed
    | ResumePlanned
    | ModelAnswered
    | ToolDispatched
    | ToolCompleted
    | ToolResolved
    | TurnSettled
    | ApprovalRequested
    | ApprovalGranted
    | ApprovalDenied
    | Tagged
    | RunContinued
    | RunFinished
    | GraphCheckpointed
    | GraphWritesSaved
    | GraphThreadDeleted
    | GraphCheckpointsRemoved
)
"""The tagged union of every event kind; the type the codec decodes into."""

EVENT_TYPES: tuple[type[Event], ...] = (
    RunStarted,
    RunClaimed,
    ResumePlanned,
    ModelAnswered,
    ToolDispatched,
    ToolCompleted,
    ToolResolved,
    TurnSettled,
    ApprovalRequested,
    ApprovalGranted,
    ApprovalDenied,
    Tagged,
    RunContinued,
    RunFinished,
    GraphCheckpointed,
    GraphWritesSaved,
    GraphThreadDeleted,
    GraphCheckpointsRemoved,
)


LATER_FORMATS: dict[str, int] = {"graph.checkpointed": 2}
"""Kinds (by tag) this code writes in a format after :data:`EVENT_FORMAT`: a kind's format is
raised alone when only its layout changed, so a reader that knows only the older one refuses
records of that kind ("upgrade Onward") and still reads every other."""


def format_of(kind: object) -> int:
    """The format this code writes a kind (its tag) in, the newest of it that it reads."""
    return LATER_FORMATS.get(kind, EVENT_FORMAT) if isinstance(kind, str) else EVENT_FORMAT


_Stamped = TypeVar("_Stamped", bound=Event)


def now_us() -> int:
    """The time an event is stamped with: microseconds since the epoch, this host's clock."""
    return time.time_ns() // 1_000


def stamped(
    kind: type[_Stamped], *, run_id: str, tenant: str, seq: int, fence: int, **fields: Any
) -> _Stamped:
    """An event with its envelope: whose run it is, its place in the run (``seq``), the fence
    it is written under, and the time now. The one place an envelope is made, so every writer
    (the runner, a claim, the LangGraph saver) stamps events alike."""
    return kind(run_id=run_id, tenant=tenant, seq=seq, fence=fence, at=now_us(), **fields)


def kind_of(event_type: type[Event]) -> str:
    """The stable wire tag of an event class."""
    tag = event_type.__struct_config__.tag
    if not isinstance(tag, str):
        raise TypeError(f"{event_type.__name__} has no string tag")
    return tag


KINDS: frozenset[str] = frozenset(kind_of(t) for t in EVENT_TYPES)
