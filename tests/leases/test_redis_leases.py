"""`RedisLeaseStore`: the conformance suite, plus the keys it leaves behind."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
import redis.exceptions as redis_errors

from onward.errors import BackendError, BackendUnavailableError, ConfigurationError
from onward.runtime.leases import LeaseStore, RedisLeaseStore
from onward.runtime.leases.redis import CLEANUP_GRACE_MS
from onward.testing import LeaseStoreConformance
from onward.testing.eventlog import TENANT, new_run_id


@pytest_asyncio.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """A plain client, to look at and tamper with the keys behind a store's back."""
    plain = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        yield plain
    finally:
        await plain.aclose()


@pytest_asyncio.fixture
async def prefix(client: aioredis.Redis) -> AsyncIterator[str]:
    """A key prefix of this test alone; its keys are deleted afterwards."""
    chosen = f"onward-test-{uuid.uuid4().hex}:"
    yield chosen
    keys = [key async for key in client.scan_iter(match=f"{chosen}*")]
    if keys:
        await client.delete(*keys)


@pytest_asyncio.fixture
async def store(redis_url: str, prefix: str) -> AsyncIterator[RedisLeaseStore]:
    async with RedisLeaseStore(redis_url, prefix=prefix) as opened:
        yield opened


class TestRedisLeaseStore(LeaseStoreConformance):
    """A wiped store is this one with the run's keys deleted, as a restart without AOF does."""

    redis_url: str
    prefix: str
    client: aioredis.Redis

    @pytest.fixture(autouse=True)
    def _server(self, redis_url: str, prefix: str, client: aioredis.Redis) -> None:
        self.redis_url = redis_url
        self.prefix = prefix
        self.client = client

    async def open_store(self) -> LeaseStore:
        return await RedisLeaseStore.open(self.redis_url, prefix=self.prefix)

    async def wiped(self, store: LeaseStore, run_id: str) -> LeaseStore:
        assert isinstance(store, RedisLeaseStore)
        await self.client.delete(store.lease_key(run_id), store.fence_key(run_id))
        return store


async def test_the_fence_key_never_expires_and_the_lease_key_does(
    store: RedisLeaseStore, client: aioredis.Redis
) -> None:
    run_id = new_run_id()
    lease = await store.acquire(run_id, tenant=TENANT, holder="w1", ttl_s=30)
    assert await client.pttl(store.fence_key(run_id)) == -1
    assert 30_000 < await client.pttl(store.lease_key(run_id)) <= 30_000 + CLEANUP_GRACE_MS
    stored = await client.hgetall(store.lease_key(run_id))
    assert stored["holder"] == "w1"
    assert stored["tenant"] == TENANT
    assert int(stored["fence"]) == lease.fence
    assert float(stored["expires_at"]) == lease.expires_at
    await store.release(lease)
    assert await client.exists(store.lease_key(run_id)) == 0
    assert await client.get(store.fence_key(run_id)) == str(lease.fence)


async def test_a_raised_fence_is_written_to_the_counter_and_the_hash(
    store: RedisLeaseStore, client: aioredis.Redis
) -> None:
    run_id = new_run_id()
    lease = await store.acquire(run_id, tenant=TENANT, holder="w1", ttl_s=30)
    raised = await store.raise_fence(lease, above=2**40)
    assert raised.fence == 2**40 + 1
    assert await client.get(store.fence_key(run_id)) == str(raised.fence)
    assert await client.hget(store.lease_key(run_id), "fence") == str(raised.fence)
    assert await client.pttl(store.fence_key(run_id)) == -1


async def test_the_fence_outlives_the_cleanup_of_the_lease_hash(
    store: RedisLeaseStore, client: aioredis.Redis
) -> None:
    run_id = new_run_id()
    first = await store.acquire(run_id, tenant=TENANT, holder="w1", ttl_s=30)
    await client.delete(store.lease_key(run_id))  # as its PEXPIRE would
    await store.release(first)  # gone and never superseded: nothing to do
    second = await store.acquire(run_id, tenant=TENANT, holder="w2", ttl_s=30)
    assert second.fence == first.fence + 1


async def test_an_unreachable_server_is_retryable() -> None:
    with pytest.raises(BackendUnavailableError) as failed:
        await RedisLeaseStore.open("redis://127.0.0.1:1/0")
    assert failed.value.retryable
    assert isinstance(failed.value.__cause__, redis_errors.ConnectionError)


async def test_a_url_that_is_not_redis_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        await RedisLeaseStore.open("http://127.0.0.1:6379")


async def test_a_server_error_becomes_a_backend_error(
    store: RedisLeaseStore, client: aioredis.Redis
) -> None:
    run_id = new_run_id()
    await client.set(store.lease_key(run_id), "not a hash")
    with pytest.raises(BackendError) as failed:
        await store.acquire(run_id, tenant=TENANT, holder="w1", ttl_s=30)
    assert not isinstance(failed.value, BackendUnavailableError)
    assert isinstance(failed.value.__cause__, redis_errors.ResponseError)
