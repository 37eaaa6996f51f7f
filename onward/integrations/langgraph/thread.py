"""A LangGraph thread as the log has it: one run's counted graph events, folded.

Every reader of a thread, the saver that writes it included, folds the same way: the run's
stored events go through :class:`~onward.eventlog.SequenceGuard` (so a superseded writer's
events are refused and kept for audit), then each counted graph event is applied here. The
writer applies its own appends through the same :meth:`ThreadState.apply`, so what it serves
from memory is what any other reader would fold from the log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from onward.eventlog import (
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    ChannelValue,
    Event,
    GraphCheckpointed,
    GraphCheckpointsRemoved,
    GraphThreadDeleted,
    GraphWritesSaved,
    RefusedEvent,
    RunFinished,
    SequenceGuard,
    Serialized,
    StoredEvent,
    ToolCompleted,
    ToolDispatched,
    ToolResolved,
    Usage,
)
from onward.projections.frontier import CallState, call_after

WriteKey = tuple[str, int]
"""A pending write's identity within one checkpoint: task id and index."""

SENT_AGAIN = {"decision": "retry"}
"""The ``result`` of the `ToolResolved` (as never run) that records a person's ``retry`` answer
to `OnwardToolMiddleware`'s question, which tells it from a settlement made by other means."""

SNAPSHOT_EVERY = 50
"""After how many appends in a row the fold holds a channel's list whole again (see
`ChannelNode`), so rebuilding any version walks at most this many appends."""


@dataclass(frozen=True, slots=True)
class ChannelNode:
    """One version of a channel as the fold holds it.

    A value stored whole (format 1, or anything but a list) is ``value``. A list stored item by
    item holds ``items``: all of them, or (``base`` set) those appended to the list of the
    version ``base`` holds. Every `snapshot_every` appends in a row the fold keeps the list's
    whole run of items at the node (references to the same stored items, no bytes copied), so
    a read walks at most that many appends back.
    """

    value: Serialized | None = None
    items: tuple[Serialized, ...] = ()
    base: ChannelNode | None = None
    listed: bool = False
    depth: int = 0
    """How many appends a read walks from here to the node holding the list's first items."""
    length: int = 0
    """How many items the list this version holds has."""
    extends: ChannelNode | None = None
    """The version this one appended to, kept where the node holds the list whole too, so a
    reader holding that version's items decoded needs only the ones appended since."""

    def all_items(self) -> list[Serialized]:
        """Every item of the list this version holds, in order."""
        segments: list[tuple[Serialized, ...]] = []
        node: ChannelNode | None = self
        while node is not None:
            segments.append(node.items)
            node = node.base
        out: list[Serialized] = []
        for segment in reversed(segments):
            out.extend(segment)
        return out

    def reaches(self, earlier: ChannelNode) -> bool:
        """Whether this version extends ``earlier`` (through any versions between) or is it:
        then the list ``earlier`` holds is the first ``earlier.length`` items of this one."""
        node: ChannelNode | None = self
        while node is not None and node is not earlier and node.length >= earlier.length:
            node = node.extends
        return node is earlier

    def items_after(self, earlier: ChannelNode) -> list[Serialized] | None:
        """The items this version appended to ``earlier`` (through any versions between), in
        order; ``None`` unless this version extends ``earlier`` (or is it)."""
        segments: list[tuple[Serialized, ...]] = []
        node: ChannelNode | None = self
        while node is not None and node is not earlier and node.length >= earlier.length:
            before = node.extends
            added = node.length - (before.length if before is not None else 0)
            segments.append(node.items[len(node.items) - added :])
            node = before
        if node is not earlier:
            return None
        out: list[Serialized] = []
        for segment in reversed(segments):
            out.extend(segment)
        return out


@dataclass(frozen=True, slots=True)
class DecodedList:
    """A list version's items as the serializer reads them back, kept so the next read of that
    version, or of one extending it, decodes only what was appended since.

    ``items`` is never handed out (readers get a copy of the list) and never changed in place.
    """

    node: ChannelNode
    items: list[Any]


@dataclass(frozen=True, slots=True)
class StoredWrite:
    """One pending write as stored: task, channel, serialized value, task path."""

    task_id: str
    channel: str
    value: Serialized
    task_path: str


@dataclass(slots=True)
class ThreadState:
    """The checkpoints, channel values and pending writes of one thread, as of ``last_seq``.

    Attributes:
        run_id: The run that stands for the thread (its ``thread_id``).
        tenant: The tenant of the run's first counted event (empty before any).
        guard: The seq and fence rules applied so far; ``guard.refused`` lists what a
            superseded writer wrote after another one claimed the thread.
        checkpoints: Namespace, then checkpoint id, to the event that saved it.
        newest: Namespace to its greatest checkpoint id (the latest checkpoint), kept as
            checkpoints come and go so finding it does not scan them all.
        values: (namespace, channel, version) to its value as stored (`ChannelNode`); kept
            when checkpoints are removed, since a kept checkpoint's version may refer to
            (or extend) one an earlier checkpoint saved.
        latest: (namespace, channel) to the version last saved, which a list's next version
            may extend.
        snapshot_every: At most how many appends a read walks back (see `ChannelNode`).
        writes: (namespace, checkpoint id) to its pending writes by (task id, index).
        waiting_on: The approval request an interrupt opened, until it is answered.
        waiting_at: The namespace and checkpoint id that interrupt was asked at, when its
            request says (the saver's do), while ``waiting_on`` is open.
        calls: Every tool call the thread recorded (`ToolDispatched`, `ToolCompleted`,
            `ToolResolved`), by tool call id, folded as a run's calls are. A graph thread has
            no turns to bound them, so they are kept until the thread is deleted.
        sent_again: By tool call id, how many times a person's ``retry`` answer to the tool
            middleware's question sent the call again: LangGraph hands the answers a task
            was given back to its ``interrupt()`` calls, in order, each time it runs the task
            again, so that many ``retry`` answers the call gets are ones already acted on.
        next_offset: The offset to read the run's partition from to continue this fold.
        decoded: (namespace, channel) to the decoded items of one list version (the latest
            one read or written), which the saver that holds this fold keeps: a cache, not
            part of the fold, dropped with it.
        partial: Folded on from a stored summary (see `.summary`): it holds the newest
            checkpoint of each namespace with what reading and writing on from it need, not
            the older checkpoints; whoever needs those folds the thread from its first event.
        whole_needed: A partial fold met an event it cannot apply as a whole fold would (the
            newest checkpoint of a namespace removed, an append to a version it does not
            hold): fold the thread from its first event instead.
        spent: The tokens of the thread's own model calls its writes carry (their
            `GraphWritesSaved.usage`, never a copied write's), and ``spent_calls`` how many
            writes carry them: what the spend ledger holds for the thread at least, unless an
            entry was lost. Kept when the thread is deleted: the calls were paid for.
        spent_seqs: The seqs of those writes, which key their ledger entries: an entry
            recorded for writes whose append failed counts in the ledger's totals as much as
            a lost one, so only the keys tell a lost entry.
    """

    run_id: str
    tenant: str = ""
    guard: SequenceGuard = field(default_factory=SequenceGuard)
    checkpoints: dict[str, dict[str, GraphCheckpointed]] = field(default_factory=dict)
    newest: dict[str, str] = field(default_factory=dict)
    values: dict[tuple[str, str, str], ChannelNode] = field(default_factory=dict)
    latest: dict[tuple[str, str], str] = field(default_factory=dict)
    snapshot_every: int = SNAPSHOT_EVERY
    writes: dict[tuple[str, str], dict[WriteKey, StoredWrite]] = field(default_factory=dict)
    waiting_on: str | None = None
    waiting_at: tuple[str, str] | None = None
    calls: dict[str, CallState] = field(default_factory=dict)
    sent_again: dict[str, int] = field(default_factory=dict)
    next_offset: int | None = None
    decoded: dict[tuple[str, str], DecodedList] = field(default_factory=dict)
    partial: bool = False
    whole_needed: bool = False
    ended: bool = False
    cancelled_as: str = ""
    """The error of the cancelled end the thread's last end records (who and why), if it is
    one and no checkpoint, deletion or interrupt came after it (a prune may): an interrupt
    still open then was ended with its invocation, not left to answer."""
    spent: Usage = field(default_factory=Usage)
    spent_calls: int = 0
    spent_seqs: list[int] = field(default_factory=list)

    @property
    def last_seq(self) -> int:
        """The seq of the last counted event."""
        return self.guard.last_seq

    @property
    def fence(self) -> int:
        """The highest fence admitted: a writer must hold a higher one to claim the thread."""
        return self.guard.fence

    @property
    def refused(self) -> list[RefusedEvent]:
        """Stored events of the thread no reader counts, and why."""
        return self.guard.refused

    def apply(self, stored: StoredEvent) -> bool:
        """Fold one stored event of the run; return whether it counted."""
        offset = stored.position.offset + 1
        if self.next_offset is None or offset > self.next_offset:
            self.next_offset = offset
        if not self.guard.admit(stored):
            return False
        event = stored.event
        self.ended = isinstance(event, RunFinished)
        self.cancelled_as = _cancelled_as(event, self.cancelled_as)
        if not self.tenant:
            self.tenant = event.tenant
        if isinstance(event, GraphCheckpointed):
            self._checkpointed(event)
        elif isinstance(event, GraphWritesSaved):
            self._writes(event)
        elif isinstance(event, ToolDispatched | ToolCompleted | ToolResolved):
            self.calls[event.call_id] = call_after(self.calls.get(event.call_id), event)
            if _sent_again(event):
                self.sent_again[event.call_id] = self.sent_again.get(event.call_id, 0) + 1
        elif isinstance(event, GraphCheckpointsRemoved):
            self._removed(event)
        elif isinstance(event, GraphThreadDeleted):
            self.checkpoints.clear()
            self.newest.clear()
            self.values.clear()
            self.latest.clear()
            self.decoded.clear()
            self.writes.clear()
            self.calls.clear()
            self.sent_again.clear()
            self.waiting_on = None
            self.waiting_at = None
            self.partial = False  # nothing before this event counts: the fold is whole
        elif isinstance(event, ApprovalRequested):
            self.waiting_on = event.request_id
            self.waiting_at = _asked_at(event.details)
        elif (
            isinstance(event, ApprovalGranted | ApprovalDenied)
            and self.waiting_on == event.request_id
        ):
            self.waiting_on = None
            self.waiting_at = None
        return True

    def left_unanswered(self, ns: str, checkpoint_id: str) -> str | None:
        """The open interrupt a new checkpoint leaves behind, if any: one asked at an older
        checkpoint of the same namespace. The graph went on from there without the answer (a
        new input, an update of the state, a fork), so LangGraph no longer has it pending."""
        at = self.waiting_at
        if self.waiting_on is None or at is None or at[0] != ns or checkpoint_id <= at[1]:
            return None
        return self.waiting_on

    def _checkpointed(self, event: GraphCheckpointed) -> None:
        ns = event.checkpoint_ns
        self.checkpoints.setdefault(ns, {})[event.checkpoint_id] = event
        if event.checkpoint_id > self.newest.get(ns, ""):
            self.newest[ns] = event.checkpoint_id
        for item in event.values:
            node = self._node(ns, item)
            if node is None and self.partial:
                self.whole_needed = True
            if node is not None:
                self.values[(ns, item.channel, item.version)] = node
                self.latest[(ns, item.channel)] = item.version

    def _node(self, ns: str, item: ChannelValue) -> ChannelNode | None:
        """The fold's node of a saved channel value; ``None`` for an append to a version the
        thread does not hold (no writer makes one: it extends only what its fold holds)."""
        if item.items is None:
            return ChannelNode(value=item.value)
        if item.base is None:
            return ChannelNode(items=tuple(item.items), listed=True, length=len(item.items))
        base = self.values.get((ns, item.channel, item.base))
        if base is None or not base.listed:
            return None
        length = base.length + len(item.items)
        if base.depth + 1 >= self.snapshot_every:
            whole = (*base.all_items(), *item.items)
            return ChannelNode(items=whole, listed=True, length=length, extends=base)
        return ChannelNode(
            items=tuple(item.items),
            base=base,
            listed=True,
            depth=base.depth + 1,
            length=length,
            extends=base,
        )

    def list_items(self, ns: str, channel: str, version: str) -> list[Serialized] | None:
        """The items of a list version stored item by item; ``None`` if it is not one."""
        node = self.values.get((ns, channel, version))
        return node.all_items() if node is not None and node.listed else None

    def _removed(self, event: GraphCheckpointsRemoved) -> None:
        # Channel values stay: a kept checkpoint may refer to a version an earlier one saved.
        for ref in event.checkpoints:
            saved = self.checkpoints.get(ref.checkpoint_ns)
            if self.partial and self.newest.get(ref.checkpoint_ns) == ref.checkpoint_id:
                self.whole_needed = True  # the next newest is among what it does not hold
            if saved is not None:
                saved.pop(ref.checkpoint_id, None)
                if not saved:
                    del self.checkpoints[ref.checkpoint_ns]
                    del self.newest[ref.checkpoint_ns]
                elif self.newest[ref.checkpoint_ns] == ref.checkpoint_id:
                    self.newest[ref.checkpoint_ns] = max(saved)
            self.writes.pop((ref.checkpoint_ns, ref.checkpoint_id), None)

    def _writes(self, event: GraphWritesSaved) -> None:
        if event.usage is not None:
            self.spent_calls += 1
            self.spent_seqs.append(event.seq)
            self.spent = Usage(
                input_tokens=self.spent.input_tokens + event.usage.input_tokens,
                output_tokens=self.spent.output_tokens + event.usage.output_tokens,
            )
        stored = self.writes.setdefault((event.checkpoint_ns, event.checkpoint_id), {})
        for write in event.writes:
            key = (event.task_id, write.idx)
            # A regular write is saved once (a retried task does not overwrite it); special
            # writes (negative indices: errors, interrupts, resumes) keep the latest.
            if write.idx >= 0 and key in stored:
                continue
            stored[key] = StoredWrite(event.task_id, write.channel, write.value, event.task_path)

    def is_new_write(self, ns: str, checkpoint_id: str, key: WriteKey) -> bool:
        """Whether a write would change anything (see the rule in ``_writes``)."""
        return key[1] < 0 or key not in self.writes.get((ns, checkpoint_id), {})


def _sent_again(event: ToolDispatched | ToolCompleted | ToolResolved) -> bool:
    """Whether ``event`` records a person's ``retry`` answer (see ``sent_again``)."""
    return (
        isinstance(event, ToolResolved)
        and event.outcome == "never_ran"
        and event.result == SENT_AGAIN
    )


def _asked_at(details: Any) -> tuple[str, str] | None:
    """The namespace and checkpoint id an interrupt's request names (see `OnwardSaver`)."""
    if not isinstance(details, dict):
        return None
    ns, checkpoint_id = details.get("checkpoint_ns"), details.get("checkpoint_id")
    if isinstance(ns, str) and isinstance(checkpoint_id, str):
        return ns, checkpoint_id
    return None


def _cancelled_as(event: Event, before: str) -> str:
    """`ThreadState.cancelled_as` after ``event``: set by a cancelled end, cleared by any other
    end and where the graph went on (a checkpoint, a deletion, an interrupt asked); a claim,
    a prune or spend after the end leaves it, or the interrupt it ended would be pending again."""
    if isinstance(event, RunFinished):
        return (event.error or "cancelled") if event.status == "cancelled" else ""
    if isinstance(event, GraphCheckpointed | GraphThreadDeleted | ApprovalRequested):
        return ""
    return before


__all__ = [
    "SENT_AGAIN",
    "SNAPSHOT_EVERY",
    "ChannelNode",
    "DecodedList",
    "StoredWrite",
    "ThreadState",
]
