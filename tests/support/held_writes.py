"""Frontier store writes a test holds back, and the PostgreSQL-alone backends they are held in.

::

    async with postgres_backends(database_url, pg_schema) as backends:
        held = HeldWrites(backends)                       # or HeldWrites(backends, fail=error)
        held.armed = True
        await held.waiting.wait()                         # a write is being held
        held.go.set()                                     # let it go (or fail with ``fail``)

    settling = settling_of(runner)                        # set as its holder waits on the folds
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from onward.runtime import AgentRunner
from onward.runtime.backends import Backends, open_backends
from onward.runtime.settings import SecretUrl, Settings


@asynccontextmanager
async def postgres_backends(database_url: str, schema: str) -> AsyncIterator[Backends]:
    """The stores of the PostgreSQL-alone backend in ``schema``, open for the block."""
    settings = Settings(
        backend="postgres", database_url=SecretUrl(database_url), database_schema=schema
    )
    async with open_backends(settings) as opened:
        yield opened


class HeldWrites:
    """Holds the frontier store's writes back from when it is armed until it is let go; then
    each write goes on, or fails with ``fail`` when one is given."""

    def __init__(self, backends: Backends, *, fail: Exception | None = None) -> None:
        self.armed = False
        self.waiting = asyncio.Event()
        self.go = asyncio.Event()
        store = backends.frontiers
        write = store.write

        async def held(*args: Any, **kwargs: Any) -> None:
            if self.armed:
                self.waiting.set()
                await asyncio.wait_for(self.go.wait(), 20)  # a failed test still ends
                if fail is not None:
                    raise fail
            await write(*args, **kwargs)

        store.write = held  # type: ignore[method-assign]


def settling_of(runner: AgentRunner) -> asyncio.Event:
    """Set when ``runner`` starts waiting on its background folds as a holding ends: the
    moment a test holding those folds back can let them go (or fail), with no sleep."""
    settling = asyncio.Event()
    settle = runner.settle_checkpoints

    async def noted() -> None:
        settling.set()
        await settle()

    runner.settle_checkpoints = noted  # type: ignore[method-assign]
    return settling
