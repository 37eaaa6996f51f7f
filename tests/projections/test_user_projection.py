"""User projections: a `Projection` run by the Kafka projector, exactly once, and rebuilt."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import random
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import pytest
import pytest_asyncio
from support.histories import append_all, workload
from support.kinds import KindCounts
from support.pg import SchemaFactory, build_registry_held_by_a_write
from typer.testing import CliRunner

from onward.errors import InvalidInputError
from onward.eventlog import KafkaEventLog, StoredEvent, kind_of
from onward.projections.builds import create_build
from onward.projections.kafka import KafkaProjector
from onward.projections.postgres_sql import SqlProjectionSink, layout_of, load_projection
from onward.projections.rebuild import rebuild_projection
from onward.runtime.cli import app

PARTITIONS = 3


@dataclass
class Setup:
    bootstrap: str
    database_url: str
    topic: str
    schema: str
    log: KafkaEventLog

    def sink(self) -> SqlProjectionSink:
        """The kind-counting projection's sink in this test's schema."""
        return SqlProjectionSink(self.database_url, KindCounts(), schema=self.schema)

    async def table(self, name: str) -> dict[str, int]:
        conn = await asyncpg.connect(
            self.database_url, server_settings={"search_path": self.schema}
        )
        try:
            rows = await conn.fetch(f"SELECT kind, events FROM {name}")
        finally:
            await conn.close()
        return {r["kind"]: r["events"] for r in rows}

    async def direct_counts(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for partition in range(PARTITIONS):
            for stored in await self.log.read_partition(partition, 0):
                counts[kind_of(type(stored.event))] += 1
        return dict(counts)


@pytest_asyncio.fixture
async def setup(
    kafka_bootstrap: str, kafka_topic: str, database_url: str, pg_schema: str
) -> AsyncIterator[Setup]:
    async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=PARTITIONS) as log:
        yield Setup(kafka_bootstrap, database_url, kafka_topic, pg_schema, log)


async def project_everything(setup: Setup) -> None:
    """Run the kind counts with the Kafka projector until every partition's end is stored."""
    async with setup.sink() as sink:
        projector = KafkaProjector(
            setup.bootstrap,
            sink,
            topic=setup.topic,
            partitions=PARTITIONS,
            group_id=uuid.uuid4().hex,
        )
        await projector.start()
        try:
            ends = {p: (await setup.log.bounds(p)).end for p in range(PARTITIONS)}
            for _ in range(600):
                stored = await sink.positions()
                if all(stored.get(p, 0) >= e for p, e in ends.items()):
                    return
                await projector.step(timeout_ms=100)
            pytest.fail("the projector did not catch up")
        finally:
            await projector.close()


async def project_a_workload(setup: Setup, rng: random.Random, runs: int) -> None:
    """Append the histories of ``runs`` random runs and project all of it."""
    await append_all(setup.log, workload(rng, runs))
    await project_everything(setup)


@pytest.mark.kafka
async def test_a_user_projection_counts_what_the_log_holds(
    setup: Setup, rng: random.Random
) -> None:
    await project_a_workload(setup, rng, 30)
    assert await setup.table("kinds") == await setup.direct_counts()


@pytest.mark.kafka
async def test_a_batch_delivered_twice_is_folded_once(setup: Setup, rng: random.Random) -> None:
    await append_all(setup.log, workload(rng, 5))
    records = {p: await setup.log.read_partition(p, 0) for p in range(PARTITIONS)}
    ends = {p: (await setup.log.bounds(p)).end for p in range(PARTITIONS)}
    async with setup.sink() as sink:
        await sink.apply(records, ends)
        await sink.apply(records, ends)
        half: dict[int, list[StoredEvent]] = {p: r[: len(r) // 2] for p, r in records.items()}
        await sink.apply(half, {p: len(r) for p, r in half.items()})
        assert sink.stats.skipped == sum(len(r) for r in records.values()) + sum(
            len(r) for r in half.values()
        )
    assert await setup.table("kinds") == await setup.direct_counts()


@pytest.mark.kafka
async def test_rebuilding_a_user_projection_switches_its_view(
    setup: Setup, rng: random.Random
) -> None:
    await project_a_workload(setup, rng, 20)
    report = await rebuild_projection(
        setup.log, setup.database_url, KindCounts(), schema=setup.schema
    )
    assert (report.projection, report.build, report.previous) == ("kinds", 2, 1)
    expected = await setup.direct_counts()
    assert await setup.table("kinds_2") == expected
    assert await setup.table("kinds_1") == expected
    conn = await asyncpg.connect(setup.database_url, server_settings={"search_path": setup.schema})
    try:
        assert "kinds_2" in await conn.fetchval("SELECT pg_get_viewdef('kinds')")
    finally:
        await conn.close()


@pytest.mark.kafka
def test_the_cli_rebuilds_a_user_projection(
    kafka_bootstrap: str,
    kafka_topic: str,
    database_url: str,
    empty_pg_schema: str,
    rng: random.Random,
) -> None:
    async def fill() -> None:
        async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=PARTITIONS) as log:
            await append_all(log, workload(rng, 5))

    asyncio.run(fill())
    env = {
        **os.environ,
        "ONWARD_BACKEND": "kafka",
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "DATABASE_URL": database_url,
        "ONWARD_DATABASE_SCHEMA": empty_pg_schema,
        "ONWARD_KAFKA_TOPIC": kafka_topic,
        "ONWARD_PARTITIONS": str(PARTITIONS),
    }
    runner = CliRunner()
    migrated = runner.invoke(app, ["db", "migrate"], env=env)
    assert migrated.exit_code == 0, migrated.output
    result = runner.invoke(
        app,
        ["projections", "rebuild", "kinds", "--projection", "support.kinds:KindCounts"],
        env=env,
    )
    assert result.exit_code == 0, result.output
    assert "kinds build 1 active" in result.output
    again = runner.invoke(
        app,
        ["projections", "rebuild", "kinds", "--projection", "support.kinds:KindCounts", "--json"],
        env=env,
    )
    assert again.exit_code == 0, again.output
    report = json.loads(again.stdout)
    assert (report["projection"], report["build"], report["previous"]) == ("kinds", 2, 1)
    wrong = runner.invoke(
        app,
        ["projections", "rebuild", "other", "--projection", "support.kinds:KindCounts"],
        env=env,
    )
    assert wrong.exit_code == 2


def test_projection_names_must_be_plain_identifiers() -> None:
    bad = KindCounts()
    bad.name = "kinds; drop table x"
    with pytest.raises(InvalidInputError, match="lower-case identifier"):
        layout_of(bad)


@pytest.mark.parametrize("name", ["kinds\n", "frontiers\n"])
def test_a_projection_name_ending_in_a_newline_is_refused(name: str) -> None:
    """The name becomes SQL unquoted (the view, ``<name>_<build>``): one ending in a newline
    would name a table ``kinds _1`` (``kinds`` aliased), and ``frontiers\n`` Onward's own view."""
    bad = KindCounts()
    bad.name = name
    with pytest.raises(InvalidInputError, match="lower-case identifier"):
        layout_of(bad)


def test_load_projection_names_what_is_wrong() -> None:
    assert isinstance(load_projection("support.kinds:KindCounts"), KindCounts)
    with pytest.raises(InvalidInputError, match=r"package\.module:attribute"):
        load_projection("support.kinds")
    with pytest.raises(InvalidInputError, match="cannot import"):
        load_projection("support.kinds:Nope")


class KindCountsIfMissing(KindCounts):
    """Kind counts whose table is created only if missing, as DDL is often written."""

    def __init__(self, name: str) -> None:
        self.name = name

    def ddl(self, table: str) -> str:
        return f"CREATE TABLE IF NOT EXISTS {table} (kind text PRIMARY KEY, events bigint NOT NULL)"


@pytest.mark.kafka
async def test_a_build_whose_table_another_projection_holds_is_refused(
    setup: Setup, rng: random.Random
) -> None:
    """Projection ``kinds_2``'s view is named as build 2 of ``kinds`` would be (both created
    by an earlier version, which did not refuse the second name): a rebuild of ``kinds`` is
    refused, saying why, rather than fold into the other projection's view (its rows written
    twice) and point ``kinds`` at it."""
    await append_all(setup.log, workload(rng, 5))
    ends = {p: (await setup.log.bounds(p)).end for p in range(PARTITIONS)}
    records = {p: await setup.log.read_partition(p, 0) for p in range(PARTITIONS)}
    conn = await asyncpg.connect(setup.database_url, server_settings={"search_path": setup.schema})
    try:
        for name in ("kinds", "kinds_2"):
            unchecked = dataclasses.replace(layout_of(KindCountsIfMissing(name)), collides=None)
            await create_build(conn, unchecked, status="active")
    finally:
        await conn.close()
    for name in ("kinds", "kinds_2"):
        projection = KindCountsIfMissing(name)
        async with SqlProjectionSink(setup.database_url, projection, schema=setup.schema) as sink:
            await sink.apply(records, ends)
    expected = await setup.direct_counts()
    with pytest.raises(InvalidInputError, match="kinds_2"):
        await rebuild_projection(
            setup.log, setup.database_url, KindCountsIfMissing("kinds"), schema=setup.schema
        )
    assert await setup.table("kinds_2") == expected
    assert await setup.table("kinds") == expected


async def test_a_table_of_a_later_schema_on_the_search_path_does_not_refuse_a_build(
    database_url: str, new_pg_schema: SchemaFactory
) -> None:
    """The URL's search path names this deployment's schema, then another holding a table
    ``kinds_1`` of its own: the first build of ``kinds`` is created in the first schema, where
    nothing holds the name, so it is created, not refused for the other schema's table."""
    ours, other = await new_pg_schema(), await new_pg_schema(migrated=False)
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(f"CREATE TABLE {other}.kinds_1 (kind text)")
    finally:
        await conn.close()
    joiner = "&" if "?" in database_url else "?"
    url = f"{database_url}{joiner}search_path={ours},{other}"
    async with SqlProjectionSink(url, KindCounts()) as sink:
        assert sink.table == "kinds_1"
    conn = await asyncpg.connect(database_url)
    try:
        where = await conn.fetchval("SELECT to_regclass($1)::text", f"{ours}.kinds_1")
    finally:
        await conn.close()
    assert where == f"{ours}.kinds_1"


@pytest.mark.parametrize(("first", "second"), [("kinds", "kinds_7"), ("kinds_7", "kinds")])
async def test_a_projection_named_as_a_build_of_another_is_refused_when_created(
    database_url: str, pg_schema: str, first: str, second: str
) -> None:
    """``kinds_7`` is the name of build 7 of ``kinds``: whichever of the two comes second is
    refused as it is created, while its name can still be chosen, not accepted until the
    7th rebuild of ``kinds`` finds its table taken, with both projections holding rows."""
    async with SqlProjectionSink(database_url, KindCountsIfMissing(first), schema=pg_schema):
        pass
    sink = SqlProjectionSink(database_url, KindCountsIfMissing(second), schema=pg_schema)
    with pytest.raises(InvalidInputError, match=f"'{second}'.*'{first}'"):
        await sink.start()
    assert not sink.is_open


async def test_a_new_projection_meeting_a_session_holding_the_build_registry_says_so(
    database_url: str, pg_schema: str
) -> None:
    """A write of another projection left open (a slow batch, a person's ``BEGIN``) holds the
    build registry as a new projection's sink creates its first build: the start fails saying
    who holds it, not that the server did not answer, and meanwhile the other projections'
    writes wait no longer than a step of its wait, not for all of it."""
    async with SqlProjectionSink(database_url, KindCountsIfMissing("tallies"), schema=pg_schema):
        pass
    sink = SqlProjectionSink(database_url, KindCounts(), schema=pg_schema, timeout_s=4)
    await build_registry_held_by_a_write(database_url, pg_schema, "tallies", sink.start)
    async with SqlProjectionSink(database_url, KindCounts(), schema=pg_schema) as sink:
        assert sink.table == "kinds_1"


class _Said(logging.Handler):
    """Keeps the messages logged, and sets ``said`` at the first."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []
        self.said = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.said.set()


async def test_a_new_projection_waiting_for_the_build_registry_with_no_timeout_says_so(
    database_url: str, pg_schema: str
) -> None:
    """With no timeout, a new projection's sink meeting a write left open on the build
    registry waits until that session ends, but not in silence: the wait is said in the log
    once it lasts, naming the session, and the start completes once the session ends."""
    async with SqlProjectionSink(database_url, KindCountsIfMissing("tallies"), schema=pg_schema):
        pass
    writer = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
    backend = writer.get_server_pid()
    said = _Said()
    logger = logging.getLogger("onward.locks")
    logger.addHandler(said)
    sink = SqlProjectionSink(database_url, KindCounts(), schema=pg_schema, timeout_s=None)
    try:
        async with writer.transaction():
            await writer.fetch(
                "SELECT build FROM onward_projection_builds "
                "WHERE projection = 'tallies' AND status = 'active' FOR SHARE"
            )
            starting = asyncio.create_task(sink.start())
            await asyncio.wait_for(said.said.wait(), 10)
            assert not starting.done()
        await asyncio.wait_for(starting, 30)
        assert sink.table == "kinds_1"
    finally:
        logger.removeHandler(said)
        await sink.close()
        await writer.close()
    assert any(
        "creating the first build of kinds" in m and f"backend pid {backend}" in m
        for m in said.messages
    ), said.messages
