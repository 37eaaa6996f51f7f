"""Builds: side-by-side generations of a projection's tables in PostgreSQL.

Every projection's rows live in a numbered build, registered in ``onward_projection_builds``;
views carry the projection's public names and point at the active build. A rebuild creates the
next build, fills it, and switches the views in one transaction; nothing is rebuilt in place and
old builds stay until dropped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar

from onward._storage import bound_lock_waits, pooled, translating
from onward._storage.locks import SAY_AFTER_S
from onward.errors import BackendUnavailableError, InvalidInputError

if TYPE_CHECKING:
    import asyncpg

log = logging.getLogger("onward.locks")

SWITCH_LOCK_WAIT_S = 1.0
"""The longest one attempt to create a build or switch a rebuild's views waits for its locks
(`in_steps`): the projection's readers and writers queue behind it meanwhile."""

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class BuildLayout:
    """How one projection's builds are laid out.

    Attributes:
        projection: The projection's name, the key of its builds and positions.
        version: The version of the code that folds it, recorded with each build.
        ddl: The statements creating one build's tables, given the build number.
        views: For a build number, each public view name and the table it shows.
        collides: For another projection's name, whether some build of one of the two would
            be named as a view or table of the other; ``None``: never. Asked as the first
            build is created, while the name can still be chosen.
    """

    projection: str
    version: int
    ddl: Callable[[int], str]
    views: Callable[[int], Mapping[str, str]]
    collides: Callable[[str], bool] | None = None


@translating("reading the active build")
async def active_build(conn: asyncpg.Connection, projection: str) -> int | None:
    """The build a projection's views point at, or ``None`` if it has none yet."""
    value = await conn.fetchval(
        "SELECT build FROM onward_projection_builds WHERE projection = $1 AND status = 'active'",
        projection,
    )
    return int(value) if value is not None else None


@translating("looking up a build")
async def build_exists(conn: asyncpg.Connection, projection: str, build: int) -> bool:
    """Whether a build of a projection is registered."""
    found = await conn.fetchval(
        "SELECT 1 FROM onward_projection_builds WHERE projection = $1 AND build = $2",
        projection,
        build,
    )
    return found is not None


@translating("creating a build")
async def create_build(
    conn: asyncpg.Connection, layout: BuildLayout, *, status: str = "building"
) -> int:
    """Create the tables of the next build and register it; return its number."""
    async with conn.transaction():
        await conn.execute("LOCK TABLE onward_projection_builds IN EXCLUSIVE MODE")
        build = int(
            await conn.fetchval(
                "SELECT coalesce(max(build), 0) + 1 FROM onward_projection_builds "
                "WHERE projection = $1",
                layout.projection,
            )
        )
        if build == 1:
            await _refuse_colliding_projections(conn, layout)
        await _refuse_taken_names(conn, layout, build)
        await conn.execute(layout.ddl(build))
        await conn.execute(
            "INSERT INTO onward_projection_builds (projection, build, version, status) "
            "VALUES ($1, $2, $3, $4)",
            layout.projection,
            build,
            layout.version,
            status,
        )
        if status == "active":
            await _point_views(conn, layout, build)
    return build


async def _refuse_colliding_projections(conn: asyncpg.Connection, layout: BuildLayout) -> None:
    """Refuse a new projection whose builds and another's would one day share a name (``a``
    and ``a_7``: build 7 of ``a`` is ``a_7``'s view): accepted, the later one's rebuild would
    be refused at that build (`_refuse_taken_names`), once both hold rows."""
    if layout.collides is None:
        return
    others = await conn.fetch(
        "SELECT DISTINCT projection FROM onward_projection_builds WHERE projection <> $1",
        layout.projection,
    )
    colliding = sorted(r["projection"] for r in others if layout.collides(r["projection"]))
    if colliding:
        raise InvalidInputError(
            f"projection {layout.projection!r} cannot be created: its builds' tables "
            f"(<name>_<build>) and those of projection {colliding[0]!r} would be named alike "
            "at some build, and its rebuild then refused; choose a name that is not another's "
            "followed by _ and a number (nor the other way around)"
        )


async def _refuse_taken_names(conn: asyncpg.Connection, layout: BuildLayout, build: int) -> None:
    """Refuse a build whose tables exist already, or whose views are named by something other
    than a view: another projection's (``a_2``'s view is build 2 of ``a``'s table). DDL that
    creates its table only if missing would otherwise fold into the other projection's view,
    writing its rows, and the views be pointed at it. Looked up in the schema they are
    created in, the search path's first: a later schema on it holding one of the names takes
    nothing from this one."""
    names = layout.views(build)
    clashes = await conn.fetchval(
        "SELECT array_agg(n.name ORDER BY n.name) FROM unnest($1::text[]) AS n(name) "
        "JOIN pg_class c ON c.oid = to_regclass(format('%I.%I', current_schema(), n.name)) "
        "WHERE n.name = ANY($2::text[]) OR c.relkind <> 'v'",
        [*names.values(), *names.keys()],
        list(names.values()),
    )
    if clashes:
        raise InvalidInputError(
            f"{layout.projection} build {build} cannot be created: {', '.join(clashes)} "
            "exists already and is not its to create (a projection of that name, or a table "
            "left behind); rename that projection or drop the table"
        )


@translating("creating the first build")
async def ensure_active(conn: asyncpg.Connection, layout: BuildLayout) -> int | None:
    """Create and activate the first build if the projection has none; return it if created.

    Asked again under the lock a build is created under: callers that all found none at once
    (migrations, projectors starting together) create one between them, and the others find it.
    """
    if await active_build(conn, layout.projection) is not None:
        return None
    async with conn.transaction():
        await conn.execute("LOCK TABLE onward_projection_builds IN EXCLUSIVE MODE")
        if await active_build(conn, layout.projection) is not None:
            return None
        return await create_build(conn, layout, status="active")


async def ensure_active_in_steps(
    pool: asyncpg.Pool, layout: BuildLayout, timeout_s: float | None
) -> int | None:
    """`ensure_active`, its wait for the build registry in steps (`in_steps`): every write of
    every projection queues behind it meanwhile, and a session holding the registry past
    ``timeout_s`` (a write left open) is named, not met as a server that did not answer."""

    async def attempt(conn: asyncpg.Connection, step_s: float) -> int | None:
        async with conn.transaction():
            await bound_lock_waits(conn, step_s)
            return await ensure_active(conn, layout)

    context = f"creating the first build of {layout.projection}"
    outcome = f"no build of {layout.projection} was created. End that session, then start again"
    return await registry_in_steps(pool, layout, context, timeout_s, attempt, outcome=outcome)


async def registry_in_steps(
    pool: asyncpg.Pool,
    layout: BuildLayout,
    context: str,
    timeout_s: float | None,
    attempt: Callable[[asyncpg.Connection, float], Awaitable[_T]],
    *,
    outcome: str,
) -> _T:
    """`in_steps` for an ``attempt`` that waits on the build registry alone; given up, it
    names the sessions that held the registry, and says ``outcome``."""

    def refused(held_by: str) -> str:
        return (
            f"{held_by} held the build registry (onward_projection_builds) for {timeout_s:g} s "
            f"(a write of a projection left open holds it); {outcome}"
        )

    async def holders(conn: asyncpg.Connection) -> list[str]:
        return await view_holders(conn, layout, views=False)

    return await in_steps(pool, context, timeout_s, attempt, holders=holders, refused=refused)


async def in_steps(
    pool: asyncpg.Pool,
    context: str,
    timeout_s: float | None,
    attempt: Callable[[asyncpg.Connection, float], Awaitable[_T]],
    *,
    holders: Callable[[asyncpg.Connection], Awaitable[list[str]]],
    refused: Callable[[str], str],
) -> _T:
    """Run ``attempt``, given how long it may wait for its locks, until its locks are free.

    The waits are in steps, the first of `SWITCH_LOCK_WAIT_S` and each twice the one before
    (a write that holds the registry longer still fits one), so the readers and writers
    queued behind an attempt wait no longer than a step, for ``timeout_s`` in all; past it,
    fails with ``context`` and what ``refused`` says of the ``holders``. A wait that lasts
    `SAY_AFTER_S` is said in the log once, naming the ``holders``, as every lock wait is:
    with no ``timeout_s``, nothing else would ever tell of a session left open holding them.
    """
    started = time.monotonic()
    deadline = None if timeout_s is None else started + timeout_s
    step_s = SWITCH_LOCK_WAIT_S
    said = False
    while True:
        if deadline is not None:
            step_s = max(min(step_s, deadline - time.monotonic()), 0.001)
        async with pooled(pool, context, timeout_s=timeout_s) as conn:
            try:
                return await attempt(conn, step_s)
            except BackendUnavailableError as exc:
                import asyncpg  # noqa: PLC0415  (loaded already: ``conn`` is its)

                if not isinstance(exc.__cause__, asyncpg.LockNotAvailableError):
                    raise
                if deadline is not None and time.monotonic() >= deadline:
                    held_by = ", ".join(await holders(conn)) or "another session"
                    raise BackendUnavailableError(f"{context}: {refused(held_by)}") from exc
                if not said and time.monotonic() - started >= SAY_AFTER_S:
                    said = True
                    await _say_wait(conn, context, timeout_s, started, holders)
        # The readers queued behind this attempt go first.
        await asyncio.sleep(min(step_s, SWITCH_LOCK_WAIT_S) / 2)
        step_s *= 2


async def _say_wait(
    conn: asyncpg.Connection,
    context: str,
    timeout_s: float | None,
    started: float,
    holders: Callable[[asyncpg.Connection], Awaitable[list[str]]],
) -> None:
    """Say in the log that ``context`` waits for its locks, who holds them and until when."""
    if timeout_s is None:
        until = "until they are free (no timeout set)"
    else:
        ends = time.time() + timeout_s - (time.monotonic() - started)
        clock = datetime.fromtimestamp(ends, tz=UTC).strftime("%H:%M:%S UTC")
        until = f"until {clock}, {timeout_s:g} s in all"
    log.warning(
        "%s: waiting for its locks, held by %s, %s",
        context,
        ", ".join(await holders(conn)) or "another session",
        until,
    )


@translating("switching builds")
async def switch_build(
    conn: asyncpg.Connection,
    layout: BuildLayout,
    build: int,
    *,
    lock_timeout_s: float | None = None,
) -> int | None:
    """Make ``build`` the active one and repoint the views; return the build it replaced.

    ``lock_timeout_s`` bounds the wait for its locks (then `BackendUnavailableError` from
    ``asyncpg.LockNotAvailableError``): every writer and every reader of the views queues
    behind a switch that waits.
    """
    async with conn.transaction():
        if lock_timeout_s is not None:
            await bound_lock_waits(conn, lock_timeout_s)
        await conn.execute("LOCK TABLE onward_projection_builds IN EXCLUSIVE MODE")
        status = await conn.fetchval(
            "SELECT status FROM onward_projection_builds WHERE projection = $1 AND build = $2",
            layout.projection,
            build,
        )
        if status is None:
            raise InvalidInputError(f"{layout.projection} build {build} does not exist")
        if status == "retired":
            # Compaction keeps nothing for a retired build: the records past where it was
            # folded may be cut, and it would be followed on with holes.
            raise InvalidInputError(
                f"{layout.projection} build {build} is retired (replaced, or its rebuild did "
                "not finish): what it has not folded may be cut from the log; rebuild instead"
            )
        previous = await active_build(conn, layout.projection)
        await conn.execute(
            "UPDATE onward_projection_builds SET status = 'retired' "
            "WHERE projection = $1 AND status = 'active'",
            layout.projection,
        )
        await conn.execute(
            "UPDATE onward_projection_builds SET status = 'active', switched_at = now() "
            "WHERE projection = $1 AND build = $2",
            layout.projection,
            build,
        )
        await _point_views(conn, layout, build)
    return previous


@translating("retiring an unfinished build")
async def retire_unfinished(conn: asyncpg.Connection, projection: str) -> None:
    """Retire the builds of ``projection`` a rebuild left unfinished (it failed or was killed).

    Nothing folds into them any more; left as they are, compaction would keep every record
    past where each stopped, for good. Called under the rebuild lock, so no rebuild is filling
    one of them.
    """
    await conn.execute(
        "UPDATE onward_projection_builds SET status = 'retired' "
        "WHERE projection = $1 AND status = 'building'",
        projection,
    )


@translating("reading the active build")
async def active_build_for_write(conn: asyncpg.Connection, projection: str) -> int | None:
    """Inside a write transaction: the active build, share-locked until the transaction ends.

    The lock conflicts with :func:`switch_build`, so a switch and a write never interleave:
    either the write lands before the switch, or it sees the new build.
    """
    value = await conn.fetchval(
        "SELECT build FROM onward_projection_builds "
        "WHERE projection = $1 AND status = 'active' FOR SHARE",
        projection,
    )
    return int(value) if value is not None else None


@translating("looking up who holds a projection's views")
async def view_holders(
    conn: asyncpg.Connection, layout: BuildLayout, *, views: bool = True
) -> list[str]:
    """The other sessions holding a lock a switch of ``layout`` waits for: on its views (unless
    not ``views``: a build's creation does not touch them), or on the build registry in a mode
    that conflicts with the switch's."""
    names = list(layout.views(0)) if views else []
    rows = await conn.fetch(
        "SELECT DISTINCT l.pid, a.application_name, host(a.client_addr) AS client "
        "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.granted AND l.pid <> pg_backend_pid() AND l.database = ("
        "SELECT oid FROM pg_database WHERE datname = current_database()) AND ("
        "l.relation IN (SELECT to_regclass(v) FROM unnest($1::text[]) AS v) "
        "OR (l.relation = 'onward_projection_builds'::regclass AND l.mode <> 'AccessShareLock')"
        ") ORDER BY l.pid",
        names,
    )
    return [
        f"backend pid {r['pid']} ({r['application_name'] or 'no application name'}"
        + (f" from {r['client']})" if r["client"] else ")")
        for r in rows
    ]


async def _point_views(conn: asyncpg.Connection, layout: BuildLayout, build: int) -> None:
    for view, table in layout.views(build).items():
        await conn.execute(f"CREATE OR REPLACE VIEW {view} AS SELECT * FROM {table}")
