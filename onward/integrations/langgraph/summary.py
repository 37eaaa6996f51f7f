"""A thread's fold at one of its events, kept beside the log, so a reader that has not folded
the thread folds only the log after it instead of the thread's whole history.

The summary holds what reading a thread's latest checkpoints and writing the thread on need:
the seq and fence the thread was at, the newest checkpoint of each namespace with its pending
writes, every channel version those checkpoints refer to and the latest version of every
channel (whole: a list as all its items), the open interrupt and the thread's tool calls
(with how often a person sent each one again), and the tokens of the model calls its own
writes carry (`ThreadState.spent`).
A state restored from it is `ThreadState.partial`: asking for anything older (an earlier
checkpoint, the list of them all) folds the thread from its first event.

Only the thread's holder writes one, from its own fold, after the lease confirmed the events
it covers, once the bytes appended since the last summary exceed that summary's own size: the
stored bytes at most double, and a thread's bytes per step stay flat. A store keeps one per
thread and replaces it only by one at a higher seq. A summary is a cache: one that is missing,
from another format, unreadable, of another run or tenant, or whose last event the log does
not hold at its offset with its seq, fence and time, is ignored and the thread is folded from
its first event; a summary never speaks for an event after the one it names, so a write it
does not cover (another writer's claim, a refused append) is folded from the log like any.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

import msgspec
import zstandard

from onward._storage import AsyncResource, PostgresStore, Resource, SqliteStore
from onward.eventlog import (
    EventLog,
    GraphCheckpointed,
    SequenceGuard,
    Serialized,
    SqliteEventLog,
    Usage,
)
from onward.projections.frontier import CallState

from .thread import ChannelNode, StoredWrite, ThreadState

SUMMARY_FORMAT = 2
"""The summary layout this code writes and reads; a summary of any other is ignored (format 1
had no ``sent_again``: a thread summarized in it is folded from its first event)."""


class SummaryValue(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One channel version, whole: ``items`` for a list, else ``value``."""

    ns: str
    channel: str
    version: str
    value: Serialized | None
    items: list[Serialized] | None


class SummaryWrite(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One pending write of a checkpoint the summary holds."""

    ns: str
    checkpoint_id: str
    task_id: str
    idx: int
    channel: str
    value: Serialized
    task_path: str


class ThreadSummary(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A thread's fold through its counted event ``last_seq``, stored at ``last_offset``.

    ``last_fence`` and ``last_at`` are that event's: a reader checks the log holds it there
    before it trusts the rest.
    """

    format: int = SUMMARY_FORMAT
    run_id: str
    tenant: str
    last_seq: int
    fence: int
    last_offset: int
    last_fence: int
    last_at: int
    checkpoints: list[GraphCheckpointed]
    values: list[SummaryValue]
    latest: list[tuple[str, str, str]]
    writes: list[SummaryWrite]
    waiting_on: str | None
    calls: list[CallState]
    waiting_at: tuple[str, str] | None = None
    sent_again: dict[str, int] = {}
    spent: Usage = Usage()
    spent_calls: int = 0
    spent_seqs: list[int] = []
    cancelled_as: str = ""


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ThreadSummary)


def encode(summary: ThreadSummary) -> bytes:
    """The summary's stored bytes (msgpack, zstd-compressed)."""
    return zstandard.ZstdCompressor(level=1).compress(_encoder.encode(summary))


def decode(body: bytes) -> ThreadSummary | None:
    """The summary in ``body``; ``None`` for bytes this code cannot read (another format)."""
    try:
        summary = _decoder.decode(zstandard.ZstdDecompressor().decompress(body))
    except (zstandard.ZstdError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    return summary if summary.format == SUMMARY_FORMAT else None


def summarize(
    state: ThreadState,
    *,
    last_offset: int,
    last_fence: int,
    last_at: int,
    refers: Callable[[GraphCheckpointed], Iterable[tuple[str, str]]],
) -> ThreadSummary:
    """What a reader needs of ``state`` (see the module); ``refers`` names the (channel,
    version) pairs a checkpoint refers to."""
    checkpoints = [state.checkpoints[ns][newest] for ns, newest in state.newest.items()]
    wanted: dict[tuple[str, str, str], None] = {}
    for event in checkpoints:
        for channel, version in refers(event):
            wanted[(event.checkpoint_ns, channel, version)] = None
    for (ns, channel), version in state.latest.items():
        wanted[(ns, channel, version)] = None
    values = [_whole(key, node) for key in wanted if (node := state.values.get(key)) is not None]
    # A task's writes may land before the checkpoint they are for (LangGraph saves them
    # apart): kept too, or a reader folding on from here loses them when it comes.
    heads = {(event.checkpoint_ns, event.checkpoint_id) for event in checkpoints}
    writes = [
        SummaryWrite(ns, checkpoint_id, task_id, idx, w.channel, w.value, w.task_path)
        for (ns, checkpoint_id), saved in state.writes.items()
        if (ns, checkpoint_id) in heads or checkpoint_id not in state.checkpoints.get(ns, {})
        for (task_id, idx), w in saved.items()
    ]
    return ThreadSummary(
        run_id=state.run_id,
        tenant=state.tenant,
        last_seq=state.last_seq,
        fence=state.fence,
        last_offset=last_offset,
        last_fence=last_fence,
        last_at=last_at,
        checkpoints=checkpoints,
        values=values,
        latest=[(ns, channel, version) for (ns, channel), version in state.latest.items()],
        writes=writes,
        waiting_on=state.waiting_on,
        calls=list(state.calls.values()),
        waiting_at=state.waiting_at,
        sent_again=dict(state.sent_again),
        spent=state.spent,
        spent_calls=state.spent_calls,
        spent_seqs=list(state.spent_seqs),
        cancelled_as=state.cancelled_as,
    )


def restored(summary: ThreadSummary, *, snapshot_every: int) -> ThreadState:
    """The `ThreadState.partial` fold a summary holds, to be folded on from the event after
    ``summary.last_offset``."""
    state = ThreadState(
        run_id=summary.run_id,
        tenant=summary.tenant,
        guard=SequenceGuard(last_seq=summary.last_seq, fence=summary.fence),
        snapshot_every=snapshot_every,
        waiting_on=summary.waiting_on,
        waiting_at=summary.waiting_at,
        next_offset=summary.last_offset + 1,
        partial=True,
        spent=summary.spent,
        spent_calls=summary.spent_calls,
        spent_seqs=list(summary.spent_seqs),
        cancelled_as=summary.cancelled_as,
    )
    for event in summary.checkpoints:
        state.checkpoints.setdefault(event.checkpoint_ns, {})[event.checkpoint_id] = event
        state.newest[event.checkpoint_ns] = event.checkpoint_id
    for item in summary.values:
        node = (
            ChannelNode(value=item.value)
            if item.items is None
            else ChannelNode(items=tuple(item.items), listed=True, length=len(item.items))
        )
        state.values[(item.ns, item.channel, item.version)] = node
    for ns, channel, version in summary.latest:
        state.latest[(ns, channel)] = version
    for w in summary.writes:
        state.writes.setdefault((w.ns, w.checkpoint_id), {})[(w.task_id, w.idx)] = StoredWrite(
            w.task_id, w.channel, w.value, w.task_path
        )
    state.calls = {call.call_id: call for call in summary.calls}
    state.sent_again = dict(summary.sent_again)
    return state


def _whole(key: tuple[str, str, str], node: ChannelNode) -> SummaryValue:
    ns, channel, version = key
    if node.listed:
        return SummaryValue(ns, channel, version, None, node.all_items())
    return SummaryValue(ns, channel, version, node.value, None)


# -- where summaries are kept ---------------------------------------------------------------


@runtime_checkable
class ThreadSummaryStore(AsyncResource, Protocol):
    """One summary per thread (run id), beside the log (see the module)."""

    async def get(self, run_id: str) -> bytes | None:
        """The stored summary of a thread, as stored; ``None`` if there is none."""
        ...

    async def put(self, run_id: str, tenant: str, last_seq: int, body: bytes) -> None:
        """Store a thread's summary unless one at ``last_seq`` or higher is stored already."""
        ...

    async def delete(self, run_id: str) -> None:
        """Forget a thread's summary (its reader folds it from its first event)."""
        ...


class MemoryThreadSummaries(Resource):
    """Summaries in a dict, for an in-memory log."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[int, bytes]] = {}

    async def get(self, run_id: str) -> bytes | None:
        row = self._rows.get(run_id)
        return row[1] if row is not None else None

    async def put(self, run_id: str, tenant: str, last_seq: int, body: bytes) -> None:
        row = self._rows.get(run_id)
        if row is None or row[0] < last_seq:
            self._rows[run_id] = (last_seq, bytes(body))

    async def delete(self, run_id: str) -> None:
        self._rows.pop(run_id, None)


_UPSERT = (
    "INSERT INTO onward_graph_summaries (run_id, tenant, last_seq, body) VALUES ({}) "
    "ON CONFLICT (run_id) DO UPDATE SET tenant = excluded.tenant, "
    "last_seq = excluded.last_seq, body = excluded.body "
    "WHERE excluded.last_seq > onward_graph_summaries.last_seq"
)


class SqliteThreadSummaries(SqliteStore):
    """Summaries in the embedded SQLite file (see `SqliteStore` for the arguments)."""

    what = "thread summary store"

    async def get(self, run_id: str) -> bytes | None:
        def read(conn: sqlite3.Connection) -> bytes | None:
            row = conn.execute(
                "SELECT body FROM onward_graph_summaries WHERE run_id = ?", (run_id,)
            ).fetchone()
            return bytes(row[0]) if row else None

        return await self._db.read(read, "reading a thread summary")

    async def put(self, run_id: str, tenant: str, last_seq: int, body: bytes) -> None:
        conn = self._db.connection()

        def write() -> None:
            conn.execute(_UPSERT.format("?, ?, ?, ?"), (run_id, tenant, last_seq, body))

        await self._db.write(write, "storing a thread summary")

    async def delete(self, run_id: str) -> None:
        conn = self._db.connection()

        def write() -> None:
            conn.execute("DELETE FROM onward_graph_summaries WHERE run_id = ?", (run_id,))

        await self._db.write(write, "deleting a thread summary")


class PostgresThreadSummaries(PostgresStore):
    """Summaries in PostgreSQL (``onward_graph_summaries``), beside the frontier rows.

    Args:
        dsn: ``postgresql://user:password@host:port/database``.
        schema: The PostgreSQL schema (search path) holding Onward's tables.
        min_size: Smallest pool size.
        max_size: Largest pool size.
    """

    what = "PostgreSQL thread summary store"

    def __init__(
        self, dsn: str, *, schema: str | None = None, min_size: int = 1, max_size: int = 4
    ) -> None:
        super().__init__(dsn, schema=schema, min_size=min_size, max_size=max_size)

    async def get(self, run_id: str) -> bytes | None:
        async with self._connection("reading a thread summary", run_id) as conn:
            body = await conn.fetchval(
                "SELECT body FROM onward_graph_summaries WHERE run_id = $1", run_id
            )
        return bytes(body) if body is not None else None

    async def put(self, run_id: str, tenant: str, last_seq: int, body: bytes) -> None:
        async with self._connection("storing a thread summary", run_id) as conn:
            await conn.execute(_UPSERT.format("$1, $2, $3, $4"), run_id, tenant, last_seq, body)

    async def delete(self, run_id: str) -> None:
        async with self._connection("deleting a thread summary", run_id) as conn:
            await conn.execute("DELETE FROM onward_graph_summaries WHERE run_id = $1", run_id)


def embedded_summaries(log: EventLog) -> SqliteThreadSummaries | None:
    """The summary store of an embedded SQLite log: in its file, on its connection. ``None``
    for any other log, whose summary store must be named."""
    if isinstance(log, SqliteEventLog):
        return SqliteThreadSummaries(log.path, sharing=log)
    return None


__all__ = [
    "SUMMARY_FORMAT",
    "MemoryThreadSummaries",
    "PostgresThreadSummaries",
    "SqliteThreadSummaries",
    "ThreadSummary",
    "ThreadSummaryStore",
    "decode",
    "embedded_summaries",
    "encode",
    "restored",
    "summarize",
]
