"""The record sweepers pass `RecordSweeperConformance`; the Redis key sweeper keeps held leases."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import pytest
import pytest_asyncio
from redis.asyncio import Redis

from onward.errors import BackendError, BackendUnavailableError, ConfigurationError
from onward.integrations.mcp import MCPSettings, SchemaCache, ServerSchema
from onward.projections.base import RunSummary, Snapshot, StoredFrontier
from onward.projections.compaction import PostgresCompactionStore, SqliteCompactionStore
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.redis import RedisFrontierStore
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.gc import (
    KeySweeper,
    PostgresRecordSweeper,
    RecordSweeper,
    RedisFrontierSweeper,
    RedisKeySweeper,
    SqliteRecordSweeper,
    SweepPlan,
    redis_frontiers,
)
from onward.runtime.gc import postgres as gc_postgres
from onward.runtime.gc import sqlite as gc_sqlite
from onward.runtime.gc.base import KEY_KINDS
from onward.runtime.gc.configured import key_sweeper
from onward.runtime.leases import PostgresLeaseStore, RedisLeaseStore, SqliteLeaseStore
from onward.runtime.settings import SecretUrl, Settings
from onward.testing.eventlog import TENANT, new_run_id
from onward.testing.gc import CUTOFF, NEW, RecordSweeperConformance, Stores


class TestSqliteRecordSweeper(RecordSweeperConformance):
    @pytest.fixture(autouse=True)
    def _folder(self, tmp_path: Path) -> None:
        self.folder = tmp_path

    async def open_stores(self) -> Stores:
        path = self.folder / "onward.db"
        return Stores(
            await SqliteFrontierStore.open(path),
            await SqliteLeaseStore.open(path),
            await SqliteCompactionStore.open(path),
            await SqliteRecordSweeper.open(path),
        )


class TestPostgresRecordSweeper(RecordSweeperConformance):
    database_url: str
    schema: str

    @pytest.fixture(autouse=True)
    def _server(self, database_url: str, pg_schema: str) -> None:
        self.database_url, self.schema = database_url, pg_schema

    async def open_stores(self) -> Stores:
        url, schema = self.database_url, self.schema
        return Stores(
            await PostgresFrontierStore.open(url, schema=schema),
            await PostgresLeaseStore.open(url, schema=schema),
            await PostgresCompactionStore.open(url, schema=schema),
            await PostgresRecordSweeper.open(url, schema=schema),
        )


class TestRedisFrontierSweeper(RecordSweeperConformance):
    """Frontiers in Redis (``ONWARD_FRONTIER_STORE=redis``), compaction and lease rows in
    PostgreSQL."""

    redis_url: str
    redis_prefix: str
    database_url: str
    schema: str

    @pytest.fixture(autouse=True)
    def _servers(
        self, redis_url: str, redis_prefix: str, database_url: str, pg_schema: str
    ) -> None:
        self.redis_url, self.redis_prefix = redis_url, redis_prefix
        self.database_url, self.schema = database_url, pg_schema

    async def open_stores(self) -> Stores:
        return await redis_frontier_stores(
            self.redis_url, self.redis_prefix, self.database_url, self.schema
        )


async def redis_frontier_stores(
    redis_url: str, prefix: str, database_url: str, schema: str
) -> Stores:
    """Frontiers in Redis, leases, compaction and tag pins in PostgreSQL, and their sweeper."""
    return Stores(
        await RedisFrontierStore.open(redis_url, prefix=prefix),
        await PostgresLeaseStore.open(database_url, schema=schema),
        await PostgresCompactionStore.open(database_url, schema=schema),
        await RedisFrontierSweeper.open(redis_url, database_url, prefix=prefix, schema=schema),
    )


@pytest.fixture
def open_redis_stores(
    redis_url: str, redis_prefix: str, database_url: str, pg_schema: str
) -> Callable[[], Awaitable[Stores]]:
    """Opens `redis_frontier_stores` on this test's Redis prefix and PostgreSQL schema."""
    return lambda: redis_frontier_stores(redis_url, redis_prefix, database_url, pg_schema)


class _CountedFetches:
    """A PostgreSQL connection whose reads of frontier rows are counted."""

    def __init__(self, conn: asyncpg.Connection, read: list[int]) -> None:
        self._conn, self._read = conn, read

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        rows: list[asyncpg.Record] = await self._conn.fetch(query, *args)
        if "FROM onward_frontiers" in query:
            self._read.append(len(rows))
        return rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_finished_runs_are_read_a_page_at_a_time(
    backend: str,
    tmp_path: Path,
    database_url: str,
    pg_schema: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With very many finished runs, a pass reads a page of their frontier rows at a time
    (those of continued runs carry the whole payload), and lists each finished run once, with
    its successor."""
    page = 3
    read: list[int] = []
    if backend == "sqlite":
        path = tmp_path / "onward.db"
        stores = Stores(
            await SqliteFrontierStore.open(path),
            await SqliteLeaseStore.open(path),
            await SqliteCompactionStore.open(path),
            await SqliteRecordSweeper.open(path),
        )
        monkeypatch.setattr(gc_sqlite, "FINISHED_AT_ONCE", page, raising=False)
    else:
        url, schema = database_url, pg_schema
        stores = Stores(
            await PostgresFrontierStore.open(url, schema=schema),
            await PostgresLeaseStore.open(url, schema=schema),
            await PostgresCompactionStore.open(url, schema=schema),
            await PostgresRecordSweeper.open(url, schema=schema),
        )
        monkeypatch.setattr(gc_postgres, "FINISHED_AT_ONCE", page, raising=False)
    async with stores:
        done = [await stores.seed("completed") for _ in range(7)]
        successor = await stores.seed("completed")
        continued = await stores.seed("continued", continued_to=successor)
        await stores.seed("completed", finished_at=NEW)
        sweeper: Any = stores.sweeper
        if backend == "sqlite":
            call = sweeper._db.call

            async def counted(fn: Any, context: str, run_id: str | None = None) -> Any:
                result = await call(fn, context, run_id)
                if context == "listing finished runs":
                    read.append(len(result))
                return result

            monkeypatch.setattr(sweeper._db, "call", counted)
        else:
            connection = sweeper._connection

            @contextlib.asynccontextmanager
            async def counted_connection(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
                async with connection(*args, **kwargs) as conn:
                    yield _CountedFetches(conn, read)

            monkeypatch.setattr(sweeper, "_connection", counted_connection)
        found = {r.run_id: r for r in await sweeper.finished(before=CUTOFF)}
        assert read
        assert max(read) <= page, read
        assert sorted(found) == sorted([*done, successor, continued])
        assert found[continued].successor == successor


async def test_finished_runs_in_redis_are_listed_a_page_at_a_time(
    open_redis_stores: Callable[[], Awaitable[Stores]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With very many finished runs, a pass reads a page of them from Redis at a time (their
    summaries and continued frontiers), and lists each finished run once, with its successor."""
    page = 3
    monkeypatch.setattr(redis_frontiers, "FINISHED_AT_ONCE", page, raising=False)
    async with await open_redis_stores() as stores:
        done = [await stores.seed("completed") for _ in range(7)]
        successor = await stores.seed("completed")
        continued = await stores.seed("continued", continued_to=successor)
        await stores.seed("completed", finished_at=NEW)
        sweeper = stores.sweeper
        assert isinstance(sweeper, RedisFrontierSweeper)
        listing, loading = sweeper.frontiers.runs, sweeper.frontiers.load
        read: list[int] = []

        async def listed(**kwargs: Any) -> list[RunSummary]:
            rows = await listing(**kwargs)
            read.append(len(rows))
            return rows

        async def loaded(run_ids: Collection[str]) -> dict[str, StoredFrontier]:
            read.append(len(run_ids))
            return await loading(run_ids)

        monkeypatch.setattr(sweeper.frontiers, "runs", listed)
        monkeypatch.setattr(sweeper.frontiers, "load", loaded)
        found = [r.run_id for r in await sweeper.finished(before=CUTOFF)]
        assert max(read) <= page, read
        assert sorted(found) == sorted([*done, successor, continued])  # each once
        assert {r.run_id: r.successor for r in await sweeper.finished(before=CUTOFF)}[
            continued
        ] == successor


async def test_a_collected_run_in_redis_leaves_no_key_and_a_tombstone(
    redis_url: str, redis_prefix: str, database_url: str, pg_schema: str
) -> None:
    """Beyond what the stores' own reads show: no key of the run is left under the prefix
    (its place in both run indexes included), and PostgreSQL has its tombstone."""
    url, schema = database_url, pg_schema
    async with await redis_frontier_stores(redis_url, redis_prefix, url, schema) as stores:
        gone, kept = await stores.seed("completed"), await stores.seed("completed")
        await stores.sweeper.sweep(SweepPlan(expired=(gone,)), delete=True)
        client = Redis.from_url(redis_url, decode_responses=True)
        try:
            left = [k async for k in client.scan_iter(f"{redis_prefix}*") if gone in k]
            indexed = [
                await client.zscore(f"{redis_prefix}{index}", run)
                for index in ("runs", f"runs-of:{TENANT}")
                for run in (gone, kept)
            ]
        finally:
            await client.aclose()
        assert left == []
        assert indexed == [None, 0, None, 0]
        conn = await asyncpg.connect(url)
        try:
            tombstones = await conn.fetch(
                f'SELECT run_id, tenant FROM "{schema}".onward_run_tombstones'
            )
        finally:
            await conn.close()
        assert [tuple(t) for t in tombstones] == [(gone, TENANT)]


async def test_a_run_in_redis_tagged_while_the_sweep_decides_keeps_its_row_and_tag(
    redis_url: str, redis_prefix: str, database_url: str, pg_schema: str
) -> None:
    """A person tags the run just after the sweep looked for tags: the tag is pinned, and the
    tagger reads the run before writing its `Tagged` event. Had the run been there for that
    read, deleting its row and pin now would lose the tag; so either the sweep keeps both, or
    the tagger's read finds the run gone (and refuses the tag)."""
    url, schema = database_url, pg_schema
    async with await redis_frontier_stores(redis_url, redis_prefix, url, schema) as stores:
        run = await stores.seed("completed")
        sweeper = stores.sweeper
        assert isinstance(sweeper, RedisFrontierSweeper)
        tagged: list[asyncio.Task[bool]] = []

        async def tag() -> bool:
            await stores.compaction.pin(run, TENANT, 4)
            return await stores.frontiers.get(run) is not None  # the tagger's read

        looked = sweeper._rows.tagged_since

        async def looked_then_tagged(*args: Any, **kwargs: Any) -> set[str]:
            found = await looked(*args, **kwargs)
            if not tagged:
                tagged.append(asyncio.create_task(tag()))
                await asyncio.wait(tagged, timeout=0.5)
            return found

        sweeper._rows.tagged_since = looked_then_tagged  # type: ignore[method-assign]
        await sweeper.sweep(SweepPlan(expired=(run,), calls=(run,)), delete=True)

        if await tagged[0]:
            assert await stores.frontiers.get(run) is not None, "the tagged run was collected"
            assert await stores.compaction.pins([run]) == {run: {4}}


async def test_a_run_in_redis_touched_while_the_sweep_decides_keeps_everything(
    redis_url: str, redis_prefix: str, database_url: str, pg_schema: str
) -> None:
    """The sweep read the run's summary (finished before the cutoff), then an event is folded
    into its row before the deletes: the run is not old now, and keeps its keys and rows, as
    the PostgreSQL sweeper's predicates keep it."""
    url, schema = database_url, pg_schema
    async with await redis_frontier_stores(redis_url, redis_prefix, url, schema) as stores:
        touched, gone = await stores.seed("completed"), await stores.seed("completed")
        sweeper = stores.sweeper
        assert isinstance(sweeper, RedisFrontierSweeper)
        row = await stores.frontiers.get(touched)
        assert row is not None
        assert row.frontier is not None
        newer = msgspec.structs.replace(
            row.frontier, updated_at=NEW, through_offset=row.frontier.through_offset + 1
        )
        looked = sweeper._rows.tagged_since

        async def looked_then_touched(*args: Any, **kwargs: Any) -> set[str]:
            found = await looked(*args, **kwargs)
            await stores.frontiers.write("seed", {}, [Snapshot.of(newer)], [])
            return found

        sweeper._rows.tagged_since = looked_then_touched  # type: ignore[method-assign]
        plan = SweepPlan(expired=(touched, gone), calls=(touched, gone), before=CUTOFF)
        counts = await sweeper.sweep(plan, delete=True)

        assert await stores.rows(touched) == (True, 2, 2, True, 2)
        assert await stores.rows(gone) == (False, 0, 0, False, 0)
        assert await sweeper._rows.collected([touched, gone]) == {gone}
        assert {k: counts[k] for k in ("frontiers", "truncations")} == dict.fromkeys(
            ("frontiers", "truncations"), 1
        )


async def test_a_run_in_redis_whose_keys_went_though_the_answer_was_lost_keeps_no_rows(
    redis_url: str, redis_prefix: str, database_url: str, pg_schema: str
) -> None:
    """Redis deleted the runs' keys but its answer never came (a timeout, a dropped
    connection): the pass fails, yet the runs whose frontier is gone lose their PostgreSQL
    rows and get their tombstone too. Rolled back, nothing would ever list them again, and
    their compaction rows, lease row and retained events would be kept for good."""
    url, schema = database_url, pg_schema
    async with await redis_frontier_stores(redis_url, redis_prefix, url, schema) as stores:
        gone, kept = await stores.seed("completed"), await stores.seed("running")
        sweeper = stores.sweeper
        assert isinstance(sweeper, RedisFrontierSweeper)
        swept = sweeper.frontiers.sweep_finished

        async def swept_then_lost(*args: Any, **kwargs: Any) -> tuple[int, int, int]:
            await swept(*args, **kwargs)
            raise BackendUnavailableError("Redis did not answer in time")

        sweeper.frontiers.sweep_finished = swept_then_lost  # type: ignore[method-assign]
        plan = SweepPlan(expired=(gone, kept), calls=(gone, kept), before=CUTOFF)
        with pytest.raises(BackendUnavailableError):
            await sweeper.sweep(plan, delete=True)

        assert await stores.rows(gone) == (False, 0, 0, False, 0)
        assert not await stores.lease_row_kept(gone)
        assert await sweeper._rows.collected([gone, kept]) == {gone}
        assert await stores.rows(kept) == (True, 2, 2, True, 2)


async def test_a_run_in_redis_whose_answer_was_lost_keeps_no_rows_though_redis_fails_again(
    redis_url: str, redis_prefix: str, database_url: str, pg_schema: str
) -> None:
    """Redis deleted the runs' keys, its answer was lost, and the read of which keys went
    failed too (Redis still away a moment): everything was rolled back, and the run whose
    frontier was gone kept its PostgreSQL rows, no tombstone, with nothing to list it again."""
    url, schema = database_url, pg_schema
    async with await redis_frontier_stores(redis_url, redis_prefix, url, schema) as stores:
        gone, kept = await stores.seed("completed"), await stores.seed("running")
        sweeper = stores.sweeper
        assert isinstance(sweeper, RedisFrontierSweeper)
        swept, read = sweeper.frontiers.sweep_finished, sweeper.frontiers.summaries
        lost: list[str] = []

        async def swept_then_lost(*args: Any, **kwargs: Any) -> tuple[int, int, int]:
            await swept(*args, **kwargs)
            lost.append("answer")
            raise BackendUnavailableError("Redis did not answer in time")

        async def read_failing_once(run_ids: Collection[str]) -> dict[str, RunSummary]:
            if lost == ["answer"]:
                lost.append("read")
                raise BackendUnavailableError("Redis did not answer in time")
            return await read(run_ids)

        sweeper.frontiers.sweep_finished = swept_then_lost  # type: ignore[method-assign]
        sweeper.frontiers.summaries = read_failing_once  # type: ignore[method-assign]
        plan = SweepPlan(expired=(gone, kept), calls=(gone, kept), before=CUTOFF)
        with pytest.raises(BackendUnavailableError):
            await sweeper.sweep(plan, delete=True)

        assert lost == ["answer", "read"]
        assert await stores.rows(gone) == (False, 0, 0, False, 0)
        assert not await stores.lease_row_kept(gone)
        assert await sweeper._rows.collected([gone, kept]) == {gone}
        assert await stores.rows(kept) == (True, 2, 2, True, 2)


async def test_a_redis_sweep_that_cannot_tell_which_keys_went_says_what_it_kept(
    open_redis_stores: Callable[[], Awaitable[Stores]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis deleted the runs' keys, its answer was lost, and every ask of which keys went
    failed too: the pass rolled every run's PostgreSQL rows back, the safe choice, but said
    only that a read of summaries timed out, naming neither the sweep nor the runs whose rows
    may now be left with no frontier and no tombstone, which no later pass lists again."""
    monkeypatch.setattr(redis_frontiers, "LEFT_PAUSE_S", 0)
    async with await open_redis_stores() as stores:
        gone = await stores.seed("completed")
        sweeper = stores.sweeper
        assert isinstance(sweeper, RedisFrontierSweeper)
        swept, read = sweeper.frontiers.sweep_finished, sweeper.frontiers.summaries
        asks_after_loss: list[Collection[str]] = []
        lost = False

        async def swept_then_lost(*args: Any, **kwargs: Any) -> tuple[int, int, int]:
            nonlocal lost
            await swept(*args, **kwargs)
            lost = True
            raise BackendUnavailableError("Redis did not answer in time")

        async def read_failing_once_lost(run_ids: Collection[str]) -> dict[str, RunSummary]:
            if lost:
                asks_after_loss.append(run_ids)
                raise BackendUnavailableError("Redis did not answer in time")
            return await read(run_ids)

        sweeper.frontiers.sweep_finished = swept_then_lost  # type: ignore[method-assign]
        sweeper.frontiers.summaries = read_failing_once_lost  # type: ignore[method-assign]
        plan = SweepPlan(expired=(gone,), calls=(), before=CUTOFF)
        with pytest.raises(BackendUnavailableError) as failed:
            await sweeper.sweep(plan, delete=True)

        assert len(asks_after_loss) == redis_frontiers.LEFT_TRIES
        said = str(failed.value)
        assert "rolled back" in said
        assert repr(gone) in said
        assert "no tombstone" in said
        assert await stores.rows(gone) == (False, 0, 0, True, 2)
        assert await sweeper._rows.collected([gone]) == set()


@pytest_asyncio.fixture
async def redis_stores(
    redis_url: str, redis_prefix: str
) -> AsyncIterator[tuple[RedisLeaseStore, RedisKeySweeper, Redis]]:
    schemas = f"{redis_prefix}mcp:schema:"
    async with (
        RedisLeaseStore(redis_url, prefix=redis_prefix) as leases,
        RedisKeySweeper(redis_url, prefix=redis_prefix, schema_prefix=schemas) as sweeper,
    ):
        client = Redis.from_url(redis_url, decode_responses=True)
        try:
            yield leases, sweeper, client
        finally:
            await client.aclose()


async def test_redis_keys_of_finished_runs_are_counted_then_deleted_held_leases_kept(
    redis_stores: tuple[RedisLeaseStore, RedisKeySweeper, Redis],
) -> None:
    leases, sweeper, client = redis_stores
    released, held, untouched = new_run_id(), new_run_id(), new_run_id()
    for run_id in (released, held, untouched):
        lease = await leases.acquire(run_id, tenant=TENANT, holder="w1", ttl_s=30)
        await client.hset(f"{sweeper.schema_prefix}{run_id}", "server", "{}")
        if run_id != held:
            await leases.release(lease)
    # A lapsed lease hash that Redis has not expired yet goes too.
    lapsed = new_run_id()
    await leases.acquire(lapsed, tenant=TENANT, holder="w1", ttl_s=30)
    await client.hset(leases.lease_key(lapsed), "expires_at", "1.0")

    runs = [released, held, lapsed]
    counted = await sweeper.sweep(runs, delete=False)
    assert counted == {"redis_leases": 1, "redis_fences": 2, "schema_cache": 2}
    assert await client.exists(leases.fence_key(released), leases.lease_key(lapsed)) == 2
    assert await sweeper.sweep(runs, delete=True) == counted
    for run_id in (released, lapsed):
        assert await client.exists(leases.fence_key(run_id), leases.lease_key(run_id)) == 0
        assert await client.exists(f"{sweeper.schema_prefix}{run_id}") == 0
    # The held run keeps its lease and fence; only its schema cache entry went.
    assert await leases.current(held) is not None
    assert await client.exists(leases.fence_key(held)) == 1
    assert await client.exists(f"{sweeper.schema_prefix}{held}") == 0
    kept = [leases.fence_key(untouched), f"{sweeper.schema_prefix}{untouched}"]
    assert await client.exists(*kept) == 2
    assert await sweeper.sweep(runs, delete=True) == dict.fromkeys(KEY_KINDS, 0)


async def test_a_schema_prefix_among_the_lease_keys_is_refused(
    redis_url: str, redis_prefix: str
) -> None:
    """With the schema cache's prefix that of the leases, the cache entry of a run named
    ``lease:<run>`` is that run's lease hash: collecting the one deleted the other's live lease,
    and a second worker could take the run."""
    async with RedisLeaseStore(redis_url, prefix=redis_prefix) as leases:
        held = new_run_id()
        await leases.acquire(held, tenant=TENANT, holder="w1", ttl_s=30)
        with pytest.raises(ConfigurationError, match="MCP_SCHEMA_CACHE_PREFIX"):
            async with RedisKeySweeper(
                redis_url, prefix=redis_prefix, schema_prefix=redis_prefix
            ) as sweeper:
                await sweeper.sweep([f"lease:{held}"], delete=True)
        assert await leases.current(held) is not None


async def test_a_redis_key_of_another_type_is_named_by_the_key_sweeper(
    redis_stores: tuple[RedisLeaseStore, RedisKeySweeper, Redis],
) -> None:
    """A lease key another program wrote in another type failed the pass with Redis's
    WRONGTYPE, the pipeline naming only a script's digest: neither the key nor the run. The
    lease hash is the one key the script reads by type: the fence and schema cache keys (the
    latter under MCP_SCHEMA_CACHE_PREFIX, which ONWARD_REDIS_PREFIX does not move) were named
    as suspects beside it."""
    leases, sweeper, client = redis_stores
    runs = [new_run_id() for _ in range(3)]
    await client.set(leases.lease_key(runs[1]), "another program's")
    await client.set(leases.fence_key(runs[1]), "another program's")
    await client.set(f"{sweeper.schema_prefix}{runs[1]}", "another program's")
    with pytest.raises(BackendError, match="WRONGTYPE") as failed:
        await sweeper.sweep(runs, delete=True)
    assert f"its key {leases.lease_key(runs[1])!r}" in str(failed.value)
    assert leases.fence_key(runs[1]) not in str(failed.value)
    assert sweeper.schema_prefix not in str(failed.value)
    assert "ONWARD_REDIS_PREFIX" in str(failed.value)
    assert failed.value.run_id == runs[1]


async def test_a_redis_frontier_key_of_another_type_is_named_by_the_sweep(
    redis_url: str, redis_prefix: str, database_url: str, pg_schema: str
) -> None:
    """The same for the frontier keys: the pass failed naming a script's digest alone."""
    url, schema = database_url, pg_schema
    async with await redis_frontier_stores(redis_url, redis_prefix, url, schema) as stores:
        run_id = await stores.seed("completed")
        sweeper = stores.sweeper
        assert isinstance(sweeper, RedisFrontierSweeper)
        calls = f"{redis_prefix}calls:{run_id}"
        client = Redis.from_url(redis_url, decode_responses=True)
        try:
            await client.delete(calls)
            await client.set(calls, "another program's")
        finally:
            await client.aclose()
        with pytest.raises(BackendError, match="WRONGTYPE") as failed:
            await sweeper.frontiers.sweep_finished([(run_id, TENANT)], [], delete=False)
    assert calls in str(failed.value)
    assert "ONWARD_REDIS_PREFIX" in str(failed.value)
    assert failed.value.run_id == run_id


def test_the_sweepers_satisfy_their_protocols(tmp_path: Path) -> None:
    assert isinstance(SqliteRecordSweeper(tmp_path / "x.db"), RecordSweeper)
    assert isinstance(PostgresRecordSweeper("postgresql://x@127.0.0.1/x"), RecordSweeper)
    assert isinstance(RedisKeySweeper("redis://127.0.0.1:6379/0"), KeySweeper)
    assert isinstance(
        RedisFrontierSweeper("redis://127.0.0.1:6379/0", "postgresql://x@127.0.0.1/x"),
        RecordSweeper,
    )


async def test_a_redis_frontier_sweeper_whose_postgresql_close_fails_still_closes_redis(
    redis_url: str, redis_prefix: str, database_url: str, pg_schema: str
) -> None:
    """A close of the PostgreSQL pool that is cancelled (a shutdown cut short while a sweep
    still holds its connection) still closes the Redis pool rather than leaking it."""
    sweeper = await RedisFrontierSweeper.open(
        redis_url, database_url, prefix=redis_prefix, schema=pg_schema
    )
    closing: asyncio.Task[None] | None = None
    # The cancelled close cut the sweep's connection, so the sweep's end fails.
    with contextlib.suppress(BackendUnavailableError):
        async with sweeper._rows.deciding(delete=False):
            closing = asyncio.create_task(sweeper.close())
            await asyncio.sleep(0.2)  # waiting for the sweep's connection to come back
            closing.cancel()
            await asyncio.wait([closing])
    assert closing is not None
    assert closing.cancelled()
    assert not sweeper.frontiers.is_open
    await sweeper.close()


async def test_deployments_apart_by_their_redis_prefix_keep_their_schema_caches_apart(
    redis_url: str, redis_prefix: str
) -> None:
    """Two deployments on one Redis, each with its own ``ONWARD_REDIS_PREFIX`` and no
    ``MCP_SCHEMA_CACHE_PREFIX``: a run id both used had one schema cache entry, which one's
    collection deleted under the other's run (and whose listing either could read)."""
    shop, staging = (
        Settings(redis_url=SecretUrl(redis_url), redis_prefix=f"{redis_prefix}{name}:")
        for name in ("shop", "staging")
    )
    run_id = new_run_id()
    cache = SchemaCache.from_settings(MCPSettings.of(staging))
    assert cache is not None
    async with cache:
        schema = ServerSchema.of([], endpoint="e", server_name="s", server_version="1")
        await cache.store(run_id, {"s": schema})
        sweeper = key_sweeper(shop)
        assert sweeper is not None
        async with sweeper:
            assert await sweeper.sweep([run_id], delete=True) == dict.fromkeys(KEY_KINDS, 0)
        assert await cache.load(run_id) == {"s": schema}


async def test_a_read_only_sqlite_sweeper_sees_runs_finished_after_it_opened(
    tmp_path: Path,
) -> None:
    """Opened on a quiet file (no ``-wal`` file: read ``immutable``), a dry run's sweeper
    lists and counts what writers stored afterwards, not the file as it was when it opened it."""
    path = tmp_path / "onward.db"

    async def seeded() -> str:
        async with Stores(
            await SqliteFrontierStore.open(path),
            await SqliteLeaseStore.open(path),
            await SqliteCompactionStore.open(path),
            await SqliteRecordSweeper.open(path),
        ) as stores:
            return await stores.seed("completed")

    first = await seeded()
    async with SqliteRecordSweeper(path, readonly=True) as sweeper:
        assert [r.run_id for r in await sweeper.finished(before=CUTOFF)] == [first]
        second = await seeded()
        found = await sweeper.finished(before=CUTOFF)
        assert sorted(r.run_id for r in found) == sorted([first, second])
        third = await seeded()
        counted = await sweeper.sweep(SweepPlan(expired=(third,), calls=(third,)), delete=False)
        assert counted["frontiers"] == 1
