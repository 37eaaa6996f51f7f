"""A throwaway PostgreSQL schema per test, so tests never see each other's rows."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from onward.projections.postgres import migrate


@asynccontextmanager
async def fresh_schema(database_url: str) -> AsyncIterator[str]:
    """Create a schema, migrate it, yield its name, drop it."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(f"CREATE SCHEMA {schema}")
        await conn.execute(f"SET search_path TO {schema}")
        await migrate(conn)
        yield schema
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await conn.close()
