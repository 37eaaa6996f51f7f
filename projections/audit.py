"""The audit timeline of a run: every stored record in log order, refused ones marked.

Audit teams replay what a run did call by call. The timeline is what every reader of the log
sees: each stored event with the verdict `SequenceGuard` reaches on it, so an event written
under a superseded fence, or a seq written twice, shows up as stored but not counted. A record
that cannot be read (not an event, an unknown kind, a newer format) is shown in its place with
its offset and why, and every readable event around it is still shown: the whole truth, though
resume and inspect refuse a run whose history has such a hole.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from onward.errors import NothingToResumeError
from onward.eventlog import events as ev
from onward.eventlog.base import (
    EventLog,
    LogRecord,
    Position,
    RefusedEvent,
    SequenceGuard,
    StoredEvent,
    UnreadableRecord,
    partition_for,
)
from onward.eventlog.events import Event, kind_of
from onward.eventlog.references import is_reference, unescaped


@dataclass(frozen=True, slots=True)
class AuditLine:
    """One stored record of a run as the audit timeline shows it.

    Attributes:
        stored: The event and its position; ``None`` for an unreadable record.
        refused: Why readers do not count it, if they do not.
        unreadable: The record that cannot be read, in its place; ``None`` for an event.
    """

    stored: StoredEvent | None
    refused: RefusedEvent | None
    unreadable: UnreadableRecord | None = None
    retained: bool = False
    """The event is a retained copy: compaction cut it from the log, it was tagged."""

    @property
    def position(self) -> Position:
        """Where the record sits."""
        if self.stored is not None:
            return self.stored.position
        assert self.unreadable is not None
        return self.unreadable.position

    def as_json(self) -> dict[str, Any]:
        """One JSON-lines object: the position, the verdict, and the event as stored (for an
        unreadable record: its kind if known and why it cannot be read, never its bytes)."""
        if self.stored is None:
            bad = self.unreadable
            assert bad is not None
            return {
                "run_id": bad.run_id,
                "partition": bad.position.partition,
                "offset": bad.position.offset,
                "seq": bad.error.seq,
                "fence": None,
                "kind": bad.kind,
                "at": None,
                "description": f"unreadable record: {bad.reason}",
                "refused": False,
                "retained": False,
                "unreadable": True,
                "reason": "newer_format" if bad.newer_format else "unreadable",
                "detail": bad.reason,
                "event": None,
            }
        event = self.stored.event
        return {
            "run_id": event.run_id,
            "partition": self.stored.position.partition,
            "offset": self.stored.position.offset,
            "seq": event.seq,
            "fence": event.fence,
            "kind": kind_of(type(event)),
            "at": event.at,
            "description": describe_event(event),
            "refused": self.refused is not None,
            "retained": self.retained,
            "unreadable": False,
            "reason": self.refused.reason.value if self.refused else None,
            "detail": self.refused.detail if self.refused else None,
            "event": event,
        }


_INVISIBLE = [
    *range(0x20),  # C0: ESC starts CSI/OSC sequences, BEL ends OSC, CR and BS overwrite
    0x7F,
    *range(0x80, 0xA0),  # C1: 0x9B is CSI and 0x9D is OSC on terminals that read them
    0x200E,
    0x200F,
    0x2028,
    0x2029,
    *range(0x202A, 0x202F),  # bidirectional embeddings and overrides: text shown reordered
    *range(0x2066, 0x206A),  # bidirectional isolates
]
_ESCAPES = {code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" for code in _INVISIBLE}


def printable(text: str) -> str:
    """``text`` with every control character shown as its escape (ESC as ``\\x1b``).

    Run content (model output, tool results, labels, ids, tenants) is written by whoever
    controls a model, a tool or a producer on the log; printed as it is, an ESC sequence in
    it retitles the operator's window, clears the screen or hides text, and a newline forges
    a line of its own. Everything a person reads that holds such content, on a terminal or in
    a log line, goes through this. C0 and C1 controls, DEL and the Unicode line separators
    and bidirectional overrides are escaped; backslashes are left as they are, so the result
    is for reading, not for parsing back.
    """
    return text.translate(_ESCAPES)


_ANSI_C = {"\\": "\\\\", "'": "\\'"}
"""What ends or escapes text in ``$'...'``, escaped there."""


def shell_word(text: str) -> str:
    """``text`` as one shell word that gives back exactly ``text`` when pasted into a shell.

    A run id (a tenant, a call id) may hold what `printable` escapes (a C1 control, a
    right-to-left override): `shlex.quote` keeps it, and `printable` then shows its escape,
    which pasted back names another run (a next page would list runs again, a command would
    find no run). Such text is ANSI-C quoted (``$'run\\u202e1'``, read so by bash, zsh and
    ksh), which `printable` leaves as it is.
    """
    if printable(text) == text:
        return shlex.quote(text)
    escaped = (_ANSI_C.get(c) or (c if printable(c) == c else f"\\u{ord(c):04x}") for c in text)
    return f"$'{''.join(escaped)}'"


_JSON_ESCAPES = {code: f"\\u{code:04x}" for code in _INVISIBLE if code >= 0x20}
"""What JSON leaves raw of `_INVISIBLE` (it escapes the C0 controls itself), as JSON escapes."""


def printable_json(value: Any) -> str:
    """``value`` as one line of JSON a terminal can be shown: every character `printable`
    escapes is a JSON escape (``\\u009b``), so the text decodes to the same value.

    JSON escapes the C0 controls but leaves DEL, the C1 controls (0x9B is CSI) and the
    Unicode separators and bidirectional overrides raw; ``--json`` output is read on a
    terminal as often as by a program. Outside strings JSON is ASCII, so escaping them
    anywhere in the text is escaping them in strings.
    """
    return msgspec.json.encode(value).decode().translate(_JSON_ESCAPES)


def one_line(value: Any, limit: int = 60) -> str:
    """A value as one short printable line of text, for tables read by people."""
    text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
    text = printable(" ".join(text.split()))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _body(value: Any) -> str:
    """A body (an input, a result, an output) as a person reads it: one the claim check moved
    out of line is said to be in the blob store, as its reference names only a digest, and one
    wrapped because it looked like a reference is shown as it was given (`unescaped`)."""
    if is_reference(value):
        return f"(in the blob store, {one_line(value['size'])} bytes)"
    return one_line(unescaped(value))


def _content(content: str | list[Any]) -> str:
    """A model message's content as `_body` shows a body: the claim check moves it out as
    its one part."""
    if isinstance(content, list) and len(content) == 1:
        part = content[0]
        return _body(part) if is_reference(part) else one_line([unescaped(part)])
    return one_line(content)


def _ids(call_ids: Sequence[str]) -> str:
    return ", ".join(call_ids) or "none"


def _model_answered(event: ev.ModelAnswered) -> str:
    usage = f"{event.usage.input_tokens} in, {event.usage.output_tokens} out"
    if event.tool_calls:
        calls = ", ".join(f"{c.call_id} {c.tool}" for c in event.tool_calls)
        return f"asks for {calls} ({usage})"
    return f"answers {_content(event.message.content)} ({usage})"


def _tool_completed(event: ev.ToolCompleted) -> str:
    if event.error is not None:
        return f"{event.call_id} failed: {event.error.type} {one_line(event.error.message)}"
    return f"{event.call_id} returned {_body(event.result)}"


def _finished(event: ev.RunFinished) -> str:
    said = event.error if event.error is not None else _body(event.output)
    return f"{event.status}: {said}"


def _started(event: ev.RunStarted) -> str:
    """A run carried on from another is given no input: its conversation is that run's."""
    ran = f"{event.agent} {event.revision or '(no revision: never ran)'}"
    if event.continuation_of is not None:
        return f"{ran}, carried on from {event.continuation_of}"
    return f"{ran}, input {_body(event.input)}"


# One entry per kind, as the fold has one rule per kind; a kind without one fails loudly.
_DESCRIPTIONS: dict[type[Event], Callable[[Any], str]] = {
    ev.RunStarted: _started,
    ev.RunClaimed: lambda e: f"claimed by {e.worker}",
    ev.ResumePlanned: lambda e: (
        f"replayed {_ids(e.replayed)}, dispatched {_ids(e.dispatched)}, "
        f"undecided {_ids(e.undecided)}"
    ),
    ev.ModelAnswered: _model_answered,
    ev.ToolDispatched: lambda e: f"{e.call_id} {e.tool}, key {e.idempotency_key}",
    ev.ToolCompleted: _tool_completed,
    ev.ToolResolved: lambda e: f"{e.call_id} settled as {e.outcome} by {e.by}: {one_line(e.why)}",
    ev.TurnSettled: lambda e: (
        f"iteration {e.iteration} settled: {', '.join(e.call_ids) or 'no calls'}"
    ),
    ev.ApprovalRequested: lambda e: f"{e.request_id}: {one_line(e.prompt)}",
    ev.ApprovalGranted: lambda e: f"{e.request_id} approved by {e.by}",
    ev.ApprovalDenied: lambda e: f"{e.request_id} denied by {e.by}",
    ev.Tagged: lambda e: f"seq {e.target_seq} tagged {e.label}",
    ev.RunContinued: lambda e: f"continued as {e.new_run_id}",
    ev.RunFinished: _finished,
    ev.GraphCheckpointed: lambda e: f"checkpoint {e.checkpoint_id} in {e.checkpoint_ns!r}",
    ev.GraphWritesSaved: lambda e: (
        f"{len(e.writes)} writes of task {e.task_id} on checkpoint {e.checkpoint_id}"
    ),
    ev.GraphThreadDeleted: lambda e: "thread deleted",
    ev.GraphCheckpointsRemoved: lambda e: (
        f"{len(e.checkpoints)} checkpoints removed: {one_line(e.why)}"
    ),
}


def describe_event(event: Event) -> str:
    """A few words on what an event says, for the audit timeline; `printable`, as every field
    in it came from the run."""
    return printable(_DESCRIPTIONS[type(event)](event))


async def audit_timeline(
    log: EventLog, run_id: str, *, tenant: str, archived: bool = False
) -> list[AuditLine]:
    """Every stored record of a run in log order, each event with the verdict every reader
    reaches, each unreadable record marked in its place.

    When compaction removed the run's beginning, the first event's seq is above 1 and the
    verdicts are reached from where the stored events start.

    Only the tenant's records are read: once compaction cut a collected run, its id is free,
    and an archive holds the old run's records with those of another tenant's run under it.
    ``archived``: ``log`` reads the archive too, so the tenant's own new run under the id may
    follow the old one (`timeline_of`'s ``reused``).

    Raises:
        NothingToResumeError: No run under that id for that tenant.
    """
    records = await log.read_records(partition_for(run_id, log.partitions), run_id=run_id)
    lines = timeline_of([r for r in records if _tenant_of(r) in (tenant, None)], reused=archived)
    check_owner(lines, run_id, tenant)
    return lines


def _tenant_of(record: LogRecord) -> str | None:
    """The tenant a record names, ``None`` when it cannot be read that far."""
    return record.event.tenant if isinstance(record, StoredEvent) else record.tenant


def timeline_of(
    records: Sequence[LogRecord],
    *,
    after: tuple[int, int] | None = None,
    reused: bool = False,
) -> list[AuditLine]:
    """The audit lines of one run's records, in the order given: the verdicts are reached from
    ``after`` (the last counted seq and the fence before the records, as a truncation point
    keeps them), else from the first event's seq on (above 1 when compaction removed the run's
    beginning).

    A run that ended and was collected leaves its id free once compaction cut it, and its
    tenant may start a new run under it: read with the archive (``reused``), a start at seq 1
    after the old run's end begins that run's history, judged afresh, not as duplicates of the
    old one. Read from the log alone, the id was not free (the old run is still there), so such
    a start is a superseded writer's, refused as every reader refuses it.
    """
    first = next((r.event for r in records if isinstance(r, StoredEvent)), None)
    guard = SequenceGuard()
    if after is not None:
        guard = SequenceGuard(last_seq=after[0], fence=after[1])
    elif first is not None and first.seq > 1:
        guard = SequenceGuard(last_seq=first.seq - 1, fence=first.fence)
    lines: list[AuditLine] = []
    ended = False
    for item in records:
        if isinstance(item, UnreadableRecord):
            lines.append(AuditLine(None, None, item))
            if item.error.seq == guard.last_seq + 1:
                # It says it holds the run's next seq (written by a newer Onward, say): the
                # events after it follow it, not a gap.
                guard.last_seq += 1
            continue
        if reused and ended and _starts_anew(item.event):
            guard, ended = SequenceGuard(), False
        counted = guard.admit(item)
        lines.append(AuditLine(item, None if counted else guard.refused[-1]))
        ended = ended or (counted and isinstance(item.event, ev.RunFinished | ev.RunContinued))
    return lines


def _starts_anew(event: Event) -> bool:
    """Whether ``event`` starts a run's history (a `RunStarted` at seq 1): after a counted end
    of the run, a new run under the same id."""
    return isinstance(event, ev.RunStarted) and event.seq == 1


def check_owner(lines: Sequence[AuditLine], run_id: str, tenant: str) -> None:
    """Refuse a timeline with no counted event, or one of another tenant's run.

    Raises:
        NothingToResumeError: No run under that id for that tenant.
    """
    first_counted = next(
        (line.stored for line in lines if line.stored is not None and line.refused is None), None
    )
    if first_counted is None or first_counted.event.tenant != tenant:
        raise NothingToResumeError(
            f"no run {run_id!r} for tenant {tenant!r}; check the id and tenant", run_id=run_id
        )


__all__ = [
    "AuditLine",
    "audit_timeline",
    "check_owner",
    "describe_event",
    "one_line",
    "printable",
    "printable_json",
    "timeline_of",
]
