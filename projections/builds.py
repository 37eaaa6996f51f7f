"""Builds: side-by-side generations of a projection's tables in PostgreSQL.

Every projection's rows live in a numbered build, registered in ``onward_projection_builds``;
views carry the projection's public names and point at the active build. A rebuild creates the
next build, fills it, and switches the views in one transaction; nothing is rebuilt in place and
old builds stay until dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import asyncpg

from onward._storage import bound_lock_waits, translating
from onward.errors import InvalidInputError


@dataclass(frozen=True, slots=True)
class BuildLayout:
    """How one projection's builds are laid out.

    Attributes:
        projection: The projection's name, the key of its builds and positions.
        version: The version of the code that folds it, recorded with each build.
        ddl: The statements creating one build's tables, given the build number.
        views: For a build number, each public view name and the table it shows.
    """

    projection: str
    version: int
    ddl: Callable[[int], str]
    views: Callable[[int], Mapping[str, str]]


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


async def _refuse_taken_names(conn: asyncpg.Connection, layout: BuildLayout, build: int) -> None:
    """Refuse a build whose tables exist already, or whose views are named by something other
    than a view: another projection's (``a_2``'s view is build 2 of ``a``'s table). DDL that
    creates its table only if missing would otherwise fold into the other projection's view,
    writing its rows, and the views be pointed at it."""
    names = layout.views(build)
    clashes = await conn.fetchval(
        "SELECT array_agg(n.name ORDER BY n.name) FROM unnest($1::text[]) AS n(name) "
        "JOIN pg_class c ON c.oid = to_regclass(n.name) "
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
