"""A LangGraph thread as the log has it: one run's counted graph events, folded.

Every reader of a thread, the saver that writes it included, folds the same way: the run's
stored events go through :class:`~onward.eventlog.SequenceGuard` (so a superseded writer's
events are refused and kept for audit), then each counted graph event is applied here. The
writer applies its own appends through the same :meth:`ThreadState.apply`, so what it serves
from memory is what any other reader would fold from the log.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from onward.eventlog import (
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    GraphCheckpointed,
    GraphCheckpointsRemoved,
    GraphThreadDeleted,
    GraphWritesSaved,
    RefusedEvent,
    SequenceGuard,
    Serialized,
    StoredEvent,
    ToolCompleted,
    ToolDispatched,
    ToolResolved,
)
from onward.projections.frontier import CallState, call_after

WriteKey = tuple[str, int]
"""A pending write's identity within one checkpoint: task id and index."""


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
        values: (namespace, channel, version) to the serialized value (``None``: empty).
        writes: (namespace, checkpoint id) to its pending writes by (task id, index).
        waiting_on: The approval request an interrupt opened, until it is answered.
        calls: Every tool call the thread recorded (`ToolDispatched`, `ToolCompleted`,
            `ToolResolved`), by tool call id, folded as a run's calls are. A graph thread has
            no turns to bound them, so they are kept until the thread is deleted.
        next_offset: The offset to read the run's partition from to continue this fold.
    """

    run_id: str
    tenant: str = ""
    guard: SequenceGuard = field(default_factory=SequenceGuard)
    checkpoints: dict[str, dict[str, GraphCheckpointed]] = field(default_factory=dict)
    values: dict[tuple[str, str, str], Serialized | None] = field(default_factory=dict)
    writes: dict[tuple[str, str], dict[WriteKey, StoredWrite]] = field(default_factory=dict)
    waiting_on: str | None = None
    calls: dict[str, CallState] = field(default_factory=dict)
    next_offset: int | None = None

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
        if not self.tenant:
            self.tenant = event.tenant
        if isinstance(event, GraphCheckpointed):
            self._checkpointed(event)
        elif isinstance(event, GraphWritesSaved):
            self._writes(event)
        elif isinstance(event, ToolDispatched | ToolCompleted | ToolResolved):
            self.calls[event.call_id] = call_after(self.calls.get(event.call_id), event)
        elif isinstance(event, GraphCheckpointsRemoved):
            self._removed(event)
        elif isinstance(event, GraphThreadDeleted):
            self.checkpoints.clear()
            self.values.clear()
            self.writes.clear()
            self.calls.clear()
            self.waiting_on = None
        elif isinstance(event, ApprovalRequested):
            self.waiting_on = event.request_id
        elif (
            isinstance(event, ApprovalGranted | ApprovalDenied)
            and self.waiting_on == event.request_id
        ):
            self.waiting_on = None
        return True

    def _checkpointed(self, event: GraphCheckpointed) -> None:
        ns = event.checkpoint_ns
        self.checkpoints.setdefault(ns, {})[event.checkpoint_id] = event
        for item in event.values:
            self.values[(ns, item.channel, item.version)] = item.value

    def _removed(self, event: GraphCheckpointsRemoved) -> None:
        # Channel values stay: a kept checkpoint may refer to a version an earlier one saved.
        for ref in event.checkpoints:
            saved = self.checkpoints.get(ref.checkpoint_ns)
            if saved is not None:
                saved.pop(ref.checkpoint_id, None)
                if not saved:
                    del self.checkpoints[ref.checkpoint_ns]
            self.writes.pop((ref.checkpoint_ns, ref.checkpoint_id), None)

    def _writes(self, event: GraphWritesSaved) -> None:
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


__all__ = ["StoredWrite", "ThreadState"]
