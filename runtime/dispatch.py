"""The write-ahead dispatch: the one order every tool call Onward makes goes through.

1. Its ``ToolDispatched`` (with the key the log records for the call) is durable in the log.
2. The lease is confirmed with the store: the last word before a side effect, so a holder that
   was paused past its ttl finds out here rather than after calling.
3. The tool is called under the confirmed lease (its fence and expiry are what the tool sees).
4. Its outcome is appended.

Steps 3 and 4 are the caller's (the runner calls the tool itself; the integrations hand the call
to their framework), so this module holds steps 1 and 2, used by `AgentRunner`, the pydantic-ai
journal and the LangGraph tool middleware alike. If step 1 fails the tool is never called; if the
process dies after it, resume finds the dispatch without an outcome and decides by the tool's
kind (retry-safe, status-checked, or a person).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from onward._storage.stores import BACKEND_TIMEOUT_S
from onward._storage.waits import outlast
from onward.eventlog.events import NOT_CALLED

from .leases.base import RunLease


async def write_ahead(
    append_dispatch: Callable[[], Awaitable[object]],
    confirm: Callable[[], Awaitable[RunLease]],
    not_called: Callable[[], Awaitable[object]],
) -> RunLease:
    """Make the dispatch durable, then confirm the lease; return the lease the call runs under.

    When either step fails, or is cancelled (a shutdown, a sibling call that failed), the tool
    is not called, and ``not_called`` records the call as never ran while the lease still lets
    this holder write (`NOT_CALLED`): left open, a resume would hand it to a person as one that
    may have run. A process that dies here leaves it open all the same.

    Raises:
        FencedError: The lease was lost; the tool must not be called.
    """
    try:
        await append_dispatch()
        return await confirm()
    except (Exception, asyncio.CancelledError):
        # In a task of its own, waited for however often this one is cancelled meanwhile: a
        # cancel scope that cancels at every await until it is left (anyio's, as pydantic-ai
        # runs tools in) cut the record short, and the call was left open for a person.
        recording = asyncio.ensure_future(not_called())
        try:
            await outlast(recording, BACKEND_TIMEOUT_S)
        finally:
            if not recording.done():
                recording.cancel()
        if not recording.cancelled() and (failure := recording.exception()) is not None:
            raise failure from None
        raise


__all__ = ["NOT_CALLED", "write_ahead"]
