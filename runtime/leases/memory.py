"""`MemoryLeaseStore`: leases in this process, for tests and single-process embedding.

The store's clock is the operating system's monotonic clock, so a wall clock set back or forward
(by NTP, by hand, or by a test patching ``time.time``) neither lengthens nor shortens a lease.
``expires_at`` is that monotonic deadline shifted by an offset taken once when the store is
made, so it reads as seconds since the epoch and compares with other leases of the same store.

Every method decides without awaiting, so on one event loop each call is atomic; the fence
counter of a run outlives releases and expiries and only goes up.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from onward._storage import Resource

from .base import CancelAsked, RunLease, check_ask, check_ttl, conflict_error, fenced_error


@dataclass(slots=True)
class _Held:
    """A granted lease: who, under which fence, until which monotonic instant."""

    tenant: str
    holder: str
    fence: int
    deadline: float


class MemoryLeaseStore(Resource):
    """A `LeaseStore` held in a dict: nothing survives the process."""

    def __init__(self) -> None:
        self._epoch_offset = time.time() - time.monotonic()
        self._held: dict[str, _Held] = {}
        self._fences: dict[str, int] = {}
        self._asks: dict[str, CancelAsked] = {}

    def _lease(self, run_id: str, held: _Held) -> RunLease:
        return RunLease(
            run_id=run_id,
            tenant=held.tenant,
            holder=held.holder,
            fence=held.fence,
            expires_at=held.deadline + self._epoch_offset,
            cancel_asked=self._asks.get(run_id),
        )

    def _live(self, run_id: str) -> _Held | None:
        held = self._held.get(run_id)
        if held is None or held.deadline <= time.monotonic():
            return None
        return held

    def _holding(self, lease: RunLease) -> _Held:
        """The live holding ``lease`` stands for.

        Raises:
            FencedError: The lease expired, was released or was superseded.
        """
        held = self._live(lease.run_id)
        if held is None or (held.holder, held.fence) != (lease.holder, lease.fence):
            raise fenced_error(lease, "expired, was released or was superseded")
        return held

    async def acquire(self, run_id: str, *, tenant: str, holder: str, ttl_s: float) -> RunLease:
        """Take a run's lease, raising its fence.

        Raises:
            ResumeConflictError: Another holder, or this same one, has an unexpired lease.
        """
        check_ttl(ttl_s)
        current = self._live(run_id)
        if current is not None:
            raise conflict_error(
                run_id,
                current.holder,
                holder_tenant=current.tenant,
                tenant=tenant,
                expires_at=current.deadline + self._epoch_offset,
            )
        fence = self._fences.get(run_id, 0) + 1
        self._fences[run_id] = fence
        held = _Held(tenant, holder, fence, time.monotonic() + ttl_s)
        self._held[run_id] = held
        return self._lease(run_id, held)

    async def renew(self, lease: RunLease, *, ttl_s: float) -> RunLease:
        """Extend a lease, keeping its fence.

        Raises:
            FencedError: The lease expired, was released or was superseded.
        """
        check_ttl(ttl_s)
        held = self._holding(lease)
        held.deadline = time.monotonic() + ttl_s
        return self._lease(lease.run_id, held)

    async def raise_fence(self, lease: RunLease, *, above: int) -> RunLease:
        """Lift a held lease's fence above ``above``, keeping its expiry.

        Raises:
            FencedError: The lease expired, was released or was superseded.
        """
        if lease.fence > above:
            return lease
        held = self._holding(lease)
        held.fence = max(self._fences.get(lease.run_id, 0), above) + 1
        self._fences[lease.run_id] = held.fence
        return self._lease(lease.run_id, held)

    async def release(self, lease: RunLease) -> None:
        """Hand a lease back; releasing one already released or lapsed (not taken) is a no-op.

        Raises:
            FencedError: A later acquisition superseded the lease.
        """
        held = self._held.get(lease.run_id)
        if held is not None and (held.holder, held.fence) == (lease.holder, lease.fence):
            del self._held[lease.run_id]
            if lease.cancel_asked is not None:
                self._asks.pop(lease.run_id, None)
            return
        if held is None and self._fences.get(lease.run_id) == lease.fence:
            return
        raise fenced_error(lease, "was superseded, so releasing it is not this holder's to do")

    async def forget(self, lease: RunLease) -> None:
        """Hand back a lease on a run that does not exist, dropping its fence if it is the first.

        Raises:
            FencedError: A later acquisition superseded the lease.
        """
        await self.release(lease)
        if lease.fence == 1 and self._fences.get(lease.run_id) == 1:
            del self._fences[lease.run_id]
            self._asks.pop(lease.run_id, None)

    async def current(self, run_id: str) -> RunLease | None:
        """The unexpired lease on a run, if any."""
        held = self._live(run_id)
        return None if held is None else self._lease(run_id, held)

    async def current_many(self, run_ids: Sequence[str]) -> dict[str, RunLease]:
        """The unexpired leases on some runs, by run id."""
        return {
            run_id: self._lease(run_id, held)
            for run_id in run_ids
            if (held := self._live(run_id)) is not None
        }

    async def ask_to_cancel(
        self, run_id: str, *, tenant: str, by: str, why: str = ""
    ) -> RunLease | None:
        """Ask the unexpired holding of ``tenant``'s run to end it cancelled (the first ask is
        kept); the holding asked, or ``None`` when there is none."""
        check_ask(run_id, by, why)
        held = self._live(run_id)
        if held is None or held.tenant != tenant:
            return None
        self._asks.setdefault(run_id, CancelAsked(by, why))
        return self._lease(run_id, held)

    async def close(self) -> None:
        """Nothing to close; the leases stay for as long as the store object lives."""
