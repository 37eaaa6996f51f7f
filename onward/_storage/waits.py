"""Waiting for clean-up that must not be cut short by a cancellation."""

from __future__ import annotations

import asyncio
from typing import Any


async def outlast(task: asyncio.Future[Any], timeout_s: float) -> None:
    """Wait for ``task`` to end, at most ``timeout_s``, however often the waiter is cancelled
    meanwhile; a cancellation it rode out is raised once the wait is over.

    A cancel scope that cancels again at every turn until it is left (anyio's) would otherwise
    cut short the clean-up a first cancellation left to do.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    cancelled = False
    while not task.done() and (left := deadline - loop.time()) > 0:
        try:
            await asyncio.wait({task}, timeout=left)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError


__all__ = ["outlast"]
