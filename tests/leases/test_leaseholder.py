"""`Leaseholder` over a store that fails: what it does when the store cannot answer."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from onward.errors import BackendUnavailableError, FencedError, InvalidInputError
from onward.runtime.leases import (
    CancelAsked,
    CancelAskHeard,
    Leaseholder,
    LeaseStore,
    MemoryLeaseStore,
    RunLease,
)
from onward.testing.eventlog import TENANT, new_run_id
from onward.testing.leases import (
    GatedRenewals,
    WrappedLeaseStore,
    cancelled_inside,
    policy,
    until,
)


class FailingStore(WrappedLeaseStore):
    """A memory store whose renewals and releases can be made to fail or crash."""

    def __init__(self) -> None:
        super().__init__(MemoryLeaseStore())
        self.renew_fails: BaseException | None = None
        self.release_fails = False
        self.renewals = 0

    async def renew(self, lease: RunLease, *, ttl_s: float) -> RunLease:
        self.renewals += 1
        if self.renew_fails is not None:
            raise self.renew_fails
        return await super().renew(lease, ttl_s=ttl_s)

    async def release(self, lease: RunLease) -> None:
        if self.release_fails:
            raise BackendUnavailableError("release: the store is down", run_id=lease.run_id)
        await super().release(lease)


class PausedAfterGrant(WrappedLeaseStore):
    """A memory store whose renewal is granted, after which the holder's process pauses (a long
    GC, SIGSTOP, a suspended VM) before it reads the answer."""

    def __init__(self) -> None:
        super().__init__(MemoryLeaseStore())
        self.pause_s = 0.0

    async def renew(self, lease: RunLease, *, ttl_s: float) -> RunLease:
        granted = await super().renew(lease, ttl_s=ttl_s)
        time.sleep(self.pause_s)  # noqa: ASYNC251 - the loop itself is what is paused
        return granted


def holding(
    store: LeaseStore, ttl_s: float = 30.0, renew_within_s: float | None = None
) -> Leaseholder:
    """A holder of a new run, ``w1``, over ``store``."""
    return Leaseholder(
        store, new_run_id(), tenant=TENANT, holder="w1", policy=policy(ttl_s, renew_within_s)
    )


def failing(renew_fails: BaseException | None = None) -> FailingStore:
    store = FailingStore()
    store.renew_fails = renew_fails
    return store


async def test_an_unreachable_store_is_retried_and_then_counts_as_lost() -> None:
    store = failing(BackendUnavailableError("down"))
    async with holding(store, 0.6) as held:
        await asyncio.wait_for(held.fenced.wait(), 5)
        assert store.renewals >= 2


async def test_a_store_that_recovers_in_time_keeps_the_lease() -> None:
    """Renewals refused for a while, then answered before the lease lapses: the holder keeps
    the run, under a lease renewed past the one it first held."""
    store = failing(BackendUnavailableError("down"))
    async with holding(store, 1.0) as held:
        first = held.lease
        await until(lambda: store.renewals >= 1, within_s=5, what="a renewal the store refused")
        store.renew_fails = None
        await until(
            lambda: held.lease.expires_at > first.expires_at or held.fenced.is_set(),
            within_s=5,
            what="a renewal once the store recovered",
        )
        assert not held.fenced.is_set()
        assert await store.current(held.run_id) == held.lease


async def test_a_crashed_renewal_counts_as_lost(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        async with holding(failing(ZeroDivisionError("a bug")), 0.3) as held:
            await asyncio.wait_for(held.fenced.wait(), 5)
    assert "renewal crashed" in caplog.text


async def test_renewal_waits_for_the_renew_margin() -> None:
    store = failing()
    async with holding(store, 1.0, renew_within_s=0.2):
        await asyncio.sleep(0.5)  # not due before 0.8 s: the margin is 0.2 s of a 1 s ttl
        assert store.renewals == 0
        await until(lambda: store.renewals >= 1, within_s=5, what="a renewal within the margin")


async def test_raise_fence_waits_for_a_renewal_in_flight_and_renewals_go_on_with_it() -> None:
    # Without the two serialized, the renewal in flight would carry the old fence after the
    # raise and be refused, or put the old lease back in place of the raised one.
    inner = MemoryLeaseStore()
    store = GatedRenewals(inner, asyncio.Event())
    async with holding(store, 1.0, renew_within_s=0.9) as held:
        first = held.lease
        await asyncio.wait_for(store.waiting.wait(), 5)
        raising = asyncio.create_task(held.raise_fence(first.fence + 41))
        await asyncio.sleep(0.05)
        assert not raising.done()
        store.gate.set()
        raised = await asyncio.wait_for(raising, 5)
        assert raised.fence > first.fence + 41
        assert held.lease == raised
        await until(
            lambda: held.lease.expires_at > raised.expires_at,
            within_s=5,
            what="a renewal under the raised fence",
        )
        assert held.lease.fence == raised.fence
        assert not held.fenced.is_set()
        assert await inner.current(held.run_id) == held.lease
    assert await inner.current(held.run_id) is None


async def test_a_failed_release_after_normal_exit_is_raised() -> None:
    store = failing()
    with pytest.raises(BackendUnavailableError):
        async with holding(store):
            store.release_fails = True


async def test_a_failed_release_never_masks_the_blocks_error() -> None:
    store = failing()

    async def work() -> None:
        async with holding(store):
            store.release_fails = True
            raise RuntimeError("the block's own")

    with pytest.raises(RuntimeError, match="the block's own"):
        await work()


async def test_a_failed_release_never_swallows_a_cancellation() -> None:
    store = failing()

    def fail_releases() -> None:
        store.release_fails = True

    await cancelled_inside(holding(store), on_entry=fail_releases)


async def test_the_lease_is_not_there_before_entering() -> None:
    held = holding(MemoryLeaseStore())
    with pytest.raises(InvalidInputError):
        _ = held.lease


async def test_a_lease_of_another_holder_cannot_be_adopted() -> None:
    store = MemoryLeaseStore()
    run_id = new_run_id()
    lease = await store.acquire(run_id, tenant=TENANT, holder="w1", ttl_s=30)
    with pytest.raises(InvalidInputError):
        Leaseholder(store, run_id, tenant=TENANT, holder="w2", lease=lease)


async def test_entering_twice_at_once_is_refused() -> None:
    held = holding(MemoryLeaseStore())
    async with held:
        with pytest.raises(InvalidInputError):
            await held.__aenter__()


async def test_a_holder_can_be_entered_again_after_exit_with_a_new_fence() -> None:
    held = holding(MemoryLeaseStore())
    async with held:
        first = held.lease.fence
    async with held:
        assert held.lease.fence > first


async def test_a_holder_paused_past_its_ttl_stops_at_its_next_check_before_any_renewal() -> None:
    """The event loop held for longer than the ttl (a long GC, SIGSTOP, a suspended VM): the
    renewal task has had no chance to run, yet the next `check` raises, counted on this
    process's own clock from the store's last answer, so no write goes out under a lease
    that has lapsed for certain."""
    store = failing()
    async with holding(store, 0.3) as held:
        await held.check()
        renewals = store.renewals
        time.sleep(0.4)  # noqa: ASYNC251 - the loop itself is what is paused
        with pytest.raises(FencedError, match="is lost"):
            await held.check()
        assert store.renewals == renewals  # told by its own clock, not by the store
        assert held.fenced.is_set()


async def test_a_raised_fence_does_not_count_as_a_renewal_for_the_local_check() -> None:
    """Lifting the fence keeps the expiry, so it must not move the instant `check` counts a
    ttl from: a holder that only raised its fence lapses a ttl after its last grant."""
    store = failing(BackendUnavailableError("renewals fail"))
    async with holding(store, 0.4) as held:
        granted = held.lease
        time.sleep(0.2)  # noqa: ASYNC251
        await held.raise_fence(granted.fence + 5)
        time.sleep(0.25)  # noqa: ASYNC251
        with pytest.raises(FencedError):
            await held.check()


async def test_an_ask_heard_by_a_renewal_cuts_a_cancelled_by_ask_block_short() -> None:
    store = MemoryLeaseStore()
    async with holding(store) as held:

        async def long_wait() -> str:
            async with held.cancelled_by_ask():
                await asyncio.sleep(3600)
            return "waited"

        waiting = asyncio.create_task(long_wait())
        await asyncio.sleep(0)
        assert await store.ask_to_cancel(held.run_id, tenant=TENANT, by="ops", why="not wanted")
        assert not waiting.done()  # asked, not heard yet
        await held.confirm()  # the holder hears it, as its next renewal would
        with pytest.raises(CancelAskHeard, match="cancelled by ops: not wanted") as heard:
            await asyncio.wait_for(waiting, 5)
        assert heard.value.asked == CancelAsked("ops", "not wanted")
        # Heard already: a block entered after the ask is cut short at once.
        with pytest.raises(CancelAskHeard):
            async with held.cancelled_by_ask():
                pytest.fail("the block ran although the ask was heard")


async def test_a_cancelled_by_ask_block_leaves_other_cancellations_alone() -> None:
    store = MemoryLeaseStore()
    async with holding(store) as held:

        async def long_wait() -> None:
            async with held.cancelled_by_ask():
                await asyncio.sleep(3600)

        waiting = asyncio.create_task(long_wait())
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        # A block that ended before any ask is untouched by a later one.
        async with held.cancelled_by_ask():
            await asyncio.sleep(0)
        assert await store.ask_to_cancel(held.run_id, tenant=TENANT, by="ops")
        await held.confirm()
        await asyncio.sleep(0.01)  # nothing is cancelled after the block
        assert held.cancel_asked == CancelAsked("ops")


async def test_a_confirm_answered_after_a_pause_past_the_ttl_is_refused() -> None:
    """The store granted the renewal, then the holder was paused past the ttl before it read
    the answer: the lease lapsed meanwhile (another worker may hold the run), so `confirm`,
    the last word before a tool call, must not hand back a lease counted from the answer."""
    store = PausedAfterGrant()
    async with holding(store, 0.5, renew_within_s=0.1) as held:
        store.pause_s = 0.7
        with pytest.raises(FencedError, match="is lost"):
            await held.confirm()
        store.pause_s = 0.0
        assert held.fenced.is_set()
        taker = await store.inner.acquire(held.run_id, tenant=TENANT, holder="w2", ttl_s=30)
        assert held.lease.superseded_by(taker)
        with pytest.raises(FencedError):
            await held.check()


async def test_a_second_cancellation_on_the_way_out_still_releases_the_lease() -> None:
    """Cancelled again while it stops its renewals (a task group, then the process's own
    shutdown): the block still hands the lease back, so the next worker need not wait it out."""
    store = MemoryLeaseStore()
    held = holding(store)
    entered = asyncio.Event()

    async def work() -> None:
        async with held:
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(work())
    await asyncio.wait_for(entered.wait(), 5)
    task.cancel()
    await asyncio.sleep(0)  # the block is on its way out, waiting for its renewals to stop
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await store.current(held.run_id) is None


class SlowReleases(WrappedLeaseStore):
    """A memory store whose release takes a round trip: it starts, then waits for a gate."""

    def __init__(self) -> None:
        super().__init__(MemoryLeaseStore())
        self.releasing = asyncio.Event()
        self.answer = asyncio.Event()

    async def release(self, lease: RunLease) -> None:
        self.releasing.set()
        await self.answer.wait()
        await super().release(lease)


async def test_a_second_cancellation_during_the_release_still_releases_the_lease() -> None:
    """Cancelled again while the store is handing the lease back (two Ctrl-C, a task group and
    then a shutdown): the release is waited out, not abandoned with the run held by nobody."""
    store = SlowReleases()
    held = holding(store)
    entered = asyncio.Event()

    async def work() -> None:
        async with held:
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(work())
    await asyncio.wait_for(entered.wait(), 5)
    task.cancel()
    await asyncio.wait_for(store.releasing.wait(), 5)
    task.cancel()
    await asyncio.sleep(0)
    store.answer.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await store.current(held.run_id) is None
