"""A store whose server is demoted to a replica in a managed failover: the refusal to write is
a passing one, and the store lets go of its connections to the demoted server so a retry can
reach the new primary."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable

import pytest
import redis.asyncio as aioredis
from support.private_servers import PrivateRedis, running
from support.proxy import TcpProxy, through, upstream

from onward.errors import BackendUnavailableError
from onward.eventlog import MemoryEventLog
from onward.projections.base import Snapshot
from onward.projections.memory import MemoryFrontierStore
from onward.projections.redis import RedisFrontierStore
from onward.runtime.backends import Backends
from onward.runtime.blobs import MemoryBlobStore
from onward.runtime.cli._health import stores_reachable
from onward.runtime.gc import RedisKeySweeper
from onward.runtime.leases import PostgresLeaseStore, RedisLeaseStore
from onward.runtime.leases.memory import MemoryLeaseStore
from onward.runtime.settings import Settings
from onward.runtime.spend.postgres import PostgresSpendLedger
from onward.testing.frontiers import frontier


async def _normal_clients(client: aioredis.Redis) -> int:
    """How many clients other than ``client`` (and a replication link) the server has."""
    return len(await client.client_list(_type="normal")) - 1


class Demotable:
    """A private Redis that `demote` makes a replica of another, as a failover does to the old
    primary, and an admin client on it."""

    def __init__(self, admin: aioredis.Redis, new_primary: PrivateRedis) -> None:
        self.admin = admin
        self._new_primary = new_primary

    async def demote(self) -> None:
        await self.admin.replicaof("127.0.0.1", self._new_primary.port)

    async def refuses_for_now(self, call: Awaitable[object]) -> None:
        """``call`` fails retryably, saying the server is read-only, and every connection to
        the demoted server was let go."""
        with pytest.raises(BackendUnavailableError) as refused:
            await call
        assert refused.value.retryable
        assert "the server is read-only" in str(refused.value)
        assert await _normal_clients(self.admin) == 0


@contextlib.asynccontextmanager
async def demotable(private_redis: PrivateRedis) -> AsyncIterator[Demotable]:
    async with running(PrivateRedis()) as new_primary:
        admin = aioredis.Redis.from_url(private_redis.url)
        try:
            yield Demotable(admin, new_primary)
        finally:
            await admin.aclose()


async def test_a_demoted_redis_refuses_a_lease_for_now_and_its_connections_are_dropped(
    private_redis: PrivateRedis,
) -> None:
    async with (
        demotable(private_redis) as server,
        RedisLeaseStore(private_redis.url, prefix="failover:") as store,
    ):
        await store.acquire("run-1", tenant="t", holder="w1", ttl_s=30)
        await server.demote()
        await server.refuses_for_now(store.acquire("run-2", tenant="t", holder="w1", ttl_s=30))
        await server.admin.replicaof("NO", "ONE")
        lease = await store.acquire("run-2", tenant="t", holder="w1", ttl_s=30)
        assert lease.run_id == "run-2"


async def test_a_demoted_redis_refuses_a_key_sweep_for_now_and_its_connections_are_dropped(
    private_redis: PrivateRedis,
) -> None:
    """The key sweeper sends its own pipeline, not through the stores' scripts: a READONLY there
    still lets go of the demoted server, or every later pass of a collector that keeps it open
    meets the same replica."""
    async with (
        demotable(private_redis) as server,
        RedisKeySweeper(private_redis.url, prefix="failover:") as sweeper,
    ):
        assert await sweeper.sweep(["run-1"], delete=True)
        await server.demote()
        await server.refuses_for_now(sweeper.sweep(["run-1"], delete=True))


async def test_a_demoted_redis_refuses_a_frontier_sweep_for_now_and_its_connections_are_dropped(
    private_redis: PrivateRedis,
) -> None:
    async with (
        demotable(private_redis) as server,
        RedisFrontierStore(private_redis.url, prefix="failover:") as store,
    ):
        finished = frontier("run-1", through=1, status="completed")
        await store.write("c", {}, [Snapshot.of(finished)], [])
        await server.demote()
        await server.refuses_for_now(store.sweep_finished([("run-1", "acme")], [], delete=True))


async def test_a_demoted_redis_refuses_to_index_runs_for_now_and_its_connections_are_dropped(
    private_redis: PrivateRedis,
) -> None:
    """A listing by status first finishes the status index, a script that writes."""
    async with (
        demotable(private_redis) as server,
        RedisFrontierStore(private_redis.url, prefix="failover:") as store,
    ):
        running_run = frontier("run-1", through=1, status="running")
        await store.write("c", {}, [Snapshot.of(running_run)], [])
        await server.admin.delete("failover:runs-by-status-built")
        await server.demote()
        await server.refuses_for_now(store.runs(statuses=["running"]))


async def test_a_read_only_postgres_session_refuses_a_lease_for_now_and_is_let_go(
    database_url: str, pg_schema: str
) -> None:
    """A pooled connection to a server that turned read-only (a standby after a failover, or
    ``default_transaction_read_only``) fails its write with a retryable error, and the retry
    gets a fresh connection rather than the same read-only one."""
    async with PostgresLeaseStore(database_url, schema=pg_schema, min_size=1, max_size=1) as store:
        async with store._connection("turning the session read-only") as conn:
            await conn.execute("SET default_transaction_read_only = on")

        with pytest.raises(BackendUnavailableError) as refused:
            await store.acquire("run-1", tenant="t", holder="w1", ttl_s=30)

        assert refused.value.retryable
        assert "the server is read-only" in str(refused.value)
        lease = await store.acquire("run-1", tenant="t", holder="w1", ttl_s=30)
        assert lease.run_id == "run-1"


async def test_a_worker_whose_postgres_is_away_is_not_ready_though_kafka_and_redis_answer(
    database_url: str, pg_schema: str
) -> None:
    """With Kafka and Redis frontiers and leases, PostgreSQL still keeps the spend ledger,
    the blobs and the compaction rows every run needs: readiness must ask it too."""
    async with TcpProxy(*upstream(database_url)) as proxy:
        spend = PostgresSpendLedger(through(database_url, proxy), schema=pg_schema, timeout_s=1)
        async with spend, MemoryEventLog() as log, MemoryFrontierStore() as frontiers:
            backends = Backends(
                Settings(backend="memory"),
                log,
                frontiers,
                MemoryLeaseStore(),
                MemoryBlobStore(),
                spend=spend,
            )
            assert await stores_reachable(backends) is None
            await proxy.cut()

            why = await stores_reachable(backends)

            assert why is not None
            assert why.startswith("the spend ledger")
