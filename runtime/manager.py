"""`ExecutionManager`: what is running, what waits on people, what was left behind.

Everything here is read from the frontier store and the lease store; nothing is written, and no
lease is taken. A run the frontier store calls ``running`` is *interrupted* when nobody holds its
lease (its worker died, or the run was started without leases and its process is gone), and
*stalled* when its lease has expired (the store's clock decided) and nobody has taken it since.
It *needs a person* when a worker tried to carry it on and found a call that may or may not have
run (`IndeterminateToolCallError`): the worker tagged it ``needs-person`` and left it; once the
call is settled (`onward resolve`) it is merely interrupted, and a fleet carries it on.

Built without stores (``ExecutionManager()``), it reads those the deployment's `Settings` name
(`open_backends`, read-only), opened at its first question and closed by `close` (or at the end
of an ``async with`` block).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, Self

from onward.errors import ConfigurationError, NothingToResumeError
from onward.projections.base import FrontierStore, RunSummary, runs_in_pages
from onward.projections.frontier import Frontier

from .leases.base import LeaseStore, RunLease, current_leases
from .limits import NEEDS_PERSON
from .settings import Settings, load_settings

_LISTED_AT_ONCE = 1024
"""How many runs `ExecutionManager.list_pending` reads from the frontier store at once."""

Attention = Literal["waiting_on_approval", "needs_person", "interrupted", "held"]


def needs_person(frontier: Frontier) -> bool:
    """Whether a worker left the run for a person: tagged ``needs-person`` after the dispatch
    of a call still open.

    The tag stays on the run for good, so it speaks only of the calls open when it was
    written: a call dispatched after it (a later turn's, or one made again) or stopped at a
    question (`ask`: it runs again) is no call a worker found undecided, and its run is
    carried on as any interrupted run is.
    """
    if frontier.status != "running":
        return False
    left = max((t.tagged_seq for t in frontier.tags if t.label.startswith(NEEDS_PERSON)), default=0)
    return any(
        c.dispatched_seq is not None
        and c.dispatched_seq < left
        and c.outcome is None
        and c.asked_seq is None
        for c in frontier.calls
    )


@dataclass(frozen=True, slots=True)
class RunOverview:
    """A run's state as the stores see it.

    Attributes:
        summary: The frontier row's scalar columns.
        lease: The unexpired lease, if a worker holds the run.
        attention: ``waiting_on_approval`` (a person must answer), ``needs_person`` (running,
            nobody holds it, and a worker found a call it must not guess about: settle it with
            `onward resolve`), ``interrupted`` (running, but nobody holds it: resume it), or
            ``held`` (a worker is on it).
    """

    summary: RunSummary
    lease: RunLease | None
    attention: Attention | None


class ExecutionManager:
    """Status and pending work across runs.

    Args:
        frontiers: The frontier store the projector (or embedded checkpointer) keeps, opened by
            the caller. ``None``: the stores ``settings`` name, frontier and lease store both,
            opened at the first question.
        leases: The lease store the workers share.
        tenant: Only this tenant's runs (an application's manager, `App.manager`): another
            tenant's run is no such run, and ``list_pending`` lists this tenant's unless told
            another. ``None`` (an operator's manager): every tenant's.
        settings: Where the stores are when ``frontiers`` is not given; read from the
            environment (`load_settings`) when not given either.

    Raises:
        ConfigurationError: Without ``frontiers``: settings that are unusable, or name the
            memory backend (no other process's runs are there to see).
    """

    def __init__(
        self,
        frontiers: FrontierStore | None = None,
        leases: LeaseStore | None = None,
        *,
        tenant: str | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.frontiers = frontiers
        self.leases = leases
        self.tenant = tenant
        self.settings: Settings | None = None
        if frontiers is None:
            self.settings = settings or load_settings()
            if self.settings.backend == "memory":
                raise ConfigurationError(
                    "ExecutionManager() reads the stores the settings name, and "
                    "ONWARD_BACKEND=memory keeps none a manager could read; pass the "
                    "application's stores (ExecutionManager(frontiers, leases))"
                )
        self._opened: AsyncExitStack | None = None
        self._opening = asyncio.Lock()

    async def _store(self) -> FrontierStore:
        """The frontier store, the settings' opened (with their lease store) on first use."""
        if self.frontiers is not None:
            return self.frontiers
        async with self._opening:
            if self.frontiers is None:
                from .backends import open_backends  # noqa: PLC0415 - backends builds runners

                assert self.settings is not None  # set when no store was given
                stack = AsyncExitStack()
                try:
                    backends = await stack.enter_async_context(
                        open_backends(self.settings, readonly=True)
                    )
                except BaseException:
                    await stack.aclose()
                    raise
                self._opened = stack
                self.frontiers, self.leases = backends.frontiers, backends.leases
            return self.frontiers

    async def close(self) -> None:
        """Close the stores this manager opened from its settings; those given are the
        caller's. It opens them again if asked another question."""
        opened, self._opened = self._opened, None
        if opened is not None:
            self.frontiers = self.leases = None
            await opened.aclose()

    async def __aenter__(self) -> Self:
        await self._store()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def get_status(self, run_id: str) -> RunOverview:
        """One run's status.

        Raises:
            NothingToResumeError: The frontier store has no row for that run.
        """
        row = await (await self._store()).get(run_id)
        if row is None or self.tenant not in (None, row.summary.tenant):
            raise NothingToResumeError(
                f"no frontier row for run {run_id!r}"
                + (f" of tenant {self.tenant!r}" if self.tenant is not None else "")
                + "; the run does not exist or the projector has not reached it yet",
                run_id=run_id,
            )
        lease = await self.leases.current(run_id) if self.leases is not None else None
        return await self._status(row.summary, lease)

    async def list_pending(
        self, *, tenant: str | None = None, user: str | None = None
    ) -> list[RunOverview]:
        """Runs that need someone: waiting on an approval (or, collaborative, on an answer at a
        checkpoint), left by a worker for a person to settle a call, or running with nobody
        holding them. ``tenant``: that tenant's runs (the manager's own when not given; every
        tenant's for a manager of none). ``user``: only the runs started for that person
        (`Options.user`).
        """
        tenant = tenant or self.tenant
        frontiers = await self._store()
        pending: list[RunOverview] = []
        # A deployment with very many runs going holds one page of their summaries at a time,
        # not every one, and each read stays short.
        pages = runs_in_pages(
            frontiers,
            size=_LISTED_AT_ONCE,
            tenant=tenant,
            statuses={"waiting", "running"},
            user=user,
        )
        async for rows in pages:
            # A page's leases in one read, not one round trip per run.
            leases = (
                await current_leases(self.leases, [summary.run_id for summary in rows])
                if self.leases is not None and rows
                else {}
            )
            for summary in rows:
                status = await self._status(summary, leases.get(summary.run_id))
                if status.attention in ("waiting_on_approval", "needs_person", "interrupted"):
                    pending.append(status)
        return pending

    async def _status(self, summary: RunSummary, lease: RunLease | None) -> RunOverview:
        """The run's overview, given its unexpired lease (``None``: nobody holds it)."""
        attention = _attention(summary, lease)
        if attention == "interrupted":
            # Only an unheld running run can have been left for a person: read its whole row.
            row = await (await self._store()).get(summary.run_id)
            if row is not None and row.frontier is not None and needs_person(row.frontier):
                attention = "needs_person"
        return RunOverview(summary, lease, attention)


def _attention(summary: RunSummary, lease: RunLease | None) -> Attention | None:
    if summary.status == "waiting" and summary.waiting_on is not None:
        return "waiting_on_approval"
    if summary.status == "running":
        return "held" if lease is not None else "interrupted"
    return None


def pending_ids(statuses: Sequence[RunOverview]) -> list[str]:
    """The run ids of some statuses."""
    return [s.summary.run_id for s in statuses]
