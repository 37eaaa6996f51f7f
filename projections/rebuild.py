"""Rebuilding the frontiers projection into a new build, beside the live one.

Never in place: the new build gets its own tables and its own positions, is folded by a fresh
reader from each partition's earliest retained offset, and the views are repointed only when it
has caught up. A projector following the active build notices the switch and carries on from
the new build's positions; the old tables stay until someone drops them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg

from onward.eventlog.base import EventLog

from .base import DEFAULT_MAX_BYTES
from .postgres import PostgresFrontierStore, create_build, switch_build
from .projector import DEFAULT_CONSUMER, FrontierProjection, LogProjector


@dataclass(frozen=True, slots=True)
class RebuildReport:
    """What a rebuild did."""

    build: int
    previous: int | None
    events: int
    seconds: float

    @property
    def events_per_second(self) -> float:
        """Fold rate of the rebuild."""
        return self.events / self.seconds if self.seconds else 0.0


async def rebuild_frontiers(
    log: EventLog,
    database_url: str,
    *,
    schema: str | None = None,
    batch_size: int = 5_000,
    max_bytes: int = DEFAULT_MAX_BYTES,
    on_progress: Callable[[int, int], None] | None = None,
) -> RebuildReport:
    """Fold the whole retained log into a new build and switch the views to it.

    Args:
        log: The log to read from its earliest retained offsets.
        database_url: PostgreSQL URL.
        schema: PostgreSQL schema of Onward's tables.
        batch_size: Records read per partition per step.
        max_bytes: The snapshot cap.
        on_progress: Called with (events folded so far, events to fold as last measured).
    """
    settings = {"search_path": schema} if schema else {}
    conn = await asyncpg.connect(database_url, server_settings=settings)
    try:
        build = await create_build(conn)
        started = time.perf_counter()
        async with PostgresFrontierStore(database_url, build=build, schema=schema) as store:
            projector = LogProjector(
                log,
                FrontierProjection(store, log, consumer=DEFAULT_CONSUMER, max_bytes=max_bytes),
                batch_size=batch_size,
            )
            done = 0
            while True:
                remaining = sum((await projector.lag()).values())
                if on_progress is not None:
                    on_progress(done, done + remaining)
                if remaining == 0:
                    break
                done += await projector.step()
        seconds = time.perf_counter() - started
        previous = await switch_build(conn, build)
    finally:
        await conn.close()
    return RebuildReport(build=build, previous=previous, events=done, seconds=seconds)
