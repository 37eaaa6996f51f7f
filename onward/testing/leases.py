"""`LeaseStoreConformance`: the behaviour every `LeaseStore` backend must show.

Subclass it once per backend and implement :meth:`LeaseStoreConformance.open_store`, which
returns an open store. Run ids are fresh per test, so the store need not be empty. Needs pytest
and pytest-asyncio (``asyncio_mode = "auto"``).

The suite also drives `Leaseholder` over the backend, since renewal and release on the way out
of a block are where a backend's timing and error behaviour meet the runtime.

Expiry is judged by the store's clock. The clock-skew tests move the *caller's* wall clock
(``time.time``, ``time.time_ns`` and ``datetime.datetime.now``) an hour either way and expect
nothing to change. For the memory and SQLite stores the store clock is the operating system's
(the monotonic clock, and SQLite's own reading of the system time), which those patches do not
touch; for PostgreSQL and Redis it is the server's.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import ClassVar, Self

import pytest
import pytest_asyncio

from onward.errors import FencedError, ResumeConflictError
from onward.runtime.leases.base import LeasePolicy, LeaseStore, RunLease
from onward.runtime.leases.holder import Leaseholder

from .eventlog import TENANT, new_run_id

LONG_TTL_S = 30.0
"""Long enough that nothing lapses during a test unless it means to."""
SHORT_TTL_S = 0.5
"""Short enough to wait out; every backend's clock resolves it (Redis and SQLite to the ms)."""
LAPSE_S = 0.8
"""How long to wait for a ``SHORT_TTL_S`` lease to lapse, with room for scheduling."""
SKEW_S = 3600.0
"""How far the caller's clock is moved in the clock-skew tests."""


_REAL_DATETIME = datetime.datetime


class _SkewedDatetime(datetime.datetime):
    """``datetime.datetime`` whose ``now`` family reads a clock moved by ``shift``."""

    shift: ClassVar[datetime.timedelta] = datetime.timedelta(0)

    @classmethod
    def now(cls, tz: datetime.tzinfo | None = None) -> Self:
        moment = _REAL_DATETIME.now(tz) + cls.shift
        return cls.combine(moment.date(), moment.timetz())

    @classmethod
    def utcnow(cls) -> Self:
        moment = _REAL_DATETIME.now(datetime.UTC).replace(tzinfo=None) + cls.shift
        return cls.combine(moment.date(), moment.time())

    @classmethod
    def today(cls) -> Self:
        return cls.now()


@contextmanager
def caller_clock_off_by(seconds: float) -> Iterator[None]:
    """Move this process's wall clock (``time.time``, ``time.time_ns``, ``datetime.now``).

    The monotonic clock is left alone: the event loop runs on it, and it is what a memory
    store's expiry is measured with, by design.
    """
    real_time = time.time
    real_time_ns = time.time_ns
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time", lambda: real_time() + seconds)
        patch.setattr(time, "time_ns", lambda: real_time_ns() + int(seconds * 1_000_000_000))
        patch.setattr(_SkewedDatetime, "shift", datetime.timedelta(seconds=seconds))
        patch.setattr(datetime, "datetime", _SkewedDatetime)
        yield


class GatedRenewals:
    """A store whose renewals wait for a gate: a holder paused past its ttl, made to order."""

    def __init__(self, store: LeaseStore, gate: asyncio.Event) -> None:
        self.store = store
        self.gate = gate

    async def acquire(self, run_id: str, *, tenant: str, holder: str, ttl_s: float) -> RunLease:
        return await self.store.acquire(run_id, tenant=tenant, holder=holder, ttl_s=ttl_s)

    async def renew(self, lease: RunLease, *, ttl_s: float) -> RunLease:
        await self.gate.wait()
        return await self.store.renew(lease, ttl_s=ttl_s)

    async def release(self, lease: RunLease) -> None:
        await self.store.release(lease)

    async def current(self, run_id: str) -> RunLease | None:
        return await self.store.current(run_id)

    async def close(self) -> None:
        """The wrapped store belongs to the test; it closes it."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _policy(ttl_s: float) -> LeasePolicy:
    return LeasePolicy(ttl=datetime.timedelta(seconds=ttl_s))


class LeaseStoreConformance:
    """The contract of `LeaseStore`. Subclass per backend; every test must pass unchanged."""

    async def open_store(self) -> LeaseStore:
        """An open store (run ids are fresh per test, so it need not be empty)."""
        raise NotImplementedError

    @pytest_asyncio.fixture
    async def store(self) -> AsyncIterator[LeaseStore]:
        store = await self.open_store()
        try:
            yield store
        finally:
            await store.close()

    async def _take(
        self, store: LeaseStore, run_id: str, holder: str, ttl_s: float = LONG_TTL_S
    ) -> RunLease:
        return await store.acquire(run_id, tenant=TENANT, holder=holder, ttl_s=ttl_s)

    # -- acquisition -------------------------------------------------------------------------

    async def test_the_store_satisfies_the_protocol(self, store: LeaseStore) -> None:
        assert isinstance(store, LeaseStore)

    async def test_acquire_returns_the_holder_tenant_and_a_fence(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        lease = await store.acquire(run_id, tenant="globex", holder="w1", ttl_s=LONG_TTL_S)
        assert (lease.run_id, lease.tenant, lease.holder) == (run_id, "globex", "w1")
        assert lease.fence >= 1

    async def test_expires_at_is_seconds_since_the_epoch(self, store: LeaseStore) -> None:
        # Assumes the store's clock is within a few seconds of this machine's (true of any
        # sane deployment, and of a local test server); it catches milliseconds or a lost ttl.
        lease = await self._take(store, new_run_id(), "w1")
        assert abs(lease.expires_at - (time.time() + LONG_TTL_S)) < 5.0

    async def test_another_holder_is_refused_while_the_lease_is_unexpired(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        await self._take(store, run_id, "w1")
        with pytest.raises(ResumeConflictError) as refused:
            await self._take(store, run_id, "w2")
        assert refused.value.holder == "w1"
        assert refused.value.run_id == run_id

    async def test_the_same_holder_acquiring_again_is_refused_too(self, store: LeaseStore) -> None:
        # No silent re-entry: a second acquisition by the same name is most likely a second
        # process configured with the same worker name, and two of those must not both write.
        run_id = new_run_id()
        await self._take(store, run_id, "w1")
        with pytest.raises(ResumeConflictError) as refused:
            await self._take(store, run_id, "w1")
        assert refused.value.holder == "w1"

    async def test_a_refused_acquisition_changes_nothing(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        lease = await self._take(store, run_id, "w1")
        with pytest.raises(ResumeConflictError):
            await self._take(store, run_id, "w2")
        current = await store.current(run_id)
        assert current is not None
        assert (current.holder, current.fence) == ("w1", lease.fence)
        renewed = await store.renew(lease, ttl_s=LONG_TTL_S)
        assert renewed.fence == lease.fence

    async def test_an_expired_lease_can_be_taken_by_another_holder(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        await self._take(store, run_id, "w1", ttl_s=SHORT_TTL_S)
        await asyncio.sleep(LAPSE_S)
        taken = await self._take(store, run_id, "w2")
        assert taken.holder == "w2"

    async def test_an_expired_lease_can_be_taken_again_by_its_old_holder(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        first = await self._take(store, run_id, "w1", ttl_s=SHORT_TTL_S)
        await asyncio.sleep(LAPSE_S)
        again = await self._take(store, run_id, "w1")
        assert again.fence > first.fence

    # -- fences ------------------------------------------------------------------------------

    async def test_acquiring_after_a_release_raises_the_fence(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        first = await self._take(store, run_id, "w1")
        await store.release(first)
        second = await self._take(store, run_id, "w2")
        assert second.fence > first.fence

    async def test_acquiring_after_an_expiry_raises_the_fence(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        first = await self._take(store, run_id, "w1", ttl_s=SHORT_TTL_S)
        await asyncio.sleep(LAPSE_S)
        second = await self._take(store, run_id, "w2")
        assert second.fence > first.fence

    async def test_the_fence_never_goes_back(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        fences: list[int] = []
        for cycle in range(25):
            lease = await self._take(store, run_id, f"w{cycle % 3}")
            fences.append(lease.fence)
            await store.release(lease)
        assert all(a < b for a, b in itertools.pairwise(fences))

    async def test_renewal_keeps_the_fence_and_extends_the_expiry(self, store: LeaseStore) -> None:
        lease = await self._take(store, new_run_id(), "w1")
        await asyncio.sleep(0.05)
        renewed = await store.renew(lease, ttl_s=2 * LONG_TTL_S)
        assert (renewed.run_id, renewed.tenant, renewed.holder, renewed.fence) == (
            lease.run_id,
            lease.tenant,
            lease.holder,
            lease.fence,
        )
        assert renewed.expires_at > lease.expires_at + LONG_TTL_S / 2

    async def test_a_renewed_lease_outlives_its_first_ttl(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        lease = await self._take(store, run_id, "w1", ttl_s=SHORT_TTL_S)
        for _ in range(4):
            await asyncio.sleep(SHORT_TTL_S / 3)
            lease = await store.renew(lease, ttl_s=SHORT_TTL_S)
        with pytest.raises(ResumeConflictError):
            await self._take(store, run_id, "w2")

    async def test_renewing_after_expiry_is_fenced_even_if_nobody_took_it(
        self, store: LeaseStore
    ) -> None:
        lease = await self._take(store, new_run_id(), "w1", ttl_s=SHORT_TTL_S)
        await asyncio.sleep(LAPSE_S)
        with pytest.raises(FencedError):
            await store.renew(lease, ttl_s=LONG_TTL_S)

    async def test_a_superseded_holder_cannot_renew(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        old = await self._take(store, run_id, "w1", ttl_s=SHORT_TTL_S)
        await asyncio.sleep(LAPSE_S)
        new = await self._take(store, run_id, "w2")
        with pytest.raises(FencedError):
            await store.renew(old, ttl_s=LONG_TTL_S)
        current = await store.current(run_id)
        assert current is not None
        assert (current.holder, current.fence) == ("w2", new.fence)

    async def test_a_superseded_holder_cannot_release(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        old = await self._take(store, run_id, "w1", ttl_s=SHORT_TTL_S)
        await asyncio.sleep(LAPSE_S)
        new = await self._take(store, run_id, "w2")
        with pytest.raises(FencedError):
            await store.release(old)
        current = await store.current(run_id)
        assert current is not None
        assert (current.holder, current.fence) == ("w2", new.fence)

    async def test_a_holder_superseded_by_itself_is_still_fenced(self, store: LeaseStore) -> None:
        # The fence, not the name, says which acquisition a lease is.
        run_id = new_run_id()
        old = await self._take(store, run_id, "w1", ttl_s=SHORT_TTL_S)
        await asyncio.sleep(LAPSE_S)
        await self._take(store, run_id, "w1")
        with pytest.raises(FencedError):
            await store.renew(old, ttl_s=LONG_TTL_S)
        with pytest.raises(FencedError):
            await store.release(old)

    async def test_superseded_by_compares_fences_of_one_run(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        old = await self._take(store, run_id, "w1")
        await store.release(old)
        new = await self._take(store, run_id, "w2")
        other_run = new_run_id()
        other = await self._take(store, other_run, "w3")
        while other.fence <= old.fence:
            await store.release(other)
            other = await self._take(store, other_run, "w3")
        assert old.superseded_by(new)
        assert not new.superseded_by(old)
        assert not new.superseded_by(new)
        assert not old.superseded_by(other)

    # -- release -----------------------------------------------------------------------------

    async def test_release_lets_another_holder_acquire_at_once(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        lease = await self._take(store, run_id, "w1")
        await store.release(lease)
        taken = await self._take(store, run_id, "w2")
        assert taken.holder == "w2"

    async def test_a_released_lease_cannot_be_renewed(self, store: LeaseStore) -> None:
        lease = await self._take(store, new_run_id(), "w1")
        await store.release(lease)
        with pytest.raises(FencedError):
            await store.renew(lease, ttl_s=LONG_TTL_S)

    async def test_releasing_twice_is_harmless(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        lease = await self._take(store, run_id, "w1")
        await store.release(lease)
        await store.release(lease)
        assert await store.current(run_id) is None

    async def test_releasing_a_lapsed_lease_nobody_took_is_allowed(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        lease = await self._take(store, run_id, "w1", ttl_s=SHORT_TTL_S)
        await asyncio.sleep(LAPSE_S)
        await store.release(lease)
        taken = await self._take(store, run_id, "w2")
        assert taken.fence > lease.fence

    # -- current -----------------------------------------------------------------------------

    async def test_current_returns_the_held_lease(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        lease = await self._take(store, run_id, "w1")
        current = await store.current(run_id)
        assert current is not None
        assert (current.run_id, current.tenant, current.holder, current.fence) == (
            run_id,
            TENANT,
            "w1",
            lease.fence,
        )
        assert current.expires_at == pytest.approx(lease.expires_at, abs=1e-3)

    async def test_current_is_none_for_a_run_never_leased(self, store: LeaseStore) -> None:
        assert await store.current(new_run_id()) is None

    async def test_current_is_none_after_release(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        await store.release(await self._take(store, run_id, "w1"))
        assert await store.current(run_id) is None

    async def test_current_is_none_after_expiry(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        await self._take(store, run_id, "w1", ttl_s=SHORT_TTL_S)
        await asyncio.sleep(LAPSE_S)
        assert await store.current(run_id) is None

    # -- the store's clock, not the caller's -------------------------------------------------

    async def test_a_caller_clock_an_hour_fast_cannot_take_an_unexpired_lease(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        await self._take(store, run_id, "w1")
        with caller_clock_off_by(SKEW_S), pytest.raises(ResumeConflictError):
            await self._take(store, run_id, "w2")
        current = await store.current(run_id)
        assert current is not None
        assert current.holder == "w1"

    async def test_a_caller_clock_an_hour_slow_cannot_keep_an_expired_lease(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        lease = await self._take(store, run_id, "w1", ttl_s=SHORT_TTL_S)
        await asyncio.sleep(LAPSE_S)
        with caller_clock_off_by(-SKEW_S):
            with pytest.raises(FencedError):
                await store.renew(lease, ttl_s=LONG_TTL_S)
            assert await store.current(run_id) is None

    async def test_a_caller_clock_an_hour_slow_gets_a_lease_of_the_asked_ttl(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        with caller_clock_off_by(-SKEW_S):
            await self._take(store, run_id, "w1", ttl_s=SHORT_TTL_S)
        await asyncio.sleep(LAPSE_S)
        taken = await self._take(store, run_id, "w2")
        assert taken.holder == "w2"

    # -- concurrency -------------------------------------------------------------------------

    async def test_concurrent_acquisitions_have_exactly_one_winner(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        outcomes = await asyncio.gather(
            *(self._take(store, run_id, f"w{i}") for i in range(20)), return_exceptions=True
        )
        winners = [o for o in outcomes if isinstance(o, RunLease)]
        refusals = [o for o in outcomes if isinstance(o, ResumeConflictError)]
        assert len(winners) == 1
        assert len(refusals) == 19
        assert {r.holder for r in refusals} == {winners[0].holder}

    async def test_runs_are_independent(self, store: LeaseStore) -> None:
        a, b = new_run_id(), new_run_id()
        lease_a = await self._take(store, a, "w1")
        lease_b = await self._take(store, b, "w2")
        assert lease_b.holder == "w2"
        await store.release(lease_a)
        current_b = await store.current(b)
        assert current_b is not None
        assert current_b.fence == lease_b.fence
        again_a = await self._take(store, a, "w3")
        assert again_a.fence > lease_a.fence
        assert (await store.renew(lease_b, ttl_s=LONG_TTL_S)).fence == lease_b.fence

    # -- Leaseholder over this store ---------------------------------------------------------

    async def test_leaseholder_renews_in_the_background(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        async with Leaseholder(
            store, run_id, tenant=TENANT, holder="w1", policy=_policy(1.0)
        ) as held:
            first = held.lease
            await asyncio.sleep(2.5)
            with pytest.raises(ResumeConflictError) as refused:
                await self._take(store, run_id, "w2")
            assert refused.value.holder == "w1"
            assert held.lease.fence == first.fence
            assert held.lease.expires_at > first.expires_at + 1.0
            assert not held.fenced.is_set()
            await held.check()

    async def test_leaseholder_refuses_to_enter_a_held_run(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        await self._take(store, run_id, "w1")
        with pytest.raises(ResumeConflictError) as refused:
            async with Leaseholder(store, run_id, tenant=TENANT, holder="w2"):
                pytest.fail("entered a run another holder has")
        assert refused.value.holder == "w1"

    async def test_leaseholder_releases_on_normal_exit(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        async with Leaseholder(store, run_id, tenant=TENANT, holder="w1") as held:
            fence = held.lease.fence
        assert await store.current(run_id) is None
        assert (await self._take(store, run_id, "w2")).fence > fence

    async def test_leaseholder_releases_when_the_block_raises(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        with pytest.raises(RuntimeError, match="tool blew up"):
            async with Leaseholder(store, run_id, tenant=TENANT, holder="w1"):
                raise RuntimeError("tool blew up")
        assert (await self._take(store, run_id, "w2")).holder == "w2"

    async def test_leaseholder_releases_when_cancelled(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        entered = asyncio.Event()

        async def work() -> None:
            async with Leaseholder(store, run_id, tenant=TENANT, holder="w1"):
                entered.set()
                await asyncio.Event().wait()

        task = asyncio.create_task(work())
        await asyncio.wait_for(entered.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await self._take(store, run_id, "w2")).holder == "w2"

    async def test_leaseholder_sets_fenced_when_superseded_while_paused(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        gate = asyncio.Event()
        async with Leaseholder(
            GatedRenewals(store, gate),
            run_id,
            tenant=TENANT,
            holder="w1",
            policy=_policy(SHORT_TTL_S),
        ) as held:
            await asyncio.sleep(LAPSE_S)
            taker = await self._take(store, run_id, "w2")
            gate.set()
            await asyncio.wait_for(held.fenced.wait(), 10)
            with pytest.raises(FencedError):
                await held.check()
            assert held.lease.superseded_by(taker)
        current = await store.current(run_id)
        assert current is not None
        assert (current.holder, current.fence) == ("w2", taker.fence)

    async def test_leaseholder_confirm_renews_a_held_lease(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        async with Leaseholder(store, run_id, tenant=TENANT, holder="w1") as held:
            first = held.lease
            await asyncio.sleep(0.05)
            confirmed = await held.confirm()
            assert confirmed.fence == first.fence
            assert confirmed.expires_at > first.expires_at
            assert held.lease == confirmed

    async def test_leaseholder_confirm_raises_once_superseded(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        async with Leaseholder(store, run_id, tenant=TENANT, holder="w1") as held:
            await store.release(held.lease)
            await self._take(store, run_id, "w2")
            with pytest.raises(FencedError):
                await held.confirm()
            assert held.fenced.is_set()
        current = await store.current(run_id)
        assert current is not None
        assert current.holder == "w2"

    async def test_leaseholder_adopts_a_lease_already_taken(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        lease = await self._take(store, run_id, "w1")
        async with Leaseholder(store, run_id, tenant=TENANT, holder="w1", lease=lease) as held:
            assert held.lease.fence == lease.fence
            with pytest.raises(ResumeConflictError):
                await self._take(store, run_id, "w2")
        assert (await self._take(store, run_id, "w2")).fence > lease.fence

    async def test_leaseholder_refuses_to_adopt_a_lost_lease(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        lease = await self._take(store, run_id, "w1")
        await store.release(lease)
        taker = await self._take(store, run_id, "w2")
        with pytest.raises(FencedError):
            async with Leaseholder(store, run_id, tenant=TENANT, holder="w1", lease=lease):
                pytest.fail("adopted a superseded lease")
        current = await store.current(run_id)
        assert current is not None
        assert current.fence == taker.fence
