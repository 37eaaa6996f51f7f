"""A throwaway PostgreSQL schema per test, so tests never see each other's rows."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Protocol

import asyncpg

from onward.projections.postgres import migrate


def new_schema_name() -> str:
    """A schema name no other test uses."""
    return f"t_{uuid.uuid4().hex[:12]}"


@asynccontextmanager
async def fresh_schema(database_url: str, *, migrated: bool = True) -> AsyncIterator[str]:
    """Create a schema, migrate it (unless ``migrated`` is false), yield its name, drop it."""
    schema = new_schema_name()
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(f"CREATE SCHEMA {schema}")
        if migrated:
            await conn.execute(f"SET search_path TO {schema}")
            await migrate(conn)
        yield schema
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await conn.close()


class SchemaFactory(Protocol):
    """Each time it is awaited, one more fresh schema, migrated unless ``migrated`` is false."""

    async def __call__(self, *, migrated: bool = True) -> str: ...


@asynccontextmanager
async def schema_factory(database_url: str) -> AsyncIterator[SchemaFactory]:
    """Yield a maker of fresh schemas; drop every schema it made afterwards."""
    async with AsyncExitStack() as stack:

        async def new(*, migrated: bool = True) -> str:
            return await stack.enter_async_context(fresh_schema(database_url, migrated=migrated))

        yield new
