"""Records no Onward of this version can read, and the direct fold of the runs around them."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from onward.eventlog import EVENT_FORMAT
from onward.eventlog.base import EventLog, StoredEvent
from onward.projections.frontier import Frontier, ToolCallRow, fold_run


def not_json(run_id: str, seq: int) -> bytes:
    """Bytes that are not JSON at all (a foreign producer, or a corrupted value)."""
    return b"\x00\x01secret-token=hunter2 not json {"


def unknown_kind(run_id: str, seq: int) -> bytes:
    """A well-formed envelope of a kind this code does not know."""
    return msgspec.json.encode(
        {"kind": "run.exploded", "run_id": run_id, "tenant": "acme", "seq": seq, "fence": 1}
    )


def newer_format(run_id: str, seq: int) -> bytes:
    """A known kind written in the event format after this code's."""
    return msgspec.json.encode(
        {
            "kind": "run.claimed",
            "run_id": run_id,
            "tenant": "acme",
            "seq": seq,
            "fence": 1,
            "format": EVENT_FORMAT + 1,
            "worker": "from-the-future",
        }
    )


BAD_RECORDS: dict[str, Callable[[str, int], bytes]] = {
    "not-json": not_json,
    "unknown-kind": unknown_kind,
    "newer-format": newer_format,
}
"""Each kind of poison record, by name, built for a run and the seq it would have taken."""

KIND_HEADERS: dict[str, str | None] = {
    "not-json": None,
    "unknown-kind": "run.exploded",
    "newer-format": "run.claimed",
}
"""The ``onward.kind`` header a foreign producer would have put on each (None: no header)."""

REASONS: dict[str, str] = {
    "not-json": "malformed",
    "unknown-kind": "run.exploded",
    "newer-format": "newer than this code reads",
}
"""A few words each reason must contain."""


async def readable_events(log: EventLog) -> dict[str, list[StoredEvent]]:
    """Every readable event of the log by run, in log order; unreadable records left out."""
    by_run: dict[str, list[StoredEvent]] = {}
    for partition in range(log.partitions):
        for record in await log.read_records(partition):
            if isinstance(record, StoredEvent):
                by_run.setdefault(record.event.run_id, []).append(record)
    return by_run


async def tolerant_direct_fold(
    log: EventLog, run_ids: Sequence[str]
) -> tuple[dict[str, Frontier], dict[tuple[str, str], ToolCallRow]]:
    """What the runs' frontiers and call rows must be, folded straight from their readable
    events; for runs with no unreadable record that is the whole fold."""
    by_run = await readable_events(log)
    frontiers: dict[str, Frontier] = {}
    calls: dict[tuple[str, str], ToolCallRow] = {}
    for run_id in run_ids:
        events = by_run[run_id]
        frontiers[run_id] = fold_run(Frontier.empty(run_id, events[0].event.tenant), events, calls)
    return frontiers, calls
