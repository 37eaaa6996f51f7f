"""Rebuilding a projection into a new build, beside the live one.

Never in place: the new build gets its own tables and its own positions, is folded by a fresh
reader from each partition's earliest retained offset, and the views are repointed only when it
has caught up. A projector following the active build notices the switch and carries on from
the new build's positions; the old tables stay until someone drops them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from onward._storage import (
    BACKEND_TIMEOUT_S,
    bound_lock_waits,
    open_pool,
    pooled,
    translated,
)
from onward.errors import InvalidInputError
from onward.eventlog.base import EventLog

from .base import DEFAULT_CONSUMER, DEFAULT_MAX_BYTES, ProjectionSink
from .builds import (
    BuildLayout,
    create_build,
    in_steps,
    registry_in_steps,
    retire_unfinished,
    switch_build,
    view_holders,
)
from .compaction.postgres import PostgresCompactionStore
from .frontier_projection import FrontierProjection
from .log_projector import LogProjector
from .postgres import FRONTIERS, PostgresFrontierStore
from .postgres_sql import Projection, SqlProjectionSink, layout_of

if TYPE_CHECKING:
    import asyncpg

REBUILD_FLUSH_EVENTS = 200_000
"""A frontier rebuild stores after folding this many events (each run once per store)..."""
REBUILD_FLUSH_INTERVAL = 10.0
"""...or after this many seconds, whichever comes first."""

Progress = Callable[[int, int], None]

_TRY_LOCK = (
    "SELECT pg_try_advisory_lock(hashtextextended("
    "'onward:' || current_schema() || ':rebuild:' || $1, 0))"
)
"""Keyed by the schema the pool's search path resolves to, not the name it was given: a
schema named by ``schema`` and one reached through the URL's search path (or the default)
is one build registry, and rebuilds beside each other retire each other's builds."""
_TRY_EARLIER_LOCK = (
    "SELECT pg_try_advisory_lock_shared(hashtextextended('onward::rebuild:' || $1, 0))"
)
"""The key earlier versions took (exclusive) for a rebuild given no schema: taken too by one
given none, so a rebuild of a process not yet upgraded and an upgraded one do not run side by
side; shared, as it is one key for every schema and upgraded rebuilds of two schemas must not
refuse each other."""


@dataclass(frozen=True, slots=True)
class RebuildReport:
    """What a rebuild did."""

    projection: str
    build: int
    previous: int | None
    events: int
    seconds: float

    @property
    def events_per_second(self) -> float:
        """Fold rate of the rebuild."""
        return self.events / self.seconds if self.seconds else 0.0


async def rebuild(
    log: EventLog,
    database_url: str,
    *,
    layout: BuildLayout,
    open_sink: Callable[[int], AbstractAsyncContextManager[ProjectionSink]],
    schema: str | None = None,
    batch_size: int = 5_000,
    on_progress: Progress | None = None,
    timeout_s: float | None = BACKEND_TIMEOUT_S,
) -> RebuildReport:
    """Fold the whole retained log into a new build of a projection and switch its views.

    Args:
        log: The log, read from each partition's earliest retained offset.
        database_url: PostgreSQL URL.
        layout: The projection's build layout.
        open_sink: Opens the sink that folds into a given build.
        schema: PostgreSQL schema of Onward's tables.
        batch_size: Records read per partition per step.
        on_progress: Called with (events folded so far, events to fold as last measured).
        timeout_s: The longest a PostgreSQL connection attempt or statement may take
            (``None``: as long as the server takes); `open_sink` applies it to its own store.
    """
    if batch_size < 1:
        # A step would read nothing and the fold never end.
        raise InvalidInputError(f"batch_size must be at least 1, not {batch_size}")
    pool = await open_pool(database_url, schema=schema, max_size=2, timeout_s=timeout_s)
    try:
        guard = await _rebuild_lock(pool, layout.projection, timeout_s, earlier=not schema)
        try:
            build = await _create(pool, layout, timeout_s)
            started = time.perf_counter()
            done = 0
            try:
                async with open_sink(build) as sink:
                    # From each partition's start, as documented: the CLI refuses a cut log
                    # unless the archive is read with it.
                    projector = LogProjector(log, sink, batch_size=batch_size, from_log_start=True)
                    while True:
                        remaining = sum((await projector.backlog()).values())
                        if on_progress is not None:
                            on_progress(done, done + remaining)
                        if remaining == 0:
                            await projector.flush()
                            if not sum((await projector.backlog()).values()):
                                break
                        done += await projector.step()
                seconds = time.perf_counter() - started
                previous = await _switch(pool, layout, build, timeout_s)
            except BaseException:
                # The build is never switched to: retired, it holds back no compaction. If
                # PostgreSQL is what failed, the next rebuild retires it.
                with contextlib.suppress(Exception):
                    context = f"retiring the unfinished build {build} of {layout.projection}"
                    async with pooled(pool, context, timeout_s=timeout_s) as conn:
                        await retire_unfinished(conn, layout.projection)
                raise
        finally:
            await pool.release(guard)  # the pool's reset of the connection unlocks
    finally:
        await pool.close()
    return RebuildReport(layout.projection, build, previous, done, seconds)


async def _create(pool: asyncpg.Pool, layout: BuildLayout, timeout_s: float | None) -> int:
    """Retire the builds a rebuild killed outright left unfinished and create the next one;
    return it.

    Its lock on the build registry is waited for in steps, as a switch's are (`in_steps`):
    every write of every projection queues behind it meanwhile. Past ``timeout_s``, the
    sessions that held the registry on are named.
    """

    async def attempt(conn: asyncpg.Connection, step_s: float) -> int:
        # Retired in a transaction of its own: a creation refused (its registry lock held
        # past the timeout, a name taken) still lets compaction past the killed builds.
        async with conn.transaction():
            await bound_lock_waits(conn, step_s)
            await retire_unfinished(conn, layout.projection)
        async with conn.transaction():
            await bound_lock_waits(conn, step_s)
            return await create_build(conn, layout)

    outcome = (
        "no build was created and the views keep the build they had. End that session, then "
        "rebuild again"
    )
    context = f"creating a build of {layout.projection}"
    return await registry_in_steps(pool, layout, context, timeout_s, attempt, outcome=outcome)


async def _switch(
    pool: asyncpg.Pool, layout: BuildLayout, build: int, timeout_s: float | None
) -> int | None:
    """Switch ``layout`` to ``build``; return the build it replaced.

    The locks are waited for in steps (`in_steps`), so the readers and writers queued behind
    the switch wait no longer than a step, for ``timeout_s`` in all; past it, the sessions
    that held them on are named (a transaction left open after reading the views keeps them
    held, where the server is reachable all along).
    """

    async def attempt(conn: asyncpg.Connection, step_s: float) -> int | None:
        return await switch_build(conn, layout, build, lock_timeout_s=step_s)

    def refused(held_by: str) -> str:
        return (
            f"{held_by} held {', '.join(layout.views(build))} or the build registry for "
            f"{timeout_s:g} s (a transaction left open after reading the views holds them); "
            f"build {build} was not switched to and the views keep the build they had. End "
            "that session, then rebuild again"
        )

    context = f"switching {layout.projection} to build {build}"
    return await in_steps(
        pool,
        context,
        timeout_s,
        attempt,
        holders=lambda conn: view_holders(conn, layout),
        refused=refused,
    )


async def _rebuild_lock(
    pool: asyncpg.Pool, projection: str, timeout_s: float | None, *, earlier: bool
) -> asyncpg.Connection:
    """A connection of ``pool`` holding the lock of ``projection``'s rebuilds, held until it is
    given back (or its process dies); a rebuild already running is refused, not run beside.
    With ``earlier``, the key earlier versions took is held too (`_TRY_EARLIER_LOCK`)."""
    context = f"taking the rebuild lock of {projection}"
    with translated(context):
        conn = await pool.acquire(timeout=timeout_s)
        try:
            conn.release_session_locks()  # unlocked as the pool takes the connection back
            taken = await conn.fetchval(_TRY_LOCK, projection)
            if taken and earlier:
                taken = await conn.fetchval(_TRY_EARLIER_LOCK, projection)
        except BaseException:
            await pool.release(conn)
            raise
    if not taken:
        await pool.release(conn)
        raise InvalidInputError(
            f"another rebuild of {projection} is running; let it finish (or stop it) before "
            "starting one"
        )
    return conn


async def rebuild_frontiers(
    log: EventLog,
    database_url: str,
    *,
    schema: str | None = None,
    batch_size: int = 5_000,
    max_bytes: int = DEFAULT_MAX_BYTES,
    on_progress: Progress | None = None,
    timeout_s: float | None = BACKEND_TIMEOUT_S,
) -> RebuildReport:
    """Rebuild the built-in frontiers projection (frontiers and tool_calls)."""

    class _FrontierSink:
        def __init__(self, build: int) -> None:
            self.store = PostgresFrontierStore(
                database_url,
                build=build,
                schema=schema,
                synchronous_commit=False,
                timeout_s=timeout_s,
            )
            # Its tombstones: a run id used again once its first run was collected holds the
            # new run's row, as the live projector folded it, not both runs folded into one.
            self.compaction = PostgresCompactionStore(
                database_url, schema=schema, max_size=2, timeout_s=timeout_s
            )

        async def __aenter__(self) -> ProjectionSink:
            await self.store.start()
            try:
                await self.compaction.start()
            except BaseException:
                await self.store.close()
                raise
            return FrontierProjection(
                self.store,
                log,
                consumer=DEFAULT_CONSUMER,
                max_bytes=max_bytes,
                flush_events=REBUILD_FLUSH_EVENTS,
                flush_interval=REBUILD_FLUSH_INTERVAL,
                write_behind=True,
                compaction=self.compaction,
            )

        async def __aexit__(self, *exc: object) -> None:
            try:
                await self.compaction.close()
            finally:
                await self.store.close()

    return await rebuild(
        log,
        database_url,
        layout=FRONTIERS,
        open_sink=_FrontierSink,
        schema=schema,
        batch_size=batch_size,
        on_progress=on_progress,
        timeout_s=timeout_s,
    )


async def rebuild_projection(
    log: EventLog,
    database_url: str,
    projection: Projection,
    *,
    schema: str | None = None,
    batch_size: int = 5_000,
    on_progress: Progress | None = None,
    timeout_s: float | None = BACKEND_TIMEOUT_S,
) -> RebuildReport:
    """Rebuild a user projection."""
    return await rebuild(
        log,
        database_url,
        layout=layout_of(projection),
        open_sink=lambda build: SqlProjectionSink(
            database_url, projection, build=build, schema=schema, timeout_s=timeout_s
        ),
        schema=schema,
        batch_size=batch_size,
        on_progress=on_progress,
        timeout_s=timeout_s,
    )
