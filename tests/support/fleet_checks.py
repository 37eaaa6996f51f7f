"""What the in-process fleet tests wait on with `until`: a run's status as its log says, and
run ids whose requests share a partition; how slow recovery passes overlap."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from onward.errors import NothingToResumeError
from onward.eventlog.base import partition_for
from onward.projections.base import RunSummary
from onward.runtime.demo_ledger import Ledger
from onward.runtime.fleet.worker import Worker


async def status_of(worker: Worker, run_id: str, tenant: str) -> str | None:
    """The run's status as its log says (no projector runs in these tests); None: no run."""
    try:
        return (await worker.runner.inspect(run_id, tenant=tenant)).status
    except NothingToResumeError:
        return None


def has_status(
    worker: Worker,
    run_id: str,
    wanted: str,
    *,
    tenant: str,
    serving: Callable[[], asyncio.Task[None]] | None = None,
) -> Callable[[], Awaitable[bool]]:
    """A check for `until`: the run's status is ``wanted``. With ``serving`` (the serving
    task, once there is one), a worker that stopped fails the wait at once, saying why."""

    async def check() -> bool:
        if serving is not None:
            task = serving()
            assert not task.done(), f"the worker stopped: {task.exception()!r}"
        return await status_of(worker, run_id, tenant) == wanted

    return check


def same_partition_runs(run_id: str, prefix: str, count: int, partitions: int) -> list[str]:
    """``count`` run ids starting with ``prefix`` whose requests share ``run_id``'s partition."""
    wanted = partition_for(run_id, partitions)
    candidates = (f"{prefix}-{n}" for n in range(10 * count * partitions + 100))
    return [c for c in candidates if partition_for(c, partitions) == wanted][:count]


async def ticked(ledger: Ledger, count: int) -> bool:
    """Whether the runaway (``looper``) runs have ticked ``count`` times in all."""
    return ledger.count("tick") >= count


class SlowListings:
    """``worker``'s frontier listings (a recovery pass's first step) made ``delay_s`` slow,
    counting how many passes listed and the most that listed at once."""

    def __init__(self, worker: Worker, monkeypatch: pytest.MonkeyPatch, delay_s: float) -> None:
        self.started = 0
        self.most_at_once = 0
        self._at_once = 0
        frontiers = worker.backends.frontiers
        listing = frontiers.runs

        async def slow(**query: Any) -> list[RunSummary]:
            self.started += 1
            self._at_once += 1
            self.most_at_once = max(self.most_at_once, self._at_once)
            try:
                await asyncio.sleep(delay_s)
                return await listing(**query)
            finally:
                self._at_once -= 1

        monkeypatch.setattr(frontiers, "runs", slow)
