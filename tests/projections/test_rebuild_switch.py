"""A rebuild's switch and the projectors that follow it, against real Kafka and PostgreSQL."""

from __future__ import annotations

import asyncio
import importlib
import random
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from support.histories import append_all, direct_fold, run_ids_of, workload
from support.kinds import KindCounts
from support.pg import SchemaFactory, build_registry_held_by_a_write

from onward._storage import open_pool
from onward.errors import BackendUnavailableError, InvalidInputError
from onward.eventlog import KafkaEventLog, StoredEvent, kind_of
from onward.projections.builds import create_build, switch_build
from onward.projections.compaction import PostgresCompactionStore
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.kafka import KafkaProjector
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.postgres_sql import SqlProjectionSink, layout_of
from onward.projections.rebuild import rebuild_frontiers, rebuild_projection

rebuild_module = importlib.import_module("onward.projections.rebuild")
pytestmark = pytest.mark.kafka
PARTITIONS = 3


@pytest_asyncio.fixture
async def log(kafka_bootstrap: str, kafka_topic: str) -> AsyncIterator[KafkaEventLog]:
    async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=PARTITIONS) as log:
        yield log


async def caught_up(
    projector: KafkaProjector[Any],
    positions: Callable[[], Awaitable[dict[int, int]]],
    log: KafkaEventLog,
) -> None:
    """Step the projector until ``positions`` reach every partition's end."""
    ends = {p: (await log.bounds(p)).end for p in range(PARTITIONS)}
    for _ in range(600):
        stored = await positions()
        if all(stored.get(p, 0) >= e for p, e in ends.items()):
            return
        await projector.step(timeout_ms=100)
    pytest.fail(f"the projector did not catch up: {stored}, ends {ends}")


async def positions_of(database_url: str, schema: str, consumer: str) -> dict[int, int]:
    conn = await asyncpg.connect(database_url, server_settings={"search_path": schema})
    try:
        rows = await conn.fetch(
            "SELECT partition, next_offset FROM onward_projector_positions WHERE consumer = $1",
            consumer,
        )
    finally:
        await conn.close()
    return {r["partition"]: r["next_offset"] for r in rows}


def appended_before_the_switch(
    monkeypatch: pytest.MonkeyPatch, during: Callable[[], Awaitable[None]]
) -> None:
    """Run ``during`` after the rebuild found no backlog left and before it switches: events
    appended meanwhile, which the live projector folds into the old build."""
    real = rebuild_module.switch_build

    async def switch(
        conn: asyncpg.Connection, layout: Any, build: int, **options: Any
    ) -> int | None:
        await during()
        previous: int | None = await real(conn, layout, build, **options)
        return previous

    monkeypatch.setattr(rebuild_module, "switch_build", switch)


async def test_a_user_projection_asked_its_lag_after_a_switch_misses_no_event(
    log: KafkaEventLog,
    kafka_bootstrap: str,
    kafka_topic: str,
    database_url: str,
    pg_schema: str,
    rng: random.Random,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await append_all(log, workload(rng, 10))
    async with SqlProjectionSink(database_url, KindCounts(), schema=pg_schema) as sink:
        projector = KafkaProjector(
            kafka_bootstrap,
            sink,
            topic=kafka_topic,
            partitions=PARTITIONS,
            group_id=uuid.uuid4().hex,
        )
        await projector.start()
        try:
            await caught_up(projector, sink.positions, log)

            async def more() -> None:
                await append_all(log, workload(rng, 10))
                await caught_up(projector, sink.positions, log)

            appended_before_the_switch(monkeypatch, more)
            report = await rebuild_projection(log, database_url, KindCounts(), schema=pg_schema)
            assert (report.build, report.previous) == (2, 1)
            # What `onward projector` asks every 10 s (and its health probes, more often).
            await projector.lag()
            await append_all(log, workload(rng, 10))
            await caught_up(
                projector, lambda: positions_of(database_url, pg_schema, "kinds@2"), log
            )
        finally:
            await projector.close()
    counts: Counter[str] = Counter()
    for partition in range(PARTITIONS):
        for stored in await log.read_partition(partition, 0):
            counts[kind_of(type(stored.event))] += 1
    conn = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
    try:
        rows = await conn.fetch("SELECT kind, events FROM kinds")
    finally:
        await conn.close()
    assert {r["kind"]: r["events"] for r in rows} == dict(counts)


async def test_a_frontier_projector_asked_its_lag_after_a_switch_misses_no_event(
    log: KafkaEventLog,
    kafka_bootstrap: str,
    kafka_topic: str,
    database_url: str,
    pg_schema: str,
    rng: random.Random,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    steps = workload(rng, 20)
    await append_all(log, steps)
    async with PostgresFrontierStore(database_url, schema=pg_schema) as store:
        projection = FrontierProjection(store, log)
        projector = KafkaProjector(
            kafka_bootstrap,
            projection,
            topic=kafka_topic,
            partitions=PARTITIONS,
            group_id=uuid.uuid4().hex,
        )
        await projector.start()
        try:
            await caught_up(projector, projection.positions, log)
            later = workload(rng, 20)

            async def more() -> None:
                await append_all(log, later)
                await caught_up(projector, projection.positions, log)

            appended_before_the_switch(monkeypatch, more)
            report = await rebuild_frontiers(log, database_url, schema=pg_schema)
            assert (report.build, report.previous) == (2, 1)
            await projector.lag()
            last = workload(rng, 5)
            await append_all(log, last)
            await caught_up(
                projector, lambda: positions_of(database_url, pg_schema, "frontiers@2"), log
            )
        finally:
            await projector.close()
        run_ids = run_ids_of(steps + later + last)
        expected, _ = await direct_fold(log, run_ids)
        new = await PostgresFrontierStore.open(database_url, schema=pg_schema, build=2)
        try:
            rows = await new.load(run_ids)
        finally:
            await new.close()
    assert sorted(rows) == sorted(expected)
    assert {r: row.frontier for r, row in rows.items()} == expected
    await asyncio.sleep(0)


async def test_of_two_rebuilds_at_once_one_wins_and_the_other_is_refused(
    log: KafkaEventLog, database_url: str, pg_schema: str, rng: random.Random
) -> None:
    await append_all(log, workload(rng, 10))
    async with SqlProjectionSink(database_url, KindCounts(), schema=pg_schema):
        pass  # the first build, active
    outcomes = await asyncio.gather(
        rebuild_projection(log, database_url, KindCounts(), schema=pg_schema, batch_size=10),
        rebuild_projection(log, database_url, KindCounts(), schema=pg_schema, batch_size=10),
        return_exceptions=True,
    )
    won = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(won) == 1, outcomes
    assert len(refused) == 1, outcomes
    assert "another rebuild of kinds is running" in str(refused[0])
    conn = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
    try:
        active = await conn.fetchval(
            "SELECT build FROM onward_projection_builds "
            "WHERE projection = 'kinds' AND status = 'active'"
        )
    finally:
        await conn.close()
    assert active == won[0].build


class FailsOnOneRun(KindCounts):
    """Counts kinds, and fails on the end of one run."""

    name = "fails"

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    async def apply(
        self, conn: asyncpg.Connection, table: str, events: Sequence[StoredEvent]
    ) -> None:
        await super().apply(conn, table, events)
        for stored in events:
            if stored.event.run_id == self.run_id and kind_of(type(stored.event)) == "run.finished":
                raise ValueError("cannot fold this one")


async def test_a_user_projection_that_raises_names_the_event_and_stores_nothing(
    log: KafkaEventLog, database_url: str, pg_schema: str, rng: random.Random
) -> None:
    steps = workload(rng, 8)
    await append_all(log, steps)
    records = {p: await log.read_partition(p, 0) for p in range(PARTITIONS)}
    ends = {p: (await log.bounds(p)).end for p in range(PARTITIONS)}
    culprit = next(
        r for p in range(PARTITIONS) for r in records[p] if kind_of(type(r.event)) == "run.finished"
    )
    projection = FailsOnOneRun(culprit.event.run_id)
    async with SqlProjectionSink(database_url, projection, schema=pg_schema) as sink:
        with pytest.raises(Exception, match="cannot fold this one") as failed:
            await sink.apply(records, ends)
        message = str(failed.value)
        assert "cannot fold this one" in message
        assert f"partition {culprit.position.partition}" in message
        assert f"offset {culprit.position.offset}" in message
        assert culprit.event.run_id in message
        assert await sink.positions() == {}
    conn = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
    try:
        assert await conn.fetchval("SELECT count(*) FROM fails") == 0
    finally:
        await conn.close()


async def test_a_failed_rebuild_leaves_no_build_that_holds_compaction_back(
    log: KafkaEventLog, database_url: str, pg_schema: str, rng: random.Random
) -> None:
    steps = workload(rng, 8)
    await append_all(log, steps)
    records = [r for p in range(PARTITIONS) for r in await log.read_partition(p, 0)]
    culprit = next(r for r in records if kind_of(type(r.event)) == "run.finished")
    projection = FailsOnOneRun(culprit.event.run_id)
    async with SqlProjectionSink(database_url, projection, schema=pg_schema) as sink:
        ends = {p: (await log.bounds(p)).end for p in range(PARTITIONS)}
        await sink.apply({p: [] for p in range(PARTITIONS)}, ends)  # the live build, caught up
    with pytest.raises(Exception, match="cannot fold this one"):
        await rebuild_projection(log, database_url, projection, schema=pg_schema, batch_size=10)
    # Nothing folds the half build any more: compaction must not wait for it to catch up.
    async with PostgresCompactionStore(database_url, schema=pg_schema) as compaction:
        held = await compaction.positions()
    assert "fails@2" not in held
    assert held["fails@1"] == ends
    conn = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
    try:
        with pytest.raises(InvalidInputError, match="fails build 2 is retired"):
            await switch_build(conn, layout_of(projection), 2)  # it would have holes
    finally:
        await conn.close()
    # A rebuild killed outright retires nothing: the next rebuild of the projection does.
    conn = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
    try:
        await conn.execute(
            "UPDATE onward_projection_builds SET status = 'building' "
            "WHERE projection = 'fails' AND build = 2"
        )
    finally:
        await conn.close()
    works = FailsOnOneRun("no such run")
    report = await rebuild_projection(log, database_url, works, schema=pg_schema)
    assert (report.build, report.previous) == (3, 1)
    async with PostgresCompactionStore(database_url, schema=pg_schema) as compaction:
        held = await compaction.positions()
    assert "fails@2" not in held


async def test_a_switch_that_meets_a_session_holding_the_views_says_so(
    log: KafkaEventLog, database_url: str, pg_schema: str, rng: random.Random
) -> None:
    await append_all(log, workload(rng, 5))
    reader = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
    try:
        # A transaction left open after reading the view (a SQL console, a report).
        async with reader.transaction():
            await reader.fetch("SELECT count(*) FROM onward_frontiers")
            with pytest.raises(BackendUnavailableError) as failed:
                await rebuild_frontiers(log, database_url, schema=pg_schema, timeout_s=2)
            backend = reader.get_server_pid()
    finally:
        await reader.close()
    message = str(failed.value)
    assert "did not answer" not in message
    assert "build 2" in message
    assert f"backend pid {backend}" in message
    async with PostgresFrontierStore(database_url, schema=pg_schema) as store:
        assert store.build == 1  # readers stay on the build they had


@pytest.mark.parametrize("batch_size", [0, -1])
async def test_a_rebuild_that_would_read_nothing_per_step_is_refused(
    log: KafkaEventLog, database_url: str, pg_schema: str, rng: random.Random, batch_size: int
) -> None:
    await append_all(log, workload(rng, 3))
    with pytest.raises(InvalidInputError, match="batch_size"):
        await asyncio.wait_for(
            rebuild_projection(
                log, database_url, KindCounts(), schema=pg_schema, batch_size=batch_size
            ),
            10,
        )


async def test_a_switch_waits_out_a_session_that_lets_go_of_the_views_in_time(
    log: KafkaEventLog, database_url: str, pg_schema: str, rng: random.Random
) -> None:
    await append_all(log, workload(rng, 5))
    reader = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
    try:
        transaction = reader.transaction()
        await transaction.start()
        await reader.fetch("SELECT count(*) FROM onward_frontiers")
        rebuilding = asyncio.create_task(
            rebuild_frontiers(log, database_url, schema=pg_schema, timeout_s=20)
        )
        await asyncio.sleep(2.5)  # past the first attempts to switch
        await transaction.rollback()
        report = await asyncio.wait_for(rebuilding, 30)
    finally:
        await reader.close()
    assert (report.build, report.previous) == (2, 1)
    async with PostgresFrontierStore(database_url, schema=pg_schema) as store:
        assert store.build == 2


async def test_two_rebuilds_naming_one_schema_two_ways_do_not_run_side_by_side(
    log: KafkaEventLog, database_url: str, pg_schema: str, rng: random.Random
) -> None:
    """One rebuild names the schema, the other reaches it through the URL's search path (as
    ONWARD_DATABASE_SCHEMA unset on one host and set on another): one registry, so one rebuild
    at a time, or each retires the build the other is filling and neither switches."""
    await append_all(log, workload(rng, 10))
    async with SqlProjectionSink(database_url, KindCounts(), schema=pg_schema):
        pass  # the first build, active
    joiner = "&" if "?" in database_url else "?"
    by_path = f"{database_url}{joiner}search_path={pg_schema}"
    outcomes = await asyncio.gather(
        rebuild_projection(log, database_url, KindCounts(), schema=pg_schema, batch_size=10),
        rebuild_projection(log, by_path, KindCounts(), batch_size=10),
        return_exceptions=True,
    )
    won = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(won) == 1, outcomes
    assert len(refused) == 1, outcomes
    assert "another rebuild of kinds is running" in str(refused[0])


async def test_a_rebuild_given_no_schema_is_refused_beside_one_of_an_earlier_version(
    log: KafkaEventLog, database_url: str, pg_schema: str, rng: random.Random
) -> None:
    """During an upgrade, a rebuild of an earlier version given no schema holds the lock under
    the key it always took (``onward::rebuild:kinds``): an upgraded one on the same schema is
    refused, or each retires the build the other is filling and neither switches."""
    await append_all(log, workload(rng, 5))
    async with SqlProjectionSink(database_url, KindCounts(), schema=pg_schema):
        pass  # the first build, active
    joiner = "&" if "?" in database_url else "?"
    by_path = f"{database_url}{joiner}search_path={pg_schema}"
    earlier = await asyncpg.connect(database_url)
    try:
        await earlier.execute(
            "SELECT pg_advisory_lock(hashtextextended('onward::rebuild:kinds', 0))"
        )
        with pytest.raises(InvalidInputError, match="another rebuild of kinds is running"):
            await rebuild_projection(log, by_path, KindCounts(), batch_size=10)
    finally:
        await earlier.close()
    report = await rebuild_projection(log, by_path, KindCounts(), batch_size=10)
    assert (report.build, report.previous) == (2, 1)


async def test_a_rebuild_that_meets_a_session_holding_the_build_registry_says_so(
    log: KafkaEventLog, database_url: str, pg_schema: str, rng: random.Random
) -> None:
    """A write of a projection left open (a slow user projection's batch, a person's
    ``BEGIN``) holds the build registry: the rebuild cannot create its build, and says who
    holds it, not that the server did not answer; meanwhile the other writes wait no longer
    than a step of its wait, not for all of it."""
    await append_all(log, workload(rng, 5))
    async with SqlProjectionSink(database_url, KindCounts(), schema=pg_schema):
        pass  # the first build, active

    async def rebuild() -> object:
        return await rebuild_projection(
            log, database_url, KindCounts(), schema=pg_schema, timeout_s=4
        )

    await build_registry_held_by_a_write(database_url, pg_schema, "kinds", rebuild)
    report = await rebuild_projection(log, database_url, KindCounts(), schema=pg_schema)
    assert (report.build, report.previous) == (2, 1)


async def test_a_rebuild_refused_its_build_still_retires_the_one_a_killed_rebuild_left(
    log: KafkaEventLog, database_url: str, pg_schema: str, rng: random.Random
) -> None:
    """A rebuild killed outright left build 2 unfinished, holding every partition back from
    compaction; the next rebuild cannot create its own build (a write left open holds the
    build registry): it must still retire build 2, as it did before its creation waited in
    steps, or compaction waits until a rebuild gets through."""
    await append_all(log, workload(rng, 5))
    async with SqlProjectionSink(database_url, KindCounts(), schema=pg_schema):
        pass  # the first build, active
    conn = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
    try:
        await create_build(conn, layout_of(KindCounts()))  # a rebuild then killed outright
        async with conn.transaction():
            await conn.fetch(
                "SELECT build FROM onward_projection_builds "
                "WHERE projection = 'kinds' AND status = 'active' FOR SHARE"
            )
            with pytest.raises(BackendUnavailableError, match="onward_projection_builds"):
                await rebuild_projection(
                    log, database_url, KindCounts(), schema=pg_schema, timeout_s=2
                )
    finally:
        await conn.close()
    async with PostgresCompactionStore(database_url, schema=pg_schema) as compaction:
        held = await compaction.positions()
    assert "kinds@2" not in held, held


async def test_rebuilds_given_no_schema_of_two_schemas_run_side_by_side(
    log: KafkaEventLog, database_url: str, new_pg_schema: SchemaFactory, rng: random.Random
) -> None:
    """Two deployments each reach their own schema through the URL's search path: a rebuild of
    ``kinds`` in one is not refused as "another rebuild is running" because one of ``kinds``
    runs in the other (the key earlier versions took is one for every schema)."""
    await append_all(log, workload(rng, 5))
    joiner = "&" if "?" in database_url else "?"
    first, second = await new_pg_schema(), await new_pg_schema()
    pool = await open_pool(f"{database_url}{joiner}search_path={first}", max_size=1)
    try:
        guard = await rebuild_module._rebuild_lock(pool, "kinds", 5, earlier=True)
        try:
            report = await rebuild_projection(
                log, f"{database_url}{joiner}search_path={second}", KindCounts(), batch_size=10
            )
        finally:
            await pool.release(guard)
    finally:
        await pool.close()
    assert report.build == 1
