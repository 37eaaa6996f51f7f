"""Records no Onward of this version can read, and the direct fold of the runs around them."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from onward.eventlog import EVENT_FORMAT, Event
from onward.eventlog.base import EventLog, StoredEvent
from onward.projections.frontier import Frontier, ToolCallRow
from onward.testing.eventlog import runs_in_partition
from support.histories import RunScript, fold_each, interleaved


def not_json(run_id: str, seq: int) -> bytes:
    """Bytes that are not JSON at all (a foreign producer, or a corrupted value)."""
    return b"\x00\x01secret-token=hunter2 not json {"


def unknown_kind(run_id: str, seq: int) -> bytes:
    """A well-formed envelope of a kind this code does not know."""
    return msgspec.json.encode(
        {"kind": "run.exploded", "run_id": run_id, "tenant": "acme", "seq": seq, "fence": 1}
    )


def _claimed(run_id: str, seq: int, **fields: object) -> bytes:
    """A run.claimed record of ``run_id`` at ``seq`` with ``fields`` over its envelope."""
    envelope = {"kind": "run.claimed", "run_id": run_id, "tenant": "acme", "seq": seq, "fence": 1}
    return msgspec.json.encode(envelope | fields)


def newer_format(run_id: str, seq: int) -> bytes:
    """A known kind written in the event format after this code's."""
    return _claimed(run_id, seq, format=EVENT_FORMAT + 1, worker="from-the-future")


def out_of_range(run_id: str, seq: int) -> bytes:
    """A known kind, well formed, with a time no store's 64-bit integer holds (a forged or
    damaged record): read, it would fail the write of every run stored with it."""
    return _claimed(run_id, seq, at=2**64, worker="from-nowhere")


def misfiled(run_id: str, seq: int) -> bytes:
    """A readable event of another run, filed under ``run_id`` (a foreign producer's key, or a
    bug's): read as it is, it would be another run's event returned as this one's."""
    return _claimed(f"{run_id}-elsewhere", seq, worker="misfiled")


BAD_RECORDS: dict[str, Callable[[str, int], bytes]] = {
    "not-json": not_json,
    "unknown-kind": unknown_kind,
    "newer-format": newer_format,
    "out-of-range": out_of_range,
    "misfiled": misfiled,
}
"""Each kind of poison record, by name, built for a run and the seq it would have taken."""

KIND_HEADERS: dict[str, str | None] = {
    "not-json": None,
    "unknown-kind": "run.exploded",
    "newer-format": "run.claimed",
    "out-of-range": "run.claimed",
    "misfiled": "run.claimed",
}
"""The ``onward.kind`` header a foreign producer would have put on each (None: no header)."""

REASONS: dict[str, str] = {
    "not-json": "malformed",
    "unknown-kind": "run.exploded",
    "newer-format": "newer than this code reads",
    "out-of-range": "<= 9223372036854775807 - at `$.at`",
    "misfiled": "but is an event of run",
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
    return fold_each(await readable_events(log), run_ids)


@dataclass
class PoisonedPartition:
    """Runs sharing one partition; run ``a`` gets a poison record after its first steps.

    Attributes:
        a: The run whose record cannot be read.
        a_steps: Its steps; the poison record goes after the first ``before`` of them and
            takes the seq the next one carries.
        others: The other runs' steps, interleaved as concurrent runs append.
        before: How many of ``a``'s steps precede the poison record.
    """

    a: str
    a_steps: list[list[Event]]
    others: list[list[Event]]
    before: int = 2

    @property
    def other_ids(self) -> list[str]:
        return list(dict.fromkeys(step[0].run_id for step in self.others))

    @property
    def bad_seq(self) -> int:
        return self.a_steps[self.before][0].seq

    def a_events(self, steps: slice) -> int:
        return sum(len(step) for step in self.a_steps[steps])


def poisoned_partition(
    rng: random.Random, *, partition: int, partitions: int, runs: int = 100
) -> PoisonedPartition:
    """``runs`` runs in ``partition`` (of ``partitions``): run A and ``runs - 1`` others."""
    ids = runs_in_partition(partition, runs, partitions)
    scripts = []
    for run_id in ids:
        script = RunScript(rng)
        script.run_id = run_id
        scripts.append(script.steps())
    return PoisonedPartition(ids[0], scripts[0], interleaved(rng, scripts[1:]))
