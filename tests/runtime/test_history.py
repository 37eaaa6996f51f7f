"""A run's history on resume: frontier row, transcript and the log's tail; never with a hole."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from support.crashes import Crash, CrashAt
from support.workers import CountingLog

from onward.errors import ConfigurationError, HistoryUnavailableError
from onward.eventlog import (
    KafkaEventLog,
    MemoryEventLog,
    Message,
    SqliteEventLog,
    ToolCall,
    ToolCompleted,
)
from onward.eventlog.base import EventLog, SequenceGuard, partition_for
from onward.projections.base import FrontierStore, Snapshot
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.log_projector import LogProjector
from onward.projections.memory import MemoryFrontierStore
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.agent import Agent
from onward.runtime.blobs import SqliteBlobStore
from onward.runtime.conversation import Conversation
from onward.runtime.leases import PostgresLeaseStore, SqliteLeaseStore
from onward.runtime.providers import ModelReply, ScriptedProvider, reply
from onward.runtime.runner import AgentRunner
from onward.runtime.tools import tool

TENANT = "acme"
BIG = "x" * (300 * 1024)  # over the claim check's threshold: stored out of line


@tool
async def search(query: str, *, idempotency_key: str) -> str:
    return f"found {query}"


@tool
async def fetch(url: str, *, idempotency_key: str) -> str:
    return BIG


AGENT = Agent(name="finder", instructions="find things", tools=[search, fetch])


class Recording:
    """A scripted provider that keeps every conversation it was called with."""

    def __init__(self, replies: list[ModelReply]) -> None:
        self.inner = ScriptedProvider(replies)
        self.calls: list[list[Message]] = []

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        self.calls.append(list(messages))
        return await self.inner.complete(agent, messages)


def script() -> list[Any]:
    return [
        reply("", ToolCall(call_id="a", tool="search", args={"query": "flights"})),
        reply("and the page", ToolCall(call_id="b", tool="fetch", args={"url": "u"})),
        reply("done"),
    ]


async def crashed_run(log: EventLog, **options: Any) -> None:
    """A run that dies once its second turn settled: the next step is a model call."""
    runner = AgentRunner(
        provider=ScriptedProvider(script()),
        log=log,
        observer=CrashAt("turn.settled", n=2),
        **options,
    )
    with pytest.raises(Crash):
        await runner.run(AGENT, {"ask": "find me a flight"}, tenant=TENANT, run_id="r")


async def whole_conversation(log: EventLog, options: dict[str, Any]) -> list[Message]:
    """The conversation as folding the whole run from its partition gives it."""
    runner = AgentRunner(provider=ScriptedProvider([]), log=log, **options)
    counted = SequenceGuard().admit_all(await log.read_run("r"))
    events = [await runner.writer.restore(s.event) for s in counted]
    return Conversation.of(AGENT.instructions, events).messages


async def test_resume_rebuilds_the_conversation_from_the_transcript(tmp_path: Path) -> None:
    db = tmp_path / "onward.db"
    async with (
        SqliteEventLog(db, partitions=1) as log,
        SqliteFrontierStore(db) as store,
        SqliteBlobStore(db) as blobs,
        SqliteLeaseStore(db) as leases,
    ):
        options: dict[str, Any] = {
            "frontiers": store,
            "checkpoint_inline": True,
            "blobs": blobs,
            "leases": leases,
        }
        await crashed_run(log, **options)
        for n in range(5):  # other runs write after this one stopped
            other = AgentRunner(provider=ScriptedProvider([reply("hi")]), log=log, **options)
            await other.run(AGENT, "go", tenant=TENANT, run_id=f"o{n}")
        row = await store.get("r")
        assert row is not None
        assert row.frontier is not None
        transcript = await store.transcript("r", tenant=TENANT, through=row.frontier.last_seq)
        assert [m.message.role for m in transcript] == [
            "user",
            "assistant",
            "tool",
            "assistant",
            "tool",
        ]
        assert "$blob" in str(transcript[-1].message.content)  # stays a reference at rest
        expected = await whole_conversation(log, options)
        provider = Recording(script())
        recording = CountingLog(log)
        runner = AgentRunner(provider=provider, log=recording, **options)
        end = (await log.bounds(0)).end
        result = await runner.resume(AGENT, "r", tenant=TENANT)
        assert result.status == "completed"
        assert provider.calls[0] == expected  # the big body is back, in place
        # The projector folded the partition to its end and the claim landed there: the run's
        # log is not read at all, least of all from its first event. (What the resume reads is
        # whether a carry cut short started a successor, `r~c1`: from the projector's position.)
        assert end > row.frontier.through_offset + 1
        assert "r" not in recording.runs
        assert recording.runs == ["r~c1"]
        assert recording.starts == [end]


async def test_a_transcript_short_of_the_rows_count_stops_the_resume() -> None:
    log, store = _memory()
    await crashed_run(log, frontiers=store)
    await LogProjector(log, FrontierProjection(store, log)).catch_up()
    del store._transcript[(TENANT, "r")][2]  # a hole, made by hand
    provider = Recording(script())
    runner = AgentRunner(provider=provider, log=log, frontiers=store)
    with pytest.raises(
        HistoryUnavailableError, match=r"'r'.*1 of the 5 messages.*seqs 1, 4, 6, 8\)"
    ):
        await runner.resume(AGENT, "r", tenant=TENANT)
    assert provider.calls == []


async def test_rows_a_superseded_writer_wrote_never_reach_the_transcript() -> None:
    log, store = _memory()
    await crashed_run(log, frontiers=store)
    history = await log.read_run("r")
    last = history[-1].event
    stale = ToolCompleted(
        run_id="r",
        tenant=TENANT,
        seq=last.seq + 1,
        fence=last.fence - 1,
        at=1,
        call_id="a",
        result="from a superseded writer",
    )
    await log.append([stale])
    await LogProjector(log, FrontierProjection(store, log)).catch_up()
    rows = await store.transcript("r", tenant=TENANT, through=99)
    row = await store.get("r")
    assert row is not None
    assert row.frontier is not None
    assert row.frontier.refused == 1
    assert len(rows) == row.frontier.messages == 5
    assert all("superseded" not in str(r.message.content) for r in rows)


def _memory() -> tuple[MemoryEventLog, MemoryFrontierStore]:
    return MemoryEventLog(partitions=1), MemoryFrontierStore()


async def truncated_then_resumed(log: EventLog, store: FrontierStore, **options: Any) -> None:
    await crashed_run(log, frontiers=store, **options)
    partition = partition_for("r", log.partitions)
    end = (await log.bounds(partition)).end
    await log.truncate_before(partition, end - 1)  # the run's events but its last are gone
    provider = Recording(script())
    runner = AgentRunner(provider=provider, log=log, frontiers=store, **options)
    # Without a frontier row the run is read from the partition's start: embedded, the log's
    # own compaction store knows of no cut, so the hole is found where the tail begins.
    hole = r"run 'r'.*(from offset 0 of partition|missing seqs 1 to)"
    with pytest.raises(HistoryUnavailableError, match=hole):
        await runner.resume(AGENT, "r", tenant=TENANT)
    assert provider.calls == []


async def test_a_truncated_sqlite_log_stops_the_resume(tmp_path: Path) -> None:
    db = tmp_path / "onward.db"
    async with (
        SqliteEventLog(db, partitions=2) as log,
        SqliteFrontierStore(db) as store,
        SqliteBlobStore(db) as blobs,
    ):
        await truncated_then_resumed(log, store, blobs=blobs)


@pytest_asyncio.fixture
async def on_kafka(
    kafka_bootstrap: str, kafka_topic: str, database_url: str, pg_schema: str
) -> AsyncIterator[tuple[KafkaEventLog, PostgresFrontierStore, PostgresLeaseStore]]:
    """A two-partition Kafka log, with frontier rows and leases in PostgreSQL."""
    async with (
        KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=2) as log,
        PostgresFrontierStore(database_url, schema=pg_schema) as store,
        PostgresLeaseStore(database_url, schema=pg_schema) as leases,
    ):
        yield log, store, leases


@pytest.mark.kafka
async def test_a_truncated_kafka_log_stops_the_resume(
    on_kafka: tuple[KafkaEventLog, PostgresFrontierStore, PostgresLeaseStore],
) -> None:
    log, store, leases = on_kafka
    await truncated_then_resumed(log, store, leases=leases)


@pytest.mark.kafka
async def test_a_kafka_run_resumes_from_the_transcript_after_its_events_are_truncated(
    on_kafka: tuple[KafkaEventLog, PostgresFrontierStore, PostgresLeaseStore],
) -> None:
    log, store, leases = on_kafka
    await crashed_run(log, frontiers=store, leases=leases)
    expected = await whole_conversation(log, {"frontiers": store, "leases": leases})
    await LogProjector(log, FrontierProjection(store, log)).catch_up()
    partition = partition_for("r", log.partitions)
    await log.truncate_before(partition, (await log.bounds(partition)).end)
    provider = Recording(script())
    runner = AgentRunner(provider=provider, log=log, frontiers=store, leases=leases)
    result = await runner.resume(AGENT, "r", tenant=TENANT)
    assert result.status == "completed"
    assert provider.calls[0] == expected


def test_a_kafka_runner_without_a_frontier_store_is_refused() -> None:
    log = KafkaEventLog("127.0.0.1:1", topic="never-opened")
    with pytest.raises(ConfigurationError, match="needs a frontier store"):
        AgentRunner(
            provider=ScriptedProvider([]), log=log, leases=PostgresLeaseStore("postgresql://x")
        )


async def test_a_row_written_before_the_transcript_rebuilds_the_conversation_from_the_log() -> None:
    log, store = _memory()
    await crashed_run(log, frontiers=store)
    expected = await whole_conversation(log, {"frontiers": store})
    await LogProjector(log, FrontierProjection(store, log)).catch_up()
    row = await store.get("r")
    assert row is not None
    assert row.frontier is not None
    old = msgspec.structs.replace(row.frontier, messages=0)  # as an older Onward wrote it
    await store.write("old", {}, [Snapshot.of(msgspec.structs.replace(old, through_offset=99))], [])
    store._transcript.clear()  # and no transcript
    provider = Recording(script())
    runner = AgentRunner(provider=provider, log=log, frontiers=store)
    result = await runner.resume(AGENT, "r", tenant=TENANT)
    assert result.status == "completed"
    assert provider.calls[0] == expected
