"""Garbage collection over real runs: what a dry run counts is what a run deletes, and runs that
are running or waiting on a person keep every row and key.

Each scenario writes runs through `AgentRunner` (old ones, tagged, then new ones), compacts them
(`CheckpointCompactor`: truncation points, retained tagged events), moves the collector's clock
30 days past the moment between them, and checks the stores directly: SQLite through sqlite3,
PostgreSQL through asyncpg, Redis through its client.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import sqlite3
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import msgspec
import pytest
import pytest_asyncio
from redis.asyncio import Redis
from support import cli_agent
from support.crashes import Crash, CrashAt
from support.servers import KafkaServers
from typer.testing import CliRunner

from onward.errors import BackendUnavailableError, ConfigurationError, InvalidInputError
from onward.eventlog import SqliteEventLog
from onward.integrations.mcp.cache import SchemaCache, ServerSchema
from onward.projections.base import FrontierStore, Snapshot
from onward.projections.compaction import (
    CompactionStore,
    PostgresCompactionStore,
    RunTruncation,
    SqliteCompactionStore,
)
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.log_projector import LogProjector
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime import AgentRunner
from onward.runtime.cli import app
from onward.runtime.compaction import CheckpointCompactor
from onward.runtime.gc import (
    GarbageCollector,
    KeySweeper,
    PostgresRecordSweeper,
    RecordSweeper,
    RedisKeySweeper,
    SqliteRecordSweeper,
)
from onward.runtime.gc.base import KINDS, FinishedRun, Kind, SweepPlan
from onward.runtime.leases import SqliteLeaseStore
from onward.testing.eventlog import new_run_id
from onward.testing.frontiers import frontier
from onward.testing.gc import Stores

TENANT = "acme"
DAY_S = 86_400.0
SQL_TABLES: dict[Kind, str] = {
    "frontiers": "onward_frontiers",
    "transcript": "onward_transcript",
    "tool_calls": "onward_tool_calls",
    "lease_rows": "onward_leases",
    "truncations": "onward_run_truncation",
    "retained_events": "onward_retained_events",
}

Rows = dict[Kind, Counter[str]]
"""Per kind, how many rows or keys each run has."""


@dataclass
class Runs:
    """The runs of the scenario, by what should happen to them."""

    old_finished: list[str]
    live: list[str]
    new_finished: list[str]


@dataclass
class World:
    """A deployment under test: how to make runners, collectors and snapshots of its stores."""

    runner: Callable[..., AgentRunner]
    records: RecordSweeper
    keys: KeySweeper | None
    snapshot: Callable[[], Awaitable[Rows]]
    after_runs: Callable[[list[str]], Awaitable[None]]
    compaction: CompactionStore
    """Where `compact` puts truncation points and retained events (the records' database)."""

    async def compact(self) -> None:
        """One compaction pass keeping one untagged resume point per live run, so the live
        runs get truncation points too."""
        runner = self.runner(provider=cli_agent.booking_model())
        assert runner.frontiers is not None
        compactor = CheckpointCompactor(
            runner.log, runner.frontiers, self.compaction, no_archive=True, max_checkpoints=1
        )
        report = await compactor.compact()
        assert sum(p.runs_compacted for p in report.partitions) > 0


async def write_runs(world: World) -> tuple[Runs, float]:
    """Old runs (two finished, one running, one waiting), each tagged at its first event, then
    the moment, then new ones; then every run is compacted."""

    async def booked() -> str:
        run_id = new_run_id()
        runner = world.runner(provider=cli_agent.booking_model())
        await runner.run(cli_agent.booker(), "go", tenant=TENANT, run_id=run_id)
        return run_id

    async def waiting() -> str:
        run_id = new_run_id()
        runner = world.runner(provider=cli_agent.paying_model())
        await runner.run(cli_agent.payer(), "go", tenant=TENANT, run_id=run_id)
        return run_id

    denied = await waiting()
    await world.runner(provider=cli_agent.paying_model()).deny(denied, "p", tenant=TENANT, by="ann")
    running = new_run_id()
    with contextlib.suppress(Crash):
        crashing = world.runner(
            provider=cli_agent.booking_model(), observer=CrashAt("turn.settled")
        )
        await crashing.run(cli_agent.booker(), "go", tenant=TENANT, run_id=running)
    runs = Runs([await booked(), denied], [running, await waiting()], [])
    tagger = world.runner(provider=cli_agent.booking_model())
    for run_id in (*runs.old_finished, *runs.live):
        await tagger.tag(run_id, "first", tenant=TENANT, seq=1)
    moment = time.time()
    runs.new_finished.append(await booked())
    await world.after_runs([*runs.old_finished, *runs.live, *runs.new_finished])
    await world.compact()
    return runs, moment


async def check_collection(world: World) -> None:
    runs, moment = await write_runs(world)
    collector = GarbageCollector(world.records, world.keys, clock=lambda: moment + 30 * DAY_S)
    before = await world.snapshot()
    for run_id in (*runs.old_finished, *runs.live, *runs.new_finished):
        assert before["frontiers"][run_id] == 1, run_id
        assert before["transcript"][run_id] >= 1, run_id
        assert before["lease_rows"][run_id] + before["redis_fences"][run_id] == 1, run_id
        assert before["truncations"][run_id] == 1, run_id
    for run_id in (*runs.old_finished, *runs.live):
        assert before["retained_events"][run_id] >= 1, run_id  # its tagged first event

    dry = await collector.dry_run()
    assert dry.dry_run
    assert await world.snapshot() == before, "a dry run deleted something"
    done = await collector.run()
    after = await world.snapshot()

    assert done.counts == dry.counts
    assert set(done.expired) == set(runs.old_finished)
    for kind in KINDS:
        assert before[kind].total() - after[kind].total() == done.count(kind), kind
    for run_id in runs.live:
        assert {k: after[k][run_id] for k in KINDS} == {k: before[k][run_id] for k in KINDS}
    for run_id in runs.old_finished:
        assert {k: after[k][run_id] for k in KINDS} == dict.fromkeys(KINDS, 0)
    (new,) = runs.new_finished
    assert after["frontiers"][new] == 1
    assert after["transcript"][new] == before["transcript"][new]
    assert after["lease_rows"][new] == before["lease_rows"][new]
    assert before["tool_calls"][new] == 1
    assert after["tool_calls"][new] == 0  # past the task-result ttl of 7 days
    for kind in ("redis_leases", "redis_fences", "schema_cache"):
        assert after[kind][new] == 0  # past the Redis key ttl of 48 hours
    assert done.count("frontiers") == 2
    assert done.count("truncations") == 2
    assert after["truncations"][new] == 1
    assert done.count("tool_calls") == 2  # the booking of each booked run; the denied one has none
    assert (await collector.dry_run()).total == 0


async def sqlite_snapshot(path: Path) -> Rows:
    def read() -> Rows:
        with contextlib.closing(sqlite3.connect(path)) as conn:
            return {
                kind: Counter(r for (r,) in conn.execute(f"SELECT run_id FROM {table}"))
                for kind, table in SQL_TABLES.items()
            } | {kind: Counter() for kind in KINDS if kind not in SQL_TABLES}

    return await asyncio.to_thread(read)


@pytest_asyncio.fixture
async def sqlite_world(tmp_path: Path) -> AsyncIterator[World]:
    path = tmp_path / "onward.db"
    async with (
        SqliteEventLog(path) as log,
        SqliteFrontierStore(path) as frontiers,
        SqliteRecordSweeper(path) as records,
    ):
        runner = functools.partial(
            AgentRunner, log=log, frontiers=frontiers, checkpoint_inline=True
        )

        async def fold(run_ids: list[str]) -> None:
            # The inline checkpointer folds at boundaries; a tag is none, and compaction only
            # sees what is folded.
            await LogProjector(log, FrontierProjection(frontiers, log)).catch_up()

        compaction = SqliteCompactionStore(path, sharing=log)
        yield World(runner, records, None, lambda: sqlite_snapshot(path), fold, compaction)


async def test_gc_on_sqlite_deletes_what_the_dry_run_counted_and_spares_live_runs(
    sqlite_world: World,
) -> None:
    await check_collection(sqlite_world)


@pytest.mark.kafka
async def test_gc_on_kafka_postgres_and_redis_deletes_what_the_dry_run_counted(
    kafka_servers: KafkaServers,
) -> None:
    d = kafka_servers
    schema_prefix = f"{d.redis_prefix}mcp:schema:"
    async with (
        d.log() as log,
        d.frontiers() as frontiers,
        d.leases() as leases,
        PostgresCompactionStore(d.database_url, schema=d.schema) as compaction,
        PostgresRecordSweeper(d.database_url, schema=d.schema) as records,
        RedisKeySweeper(d.redis_url, prefix=d.redis_prefix, schema_prefix=schema_prefix) as keys,
    ):
        client = Redis.from_url(d.redis_url, decode_responses=True)
        conn = await asyncpg.connect(d.database_url, server_settings={"search_path": d.schema})
        try:
            runner = functools.partial(AgentRunner, log=log, leases=leases, frontiers=frontiers)
            written: list[str] = []

            async def project_and_cache(run_ids: list[str]) -> None:
                written.extend(run_ids)
                await LogProjector(log, FrontierProjection(frontiers, log)).catch_up()
                cache = SchemaCache(client, prefix=schema_prefix)
                listing = ServerSchema.of([], endpoint="e", server_name="s", server_version="1")
                for run_id in run_ids:
                    await cache.store(run_id, {"s": listing})

            async def snapshot() -> Rows:
                counts: Rows = {}
                for kind, table in SQL_TABLES.items():
                    rows = await conn.fetch(f"SELECT run_id FROM {table}")
                    counts[kind] = Counter(r["run_id"] for r in rows)
                key_of: dict[Kind, Callable[[str], str]] = {
                    "redis_leases": leases.lease_key,
                    "redis_fences": leases.fence_key,
                    "schema_cache": lambda r: f"{schema_prefix}{r}",
                }
                for kind, key in key_of.items():
                    counts[kind] = Counter([r for r in written if await client.exists(key(r))])
                return counts

            world = World(runner, records, keys, snapshot, project_and_cache, compaction)
            await check_collection(world)
        finally:
            await conn.close()
            await client.aclose()


async def test_a_continued_run_is_kept_while_the_run_it_was_carried_into_is(
    tmp_path: Path,
) -> None:
    path = tmp_path / "onward.db"
    async with (
        SqliteFrontierStore(path) as frontiers,
        SqliteLeaseStore(path) as leases,
        SqliteCompactionStore(path) as compaction,
        SqliteRecordSweeper(path) as records,
    ):
        stores = Stores(frontiers, leases, compaction, records)
        young = await stores.seed("completed", finished_at=int(50 * DAY_S * 1e6))
        first = await stores.seed("continued", finished_at=1)
        head = await stores.seed("continued", finished_at=2, continued_to=first)
        old = await stores.seed("completed", finished_at=3)
        # `first` was carried into a run that finished recently, `head` into `first`.
        await _carry(frontiers, first, young)
        collector = GarbageCollector(records, clock=lambda: 40 * DAY_S)
        report = await collector.run()
        assert report.expired == (old,)
        assert set(report.kept) == {first, head}
        assert await frontiers.get(first) is not None
        assert await frontiers.get(head) is not None
        assert await frontiers.get(old) is None
        later = await GarbageCollector(records, clock=lambda: 90 * DAY_S).run()
        assert set(later.expired) == {first, head, young}
        assert later.kept == ()


async def test_a_pass_cut_short_never_strands_a_chain_of_continued_runs(
    tmp_path: Path,
) -> None:
    """A run carried ten times (``r``, ``r~c1`` .. ``r~c10``): ids sort ``r~c10`` before
    ``r~c2``. Were runs removed in id order, a pass failing after ``r~c10`` went would leave
    ``r~c9`` carried into a run that is gone, kept (with all before it) by every later pass."""
    path = tmp_path / "onward.db"
    async with (
        SqliteFrontierStore(path) as frontiers,
        SqliteRecordSweeper(path) as records,
    ):
        chain = [f"r{'' if n == 0 else f'~c{n}'}" for n in range(11)]
        rows = [
            msgspec.structs.replace(
                frontier(run_id, through=n, status="continued" if n < 10 else "completed"),
                agent="booker",
                updated_at=n + 1,
                continued_to=chain[n + 1] if n < 10 else None,
            )
            for n, run_id in enumerate(chain)
        ]
        await frontiers.write("seed", {}, [Snapshot.of(row) for row in rows], [])
        async with FailsAfter(path, sweeps=3) as failing:
            with pytest.raises(BackendUnavailableError):
                await GarbageCollector(failing, clock=lambda: 40 * DAY_S, batch=1).run()

        report = await GarbageCollector(records, clock=lambda: 40 * DAY_S).run()

        assert report.kept == ()
        assert [run_id for run_id in chain if await frontiers.get(run_id) is not None] == []


class FailsAfter(SqliteRecordSweeper):
    """A record sweeper whose sweeps fail after the first few (a database lost mid-pass)."""

    def __init__(self, path: Path, *, sweeps: int) -> None:
        super().__init__(path)
        self.sweeps = sweeps

    async def sweep(self, plan: SweepPlan, *, delete: bool) -> dict[Kind, int]:
        if self.sweeps == 0:
            raise BackendUnavailableError("the database went away")
        self.sweeps -= 1
        return await super().sweep(plan, delete=delete)


class Listed:
    """A record sweeper that lists the finished runs given and sweeps nothing."""

    def __init__(self, runs: list[FinishedRun]) -> None:
        self.runs = runs

    async def close(self) -> None:
        pass

    async def __aenter__(self) -> Listed:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    async def finished(self, *, before: int) -> list[FinishedRun]:
        return [run for run in self.runs if run.finished_at < before]

    async def sweep(self, plan: SweepPlan, *, delete: bool) -> dict[Kind, int]:
        return {}


async def test_a_long_chain_of_continued_runs_is_planned_in_time() -> None:
    """A run carried on 20,000 times (a long-lived agent continued at every context limit),
    its newest run still live: the whole chain is kept for it, and deciding so takes a walk
    along the chain, not a pass over every finished run per run of the chain."""
    chain = [f"r{'' if n == 0 else f'~c{n}'}" for n in range(20_001)]
    runs = sorted(
        (
            FinishedRun(run_id, TENANT, "continued", n + 1, True, chain[n + 1])
            for n, run_id in enumerate(chain[:-1])
        ),
        key=lambda run: run.run_id,
    )
    collector = GarbageCollector(Listed(runs), clock=lambda: 40 * DAY_S)
    started = time.monotonic()
    report = await collector.dry_run()
    took = time.monotonic() - started
    assert report.expired == ()
    assert set(report.kept) == set(chain[:-1])
    assert took < 5, f"planning took {took:.1f}s"


async def test_a_continued_run_goes_once_the_run_it_was_carried_into_is_gone(
    tmp_path: Path,
) -> None:
    """Its successor collected first (the continued run's row was touched since, a late tag):
    the continued run is kept for nothing, and goes once its own ttl is over."""
    path = tmp_path / "onward.db"
    async with (
        SqliteFrontierStore(path) as frontiers,
        SqliteLeaseStore(path) as leases,
        SqliteCompactionStore(path) as compaction,
        SqliteRecordSweeper(path) as records,
    ):
        stores = Stores(frontiers, leases, compaction, records)
        successor = await stores.seed("completed", finished_at=1)
        head = await stores.seed("continued", finished_at=int(50 * DAY_S * 1e6))
        await _carry(frontiers, head, successor)
        first = await GarbageCollector(records, clock=lambda: 40 * DAY_S).run()
        assert first.expired == (successor,)
        assert first.kept == ()

        later = await GarbageCollector(records, clock=lambda: 90 * DAY_S).run()

        assert later.expired == (head,)
        assert later.kept == ()
        assert await frontiers.get(head) is None


async def _carry(frontiers: FrontierStore, run_id: str, into: str) -> None:
    """Point a seeded continued run's row at the run it was carried into."""
    row = await frontiers.get(run_id)
    assert row is not None
    assert row.frontier is not None
    carried = msgspec.structs.replace(
        row.frontier, continued_to=into, through_offset=row.frontier.through_offset + 1
    )
    await frontiers.write("seed", {}, [Snapshot.of(carried)], [])


def test_bad_ttls_are_a_configuration_error(tmp_path: Path) -> None:
    records = SqliteRecordSweeper(tmp_path / "x.db")
    with pytest.raises(ConfigurationError, match="checkpoint_ttl_days=0"):
        GarbageCollector(records, checkpoint_ttl_days=0)
    with pytest.raises(ConfigurationError, match="batch"):
        GarbageCollector(records, batch=0)


def test_onward_gc_counts_with_dry_run_then_deletes(tmp_path: Path) -> None:
    path = tmp_path / "onward.db"

    async def write() -> tuple[str, str]:
        async with SqliteEventLog(path) as log, SqliteFrontierStore(path) as frontiers:
            done, waiting = new_run_id(), new_run_id()
            for run_id, agent, model in [
                (done, cli_agent.booker(), cli_agent.booking_model()),
                (waiting, cli_agent.payer(), cli_agent.paying_model()),
            ]:
                runner = AgentRunner(
                    provider=model, log=log, frontiers=frontiers, checkpoint_inline=True
                )
                await runner.run(agent, "go", tenant=TENANT, run_id=run_id)
            return done, waiting

    done, waiting = asyncio.run(write())
    env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(path), "REDIS_URL": None}
    tiny = ["--checkpoint-ttl-days", "1e-12", "--json"]  # everything finished is past it

    def onward(*args: str) -> dict[str, object]:
        result = CliRunner().invoke(app, ["gc", *args], env=env)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)  # type: ignore[no-any-return]

    dry = onward("--dry-run", *tiny)
    assert dry["dry_run"] is True
    counts = dry["counts"]
    assert isinstance(counts, dict)
    assert counts["frontiers"] == 1
    assert counts["tool_calls"] == 1
    assert onward("--dry-run", *tiny) == dry
    assert onward(*tiny) == {**dry, "dry_run": False}
    assert onward(*tiny)["counts"] == dict.fromkeys(KINDS, 0)
    inspect = CliRunner().invoke(app, ["inspect", waiting, "--tenant", TENANT], env=env)
    assert inspect.exit_code == 0, inspect.output
    # Its events are still in the log (compaction cuts them, not GC), but no reader goes
    # back past the stored positions to find them.
    gone = CliRunner().invoke(app, ["inspect", done, "--tenant", TENANT], env=env)
    assert gone.exit_code == 1, gone.output
    table = CliRunner().invoke(app, ["gc", "--dry-run"], env=env)
    assert table.exit_code == 0, table.output
    assert "would delete 0 row(s)" in table.stdout
    bad = CliRunner().invoke(app, ["gc", "--task-result-ttl-days", "-1"], env=env)
    assert bad.exit_code == 2
    assert "--task-result-ttl-days=-1" in bad.stderr


async def start_again_after_collection(world: World) -> None:
    """A run is collected; a start under its id is refused, saying why, and writes nothing: the
    old run's events are still in the log, and a new history under the id would be read with
    them (its first events refused as duplicates, or its fold counting the old run's)."""
    run_id = new_run_id()
    runner = world.runner(provider=cli_agent.booking_model(), compaction=world.compaction)
    first = await runner.run(cli_agent.booker(), "go", tenant=TENANT, run_id=run_id)
    assert first.status == "completed"
    await world.after_runs([run_id])
    done = await GarbageCollector(
        world.records, world.keys, clock=lambda: time.time() + 31 * DAY_S
    ).run()
    assert run_id in done.expired
    again = world.runner(provider=cli_agent.booking_model(), compaction=world.compaction)
    with pytest.raises(InvalidInputError, match="garbage collection") as refused:
        await again.run(cli_agent.booker(), "go", tenant=TENANT, run_id=run_id)
    assert run_id in str(refused.value)
    with pytest.raises(InvalidInputError, match="garbage collection"):
        await again.end_at_start(
            "booker", "go", tenant=TENANT, run_id=run_id, status="failed", error="x"
        )
    await world.after_runs([run_id])
    assert again.frontiers is not None
    assert await again.frontiers.get(run_id) is None  # nothing of a new run was written


async def test_a_start_under_a_collected_run_id_is_refused_on_sqlite(sqlite_world: World) -> None:
    await start_again_after_collection(sqlite_world)


@pytest.mark.kafka
async def test_a_start_under_a_collected_run_id_is_refused_on_kafka_postgres(
    kafka_servers: KafkaServers,
) -> None:
    d = kafka_servers
    async with (
        d.log() as log,
        d.frontiers() as frontiers,
        d.leases() as leases,
        PostgresCompactionStore(d.database_url, schema=d.schema) as compaction,
        PostgresRecordSweeper(d.database_url, schema=d.schema) as records,
    ):
        runner = functools.partial(AgentRunner, log=log, leases=leases, frontiers=frontiers)

        async def project(run_ids: list[str]) -> None:
            await LogProjector(log, FrontierProjection(frontiers, log)).catch_up()

        async def no_snapshot() -> Rows:
            return {}

        world = World(runner, records, None, no_snapshot, project, compaction)
        await start_again_after_collection(world)


async def test_a_pass_planned_before_a_second_collection_of_a_run_keeps_nothing_of_it(
    sqlite_world: World,
) -> None:
    """A run collected, its row folded back (a rebuild from the log), then collected again:
    a compaction pass that planned the run's point between the two collections stores
    nothing of it. The second tombstone left ``collected_at`` at the first collection, so the
    pass took the run for one still there and wrote a point no collection ever removes."""
    world = sqlite_world
    run_id = new_run_id()
    runner = world.runner(provider=cli_agent.booking_model(), compaction=world.compaction)
    await runner.run(cli_agent.booker(), "go", tenant=TENANT, run_id=run_id)
    later = time.time() + 31 * DAY_S
    assert run_id in (await GarbageCollector(world.records, clock=lambda: later).run()).expired
    assert runner.frontiers is not None
    await LogProjector(
        runner.log, FrontierProjection(runner.frontiers, runner.log, consumer="rebuild")
    ).catch_up()
    assert await runner.frontiers.get(run_id) is not None, "the rebuild brought no row back"
    planned = time.time_ns() // 1_000
    await asyncio.sleep(0.01)
    assert run_id in (await GarbageCollector(world.records, clock=lambda: later).run()).expired
    point = RunTruncation(
        tenant=TENANT,
        run_id=run_id,
        partition=0,
        before_seq=2,
        before_offset=1,
        at=planned,
        whole=False,
        fence=1,
    )
    await world.compaction.truncate([point], [])
    assert await world.compaction.truncations([run_id]) == {}
