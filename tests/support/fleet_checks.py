"""What the in-process fleet tests wait on with `until`: a run's status as its log says, and
run ids whose requests share a partition."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from onward.errors import NothingToResumeError
from onward.eventlog.base import partition_for
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
