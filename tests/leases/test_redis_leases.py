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


async def _delete_prefix(url: str, prefix: str) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        keys = [key async for key in client.scan_iter(match=f"{prefix}*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


@pytest_asyncio.fixture
async def prefix(redis_url: str) -> AsyncIterator[str]:
    """A key prefix of this test alone; its keys are deleted afterwards."""
    chosen = f"onward-test-{uuid.uuid4().hex}:"
    yield chosen
    await _delete_prefix(redis_url, chosen)


class TestRedisLeaseStore(LeaseStoreConformance):
    redis_url: str
    prefix: str

    @pytest.fixture(autouse=True)
    def _prefix(self, redis_url: str, prefix: str) -> None:
        self.redis_url = redis_url
        self.prefix = prefix

    async def open_store(self) -> LeaseStore:
        return await RedisLeaseStore.open(self.redis_url, prefix=self.prefix)


async def test_the_fence_key_never_expires_and_the_lease_key_does(
    redis_url: str, prefix: str
) -> None:
    run_id = new_run_id()
    async with RedisLeaseStore(redis_url, prefix=prefix) as store:
        lease = await store.acquire(run_id, tenant=TENANT, holder="w1", ttl_s=30)
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            assert await client.pttl(store.fence_key(run_id)) == -1
            assert 30_000 < await client.pttl(store.lease_key(run_id)) <= 30_000 + CLEANUP_GRACE_MS
            stored = await client.hgetall(store.lease_key(run_id))
            await store.release(lease)
            assert await client.exists(store.lease_key(run_id)) == 0
            assert await client.get(store.fence_key(run_id)) == str(lease.fence)
        finally:
            await client.aclose()
    assert stored["holder"] == "w1"
    assert stored["tenant"] == TENANT
    assert int(stored["fence"]) == lease.fence
    assert float(stored["expires_at"]) == lease.expires_at


async def test_the_fence_outlives_the_cleanup_of_the_lease_hash(
    redis_url: str, prefix: str
) -> None:
    run_id = new_run_id()
    async with RedisLeaseStore(redis_url, prefix=prefix) as store:
        first = await store.acquire(run_id, tenant=TENANT, holder="w1", ttl_s=30)
        client = aioredis.Redis.from_url(redis_url)
        try:
            await client.delete(store.lease_key(run_id))  # as its PEXPIRE would
        finally:
            await client.aclose()
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


async def test_a_server_error_becomes_a_backend_error(redis_url: str, prefix: str) -> None:
    run_id = new_run_id()
    async with RedisLeaseStore(redis_url, prefix=prefix) as store:
        client = aioredis.Redis.from_url(redis_url)
        try:
            await client.set(store.lease_key(run_id), "not a hash")
        finally:
            await client.aclose()
        with pytest.raises(BackendError) as failed:
            await store.acquire(run_id, tenant=TENANT, holder="w1", ttl_s=30)
    assert not isinstance(failed.value, BackendUnavailableError)
    assert isinstance(failed.value.__cause__, redis_errors.ResponseError)
