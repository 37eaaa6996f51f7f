"""`MemoryLeaseStore`: the conformance suite, plus its clock being the monotonic one."""

from __future__ import annotations

import time

import pytest

from onward.errors import InvalidInputError
from onward.runtime.leases import LeaseStore, MemoryLeaseStore
from onward.testing import LeaseStoreConformance
from onward.testing.eventlog import TENANT, new_run_id


class TestMemoryLeaseStore(LeaseStoreConformance):
    async def open_store(self) -> LeaseStore:
        return MemoryLeaseStore()


async def test_a_wall_clock_jump_does_not_lapse_a_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryLeaseStore()
    run_id = new_run_id()
    lease = await store.acquire(run_id, tenant=TENANT, holder="w1", ttl_s=30)
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 86_400)
    assert await store.current(run_id) == lease
    assert (await store.renew(lease, ttl_s=30)).fence == lease.fence


@pytest.mark.parametrize("ttl_s", [0.0, -1.0, float("nan"), float("inf")])
async def test_a_ttl_that_cannot_hold_a_run_is_refused(ttl_s: float) -> None:
    store = MemoryLeaseStore()
    with pytest.raises(InvalidInputError):
        await store.acquire(new_run_id(), tenant=TENANT, holder="w1", ttl_s=ttl_s)
