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

from onward._storage import translating
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
async def switch_build(conn: asyncpg.Connection, layout: BuildLayout, build: int) -> int | None:
    """Make ``build`` the active one and repoint the views; return the build it replaced."""
    async with conn.transaction():
        await conn.execute("LOCK TABLE onward_projection_builds IN EXCLUSIVE MODE")
        previous = await active_build(conn, layout.projection)
        await conn.execute(
            "UPDATE onward_projection_builds SET status = 'retired' "
            "WHERE projection = $1 AND status = 'active'",
            layout.projection,
        )
        updated = await conn.execute(
            "UPDATE onward_projection_builds SET status = 'active', switched_at = now() "
            "WHERE projection = $1 AND build = $2",
            layout.projection,
            build,
        )
        if updated != "UPDATE 1":
            raise InvalidInputError(f"{layout.projection} build {build} does not exist")
        await _point_views(conn, layout, build)
    return previous


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


async def _point_views(conn: asyncpg.Connection, layout: BuildLayout, build: int) -> None:
    for view, table in layout.views(build).items():
        await conn.execute(f"CREATE OR REPLACE VIEW {view} AS SELECT * FROM {table}")
