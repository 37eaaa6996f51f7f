"""Which checkpoints of a thread `prune` and `delete_for_runs` remove, and where the runs are.

Both append `GraphCheckpointsRemoved` under the thread's lease: the checkpoints it names, and
their pending writes, are gone for every reader at once; their bytes go when compaction cuts
the run's prefix. The choices here read a thread's fold and decide; they write nothing.

``keep_latest`` keeps the latest checkpoint of each namespace, except that the checkpoints of
a subgraph call (a namespace with a task id after ``:``) go with the root checkpoint the call
started from when that one is saved and is not the root's latest. A thread whose graph uses a
``DeltaChannel`` is refused: its latest values are rebuilt from older checkpoints' writes.

The saver's own appends (a list saved as the items it added to an earlier version) need no
such refusal: removing a checkpoint removes it and its writes from reads, never the values it
saved, so a kept checkpoint's list still reaches the versions it extends. Whatever one day
drops the bytes of removed checkpoints must keep the records that hold those versions.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any

from onward.errors import ConfigurationError, InvalidInputError
from onward.eventlog import (
    EventLog,
    GraphCheckpointed,
    GraphCheckpointRef,
    Serialized,
    UnreadableRecord,
)
from onward.projections import FrontierStore
from onward.projections.compaction import CompactionStore

from .thread import ThreadState

Loads = Callable[[Serialized], Any]
"""A serialized LangGraph value back as the value (the saver's serializer)."""

SCAN_BATCH = 2_000
"""How many records ``threads_of_runs`` reads at a time."""

ROWS_PAGE = 500
"""How many of the tenant's frontier rows ``threads_of_runs`` looks at a time for threads
compaction cut out of the log."""

_PLAIN_FORMATS = frozenset({"msgpack", "json"})
"""Serializer formats that hold strings as their UTF-8 bytes (not encrypted, not compressed)."""

_DELTA_METADATA = ("counters_since_delta_snapshot", "delta_writes_versioned")


def keep_latest(state: ThreadState, loads: Loads) -> list[GraphCheckpointRef]:
    """Every checkpoint of the thread but the latest of each namespace (see the module).

    Raises:
        InvalidInputError: The thread's graph uses a ``DeltaChannel``.
    """
    refuse_delta_channels(state, loads)
    heads = {ns: max(saved) for ns, saved in state.checkpoints.items() if saved}
    root = heads.get("")
    gone: list[GraphCheckpointRef] = []
    for ns, saved in state.checkpoints.items():
        drop_all = False
        if ":" in ns:
            started_from = loads(saved[heads[ns]].metadata).get("parents", {}).get("")
            drop_all = started_from in state.checkpoints.get("", {}) and started_from != root
        gone.extend(
            GraphCheckpointRef(checkpoint_ns=ns, checkpoint_id=checkpoint_id)
            for checkpoint_id in saved
            if drop_all or checkpoint_id != heads[ns]
        )
    return gone


def refuse_delta_channels(state: ThreadState, loads: Loads) -> None:
    """Raise if the thread's graph uses a ``DeltaChannel`` (its metadata counts snapshots).

    Raises:
        InvalidInputError: It does; nothing may be pruned from it.
    """
    for event in _saved(state):
        metadata = loads(event.metadata)
        if any(key in metadata for key in _DELTA_METADATA):
            raise InvalidInputError(
                f"thread {state.run_id!r} uses a DeltaChannel, whose latest values are "
                "rebuilt from older checkpoints: keep_latest would lose them; prune it with "
                "strategy='delete' or leave it",
                run_id=state.run_id,
            )


def of_runs(state: ThreadState, run_ids: Collection[str], loads: Loads) -> list[GraphCheckpointRef]:
    """The thread's checkpoints whose metadata names one of the LangGraph ``run_ids``."""
    return [
        GraphCheckpointRef(checkpoint_ns=event.checkpoint_ns, checkpoint_id=event.checkpoint_id)
        for event in _saved(state)
        if loads(event.metadata).get("run_id") in run_ids
    ]


async def threads_of_runs(
    log: EventLog,
    *,
    tenant: str,
    run_ids: Collection[str],
    loads: Loads,
    frontiers: FrontierStore | None = None,
    compaction: CompactionStore | None = None,
) -> list[str]:
    """The threads of ``tenant`` holding a checkpoint saved by one of the LangGraph runs.

    Reads every partition of the log once: nothing indexes LangGraph's run ids by thread.
    A thread compaction cut out of the log lives on in ``compaction``'s retained copies: the
    tenant's frontier rows name the runs, and those compaction truncated are read there too.
    Metadata in a plain format (msgpack, JSON) that does not contain a run id's bytes is not
    decoded. What the scan finds is a candidate: each thread's own fold decides what goes.
    A record that cannot be read (another writer's junk on the log) is passed over, as
    projectors pass it over: no reader counts it as a checkpoint, so there is nothing of it to
    remove, and it must not stop the deletion for every tenant.

    Raises:
        ConfigurationError: Compaction has cut the log but no frontier store says which runs it
            cut: the threads only its copies hold could not be found.
    """
    wanted = [run_id.encode() for run_id in run_ids]
    found: dict[str, None] = {}

    def names_a_run(event: object) -> bool:
        return (
            isinstance(event, GraphCheckpointed)
            and event.tenant == tenant
            and _may_name(event.metadata, wanted)
            and loads(event.metadata).get("run_id") in run_ids
        )

    for partition in range(log.partitions):
        bounds = await log.bounds(partition)
        start = bounds.start
        while start < bounds.end:
            batch = await log.read_records(partition, start, bounds.end, limit=SCAN_BATCH)
            if not batch:
                break
            for stored in batch:
                if not isinstance(stored, UnreadableRecord) and names_a_run(stored.event):
                    found[stored.event.run_id] = None
            start = batch[-1].position.offset + 1
    if compaction is not None:
        for run_id in await _cut_runs(frontiers, compaction, tenant):
            if run_id not in found and any(
                names_a_run(kept.stored().event) for kept in await compaction.retained(run_id)
            ):
                found[run_id] = None
    return list(found)


async def _cut_runs(
    frontiers: FrontierStore | None, compaction: CompactionStore, tenant: str
) -> list[str]:
    """The tenant's runs compaction truncated (some of their events are only in its copies).

    Raises:
        ConfigurationError: The log was cut and there are no frontier rows to name the runs.
    """
    if not await compaction.cuts():
        return []  # nothing was cut: the log holds every thread whole
    if frontiers is None:
        raise ConfigurationError(
            "compaction has cut the log, so threads may live only in its retained copies; "
            "finding them needs the frontier rows that name them "
            "(OnwardSaver(..., frontiers=...))"
        )
    out: list[str] = []
    after: str | None = None
    while True:
        page = await frontiers.runs(tenant=tenant, after=after, limit=ROWS_PAGE)
        if not page:
            return out
        out.extend(await compaction.truncations([row.run_id for row in page]))
        after = page[-1].run_id


def _may_name(metadata: Serialized, run_ids: list[bytes]) -> bool:
    """Whether metadata may name one of the run ids; only a plain format can say no unread."""
    if metadata.type not in _PLAIN_FORMATS:
        return True
    return any(run_id in metadata.data for run_id in run_ids)


def _saved(state: ThreadState) -> Iterable[GraphCheckpointed]:
    return (event for saved in state.checkpoints.values() for event in saved.values())


__all__ = ["keep_latest", "of_runs", "refuse_delta_channels", "threads_of_runs"]
