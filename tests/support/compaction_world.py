"""Long runs to compact, and what a compaction test compares before and after.

A `World` is one deployment's stores (embedded SQLite, or Kafka + PostgreSQL): runs are written
with `AgentRunner`, folded by a `LogProjector` (inline on SQLite), and compacted by a
`CheckpointCompactor` on the same stores.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from onward.eventlog import KafkaEventLog, Message, SqliteEventLog, Tagged, ToolCall
from onward.eventlog.base import EventLog, SequenceGuard, partition_for
from onward.projections.base import FrontierStore
from onward.projections.compaction import (
    CompactionStore,
    PostgresCompactionStore,
    SqliteCompactionStore,
)
from onward.projections.frontier import Frontier, ToolCallRow
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.log_projector import LogProjector
from onward.projections.memory import MemoryFrontierStore
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime import (
    Agent,
    AgentRunner,
    LeaseStore,
    ModelReply,
    Provider,
    RedisLeaseStore,
    ScriptedProvider,
    SqliteLeaseStore,
    reply,
    tool,
)
from onward.runtime.conversation import Conversation
from onward.runtime.gc import PostgresRecordSweeper, SqliteRecordSweeper
from onward.runtime.gc.base import RecordSweeper
from support.servers import KafkaServers


@tool
async def lookup(query: str, *, idempotency_key: str) -> str:
    """What the researcher's model asks for at every turn."""
    return f"found {query}"


AGENT = Agent(name="researcher", instructions="look things up", tools=[lookup])
TENANT = "acme"


class Crash(BaseException):
    """The worker 'dies' before a model call."""


class Script:
    """A scripted model: ``turns`` tool calls, then an answer (picked by how many answers the
    conversation holds); it dies (raises `Crash`) when asked for the ``die_at``-th time
    (0-based), and keeps every conversation it was sent."""

    def __init__(self, turns: int, *, die_at: int | None = None) -> None:
        replies = [
            reply(f"turn {n}", ToolCall(call_id=f"c{n}", tool="lookup", args={"query": f"q{n}"}))
            for n in range(turns)
        ]
        self.inner = ScriptedProvider([*replies, reply("done")])
        self.die_at = die_at
        self.calls: list[list[Message]] = []

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        if self.die_at is not None and len(self.calls) == self.die_at:
            raise Crash(f"before model call {self.die_at}")
        self.calls.append(list(messages))
        return await self.inner.complete(agent, messages)


@dataclass
class World:
    """One deployment's stores, and how to fold the log into its frontier store."""

    log: EventLog
    frontiers: FrontierStore
    store: CompactionStore
    leases: LeaseStore
    inline: bool
    database_url: str = ""
    """PostgreSQL, where the frontier store is there."""
    servers: KafkaServers | None = None
    """Kafka + PostgreSQL + Redis: the test's topic, schema and key prefix."""

    def runner(self, provider: Provider) -> AgentRunner:
        return AgentRunner(
            provider=provider,
            log=self.log,
            frontiers=self.frontiers,
            leases=self.leases,
            checkpoint_inline=self.inline,
            compaction=self.store,
        )

    async def fold(self) -> None:
        """Fold whatever the log holds past the stored positions."""
        projection = FrontierProjection(self.frontiers, self.log, compaction=self.store)
        await LogProjector(self.log, projection).catch_up()

    async def tag_late(self, run_id: str) -> None:
        """Append a tag to ``run_id`` right after its last event, as a writer that read the run
        before it was collected (a zombie worker, a tagger with no pin) would."""
        last = (await self.log.read_run(run_id))[-1].event
        late = Tagged(
            run_id=run_id,
            tenant=last.tenant,
            seq=last.seq + 1,
            fence=last.fence,
            at=last.at + 1,
            target_seq=1,
            label="late",
        )
        await self.log.append([late])

    async def live_run(self, run_id: str, *, turns: int, done: int) -> None:
        """A run that dies after ``done`` settled turns of ``turns``: the next step a model call."""
        try:
            await self.runner(Script(turns, die_at=done)).run(
                AGENT, {"ask": run_id}, tenant=TENANT, run_id=run_id
            )
        except Crash:
            return
        raise AssertionError("the run should have died")

    async def finished_run(self, run_id: str, *, turns: int) -> None:
        result = await self.runner(Script(turns)).run(
            AGENT, {"ask": run_id}, tenant=TENANT, run_id=run_id
        )
        assert result.status == "completed"


@asynccontextmanager
async def sqlite_world(folder: Path, *, partitions: int = 1) -> AsyncIterator[World]:
    """The embedded deployment in ``folder/onward.db``."""
    db = folder / "onward.db"
    async with (
        SqliteEventLog(db, partitions=partitions) as log,
        SqliteFrontierStore(db) as frontiers,
        SqliteCompactionStore(db) as store,
        SqliteLeaseStore(db) as leases,
    ):
        yield World(log, frontiers, store, leases, inline=True)


@asynccontextmanager
async def kafka_stores(servers: KafkaServers, *, partitions: int = 1) -> AsyncIterator[World]:
    """Kafka + PostgreSQL + Redis on the test's own topic, schema and key prefix."""
    url, schema = servers.database_url, servers.schema
    async with (
        KafkaEventLog(servers.bootstrap, topic=servers.topic, partitions=partitions) as log,
        PostgresFrontierStore(url, schema=schema) as frontiers,
        PostgresCompactionStore(url, schema=schema) as store,
        RedisLeaseStore(servers.redis_url, prefix=servers.redis_prefix) as leases,
    ):
        yield World(log, frontiers, store, leases, inline=False, database_url=url, servers=servers)


@asynccontextmanager
async def world_of(clustered: KafkaServers | None, folder: Path) -> AsyncIterator[World]:
    """The embedded deployment in ``folder`` when ``clustered`` is None (the `clustered`
    fixture's embedded side), else Kafka + PostgreSQL + Redis on the test's own servers."""
    if clustered is None:
        async with sqlite_world(folder) as embedded:
            yield embedded
    else:
        async with kafka_stores(clustered) as stores:
            yield stores


def record_sweeper(world: World, folder: Path) -> RecordSweeper:
    """The GC sweeper of ``world``'s frontier store: the SQLite file in ``folder``, else the
    PostgreSQL schema of its servers."""
    if world.servers is None:
        return SqliteRecordSweeper(folder / "onward.db")
    return PostgresRecordSweeper(world.database_url, schema=world.servers.schema)


async def conversation(log: EventLog, run_id: str) -> list[Message]:
    """The run's conversation as folding its whole history from the log gives it."""
    counted = SequenceGuard().admit_all(await log.read_run(run_id))
    return Conversation.of(AGENT.instructions, [s.event for s in counted]).messages


async def rows(
    frontiers: FrontierStore, run_ids: Sequence[str]
) -> dict[str, tuple[Frontier | None, list[ToolCallRow]]]:
    """Every run's frontier and tool_calls rows, to compare stores by."""
    loaded = await frontiers.load(run_ids)
    found: dict[str, tuple[Frontier | None, list[ToolCallRow]]] = {}
    for run_id in run_ids:
        row = loaded.get(run_id)
        found[run_id] = (row.frontier if row else None, await frontiers.tool_calls(run_id))
    return found


async def refolded(
    log: EventLog, run_ids: Sequence[str]
) -> dict[str, tuple[Frontier | None, list[ToolCallRow]]]:
    """The same rows, folded from scratch from ``log`` into a fresh store."""
    store = MemoryFrontierStore()
    await LogProjector(log, FrontierProjection(store, log)).catch_up()
    return await rows(store, run_ids)


async def log_sizes(log: EventLog) -> list[tuple[int, int]]:
    """Every partition's (start, end)."""
    return [(b.start, b.end) for b in [await log.bounds(p) for p in range(log.partitions)]]


def partition(log: EventLog, run_id: str) -> int:
    return partition_for(run_id, log.partitions)


Scenario = Callable[[World], Awaitable[None]]
