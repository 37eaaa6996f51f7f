"""Leases: one worker per run, with a fence that every acquisition raises.

The store owns the clock: expiry is decided by the store's time (Redis ``TIME`` inside the Lua
scripts, PostgreSQL ``now()``, the operating system's clock in SQLite and memory), never by a
time the caller passes, so a worker whose clock is an hour off can neither take a lease that has
not lapsed nor keep one that has. Every acquisition raises the run's fence, after a release or an
expiry too, and the fence never goes back; renewal keeps it. A superseded holder is refused on
the number, not on the time: its renew and release raise `FencedError`, and whatever it writes
to the log under the old fence is refused by every reader.

The fence never strands a run: a store that hands out a fence the run's log already has (it
was wiped, or configured after the run was written) is told to go above the log's with
`LeaseStore.raise_fence`, atomically and only while the caller still holds the lease.

The ttl check and the two refusals are defined here and shared by every backend, so a caller
sees the same messages whichever store it runs on.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

from onward._storage import AsyncResource
from onward.errors import (
    ConfigurationError,
    FencedError,
    InvalidInputError,
    ResumeConflictError,
)
from onward.runtime.limits import check_name, check_note


@dataclass(frozen=True, slots=True)
class CancelAsked:
    """Someone asked a run's holder to end the run ``cancelled`` (`LeaseStore.ask_to_cancel`).

    Attributes:
        by: Who asked, as the run's `RunFinished` will record it.
        why: Why, recorded with who (may be empty).
    """

    by: str
    why: str = ""

    @property
    def error(self) -> str:
        """The error the run ends with, cancelled: who cancelled it and why."""
        return f"cancelled by {self.by}" + (f": {self.why}" if self.why else "")


@dataclass(frozen=True, slots=True)
class RunLease:
    """A worker's hold on a run.

    Attributes:
        run_id: The run.
        tenant: The run's tenant.
        holder: The worker holding it.
        fence: Raised on every acquisition; the number every write of this holder carries.
        expires_at: When the lease lapses, in the store's clock (seconds since the epoch).
        cancel_asked: Someone asked a holder of the run to end it cancelled (the first ask);
            the holder learns it from its acquisition, a renewal or a fence raise.
    """

    run_id: str
    tenant: str
    holder: str
    fence: int
    expires_at: float
    cancel_asked: CancelAsked | None = None

    def superseded_by(self, other: RunLease) -> bool:
        """Whether ``other`` is a later acquisition of the same run."""
        return other.run_id == self.run_id and other.fence > self.fence


DEFAULT_LEASE_TTL_S = 60.0
"""How long a run's lease lasts unless renewed, by default (``ONWARD_LEASE_TTL``, ``--lease-ttl``).

The ttl is how long a run stays held after its holder is gone without a word: a run held by a
process of this host that has ended is taken at once (its presence lock is free,
`onward.runtime.leases.presence`), but one whose host was lost, or whose worker is paused,
blocks resume until its lease lapses. A paused worker learns it lost the lease at its next write
(its own clock, `Leaseholder.check`), so a short ttl costs it nothing in safety. A minute keeps a
lost host's runs waiting at most that long, renews every 20 s (two thirds of the ttl are the
renewal margin), and still lets a tool declare up to 20 s of ``max_call_s``.
"""

MAX_LEASE_TTL_S = 86_400.0
"""The longest lease ttl ``ONWARD_LEASE_TTL`` and ``--lease-ttl`` take: a day, already a long
time for a run to stay locked after its holder is gone."""


@dataclass(frozen=True, slots=True)
class LeasePolicy:
    """How long a lease lasts and when its holder renews it.

    Attributes:
        ttl: How long an acquisition or renewal holds the run (`DEFAULT_LEASE_TTL_S`; a
            command or `Backends.runner` takes ``ONWARD_LEASE_TTL`` through `Settings`).
        renew_within: Renew when less than this is left.
    """

    ttl: timedelta = timedelta(seconds=DEFAULT_LEASE_TTL_S)
    renew_within: timedelta | None = None

    def __post_init__(self) -> None:
        if self.ttl <= timedelta(0):
            raise ConfigurationError(f"lease ttl must be positive, got {self.ttl}")
        if self.renew_within is not None and not timedelta(0) < self.renew_within < self.ttl:
            raise ConfigurationError(
                f"renew_within must be between 0 and the ttl ({self.ttl}), got {self.renew_within}"
            )

    @property
    def renew_margin(self) -> timedelta:
        """Renew when this much of the lease is left (two thirds of the ttl by default)."""
        return self.renew_within if self.renew_within is not None else self.ttl * 2 / 3

    @property
    def ttl_s(self) -> float:
        return self.ttl.total_seconds()


def check_ttl(ttl_s: float) -> None:
    """Refuse a ttl that could not hold a run, before any store is asked (every backend uses it).

    Raises:
        InvalidInputError: ``ttl_s`` is not a positive, finite number of seconds.
    """
    if not (ttl_s > 0 and math.isfinite(ttl_s)):
        raise InvalidInputError(f"a lease ttl must be positive, finite seconds, got {ttl_s!r}")


def check_ask(run_id: str, by: object, why: object) -> None:
    """Refuse a cancel ask whose asker or reason a store could not keep, before any store is
    asked, as `AgentRunner.ask_to_cancel` does: a store would otherwise keep ``None`` as
    given, turn it into an empty reason, or record an ask of nobody (every backend uses it).

    Raises:
        InvalidInputError: ``by`` is not a name, or ``why`` is neither empty nor a note.
    """
    check_name("by", by, run_id=run_id)
    if why != "":  # any other value, None too, is refused
        check_note("why", why, run_id=run_id)


def conflict_error(
    run_id: str,
    holder: str | None,
    *,
    holder_tenant: str | None,
    tenant: str,
    expires_at: float | None = None,
) -> ResumeConflictError:
    """The refusal every backend raises when an unexpired lease is in the way.

    The holder (a worker's host and process, or ``person:<who>``, often an email address) and
    when its lease lapses unless renewed are told only to the tenant whose lease it is: to
    anyone else the refusal says neither who holds the run nor that it is held for sure, only
    that it is not theirs to take now. ``holder`` is ``None`` only when the holder let go
    between the refusal and the look.
    """
    if holder_tenant != tenant:
        return ResumeConflictError(
            f"run {run_id!r} cannot be taken by tenant {tenant!r} now: it is held, or it is not "
            "this tenant's",
            run_id=run_id,
        )
    until = "" if expires_at is None else f" until {lapse_text(expires_at)}"
    return ResumeConflictError(
        f"run {run_id!r} is held by {holder!r}{until}; wait for it to finish or for its lease "
        "to lapse",
        run_id=run_id,
        holder=holder,
        expires_at=expires_at,
    )


def lapse_text(expires_at: float) -> str:
    """When a lease lapses, as an operator reads it: the UTC time and how far off it is."""
    moment = datetime.fromtimestamp(expires_at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    left = expires_at - time.time()
    if left <= 0:
        return f"{moment} (now)"
    if left < 90:
        return f"{moment} (in {math.ceil(left)} s, unless its holder renews it)"
    return f"{moment} (in {math.ceil(left / 60)} min, unless its holder renews it)"


def unheard(lease: RunLease) -> RunLease:
    """``lease`` as released by a holder that did not answer its cancel ask (it let go on an
    error, or releases on another's behalf): the store keeps the ask for the next holder."""
    return replace(lease, cancel_asked=None)


def fenced_error(lease: RunLease, why: str) -> FencedError:
    """The refusal every backend raises to a holder whose lease is gone."""
    return FencedError(
        f"run {lease.run_id!r}: the lease of {lease.holder!r} under fence {lease.fence} {why}; "
        "stop writing to the run",
        run_id=lease.run_id,
        fence=lease.fence,
        holder=lease.holder,
    )


@runtime_checkable
class LeaseStore(AsyncResource, Protocol):
    """Who holds which run, decided by the store's clock."""

    async def acquire(self, run_id: str, *, tenant: str, holder: str, ttl_s: float) -> RunLease:
        """Take a run's lease, raising its fence.

        Raises:
            ResumeConflictError: Another holder has an unexpired lease (``holder`` names it).
        """
        ...

    async def renew(self, lease: RunLease, *, ttl_s: float) -> RunLease:
        """Extend a lease, keeping its fence.

        Raises:
            FencedError: The lease expired or was superseded; the caller must stop writing.
        """
        ...

    async def raise_fence(self, lease: RunLease, *, above: int) -> RunLease:
        """Lift a held lease's fence above ``above``, the highest fence already in the run's log.

        A store can hand out a fence at or below one the log already holds: the store was
        wiped, Redis restarted without persistence, or the run was written before a lease store
        was configured. Readers would then refuse the holder's writes, and the run could never
        go on. Instead the holder raises the store's fence past the log's and carries on.

        If ``lease.fence > above`` the lease is returned as it is, without asking the store.
        Otherwise, in one atomic step and only while ``lease`` is still the live holding (same
        holder, same fence, unexpired by the store's clock), the run's fence becomes
        ``max(the store's fence counter, above) + 1`` and the counter is raised with it, so
        every later acquisition goes higher still. The holder, tenant and expiry are kept (the
        expiry is not renewed: the holder's renewal schedule stays what it was).

        The old fence is superseded: renewing or releasing ``lease`` afterwards raises
        `FencedError`, so two raises of one lease at once leave exactly one winner.

        Raises:
            FencedError: The lease expired, was released or was superseded.
        """
        ...

    async def release(self, lease: RunLease) -> None:
        """Hand a lease back so the next worker need not wait out the ttl.

        A cancel ask of the run (`ask_to_cancel`) is dropped only when ``lease`` carries it:
        its holder heard it, and lets go having ended the run. One it carries not (asked after
        its last renewal, or a holder letting go on an error, `unheard`) is kept for whoever
        takes the run next.

        Raises:
            FencedError: The lease was superseded (releasing is then not this caller's to do).
        """
        ...

    async def forget(self, lease: RunLease) -> None:
        """Hand back a lease taken for a run that turned out not to exist, and with it every
        trace of the run in the store when the lease holds the run's first fence (1).

        A resume of an id nobody ever wrote takes the lease before it can tell (the run's
        events are read under the lease); releasing would keep that id's fence for good, one
        row or key per id ever asked for. A first fence was never written to the log, so
        dropping it loses nothing: the next acquisition gets fence 1 again. A lease with a
        higher fence is released as `release` does, its counter kept.

        Raises:
            FencedError: A later acquisition superseded the lease.
        """
        ...

    async def current(self, run_id: str) -> RunLease | None:
        """The unexpired lease on a run, if any."""
        ...

    async def current_many(self, run_ids: Sequence[str]) -> dict[str, RunLease]:
        """The unexpired leases on some runs, by run id, read together: a run free, lapsed or
        never leased has no entry, exactly as `current` says ``None`` of it.

        A listing of many runs (`ExecutionManager.list_pending`, a recovery pass) asks once
        per page rather than once per run, through `current_leases`, which also serves a
        store written before this method (without it). This default asks `current` of each
        run at once, for a store that subclasses the protocol and has no read of many.
        """
        return await _each_current(self, run_ids)

    async def ask_to_cancel(
        self, run_id: str, *, tenant: str, by: str, why: str = ""
    ) -> RunLease | None:
        """Ask whoever holds the run now to end it ``cancelled`` at its next boundary.

        The ask is kept with the unexpired holding of ``tenant``'s run and handed to its holder
        with the holding's next renewal or fence raise (`RunLease.cancel_asked`); a second ask
        keeps the first. It outlives the holding: a holder that lets go (an error, a drain) or
        lapses (a crash) before it answered the ask leaves it to whoever takes the run next,
        who hears it at its acquisition, since the asker was told the run ends. A release of a
        lease that carries it (`release`) and `forget` drop it. The fence and expiry are
        untouched.

        Returns the holding asked, or ``None`` when the run has no unexpired lease of
        ``tenant`` (free, lapsed, or not this tenant's): then nobody is driving it, and the
        cancel can take the lease itself.
        """
        ...


async def current_leases(store: LeaseStore, run_ids: Sequence[str]) -> dict[str, RunLease]:
    """The unexpired leases on ``run_ids``, by run id (`LeaseStore.current_many`); a store
    of one's own written before that method, and not subclassing the protocol, is asked run
    by run with `current`, as before, rather than failing the listing."""
    many = getattr(store, "current_many", None)
    if many is None:
        return await _each_current(store, run_ids)
    found: dict[str, RunLease] = await many(run_ids)
    return found


async def _each_current(store: LeaseStore, run_ids: Sequence[str]) -> dict[str, RunLease]:
    found = await asyncio.gather(*(store.current(run_id) for run_id in run_ids))
    return {lease.run_id: lease for lease in found if lease is not None}
