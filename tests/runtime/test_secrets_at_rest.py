"""A secret passed in a tool argument or returned by a tool reaches no store at rest.

Each store is read directly, as an attacker with a copy of it would: the SQLite file's bytes,
the Kafka topic's raw record bytes (values, keys and headers), and every column and every row
(as text) of every Onward table in PostgreSQL, compressed values opened as a reader would.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import zstandard
from aiokafka import AIOKafkaConsumer, TopicPartition
from support.sqlite_files import stored_bytes

from onward._storage import unpack
from onward._storage.packing import PACKED
from onward.eventlog import KafkaEventLog, PostgresEventLog, SqliteEventLog, ToolCall
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.log_projector import LogProjector
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.agent import Agent
from onward.runtime.blobs import PostgresBlobStore
from onward.runtime.leases import PostgresLeaseStore
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.runner import AgentRunner
from onward.runtime.tools import Tool, tool

pytestmark = pytest.mark.kafka
PARTITIONS = 2


def invented_key(rng: random.Random) -> str:
    """An API key of a real shape, invented here, assembled at run time."""
    alphabet = string.ascii_letters + string.digits
    return "sk-" + "proj-" + "".join(rng.choice(alphabet) for _ in range(48))


async def raw_topic(bootstrap: str, topic: str) -> bytes:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        chunks: list[bytes] = []
        while [tp for tp in parts if await consumer.position(tp) < ends[tp]]:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for r in records:
                    chunks += [r.key or b"", r.value or b""]
                    chunks += [v for _, v in r.headers]
        return b"\n".join(chunks)
    finally:
        await consumer.stop()


async def raw_database(database_url: str, schema: str) -> str:
    conn = await asyncpg.connect(database_url, server_settings={"search_path": schema})
    try:
        tables = await conn.fetch(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = $1 AND table_type = 'BASE TABLE'",
            schema,
        )
        dumps: list[str] = []
        for row in tables:
            table = row["table_name"]
            for record in await conn.fetch(f'SELECT * FROM "{table}"'):
                dumps.extend(_text(value) for value in record.values())
            dumps.extend(r[0] for r in await conn.fetch(f'SELECT t::text FROM "{table}" t'))
        return "\n".join(dumps)
    finally:
        await conn.close()


def _text(value: object) -> str:
    if isinstance(value, bytes | memoryview):
        raw = bytes(value)
        return "\n".join(b.decode(errors="replace") for b in (raw, _opened(raw)))
    return str(value)


_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _opened(raw: bytes) -> bytes:
    """A stored value as its reader sees it: a packed log record unpacked, a zstd frame (a
    transcript message or chunk) decompressed; a search of the stored bytes alone would miss
    text they hold."""
    if raw.startswith(_ZSTD_MAGIC):
        return zstandard.ZstdDecompressor().decompressobj().decompress(raw)
    return unpack(raw)


async def test_a_secret_in_tool_arguments_is_masked_everywhere_at_rest(
    kafka_bootstrap: str, kafka_topic: str, database_url: str, pg_schema: str, rng: random.Random
) -> None:
    secret = invented_key(rng)

    @tool(requires_approval=True)
    async def configure(api_key: str, note: str, *, idempotency_key: str) -> str:
        return "configured"

    agent = Agent(name="ops", instructions="configure the integration", tools=[configure])
    call = ToolCall(
        call_id="c1",
        tool="configure",
        args={"api_key": secret, "note": f"Authorization: Bearer {secret}"},
    )
    provider = ScriptedProvider([reply(f"using {secret}", call), reply("done")])
    async with (
        KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=PARTITIONS) as log,
        PostgresFrontierStore(database_url, schema=pg_schema) as store,
        PostgresBlobStore(database_url, schema=pg_schema) as blobs,
        PostgresLeaseStore(database_url, schema=pg_schema) as leases,
    ):
        runner = AgentRunner(
            provider=provider, log=log, frontiers=store, blobs=blobs, leases=leases
        )
        result = await runner.run(
            agent, f"here is my key {secret}", tenant="acme", run_id="r-secret"
        )
        assert result.status == "waiting"  # the call and its arguments sit in the frontier
        projected = await LogProjector(log, FrontierProjection(store, log)).catch_up()
        assert projected > 0
        row = await store.get("r-secret")
        assert row is not None
        assert row.frontier is not None
        assert row.frontier.calls[0].args["api_key"] == "[REDACTED]"
        topic_bytes = await raw_topic(kafka_bootstrap, kafka_topic)
        database_text = await raw_database(database_url, pg_schema)
    assert secret.encode() not in topic_bytes
    assert b"[REDACTED]" in topic_bytes
    assert secret not in database_text
    assert "[REDACTED]" in database_text


PASSWORD = "hunter2-very-secret"


def login_tool(api_key: str) -> Tool:
    """A tool taking a password and returning an API key, as a login to some service would."""

    @tool
    async def login(user: str, password: str, *, idempotency_key: str) -> dict[str, Any]:
        return {"user": user, "api_key": api_key}

    return login


def login_script() -> ScriptedProvider:
    """A model that logs ann in, then says it is done."""
    args = {"user": "ann", "password": PASSWORD}
    return ScriptedProvider(
        [reply("", ToolCall(call_id="c1", tool="login", args=args)), reply("ok")]
    )


async def test_a_password_argument_and_an_api_key_result_are_masked_in_the_sqlite_file(
    tmp_path: Path, rng: random.Random
) -> None:
    """security review #4: structured secrets (by their keys) were stored in clear."""
    api_key = invented_key(rng)
    path = tmp_path / "onward.db"
    agent = Agent(name="ops", instructions="log in", tools=[login_tool(api_key)])
    async with SqliteEventLog(path) as log, SqliteFrontierStore(path) as store:
        runner = AgentRunner(
            provider=login_script(), log=log, frontiers=store, checkpoint_inline=True
        )
        result = await runner.run(agent, "log ann in", tenant="acme", run_id="r-login")
        assert result.status == "completed"
    stored = sqlite_bytes(path)
    assert PASSWORD.encode() not in stored
    assert api_key.encode() not in stored
    assert b"[REDACTED]" in stored


def sqlite_bytes(path: Path) -> bytes:
    """Every byte of a SQLite database, its -wal and -shm files included, and its rows unpacked."""
    return stored_bytes(path)


async def test_a_password_argument_and_an_api_key_result_reach_neither_kafka_nor_postgresql(
    kafka_bootstrap: str, kafka_topic: str, database_url: str, pg_schema: str, rng: random.Random
) -> None:
    """security review #4: on the Kafka deployment, the events topic and every PostgreSQL
    table held the password argument and the API key result in clear."""
    api_key = invented_key(rng)
    agent = Agent(name="ops", instructions="log in", tools=[login_tool(api_key)])
    async with (
        KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=PARTITIONS) as log,
        PostgresFrontierStore(database_url, schema=pg_schema) as store,
        PostgresBlobStore(database_url, schema=pg_schema) as blobs,
        PostgresLeaseStore(database_url, schema=pg_schema) as leases,
    ):
        runner = AgentRunner(
            provider=login_script(), log=log, frontiers=store, blobs=blobs, leases=leases
        )
        result = await runner.run(agent, "log ann in", tenant="acme", run_id="r-login")
        assert result.status == "completed"
        assert await LogProjector(log, FrontierProjection(store, log)).catch_up() > 0
        topic_bytes = await raw_topic(kafka_bootstrap, kafka_topic)
        database_text = await raw_database(database_url, pg_schema)
    assert b"r-login" in topic_bytes
    assert PASSWORD.encode() not in topic_bytes
    assert api_key.encode() not in topic_bytes
    assert "r-login" in database_text
    assert PASSWORD not in database_text
    assert api_key not in database_text


async def test_a_password_argument_and_an_api_key_result_reach_no_table_of_the_postgres_backend(
    database_url: str, pg_schema: str, rng: random.Random
) -> None:
    """The PostgreSQL backend stores its log in PostgreSQL too, packed: opened, no row holds
    either secret."""
    api_key = invented_key(rng)
    agent = Agent(name="ops", instructions="log in", tools=[login_tool(api_key)])
    async with (
        PostgresEventLog(database_url, schema=pg_schema, partitions=PARTITIONS) as log,
        PostgresFrontierStore(database_url, schema=pg_schema) as store,
        PostgresLeaseStore(database_url, schema=pg_schema) as leases,
    ):
        runner = AgentRunner(
            provider=login_script(),
            log=log,
            frontiers=store,
            leases=leases,
            checkpoint_inline=True,
        )
        result = await runner.run(agent, "log ann in", tenant="acme", run_id="r-login")
        assert result.status == "completed"
        database_text = await raw_database(database_url, pg_schema)
        conn = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
        try:
            records = [bytes(r[0]) for r in await conn.fetch("SELECT record FROM onward_log")]
        finally:
            await conn.close()
    asked = [r for r in records if b"model.answered" in unpack(r) and b'"login"' in unpack(r)]
    assert asked
    assert all(r.startswith(PACKED) for r in asked)  # unread, a search would miss them
    assert all(b'"password":"[REDACTED]"' in unpack(r) for r in asked)
    assert PASSWORD not in database_text
    assert api_key not in database_text


@dataclass
class Connection:
    """A tool's result as a dataclass, which the log writes as an object of its fields."""

    user: str
    password: str
    url: str


async def test_a_dataclass_result_and_input_hold_no_secret_in_the_sqlite_file(
    tmp_path: Path, rng: random.Random
) -> None:
    """A dataclass is written as msgspec writes it (an object of its fields), so its fields
    are masked as a dict's are: by key and by shape, in a tool's result and in a run's input."""
    api_key = invented_key(rng)

    @tool
    async def connect(user: str, *, idempotency_key: str) -> Connection:
        return Connection(user, PASSWORD, f"postgresql://{user}:{PASSWORD}@db/app")

    provider = ScriptedProvider(
        [reply("", ToolCall(call_id="c1", tool="connect", args={"user": "ann"})), reply("ok")]
    )
    agent = Agent(name="ops", instructions="connect", tools=[connect])
    path = tmp_path / "onward.db"
    async with SqliteEventLog(path) as log, SqliteFrontierStore(path) as store:
        runner = AgentRunner(provider=provider, log=log, frontiers=store, checkpoint_inline=True)
        given = Connection("ann", api_key, "https://example.com")
        result = await runner.run(agent, given, tenant="acme", run_id="r-dataclass")
        assert result.status == "completed"
    stored = sqlite_bytes(path)
    assert PASSWORD.encode() not in stored
    assert api_key.encode() not in stored
    assert b"postgresql://ann:[REDACTED]@db/app" in stored


async def test_a_secret_where_a_long_tool_error_is_cut_is_masked_in_the_sqlite_file(
    tmp_path: Path,
) -> None:
    """A tool's error message is cut to its first 2,000 characters: cut first and masked
    after, a URL cut between its password and its ``@`` no longer looked like one and the
    password was stored."""

    @tool
    async def query(sql: str, *, idempotency_key: str) -> str:
        raise RuntimeError(
            f"{sql[:1960].ljust(1960, '.')} failed on postgresql://app:{PASSWORD}@db/app"
        )

    provider = ScriptedProvider(
        [reply("", ToolCall(call_id="c1", tool="query", args={"sql": "select 1"})), reply("ok")]
    )
    agent = Agent(name="ops", instructions="query", tools=[query])
    path = tmp_path / "onward.db"
    async with SqliteEventLog(path) as log, SqliteFrontierStore(path) as store:
        runner = AgentRunner(provider=provider, log=log, frontiers=store, checkpoint_inline=True)
        result = await runner.run(agent, "count", tenant="acme", run_id="r-error")
        assert result.status == "completed"
    stored = sqlite_bytes(path)
    assert b"failed on postgresql://app:" in stored
    assert PASSWORD[:10].encode() not in stored
