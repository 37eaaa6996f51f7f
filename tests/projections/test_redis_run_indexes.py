"""`RedisFrontierStore.runs` reads only the runs its indexes point at: a listing by status
reads the runs of those statuses, not every finished run kept until garbage collection, and a
listing by tenant lists the runs whose stored row is that tenant's."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from onward.projections.base import RunSummary, Snapshot
from onward.projections.frontier import TERMINAL_STATUSES
from onward.projections.redis import RedisFrontierStore
from onward.testing.eventlog import new_run_id
from onward.testing.frontiers import CONSUMER, frontier

FINISHED = 5_000
RUNNING = 10


@pytest_asyncio.fixture
async def store(redis_url: str, redis_prefix: str) -> AsyncIterator[RedisFrontierStore]:
    async with RedisFrontierStore(redis_url, prefix=redis_prefix) as store:
        yield store


@pytest_asyncio.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


def _count_reads(store: RedisFrontierStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many run summaries ``store`` reads from Redis, counted as it reads them."""
    read = [0]
    summaries = store._summaries

    async def counted(client: aioredis.Redis, run_ids: Sequence[str]) -> list[RunSummary]:
        read[0] += len(run_ids)
        return await summaries(client, run_ids)

    monkeypatch.setattr(store, "_summaries", counted)
    return read


async def _write_many(
    store: RedisFrontierStore, finished: int, running: int
) -> tuple[list[str], list[str]]:
    """Write ``finished`` completed runs and ``running`` running ones through the write path."""
    done = [new_run_id() for _ in range(finished)]
    going = [new_run_id() for _ in range(running)]
    rows = [frontier(r, through=1, status="completed") for r in done]
    rows += [frontier(r, through=1) for r in going]
    for start in range(0, len(rows), 500):
        snapshots = [Snapshot.of(f) for f in rows[start : start + 500]]
        await store.write(CONSUMER, {0: start + 1}, snapshots, [])
    return done, going


async def _forget_the_status_index(client: aioredis.Redis, prefix: str) -> None:
    """Leave what an older version wrote: rows with no tenant or status beside the summary,
    the indexes of every run and of each tenant, and no index by status."""
    indexes = [k async for k in client.scan_iter(match=f"{prefix}runs-by-status*")]
    assert indexes
    await client.delete(*indexes)
    async for key in client.scan_iter(match=f"{prefix}frontier:*"):
        await client.hdel(key, "tenant", "status")


async def test_listing_running_runs_reads_only_running_ones(
    store: RedisFrontierStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, going = await _write_many(store, FINISHED, RUNNING)
    read = _count_reads(store, monkeypatch)
    listed = await store.runs(statuses={"running"})
    assert sorted(s.run_id for s in listed) == sorted(going)
    assert read[0] <= RUNNING, f"read {read[0]} summaries to list {RUNNING} running runs"


async def test_a_run_that_finishes_leaves_the_running_listing(
    store: RedisFrontierStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = new_run_id()
    await store.write(CONSUMER, {0: 2}, [Snapshot.of(frontier(run_id, through=1))], [])
    await store.write(
        CONSUMER, {0: 3}, [Snapshot.of(frontier(run_id, through=2, status="completed"))], []
    )
    read = _count_reads(store, monkeypatch)
    assert await store.runs(statuses={"running"}) == []
    assert read[0] == 0
    assert [s.run_id for s in await store.runs(statuses=TERMINAL_STATUSES)] == [run_id]
    # A frontier folded twice, or an older one, moves nothing.
    await store.write(CONSUMER, {0: 3}, [Snapshot.of(frontier(run_id, through=1))], [])
    assert await store.runs(statuses={"running"}) == []


async def test_listing_by_several_statuses_pages_in_run_id_order(
    store: RedisFrontierStore,
) -> None:
    statuses = ["running", "waiting", "completed"]
    ids = sorted(new_run_id() for _ in range(30))
    rows = [frontier(r, through=1, status=statuses[n % 3]) for n, r in enumerate(ids)]
    await store.write(CONSUMER, {0: 2}, [Snapshot.of(f) for f in rows], [])
    wanted = [r for n, r in enumerate(ids) if statuses[n % 3] != "completed"]
    paged: list[str] = []
    after: str | None = None
    while page := await store.runs(statuses={"running", "waiting"}, after=after, limit=7):
        paged += [s.run_id for s in page]
        after = page[-1].run_id
    assert paged == wanted
    assert [s.run_id for s in await store.runs(tenant="acme", statuses={"waiting"})] == wanted[1::2]


async def test_runs_written_before_the_status_index_are_listed(
    store: RedisFrontierStore,
    client: aioredis.Redis,
    redis_url: str,
    redis_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    done, going = await _write_many(store, 600, 3)
    await _forget_the_status_index(client, redis_prefix)
    async with RedisFrontierStore(redis_url, prefix=redis_prefix) as upgraded:
        listed = await upgraded.runs(statuses={"running"})
        assert sorted(s.run_id for s in listed) == sorted(going)
        assert len(await upgraded.runs(statuses={"completed"})) == len(done)
        read = _count_reads(upgraded, monkeypatch)
        assert len(await upgraded.runs(statuses={"running"})) == len(going)
        assert read[0] == len(going)


async def test_garbage_collection_drops_a_run_from_its_status_index(
    store: RedisFrontierStore, client: aioredis.Redis, redis_prefix: str
) -> None:
    run_id = new_run_id()
    await store.write(
        CONSUMER, {0: 2}, [Snapshot.of(frontier(run_id, through=1, status="failed"))], []
    )
    assert await store.sweep_finished([(run_id, "acme")], [], delete=True) == (1, 0, 0)
    assert await store.runs(statuses={"failed"}) == []
    assert await client.zcard(f"{redis_prefix}runs-by-status:failed") == 0


async def test_a_run_whose_tenant_is_learned_late_moves_to_its_tenants_index(
    store: RedisFrontierStore,
) -> None:
    # The first record was unreadable: the row is stored under no tenant, until a release
    # folds the run again with its real one.
    run_id = new_run_id()
    await store.write(CONSUMER, {0: 2}, [Snapshot.of(frontier(run_id, through=1, tenant=""))], [])
    await store.write(CONSUMER, {0: 3}, [Snapshot.of(frontier(run_id, through=2))], [])
    assert [s.run_id for s in await store.runs(tenant="acme")] == [run_id]
    assert await store.runs(tenant="") == []
    assert [s.run_id for s in await store.runs(tenant="acme", statuses={"running"})] == [run_id]


async def test_a_row_written_before_the_indexes_moves_when_its_tenant_is_learned(
    store: RedisFrontierStore, client: aioredis.Redis, redis_prefix: str
) -> None:
    run_id = new_run_id()
    await store.write(CONSUMER, {0: 2}, [Snapshot.of(frontier(run_id, through=1, tenant=""))], [])
    await _forget_the_status_index(client, redis_prefix)
    await store.write(CONSUMER, {0: 3}, [Snapshot.of(frontier(run_id, through=2))], [])
    assert await client.zscore(f"{redis_prefix}runs-of:", run_id) is None
    assert await client.zscore(f"{redis_prefix}runs-of:acme", run_id) == 0
    assert await client.zscore(f"{redis_prefix}runs-by-status:running", run_id) == 0
    assert [s.run_id for s in await store.runs(tenant="acme", statuses={"running"})] == [run_id]


async def test_a_listing_by_tenant_never_returns_another_tenants_row(
    store: RedisFrontierStore, client: aioredis.Redis, redis_prefix: str
) -> None:
    # An entry an older version left in the wrong tenant's index.
    run_id = new_run_id()
    await store.write(CONSUMER, {0: 2}, [Snapshot.of(frontier(run_id, through=1))], [])
    await client.zadd(f"{redis_prefix}runs-of:", {run_id: 0})
    assert await store.runs(tenant="") == []
    assert await store.runs(tenant="", statuses={"running"}) == []


async def test_indexing_by_status_puts_a_misplaced_run_in_its_tenants_index(
    store: RedisFrontierStore, client: aioredis.Redis, redis_prefix: str
) -> None:
    # An older version indexed the run under no tenant, and its row says its real one.
    run_id = new_run_id()
    await store.write(CONSUMER, {0: 2}, [Snapshot.of(frontier(run_id, through=1))], [])
    await _forget_the_status_index(client, redis_prefix)
    await client.zrem(f"{redis_prefix}runs-of:acme", run_id)
    await client.zadd(f"{redis_prefix}runs-of:", {run_id: 0})
    assert [s.run_id for s in await store.runs(statuses={"running"})] == [run_id]
    assert [s.run_id for s in await store.runs(tenant="acme")] == [run_id]
    assert await store.runs(tenant="") == []
