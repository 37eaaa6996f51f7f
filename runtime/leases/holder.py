"""`Leaseholder`: hold a run's lease for the length of an ``async with`` block.

::

    async with Leaseholder(store, run_id, tenant="acme", holder=worker) as held:
        ...                      # write under held.lease.fence
        await held.check()       # raises FencedError once the lease is known to be lost
        await held.confirm()     # asks the store, right now, before an irreversible step
        await held.raise_fence(log_fence)  # when the store's fence is not above the log's
        held.cancel_asked        # someone asked, as the last renewal heard: end the run cancelled
        async with held.cancelled_by_ask():   # a wait the ask cuts short (a long model call)
            ...

The lease is taken on entry (or, given ``lease=``, an already taken one is adopted) and renewed
in a background task whenever less than the policy's renew margin is left. The wait is measured
from when the last grant was *requested*, with the event loop's monotonic clock and the ttl the
store was asked for: the store granted at that instant or later, so the lease lasts at least
that long, and no clock of the caller is compared with the store's. Once a renewal is refused
with `FencedError` the task stops and ``fenced`` is set; the holder must stop writing (whatever
it still writes under the old fence is refused by readers anyway). If the store cannot be
reached, renewal is retried until the lease must have lapsed, and then ``fenced`` is set too.

The lease is released on the way out of the block, whether it ends normally, with an exception
or by cancellation, so the next worker need not wait out the ttl. A release the store fails
(`BackendError`: the server is down, the SQLite disk is full) is tried again in the background
every `RELEASE_RETRY_S` until it succeeds or the lease must have lapsed anyway (one ttl), so a
worker that cannot write lets go of its run as soon as the store takes writes again. That needs
the process, and the event loop, to live on: a process that exits at once (a command-line
`onward run --resume`) leaves the lease to lapse after its ttl (five minutes by default).

A store that fails to answer (a timeout, a dropped connection) may have acted all the same: an
acquisition that failed so hands back the lease the store shows under this process's name, and
a fence raise that failed so keeps the fence the store shows raised, so neither leaves the run
held by nobody for a ttl.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Self

from onward.errors import BackendError, FencedError, InvalidInputError, OnwardError

from .base import CancelAsked, LeasePolicy, LeaseStore, RunLease, unheard
from .presence import acquire_run, is_this_process

logger = logging.getLogger(__name__)

BACKEND_RETRY_S = 1.0
"""Longest wait between renewal attempts while the store is failing (shorter near the end)."""

RELEASE_RETRY_S = 0.5
"""Wait between attempts to hand back a lease whose release failed with a store error."""

_RELEASING: set[asyncio.Task[None]] = set()
"""Background releases in flight, kept referenced until they end."""

_HOLDING: set[tuple[int, str, str]] = set()
"""The runs a `Leaseholder` of this process holds, as (store, run, holder): a failed acquisition
of one of them must not hand back the lease another block holds."""


class Leaseholder:
    """Takes, keeps and hands back one run's lease around a block of work.

    Args:
        store: Where leases are kept.
        run_id: The run to hold.
        tenant: The run's tenant.
        holder: This worker's name, as other workers will see it in `ResumeConflictError`.
        policy: The ttl asked for and when to renew.
        lease: A lease of this run and holder already taken (by a `Resumer`, say) to keep and
            release instead of acquiring one. It is renewed on entry, which both proves it is
            still held and starts the renewal clock from a known instant.

    Attributes:
        fenced: Set once the lease is known to be lost (a renewal raised `FencedError`, or the
            store stayed unreachable until the lease must have lapsed).
        releasing: The background task retrying a release the store failed, while it runs
            (``None`` when the release succeeded at once).
    """

    def __init__(
        self,
        store: LeaseStore,
        run_id: str,
        *,
        tenant: str,
        holder: str,
        policy: LeasePolicy | None = None,
        lease: RunLease | None = None,
    ) -> None:
        if lease is not None and (lease.run_id, lease.holder) != (run_id, holder):
            raise InvalidInputError(
                f"run {run_id!r}: the lease to adopt is of run {lease.run_id!r} and holder "
                f"{lease.holder!r}, not of holder {holder!r}",
                run_id=run_id,
            )
        self.store = store
        self.run_id = run_id
        self.tenant = tenant
        self.holder = holder
        self.policy = policy or LeasePolicy()
        self.fenced = asyncio.Event()
        self._lease = lease
        self._adopt = lease is not None
        self._held = False
        self._renewing = asyncio.Lock()
        self._renewal: asyncio.Task[None] | None = None
        self.releasing: asyncio.Task[None] | None = None
        self._no_run = False
        self._requested: float | None = None
        self._ttl_s = self.policy.ttl_s
        self._on_ask: set[Callable[[], None]] = set()
        self._keeps_ask = False

    @property
    def lease(self) -> RunLease:
        """The latest grant, with the fence every write must carry (kept after the block ends)."""
        if self._lease is None:
            raise InvalidInputError(
                f"run {self.run_id!r}: the lease was never taken; "
                "use `async with Leaseholder(...)`",
                run_id=self.run_id,
            )
        return self._lease

    @property
    def cancel_asked(self) -> CancelAsked | None:
        """Someone asked this holding to end the run cancelled (`LeaseStore.ask_to_cancel`),
        as the last renewal, `confirm` or fence raise heard it; ``None`` until one did."""
        lease = self._lease
        return None if lease is None else lease.cancel_asked

    def when_asked(self, heard: Callable[[], None]) -> None:
        """Call ``heard`` each time a renewal, `confirm` or fence raise hears a cancel ask
        (on the loop, from the call that heard it): for a holder idle between its writes,
        which would otherwise hear it only at its next one."""
        self._on_ask.add(heard)

    def keep_ask(self) -> None:
        """Leave a cancel ask this holding heard for the run's next holder: this one does not
        answer it (a person's write to a run it does not end). Released otherwise, the lease
        that carries the ask tells the store it was answered (`LeaseStore.release`)."""
        self._keeps_ask = True

    async def check(self) -> None:
        """Raise if the lease is known to be lost, so work stops before its next write.

        This asks nothing of the store; it reads what the renewals found, and this process's
        own clock: a lease whose last grant was requested more than a ttl ago may have lapsed
        (the store granted it at that instant or later, however late the answer was read), so
        a holder that was paused past its ttl (SIGSTOP, a long GC, a suspended VM), during a
        renewal's round trip too, stops at its next write even before its renewal task has run
        again. Use :meth:`confirm` where a stale answer would be costly.

        Raises:
            FencedError: ``fenced`` is set, or the lease may have lapsed by this process's clock.
        """
        requested = self._requested
        if requested is not None and asyncio.get_running_loop().time() > requested + self._ttl_s:
            self.fenced.set()
        if self.fenced.is_set():
            raise FencedError(
                f"run {self.run_id!r}: the lease of {self.holder!r} under fence "
                f"{self.lease.fence} is lost; stop writing to the run",
                run_id=self.run_id,
                fence=self.lease.fence,
                holder=self.holder,
            )

    async def confirm(self) -> RunLease:
        """Renew now and return the lease: the last word before an irreversible step.

        A holder that was paused (a long GC, a suspended VM) past its ttl learns it here from
        the store itself, rather than from a renewal task that has not yet run; one paused
        while this very renewal was answered learns it from the check that follows it.

        Raises:
            FencedError: The lease is lost (``fenced`` is set as well).
            BackendError: The store could not say; the step should not be taken either.
        """
        await self.check()
        await self._renew()
        await self.check()
        return self.lease

    async def raise_fence(self, above: int) -> RunLease:
        """Make the held lease's fence higher than ``above`` (the log's highest), lifting it
        only if it is not already; the one way a holder lifts its fence.

        A store that forgot the run (wiped, restarted without persistence, configured after
        the run was written) hands out a fence the log already has; this lifts it past the
        log's so the run can go on. Serialized with the renewals, so a renewal in flight
        finishes first and every later renewal, `check`, `confirm` and the release use the new
        fence. The expiry is kept, so the renewal schedule does not change. A fence already
        above costs nothing: the store is not asked.

        Raises:
            FencedError: The lease is lost (``fenced`` is set as well).
        """
        await self.check()
        if self.lease.fence > above:
            return self.lease
        await self._swap(lambda lease: self.store.raise_fence(lease, above=above), renews=False)
        return self.lease

    async def _renew(self) -> None:
        """One renewal, serialized with the others; a refusal sets ``fenced``."""
        ttl_s = self.policy.ttl_s
        await self._swap(lambda lease: self.store.renew(lease, ttl_s=ttl_s), renews=True)

    async def _swap(self, ask: Callable[[RunLease], Awaitable[RunLease]], *, renews: bool) -> None:
        """Replace the held lease by what the store answers about it, one request at a time.

        The lease is read under the lock, so a request never carries a fence that another one
        has just replaced. A refusal sets ``fenced``. ``renews``: the answer extends the lease
        by a ttl from when it was granted, no earlier than when it was requested, which is
        what `check` counts from (not the answer, which a paused process may read late). A
        fence raise is waited out even through a cancellation, which is raised after its answer
        is kept.
        """
        cancelled = False
        async with self._renewing:
            requested = asyncio.get_running_loop().time()
            asking = asyncio.ensure_future(ask(self.lease))
            try:
                if renews:
                    granted = await asking
                else:
                    # The store may raise the fence after its caller is cancelled; without its
                    # answer the renewals and the release would carry a fence it no longer has.
                    cancelled = await _to_the_end(asking)
                    granted = await self._raised(asking)
            except FencedError:
                self.fenced.set()
                raise
            if renews:  # a raised fence keeps the expiry, so it proves nothing new
                self._requested = requested
            self._lease = granted
        if granted.cancel_asked is not None:
            for heard in list(self._on_ask):
                heard()
        if cancelled:
            raise asyncio.CancelledError

    async def _raised(self, raising: asyncio.Future[RunLease]) -> RunLease:
        """A fence raise's answer; when the store failed to give it (a timeout), the raise it
        made all the same, if it made one.

        The store may have raised the fence and lost the answer: carrying the old fence would
        have every renewal refused and the release too, leaving the run held by nobody for a
        ttl. The store's lease is this raise when it is this holder's, with a higher fence and
        the expiry a raise keeps (the renewals wait for this one, so nothing else changed it).
        """
        try:
            return raising.result()
        except BackendError:
            lease = self.lease
            try:
                now = await self.store.current(lease.run_id)
            except OnwardError:
                now = None
            if (
                now is None
                or (now.holder, now.tenant, now.expires_at)
                != (lease.holder, lease.tenant, lease.expires_at)
                or now.fence <= lease.fence
            ):
                raise
            logger.info(
                "run %r: the store raised the fence to %d though its answer was lost",
                self.run_id,
                now.fence,
            )
            return now

    async def _hand_back_if_taken(self) -> None:
        """After an acquisition failed with a store error, hand back the lease it may have taken
        all the same (a script run or a commit made whose answer was lost): the caller holds
        nothing, so the run would stay held by nobody for a ttl.

        Only a lease under this process's own holder name (`default_holder`) is handed back,
        and not one another block of this process holds: under a custom name it may be another
        process's, given the same name by mistake, and it is left to lapse.
        """
        if not is_this_process(self.holder) or (
            (id(self.store), self.run_id, self.holder) in _HOLDING
        ):
            return
        try:
            taken = await self.store.current(self.run_id)
            if taken is None or (taken.holder, taken.tenant) != (self.holder, self.tenant):
                return
            await self.store.release(unheard(taken))
        except OnwardError as error:
            logger.warning(
                "run %r: the failed acquisition may have taken the lease, which was not handed "
                "back (%s); it lapses after its ttl",
                self.run_id,
                error,
            )
            return
        logger.info(
            "run %r: handed back the lease (fence %d) a failed acquisition took all the same",
            self.run_id,
            taken.fence,
        )

    def cancelled_by_ask(self) -> CancelledByAsk:
        """A block that a cancel ask cuts short: if a renewal (or `confirm`) hears one while
        the block runs, the task running it is cancelled and the block raises `CancelAskHeard`
        instead of `asyncio.CancelledError`. For waits worth abandoning when nobody wants the
        run any more, a model call above all: without it a run hears the ask only once the
        call returns, however long that takes."""
        return CancelledByAsk(self)

    async def __aenter__(self) -> Self:
        """Take (or adopt and renew) the lease and start renewing it.

        Raises:
            ResumeConflictError: Another worker (or this one, already) holds the run.
            FencedError: The adopted lease is already lost.
        """
        if self._held:
            raise InvalidInputError(
                f"run {self.run_id!r}: this Leaseholder is already held", run_id=self.run_id
            )
        loop = asyncio.get_running_loop()
        requested = loop.time()
        self.fenced.clear()
        self._keeps_ask = False
        if self._adopt:
            await self._renew()
        else:
            try:
                self._lease = await acquire_run(
                    self.store,
                    self.run_id,
                    tenant=self.tenant,
                    holder=self.holder,
                    ttl_s=self.policy.ttl_s,
                )
            except BackendError:
                await self._hand_back_if_taken()
                raise
            self._requested = requested
        self._held = True
        _HOLDING.add((id(self.store), self.run_id, self.holder))
        self._renewal = asyncio.create_task(
            self._keep(requested), name=f"onward-lease-renewal:{self.run_id}"
        )
        self._renewal.add_done_callback(self._renewal_ended)
        return self

    async def _keep(self, granted: float) -> None:
        """Renew the lease until told to stop or until it is lost.

        Args:
            granted: Loop time at which the request behind the current lease was sent.
        """
        loop = asyncio.get_running_loop()
        ttl_s = self.policy.ttl_s
        margin_s = self.policy.renew_margin.total_seconds()
        due = granted + ttl_s - margin_s
        while True:
            await asyncio.sleep(max(0.0, due - loop.time()))
            requested = loop.time()
            lapses = granted + ttl_s
            try:
                # A renewal still unanswered when the lease may lapse cannot save it: a silent
                # store would otherwise keep the holder unaware for a whole store timeout.
                async with asyncio.timeout_at(lapses):
                    await self._renew()
            except FencedError as exc:
                logger.warning("run %r: lease lost, renewal refused: %s", self.run_id, exc)
                return
            except (OnwardError, TimeoutError) as exc:
                if loop.time() >= lapses:
                    logger.warning(
                        "run %r: lease must have lapsed; the store stayed unreachable: %s",
                        self.run_id,
                        exc,
                    )
                    self.fenced.set()
                    return
                logger.warning("run %r: lease renewal failed, retrying: %s", self.run_id, exc)
                due = loop.time() + min(BACKEND_RETRY_S, (lapses - loop.time()) / 2)
                continue
            granted = requested
            due = granted + ttl_s - margin_s

    def _renewal_ended(self, task: asyncio.Task[None]) -> None:
        """A renewal task that died of a bug stops renewing: say so, and treat it as lost."""
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            logger.error(
                "run %r: lease renewal crashed; the lease will lapse",
                self.run_id,
                exc_info=error,
            )
            self.fenced.set()

    async def _stop_renewing(self) -> bool:
        """Cancel the renewal task and wait until it has stopped, so it cannot race the release.

        A cancellation of this task while it waits does not cut the wait short (the renewal
        task, cancelled, ends at its next await): it is returned, for the caller to raise once
        the lease is handed back, so a block cancelled on its way out still releases.

        Returns:
            Whether this task was cancelled while waiting.
        """
        task, self._renewal = self._renewal, None
        if task is None:
            return False
        task.cancel()
        cancelled = False
        while not task.done():
            try:
                await asyncio.wait([task])
            except asyncio.CancelledError:
                cancelled = True
        return cancelled

    def found_no_run(self) -> None:
        """The run turned out not to exist: on the way out the lease is forgotten
        (`LeaseStore.forget`), not released, so an id nobody wrote leaves no lease state."""
        self._no_run = True

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop renewing and release the lease (forget it, after `found_no_run`).

        A `FencedError` from the release is logged and swallowed: the lease was already lost,
        which ``fenced`` reports. A store error (`BackendError`) starts :attr:`releasing`, which
        retries the release in the background for up to one ttl. Any release failure is raised
        when the block ended normally, and logged in one line when the block is already raising,
        so it never masks that error. A cancellation that arrives while the renewals stop or
        while the store hands the lease back is raised once the lease is handed back.
        """
        cancelled = await self._stop_renewing()
        if not self._held:
            return
        self._held = False
        _HOLDING.discard((id(self.store), self.run_id, self.holder))
        self._adopt = False  # entering again takes a new lease; this one is being handed back
        # A holder letting go on an error or a cancellation (a drain) did not answer a cancel
        # ask it may have heard: the store keeps it for the run's next holder.
        answered = exc_type is None and not cancelled and not self._keeps_ask
        lease = self.lease if answered else unheard(self.lease)
        handing_back = asyncio.ensure_future(
            self.store.forget(lease) if self._no_run else self.store.release(lease)
        )
        try:
            # A cancellation during the release must not abandon it: the store may still be
            # handing back the run, and a release cut short leaves it held by nobody for a ttl.
            cancelled = await _to_the_end(handing_back) or cancelled
            handing_back.result()
        except FencedError as error:
            logger.warning("run %r: lease already lost at release: %s", self.run_id, error)
        except OnwardError as error:
            retrying = isinstance(error, BackendError)
            if retrying:
                self._release_later(lease)
            if exc is None and not cancelled:
                raise
            logger.warning(
                "run %r: releasing the lease failed (%s); %s",
                self.run_id,
                error,
                "retrying in the background" if retrying else "it lapses after its ttl",
            )
        if cancelled:
            raise asyncio.CancelledError

    def _release_later(self, lease: RunLease) -> None:
        """Start retrying the release of ``lease`` in the background (:attr:`releasing`)."""
        task = asyncio.create_task(
            self._retry_release(lease), name=f"onward-lease-release:{self.run_id}"
        )
        _RELEASING.add(task)
        task.add_done_callback(_RELEASING.discard)
        self.releasing = task

    async def _retry_release(self, lease: RunLease) -> None:
        """Release ``lease`` once the store takes writes again; give up once it must have lapsed.

        Stops at the first answer that is not a store error: released, superseded (another
        worker took the lapsed lease), or the store closed by its owner.
        """
        loop = asyncio.get_running_loop()
        lapsed = loop.time() + self.policy.ttl_s
        while loop.time() < lapsed:
            await asyncio.sleep(min(RELEASE_RETRY_S, max(0.0, lapsed - loop.time())))
            try:
                await self.store.release(lease)
            except BackendError:
                continue
            except OnwardError as error:
                logger.info("run %r: lease not released in the background: %s", self.run_id, error)
                return
            logger.info("run %r: lease released once the store took writes again", self.run_id)
            return
        logger.warning("run %r: the store never took the release; the lease lapsed", self.run_id)


async def _to_the_end(work: asyncio.Future[Any]) -> bool:
    """Wait until ``work`` is done, even through a cancellation of this task (the store's own
    timeout bounds the wait); whether this task was cancelled meanwhile."""
    cancelled = False
    while not work.done():
        try:
            await asyncio.wait([work])
        except asyncio.CancelledError:
            cancelled = True
    return cancelled


class CancelAskHeard(Exception):  # noqa: N818 - a control signal, not a failure
    """A cancel ask cut a `Leaseholder.cancelled_by_ask` block short.

    Attributes:
        asked: The ask heard.
    """

    def __init__(self, asked: CancelAsked) -> None:
        super().__init__(asked.error)
        self.asked = asked


class CancelledByAsk:
    """`Leaseholder.cancelled_by_ask`: cancels the task in the block when an ask is heard, the
    way `asyncio.timeout` cancels it when time is up (`Task.uncancel` tells the two apart)."""

    def __init__(self, held: Leaseholder) -> None:
        self._held = held
        self._task: asyncio.Task[object] | None = None
        self._fired = False

    async def __aenter__(self) -> Self:
        asked = self._held.cancel_asked
        if asked is not None:
            raise CancelAskHeard(asked)
        self._task = asyncio.current_task()
        self._held._on_ask.add(self._heard)
        return self

    def _heard(self) -> None:
        if not self._fired and self._task is not None:
            self._fired = True
            self._task.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._held._on_ask.discard(self._heard)
        if not self._fired or self._task is None:
            return
        if self._task.uncancel() == 0 and exc_type is asyncio.CancelledError:
            asked = self._held.cancel_asked
            if asked is not None:
                raise CancelAskHeard(asked) from exc
