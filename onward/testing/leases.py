"""`LeaseStoreConformance`: the behaviour every `LeaseStore` backend must show.

Subclass it once per backend and implement :meth:`LeaseStoreConformance.open_store`, which
returns an open store. Run ids are fresh per test, so the store need not be empty. Override
:meth:`LeaseStoreConformance.wiped` when ``open_store`` reopens the same data rather than an
empty store. Needs pytest and pytest-asyncio (``asyncio_mode = "auto"``).

Tests that need a lease to lapse poll the store until it has (`until_lapsed`) rather than
sleep past the ttl, and fail when it has not lapsed a bounded time after its ttl.
`WrappedLeaseStore` is a store to subclass when a test needs one call slow, gated or failing.

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
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, contextmanager
from typing import ClassVar, Self

import pytest
import pytest_asyncio

from onward._storage import Resource
from onward.errors import FencedError, InvalidInputError, ResumeConflictError
from onward.runtime.leases.base import CancelAsked, LeasePolicy, LeaseStore, RunLease
from onward.runtime.leases.holder import Leaseholder

from .eventlog import TENANT, new_run_id

LONG_TTL_S = 30.0
"""Long enough that nothing lapses during a test unless it means to."""
SHORT_TTL_S = 0.5
"""Short enough to wait out; every backend's clock resolves it (Redis and SQLite to the ms)."""
LAPSE_WITHIN_S = 5.0
"""How long past its ttl a lease may still be held before the test calls its expiry broken."""
POLL_S = 0.02
"""How often a test asks the store whether a lease has lapsed."""
SKEW_S = 3600.0
"""How far the caller's clock is moved in the clock-skew tests."""
LOG_AHEAD_BY = 41
"""How far above a lease's fence the raise tests put the highest fence in the run's log."""


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


async def until_lapsed(store: LeaseStore, run_id: str, *, ttl_s: float = SHORT_TTL_S) -> None:
    """Wait, polling the store, until a run's lease has lapsed by the store's clock.

    Fails the test when the lease is still held ``LAPSE_WITHIN_S`` past ``ttl_s``, so a store
    whose leases never expire cannot pass a test that waits here.
    """
    deadline = time.monotonic() + ttl_s + LAPSE_WITHIN_S
    while (held := await store.current(run_id)) is not None:
        if time.monotonic() > deadline:
            pytest.fail(f"run {run_id!r}: the lease {held} of a {ttl_s} s ttl never lapsed")
        await asyncio.sleep(POLL_S)


async def until(condition: Callable[[], bool], *, within_s: float, what: str) -> None:
    """Wait until ``condition()`` holds, failing the test after ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {within_s} s")
        await asyncio.sleep(POLL_S)


async def assert_exactly_one_acquires(stores: Sequence[LeaseStore], *, contenders: int) -> None:
    """Race ``contenders`` acquisitions of one run over ``stores`` (round robin).

    Exactly one must win, and every other must be refused naming the winner.
    """
    run_id = new_run_id()
    outcomes = await asyncio.gather(
        *(
            stores[i % len(stores)].acquire(run_id, tenant=TENANT, holder=f"w{i}", ttl_s=LONG_TTL_S)
            for i in range(contenders)
        ),
        return_exceptions=True,
    )
    winners = [o for o in outcomes if isinstance(o, RunLease)]
    refusals = [o for o in outcomes if isinstance(o, ResumeConflictError)]
    assert len(winners) == 1, outcomes
    assert len(refusals) == contenders - 1, outcomes
    assert {r.holder for r in refusals} == {winners[0].holder}


async def cancelled_inside(
    held: Leaseholder, *, on_entry: Callable[[], None] = lambda: None
) -> None:
    """Cancel a task inside ``held``'s block and check that the cancellation comes out of it.

    ``on_entry`` runs inside the block, before the cancellation.
    """
    entered = asyncio.Event()

    async def work() -> None:
        async with held:
            on_entry()
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(work())
    await asyncio.wait_for(entered.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


class WrappedLeaseStore(Resource):
    """A `LeaseStore` that hands every call to ``inner``.

    Subclass it to make one call slow, gated or failing and leave the rest alone. Closing it
    leaves ``inner`` open: the wrapped store belongs to whoever made it.
    """

    def __init__(self, inner: LeaseStore) -> None:
        self.inner = inner

    async def acquire(self, run_id: str, *, tenant: str, holder: str, ttl_s: float) -> RunLease:
        return await self.inner.acquire(run_id, tenant=tenant, holder=holder, ttl_s=ttl_s)

    async def renew(self, lease: RunLease, *, ttl_s: float) -> RunLease:
        return await self.inner.renew(lease, ttl_s=ttl_s)

    async def raise_fence(self, lease: RunLease, *, above: int) -> RunLease:
        return await self.inner.raise_fence(lease, above=above)

    async def release(self, lease: RunLease) -> None:
        await self.inner.release(lease)

    async def forget(self, lease: RunLease) -> None:
        await self.inner.forget(lease)

    async def current(self, run_id: str) -> RunLease | None:
        return await self.inner.current(run_id)

    async def current_many(self, run_ids: Sequence[str]) -> dict[str, RunLease]:
        return await self.inner.current_many(run_ids)

    async def ask_to_cancel(
        self, run_id: str, *, tenant: str, by: str, why: str = ""
    ) -> RunLease | None:
        return await self.inner.ask_to_cancel(run_id, tenant=tenant, by=by, why=why)

    async def close(self) -> None:
        """The wrapped store is not this one's to close."""


class GatedRenewals(WrappedLeaseStore):
    """A store whose renewals wait for a gate: a holder paused past its ttl, made to order.

    Attributes:
        gate: Renewals wait until it is set.
        waiting: Set once a renewal is waiting at the gate.
    """

    def __init__(self, inner: LeaseStore, gate: asyncio.Event) -> None:
        super().__init__(inner)
        self.gate = gate
        self.waiting = asyncio.Event()

    async def renew(self, lease: RunLease, *, ttl_s: float) -> RunLease:
        self.waiting.set()
        await self.gate.wait()
        return await super().renew(lease, ttl_s=ttl_s)


def policy(ttl_s: float, renew_within_s: float | None = None) -> LeasePolicy:
    """A `LeasePolicy` in seconds."""
    return LeasePolicy(
        ttl=datetime.timedelta(seconds=ttl_s),
        renew_within=None if renew_within_s is None else datetime.timedelta(seconds=renew_within_s),
    )


class LeaseStoreConformance:
    """The contract of `LeaseStore`. Subclass per backend; every test must pass unchanged.

    Attributes:
        exit_stack: Unwound after each test, after the stores are closed: ``open_store`` may
            enter into it what its store needs for the test (a schema, a file).
    """

    exit_stack: AsyncExitStack

    async def open_store(self) -> LeaseStore:
        """An open store (run ids are fresh per test, so it need not be empty)."""
        raise NotImplementedError

    async def wiped(self, store: LeaseStore, run_id: str) -> LeaseStore:
        """A store that has forgotten ``run_id``'s lease and fence, as after a wipe.

        That is a Redis restarted without persistence, a database restored from an old backup,
        or a lease store configured after the run was written. By default it is a store newly
        opened with `open_store`, right for a backend whose `open_store` returns an empty store;
        override it where `open_store` reopens the same data (and delete the run's data, say).
        """
        return await self._opened()

    async def _opened(self) -> LeaseStore:
        store = await self.open_store()
        self.exit_stack.push_async_callback(store.close)
        return store

    @pytest_asyncio.fixture
    async def store(self) -> AsyncIterator[LeaseStore]:
        async with AsyncExitStack() as self.exit_stack:
            yield await self._opened()

    async def _take(
        self, store: LeaseStore, run_id: str, holder: str, ttl_s: float = LONG_TTL_S
    ) -> RunLease:
        return await store.acquire(run_id, tenant=TENANT, holder=holder, ttl_s=ttl_s)

    async def _lapsed(self, store: LeaseStore, run_id: str, holder: str = "w1") -> RunLease:
        """A lease of ``SHORT_TTL_S`` taken and then waited out, by the store's clock."""
        lease = await self._take(store, run_id, holder, ttl_s=SHORT_TTL_S)
        await until_lapsed(store, run_id)
        return lease

    async def _superseded(self, store: LeaseStore, run_id: str) -> tuple[RunLease, RunLease]:
        """A lease of ``w1`` that lapsed, and the lease ``w2`` took after it."""
        old = await self._lapsed(store, run_id)
        return old, await self._take(store, run_id, "w2")

    async def _raised(
        self, store: LeaseStore, run_id: str, ttl_s: float = LONG_TTL_S
    ) -> tuple[RunLease, RunLease]:
        """A lease of ``w1``, and that lease raised above a log ``LOG_AHEAD_BY`` fences ahead."""
        lease = await self._take(store, run_id, "w1", ttl_s=ttl_s)
        return lease, await store.raise_fence(lease, above=lease.fence + LOG_AHEAD_BY)

    async def _handed_over(self, store: LeaseStore, run_id: str) -> tuple[RunLease, RunLease]:
        """A lease of ``w1`` that was released, and the lease ``w2`` took after it."""
        old = await self._take(store, run_id, "w1")
        await store.release(old)
        return old, await self._take(store, run_id, "w2")

    async def _assert_held_by(self, store: LeaseStore, run_id: str, lease: RunLease) -> None:
        current = await store.current(run_id)
        assert current is not None
        assert (current.holder, current.fence) == (lease.holder, lease.fence)

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
        lease = await self._take(store, run_id, "w1")
        with pytest.raises(ResumeConflictError) as refused:
            await self._take(store, run_id, "w2")
        assert refused.value.holder == "w1"
        assert refused.value.run_id == run_id
        # When the holder's lease lapses unless renewed, so a caller can say how long to wait.
        assert refused.value.expires_at is not None
        assert abs(refused.value.expires_at - lease.expires_at) < 0.01
        assert " until " in str(refused.value)

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
        await self._assert_held_by(store, run_id, lease)
        renewed = await store.renew(lease, ttl_s=LONG_TTL_S)
        assert renewed.fence == lease.fence

    async def test_an_expired_lease_can_be_taken_by_another_holder(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        await self._lapsed(store, run_id)
        taken = await self._take(store, run_id, "w2")
        assert taken.holder == "w2"

    async def test_an_expired_lease_can_be_taken_again_by_its_old_holder(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        first = await self._lapsed(store, run_id)
        again = await self._take(store, run_id, "w1")
        assert again.fence > first.fence

    # -- fences ------------------------------------------------------------------------------

    async def test_acquiring_after_a_release_raises_the_fence(self, store: LeaseStore) -> None:
        first, second = await self._handed_over(store, new_run_id())
        assert second.fence > first.fence

    async def test_acquiring_after_an_expiry_raises_the_fence(self, store: LeaseStore) -> None:
        first, second = await self._superseded(store, new_run_id())
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
        # Sleeps on purpose: the point is to be past the first ttl while still renewing.
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
        lease = await self._lapsed(store, new_run_id())
        with pytest.raises(FencedError):
            await store.renew(lease, ttl_s=LONG_TTL_S)

    async def test_a_superseded_holder_cannot_renew(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        old, new = await self._superseded(store, run_id)
        with pytest.raises(FencedError):
            await store.renew(old, ttl_s=LONG_TTL_S)
        await self._assert_held_by(store, run_id, new)

    async def test_a_superseded_holder_cannot_release(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        old, new = await self._superseded(store, run_id)
        with pytest.raises(FencedError):
            await store.release(old)
        await self._assert_held_by(store, run_id, new)

    async def test_a_holder_superseded_by_itself_is_still_fenced(self, store: LeaseStore) -> None:
        # The fence, not the name, says which acquisition a lease is.
        run_id = new_run_id()
        old = await self._lapsed(store, run_id)
        await self._take(store, run_id, "w1")
        with pytest.raises(FencedError):
            await store.renew(old, ttl_s=LONG_TTL_S)
        with pytest.raises(FencedError):
            await store.release(old)

    async def test_superseded_by_compares_fences_of_one_run(self, store: LeaseStore) -> None:
        old, new = await self._handed_over(store, new_run_id())
        other_run = new_run_id()
        other = await self._take(store, other_run, "w3")
        while other.fence <= old.fence:
            await store.release(other)
            other = await self._take(store, other_run, "w3")
        assert old.superseded_by(new)
        assert not new.superseded_by(old)
        assert not new.superseded_by(new)
        assert not old.superseded_by(other)

    # -- raising the fence above the log's ---------------------------------------------------

    async def test_raising_the_fence_goes_above_the_log_and_keeps_the_rest(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        lease, raised = await self._raised(store, run_id)
        assert raised.fence > lease.fence + LOG_AHEAD_BY
        assert (raised.run_id, raised.tenant, raised.holder) == (run_id, TENANT, "w1")
        assert raised.expires_at == pytest.approx(lease.expires_at, abs=1e-3)
        await self._assert_held_by(store, run_id, raised)

    async def test_acquiring_after_a_raise_and_a_release_goes_higher_still(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        _, raised = await self._raised(store, run_id)
        await store.release(raised)
        assert (await self._take(store, run_id, "w2")).fence > raised.fence

    async def test_acquiring_after_a_raise_and_an_expiry_goes_higher_still(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        _, raised = await self._raised(store, run_id, ttl_s=SHORT_TTL_S)
        await until_lapsed(store, run_id)
        assert (await self._take(store, run_id, "w2")).fence > raised.fence

    async def test_a_lease_already_above_the_log_is_returned_unchanged(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        lease = await self._take(store, run_id, "w1")
        assert await store.raise_fence(lease, above=lease.fence - 1) == lease
        assert await store.raise_fence(lease, above=0) == lease
        await self._assert_held_by(store, run_id, lease)

    async def test_raising_the_fence_of_an_expired_lease_is_fenced(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        lease = await self._lapsed(store, run_id)
        with pytest.raises(FencedError):
            await store.raise_fence(lease, above=lease.fence + LOG_AHEAD_BY)
        taken = await self._take(store, run_id, "w2")
        assert lease.fence < taken.fence <= lease.fence + LOG_AHEAD_BY  # the raise left no trace

    async def test_raising_the_fence_of_a_released_lease_is_fenced(self, store: LeaseStore) -> None:
        lease = await self._take(store, new_run_id(), "w1")
        await store.release(lease)
        with pytest.raises(FencedError):
            await store.raise_fence(lease, above=lease.fence)

    async def test_raising_the_fence_of_a_superseded_lease_is_fenced(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        old, new = await self._superseded(store, run_id)
        with pytest.raises(FencedError):
            await store.raise_fence(old, above=new.fence + LOG_AHEAD_BY)
        await self._assert_held_by(store, run_id, new)

    async def test_after_a_raise_the_new_fence_renews_and_releases_and_the_old_is_refused(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        lease, raised = await self._raised(store, run_id)
        with pytest.raises(FencedError):
            await store.renew(lease, ttl_s=LONG_TTL_S)
        with pytest.raises(FencedError):
            await store.raise_fence(lease, above=raised.fence)
        renewed = await store.renew(raised, ttl_s=LONG_TTL_S)
        assert renewed.fence == raised.fence
        with pytest.raises(FencedError):
            await store.release(lease)
        await store.release(renewed)
        assert await store.current(run_id) is None

    async def test_two_raises_of_one_lease_at_once_leave_one_consistent_fence(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        lease = await self._take(store, run_id, "w1")
        outcomes = await asyncio.gather(
            store.raise_fence(lease, above=lease.fence + 10),
            store.raise_fence(lease, above=lease.fence + 20),
            return_exceptions=True,
        )
        winners = [o for o in outcomes if isinstance(o, RunLease)]
        assert len(winners) == 1, outcomes
        assert sum(isinstance(o, FencedError) for o in outcomes) == 1, outcomes
        await self._assert_held_by(store, run_id, winners[0])
        assert (await store.renew(winners[0], ttl_s=LONG_TTL_S)).fence == winners[0].fence
        await store.release(winners[0])
        assert (await self._take(store, run_id, "w2")).fence > winners[0].fence

    async def test_a_wiped_store_hands_out_a_low_fence_that_can_be_raised(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        _, in_the_log = await self._raised(store, run_id)
        wiped = await self.wiped(store, run_id)
        low = await self._take(wiped, run_id, "w2")
        assert low.fence <= in_the_log.fence
        raised = await wiped.raise_fence(low, above=in_the_log.fence)
        assert raised.fence >= in_the_log.fence + 1
        await wiped.release(raised)
        assert (await self._take(wiped, run_id, "w3")).fence > raised.fence

    # -- release -----------------------------------------------------------------------------

    async def test_release_lets_another_holder_acquire_at_once(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        _, taken = await self._handed_over(store, run_id)
        await self._assert_held_by(store, run_id, taken)

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
        lease = await self._lapsed(store, run_id)
        await store.release(lease)
        taken = await self._take(store, run_id, "w2")
        assert taken.fence > lease.fence

    # -- forgetting a run that does not exist -----------------------------------------------

    async def test_forgetting_a_first_lease_leaves_no_trace_of_the_run(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        lease = await self._take(store, run_id, "w1")
        assert lease.fence == 1
        await store.forget(lease)
        assert await store.current(run_id) is None
        # Nothing kept: the next acquisition starts the run's fences afresh.
        assert (await self._take(store, run_id, "w2")).fence == 1

    async def test_forgetting_a_later_lease_releases_it_and_keeps_the_fence(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        _, second = await self._handed_over(store, run_id)
        assert second.fence > 1
        await store.forget(second)
        assert await store.current(run_id) is None
        assert (await self._take(store, run_id, "w3")).fence > second.fence

    async def test_forgetting_a_raised_first_lease_keeps_the_raised_fence(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        _, raised = await self._raised(store, run_id)
        await store.forget(raised)
        assert (await self._take(store, run_id, "w2")).fence > raised.fence

    async def test_forgetting_a_superseded_lease_is_refused_and_the_new_one_kept(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        old, taken = await self._superseded(store, run_id)
        with pytest.raises(FencedError):
            await store.forget(old)
        await self._assert_held_by(store, run_id, taken)

    async def test_leaseholder_forgets_a_run_found_not_to_exist(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        async with Leaseholder(store, run_id, tenant=TENANT, holder="w1") as held:
            assert held.lease.fence == 1
            held.found_no_run()
        assert await store.current(run_id) is None
        assert (await self._take(store, run_id, "w2")).fence == 1

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
        # ``until_lapsed`` polls ``current`` until it says None, and fails if it never does.
        await self._lapsed(store, new_run_id())

    async def test_current_many_says_of_each_run_what_current_says(self, store: LeaseStore) -> None:
        """Held, raised, lapsed, released and never leased runs, read together, read as
        `current` reads each: the unexpired leases, and no entry for the others."""
        held, raised_run, lapsed, released, never = (new_run_id() for _ in range(5))
        await self._take(store, held, "w1")
        await self._raised(store, raised_run)
        await self._lapsed(store, lapsed)
        await store.release(await self._take(store, released, "w1"))
        run_ids = [held, raised_run, lapsed, released, never]
        found = await store.current_many(run_ids)
        each = {run_id: await store.current(run_id) for run_id in run_ids}
        assert set(found) == {held, raised_run}
        for run_id, lease in found.items():
            current = each[run_id]
            assert current is not None
            assert (lease.run_id, lease.tenant, lease.holder, lease.fence) == (
                current.run_id,
                current.tenant,
                current.holder,
                current.fence,
            )
            assert lease.expires_at == pytest.approx(current.expires_at, abs=1e-3)

    async def test_current_many_of_no_runs_is_empty(self, store: LeaseStore) -> None:
        assert await store.current_many([]) == {}

    async def test_current_many_reads_more_runs_than_one_query_names(
        self, store: LeaseStore
    ) -> None:
        """Past any backend's parameter limit (SQLite's 999), every held run is read."""
        run_ids = [new_run_id() for _ in range(1200)]
        held = run_ids[::97] + run_ids[-1:]
        for run_id in held:
            await self._take(store, run_id, "w1")
        assert set(await store.current_many(run_ids)) == set(held)

    # -- asking the holder to cancel ---------------------------------------------------------

    async def test_a_cancel_ask_reaches_the_holder_with_its_next_renewal(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        lease = await self._take(store, run_id, "w1")
        assert lease.cancel_asked is None
        asked = await store.ask_to_cancel(run_id, tenant=TENANT, by="ops", why="runaway")
        assert asked is not None
        assert (asked.holder, asked.fence) == ("w1", lease.fence)
        assert asked.expires_at == pytest.approx(lease.expires_at, abs=1e-3)
        assert asked.cancel_asked == CancelAsked("ops", "runaway")
        renewed = await store.renew(lease, ttl_s=LONG_TTL_S)
        assert renewed.cancel_asked == CancelAsked("ops", "runaway")
        assert renewed.fence == lease.fence
        current = await store.current(run_id)
        assert current is not None
        assert current.cancel_asked == CancelAsked("ops", "runaway")

    async def test_a_second_cancel_ask_keeps_the_first(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        lease = await self._take(store, run_id, "w1")
        await store.ask_to_cancel(run_id, tenant=TENANT, by="ops", why="")
        again = await store.ask_to_cancel(run_id, tenant=TENANT, by="audit", why="later")
        assert again is not None
        assert again.cancel_asked == CancelAsked("ops", "")
        renewed = await store.renew(lease, ttl_s=LONG_TTL_S)
        assert renewed.cancel_asked == CancelAsked("ops", "")

    async def test_a_cancel_ask_with_no_asker_or_no_reason_is_refused(
        self, store: LeaseStore
    ) -> None:
        # As `AgentRunner.ask_to_cancel` refuses it: kept, a None would end the run "cancelled
        # by None", or be told to its asker as asked while no holder ever hears it.
        run_id = new_run_id()
        lease = await self._take(store, run_id, "w1")
        for by, why in ((None, ""), ("", ""), ("ops", None), ("ops", "a\x00b")):
            with pytest.raises(InvalidInputError, match=r"^(by|why) "):
                await store.ask_to_cancel(run_id, tenant=TENANT, by=by, why=why)  # type: ignore[arg-type]
        assert (await store.renew(lease, ttl_s=LONG_TTL_S)).cancel_asked is None

    async def test_a_cancel_ask_survives_a_fence_raise(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        lease = await self._take(store, run_id, "w1")
        await store.ask_to_cancel(run_id, tenant=TENANT, by="ops", why="stop")
        raised = await store.raise_fence(lease, above=lease.fence + LOG_AHEAD_BY)
        assert raised.cancel_asked == CancelAsked("ops", "stop")

    async def test_a_cancel_ask_of_a_free_lapsed_or_foreign_run_asks_nobody(
        self, store: LeaseStore
    ) -> None:
        assert await store.ask_to_cancel(new_run_id(), tenant=TENANT, by="ops") is None
        released = new_run_id()
        await store.release(await self._take(store, released, "w1"))
        assert await store.ask_to_cancel(released, tenant=TENANT, by="ops") is None
        lapsed = new_run_id()
        await self._lapsed(store, lapsed)
        assert await store.ask_to_cancel(lapsed, tenant=TENANT, by="ops") is None
        foreign = new_run_id()
        lease = await self._take(store, foreign, "w1")
        assert await store.ask_to_cancel(foreign, tenant="globex", by="ops") is None
        assert (await store.renew(lease, ttl_s=LONG_TTL_S)).cancel_asked is None

    async def test_a_cancel_ask_outlives_a_holder_that_let_go(self, store: LeaseStore) -> None:
        # Its asker was told the run ends: a holder that let go (an error, a drain) or died
        # before it heard the ask must not take it with it, or the next holder carries on.
        run_id = new_run_id()
        lease = await self._take(store, run_id, "w1")
        await store.ask_to_cancel(run_id, tenant=TENANT, by="ops", why="runaway")
        await store.release(lease)
        after_release = await self._take(store, run_id, "w2")
        assert after_release.cancel_asked == CancelAsked("ops", "runaway")
        assert (await store.renew(after_release, ttl_s=LONG_TTL_S)).cancel_asked == CancelAsked(
            "ops", "runaway"
        )
        lapsed = new_run_id()
        await self._take(store, lapsed, "w1", ttl_s=SHORT_TTL_S)
        await store.ask_to_cancel(lapsed, tenant=TENANT, by="ops")
        await until_lapsed(store, lapsed)
        after_expiry = await self._take(store, lapsed, "w2")
        assert after_expiry.cancel_asked == CancelAsked("ops")
        again = await store.ask_to_cancel(lapsed, tenant=TENANT, by="audit", why="later")
        assert again is not None
        assert again.cancel_asked == CancelAsked("ops")

    async def test_a_cancel_ask_its_holder_heard_goes_with_its_release(
        self, store: LeaseStore
    ) -> None:
        # A holder releasing the lease it heard the ask with answered it (it ended the run): a
        # run that lives on under the same id (a LangGraph thread) is not cancelled again.
        run_id = new_run_id()
        lease = await self._take(store, run_id, "w1")
        await store.ask_to_cancel(run_id, tenant=TENANT, by="ops")
        await store.release(await store.renew(lease, ttl_s=LONG_TTL_S))
        assert (await self._take(store, run_id, "w2")).cancel_asked is None

    async def test_a_leaseholder_letting_go_on_an_error_leaves_the_ask_it_heard(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()

        async def fails_after_hearing_it() -> None:
            async with Leaseholder(store, run_id, tenant=TENANT, holder="w1") as held:
                await store.ask_to_cancel(run_id, tenant=TENANT, by="ops", why="runaway")
                await held.confirm()
                assert held.cancel_asked is not None
                raise RuntimeError("the model call failed before the run's next boundary")

        with pytest.raises(RuntimeError):
            await fails_after_hearing_it()
        async with Leaseholder(store, run_id, tenant=TENANT, holder="w2") as held:
            assert held.cancel_asked == CancelAsked("ops", "runaway")

    async def test_a_cancel_ask_goes_with_a_forgotten_run(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        lease = await self._take(store, run_id, "w1")
        await store.ask_to_cancel(run_id, tenant=TENANT, by="ops")
        await store.forget(lease)
        assert (await self._take(store, run_id, "w2")).cancel_asked is None

    async def test_leaseholder_learns_a_cancel_ask_at_its_renewal(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        async with Leaseholder(store, run_id, tenant=TENANT, holder="w1") as held:
            assert held.lease.cancel_asked is None
            await store.ask_to_cancel(run_id, tenant=TENANT, by="ops", why="runaway")
            assert held.lease.cancel_asked is None  # nothing asked the store yet
            await held.confirm()
            assert held.cancel_asked == CancelAsked("ops", "runaway")
        assert await store.current(run_id) is None

    # -- the store's clock, not the caller's -------------------------------------------------

    async def test_a_caller_clock_an_hour_fast_cannot_take_an_unexpired_lease(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        lease = await self._take(store, run_id, "w1")
        with caller_clock_off_by(SKEW_S), pytest.raises(ResumeConflictError):
            await self._take(store, run_id, "w2")
        await self._assert_held_by(store, run_id, lease)

    async def test_a_caller_clock_an_hour_slow_cannot_keep_an_expired_lease(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        lease = await self._lapsed(store, run_id)
        with caller_clock_off_by(-SKEW_S):
            with pytest.raises(FencedError):
                await store.renew(lease, ttl_s=LONG_TTL_S)
            with pytest.raises(FencedError):
                await store.raise_fence(lease, above=lease.fence)
            assert await store.current(run_id) is None

    async def test_a_caller_clock_an_hour_slow_gets_a_lease_of_the_asked_ttl(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        with caller_clock_off_by(-SKEW_S):
            await self._take(store, run_id, "w1", ttl_s=SHORT_TTL_S)
        await until_lapsed(store, run_id)
        taken = await self._take(store, run_id, "w2")
        assert taken.holder == "w2"

    # -- concurrency -------------------------------------------------------------------------

    async def test_concurrent_acquisitions_have_exactly_one_winner(self, store: LeaseStore) -> None:
        await assert_exactly_one_acquires([store], contenders=20)

    async def test_runs_are_independent(self, store: LeaseStore) -> None:
        a, b = new_run_id(), new_run_id()
        lease_a = await self._take(store, a, "w1")
        lease_b = await self._take(store, b, "w2")
        assert lease_b.holder == "w2"
        await store.release(lease_a)
        await self._assert_held_by(store, b, lease_b)
        again_a = await self._take(store, a, "w3")
        assert again_a.fence > lease_a.fence
        assert (await store.renew(lease_b, ttl_s=LONG_TTL_S)).fence == lease_b.fence

    # -- Leaseholder over this store ---------------------------------------------------------

    async def test_leaseholder_renews_in_the_background(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        async with Leaseholder(
            store, run_id, tenant=TENANT, holder="w1", policy=policy(1.0)
        ) as held:
            first = held.lease
            # Renewed after the first ttl ran out by the store's clock: still held.
            await until(
                lambda: held.lease.expires_at > first.expires_at + 1.0,
                within_s=1.0 + LAPSE_WITHIN_S,
                what="a renewal past the first ttl",
            )
            with pytest.raises(ResumeConflictError) as refused:
                await self._take(store, run_id, "w2")
            assert refused.value.holder == "w1"
            assert held.lease.fence == first.fence
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
        await cancelled_inside(Leaseholder(store, run_id, tenant=TENANT, holder="w1"))
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
            policy=policy(SHORT_TTL_S),
        ) as held:
            await until_lapsed(store, run_id)
            taker = await self._take(store, run_id, "w2")
            gate.set()
            await asyncio.wait_for(held.fenced.wait(), 10)
            with pytest.raises(FencedError):
                await held.check()
            assert held.lease.superseded_by(taker)
        await self._assert_held_by(store, run_id, taker)

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
            taker = await self._take(store, run_id, "w2")
            with pytest.raises(FencedError):
                await held.confirm()
            assert held.fenced.is_set()
        await self._assert_held_by(store, run_id, taker)

    async def test_leaseholder_raise_fence_holds_the_raised_lease(self, store: LeaseStore) -> None:
        run_id = new_run_id()
        async with Leaseholder(store, run_id, tenant=TENANT, holder="w1") as held:
            first = held.lease
            raised = await held.raise_fence(first.fence + LOG_AHEAD_BY)
            assert raised.fence > first.fence + LOG_AHEAD_BY
            assert held.lease == raised
            assert await held.raise_fence(first.fence) == raised
            assert (await held.confirm()).fence == raised.fence
            await self._assert_held_by(store, run_id, raised)
            with pytest.raises(FencedError):
                await store.renew(first, ttl_s=LONG_TTL_S)
        assert await store.current(run_id) is None
        assert (await self._take(store, run_id, "w2")).fence > raised.fence

    async def test_leaseholder_raise_fence_once_superseded_is_fenced(
        self, store: LeaseStore
    ) -> None:
        run_id = new_run_id()
        async with Leaseholder(store, run_id, tenant=TENANT, holder="w1") as held:
            await store.release(held.lease)
            taker = await self._take(store, run_id, "w2")
            with pytest.raises(FencedError):
                await held.raise_fence(taker.fence + LOG_AHEAD_BY)
            assert held.fenced.is_set()
        await self._assert_held_by(store, run_id, taker)

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
        lease, taker = await self._handed_over(store, run_id)
        with pytest.raises(FencedError):
            async with Leaseholder(store, run_id, tenant=TENANT, holder="w1", lease=lease):
                pytest.fail("adopted a superseded lease")
        await self._assert_held_by(store, run_id, taker)
