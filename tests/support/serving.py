"""A `Worker` serving a requests topic in the test's own process, for as long as a block runs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from onward.runtime.fleet.worker import Worker
from onward.runtime.signing import RequestSigner


@asynccontextmanager
async def serving(
    worker: Worker,
    bootstrap: str,
    topic: str,
    *,
    signer: RequestSigner | None = None,
    accept_unsigned: bool = False,
) -> AsyncIterator[asyncio.Task[None]]:
    """Yield once ``worker`` is in its group (``{topic}.workers``) on ``topic``; on the way out
    stop it and wait for it to drain. The yielded task is the serving itself: a test asserts it
    did not fail."""
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        worker.serve_kafka(
            stop,
            bootstrap_servers=bootstrap,
            topic=topic,
            group_id=f"{topic}.workers",
            session_timeout_ms=6000,
            on_ready=ready.set,
            signer=signer,
            accept_unsigned=accept_unsigned,
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), 60)
        yield task
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 60)
