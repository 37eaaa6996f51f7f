"""PostgreSQL connection pools: opened, verified and used through one translating path.

Every PostgreSQL store opens its pool with :func:`open_pool` (search path set, schema version
verified) and runs its work through :func:`pooled`, so no asyncpg or socket exception reaches
a caller untranslated.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from .migrations import verify_postgres
from .translate import translated

APPLICATION_NAME = "onward"
"""What Onward's connections call themselves on the server (``pg_stat_activity``)."""


def application_name(schema: str | None) -> str:
    """The ``application_name`` of a store's connections: ``onward``, or ``onward:<schema>``.

    The schema in it lets an operator (or a test) tell apart the connections of deployments
    sharing one server.
    """
    return f"{APPLICATION_NAME}:{schema}" if schema else APPLICATION_NAME


async def open_pool(
    dsn: str, *, schema: str | None = None, min_size: int = 1, max_size: int = 10
) -> asyncpg.Pool:
    """A connection pool to a PostgreSQL store, its schema verified before anything uses it.

    What every PostgreSQL store opens with: the search path set to ``schema``, driver failures
    translated, and the pool closed again if the schema is not this code's version.
    """
    settings = {"application_name": application_name(schema)}
    if schema:
        settings["search_path"] = schema
    with translated("connecting to PostgreSQL"):
        pool = await asyncpg.create_pool(
            dsn, min_size=min_size, max_size=max_size, server_settings=settings
        )
    try:
        async with pooled(pool, "verifying schema") as conn:
            await verify_postgres(conn)
    except BaseException:
        await pool.close()
        raise
    return pool


@asynccontextmanager
async def pooled(
    pool: asyncpg.Pool, context: str, *, run_id: str | None = None, transaction: bool = False
) -> AsyncIterator[asyncpg.Connection]:
    """A connection from the pool, in a transaction if asked; every driver error translated.

    A connection the server dropped (restart, failover, ``pg_terminate_backend``) fails the
    call in progress with a retryable `BackendUnavailableError`; the pool discards it, so the
    next call gets a fresh connection.

    Args:
        pool: The store's pool.
        context: What the store is doing, in a few words, for the error message.
        run_id: The run concerned, if any.
        transaction: Run the block in one transaction, rolled back if it raises.
    """
    with translated(context, run_id=run_id):
        async with pool.acquire() as conn:
            if not transaction:
                yield conn
                return
            async with conn.transaction():
                yield conn
