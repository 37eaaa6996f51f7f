"""A garbage collection pass that Redis fails part way leaves nothing for good: the next pass,
with Redis back, deletes both the run's rows and its Redis keys.

The run's rows are what lists it as finished; had they gone before its keys, a pass failing on
Redis would have left the keys with nothing left to name them, never collected.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.asyncio import Redis
from support.proxy import TcpProxy

from onward.errors import BackendUnavailableError
from onward.projections.compaction import SqliteCompactionStore
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.gc import GarbageCollector, RedisKeySweeper, SqliteRecordSweeper
from onward.runtime.leases import RedisLeaseStore, SqliteLeaseStore
from onward.testing.eventlog import TENANT
from onward.testing.gc import Stores


async def test_a_pass_redis_fails_leaves_the_run_for_the_next_pass(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    path = tmp_path / "onward.db"
    host, port = redis_url.removeprefix("redis://").split("/")[0].split(":")
    async with (
        Stores(
            await SqliteFrontierStore.open(path),
            await SqliteLeaseStore.open(path),
            await SqliteCompactionStore.open(path),
            await SqliteRecordSweeper.open(path),
        ) as stores,
        TcpProxy(host, int(port)) as proxy,
        RedisLeaseStore(redis_url, prefix=redis_prefix) as leases,
        RedisKeySweeper(
            f"redis://127.0.0.1:{proxy.port}/0", prefix=redis_prefix, timeout_s=2.0
        ) as keys,
    ):
        run_id = await stores.seed("completed")
        lease = await leases.acquire(run_id, tenant=TENANT, holder="w1", ttl_s=30)
        await leases.release(lease)
        collector = GarbageCollector(stores.sweeper, keys)

        await proxy.cut()
        with pytest.raises(BackendUnavailableError):
            await collector.run()
        await proxy.restore()
        report = await collector.run()

        assert report.expired == (run_id,)
        assert report.counts["redis_fences"] == 1
        assert await stores.frontiers.get(run_id) is None
        client = Redis.from_url(redis_url)
        try:
            assert await client.exists(leases.fence_key(run_id)) == 0
        finally:
            await client.aclose()
