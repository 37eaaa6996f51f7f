"""`Leaseholder` over a store that fails: what it does when the store cannot answer."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from types import TracebackType
from typing import Self

import pytest

from onward.errors import BackendUnavailableError, InvalidInputError
from onward.runtime.leases import Leaseholder, LeasePolicy, MemoryLeaseStore, RunLease
from onward.testing.eventlog import TENANT, new_run_id


class FailingStore:
    """A memory store whose renewals and releases can be made to fail or crash."""

    def __init__(self) -> None:
        self.inner = MemoryLeaseStore()
        self.renew_fails: BaseException | None = None
        self.release_fails = False
        self.renewals = 0

    async def acquire(self, run_id: str, *, tenant: str, holder: str, ttl_s: float) -> RunLease:
        return await self.inner.acquire(run_id, tenant=tenant, holder=holder, ttl_s=ttl_s)

    async def renew(self, lease: RunLease, *, ttl_s: float) -> RunLease:
        self.renewals += 1
        if self.renew_fails is not None:
            raise self.renew_fails
        return await self.inner.renew(lease, ttl_s=ttl_s)

    async def release(self, lease: RunLease) -> None:
        if self.release_fails:
            raise BackendUnavailableError("release: the store is down", run_id=lease.run_id)
        await self.inner.release(lease)

    async def current(self, run_id: str) -> RunLease | None:
        return await self.inner.current(run_id)

    async def close(self) -> None:
        await self.inner.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def policy(ttl_s: float, renew_within_s: float | None = None) -> LeasePolicy:
    return LeasePolicy(
        ttl=timedelta(seconds=ttl_s),
        renew_within=None if renew_within_s is None else timedelta(seconds=renew_within_s),
    )


async def test_an_unreachable_store_is_retried_and_then_counts_as_lost() -> None:
    store = FailingStore()
    store.renew_fails = BackendUnavailableError("down")
    async with Leaseholder(
        store, new_run_id(), tenant=TENANT, holder="w1", policy=policy(0.6)
    ) as held:
        await asyncio.wait_for(held.fenced.wait(), 5)
        assert store.renewals >= 2


async def test_a_store_that_recovers_in_time_keeps_the_lease() -> None:
    store = FailingStore()
    store.renew_fails = BackendUnavailableError("down")
    async with Leaseholder(
        store, new_run_id(), tenant=TENANT, holder="w1", policy=policy(1.0)
    ) as held:
        await asyncio.sleep(0.5)
        store.renew_fails = None
        await asyncio.sleep(1.5)
        assert not held.fenced.is_set()
        assert await store.current(held.run_id) is not None


async def test_a_crashed_renewal_counts_as_lost(caplog: pytest.LogCaptureFixture) -> None:
    store = FailingStore()
    store.renew_fails = ZeroDivisionError("a bug")
    with caplog.at_level(logging.ERROR):
        async with Leaseholder(
            store, new_run_id(), tenant=TENANT, holder="w1", policy=policy(0.3)
        ) as held:
            await asyncio.wait_for(held.fenced.wait(), 5)
    assert "renewal crashed" in caplog.text


async def test_renewal_waits_for_the_renew_margin() -> None:
    store = FailingStore()
    async with Leaseholder(
        store, new_run_id(), tenant=TENANT, holder="w1", policy=policy(1.0, renew_within_s=0.2)
    ):
        await asyncio.sleep(0.5)
        assert store.renewals == 0
        await asyncio.sleep(0.6)
        assert store.renewals >= 1


async def test_a_failed_release_after_normal_exit_is_raised() -> None:
    store = FailingStore()
    with pytest.raises(BackendUnavailableError):
        async with Leaseholder(store, new_run_id(), tenant=TENANT, holder="w1"):
            store.release_fails = True


async def test_a_failed_release_never_masks_the_blocks_error() -> None:
    store = FailingStore()

    async def work() -> None:
        async with Leaseholder(store, new_run_id(), tenant=TENANT, holder="w1"):
            store.release_fails = True
            raise RuntimeError("the block's own")

    with pytest.raises(RuntimeError, match="the block's own"):
        await work()


async def test_a_failed_release_never_swallows_a_cancellation() -> None:
    store = FailingStore()
    entered = asyncio.Event()

    async def work() -> None:
        async with Leaseholder(store, new_run_id(), tenant=TENANT, holder="w1"):
            store.release_fails = True
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(work())
    await asyncio.wait_for(entered.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_the_lease_is_not_there_before_entering() -> None:
    held = Leaseholder(MemoryLeaseStore(), new_run_id(), tenant=TENANT, holder="w1")
    with pytest.raises(InvalidInputError):
        _ = held.lease


async def test_a_lease_of_another_holder_cannot_be_adopted() -> None:
    store = MemoryLeaseStore()
    run_id = new_run_id()
    lease = await store.acquire(run_id, tenant=TENANT, holder="w1", ttl_s=30)
    with pytest.raises(InvalidInputError):
        Leaseholder(store, run_id, tenant=TENANT, holder="w2", lease=lease)


async def test_entering_twice_at_once_is_refused() -> None:
    held = Leaseholder(MemoryLeaseStore(), new_run_id(), tenant=TENANT, holder="w1")
    async with held:
        with pytest.raises(InvalidInputError):
            await held.__aenter__()


async def test_a_holder_can_be_entered_again_after_exit_with_a_new_fence() -> None:
    held = Leaseholder(MemoryLeaseStore(), new_run_id(), tenant=TENANT, holder="w1")
    async with held:
        first = held.lease.fence
    async with held:
        assert held.lease.fence > first
