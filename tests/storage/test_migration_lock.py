"""`onward db migrate` while another migration of the database is under way.

Migrations of one schema are serialized by a lock every migrator sees; migrations of other
schemas on the same server do not wait for it. A migrator that waits says on whom and until
when, and gives up after ``ONWARD_BACKEND_TIMEOUT`` (exit 5) rather than wait in silence for
as long as the other one takes. The other migration is a real one, left open in its
transaction.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from support.pg import SchemaFactory

from onward._storage import migrate_postgres
from onward.projections.postgres import migrate


@asynccontextmanager
async def migrating(database_url: str, schema: str) -> AsyncIterator[int]:
    """A migration of ``schema`` done but not committed, so it holds what a migration holds;
    its backend pid. Rolled back on the way out."""
    conn = await asyncpg.connect(database_url, server_settings={"search_path": schema})
    try:
        transaction = conn.transaction()
        await transaction.start()
        await migrate(conn)
        try:
            yield conn.get_server_pid()
        finally:
            await transaction.rollback()
    finally:
        await conn.close()


async def onward_migrate(database_url: str, schema: str, timeout_s: float) -> tuple[int, str]:
    """``onward db migrate`` into ``schema`` with ``ONWARD_BACKEND_TIMEOUT=timeout_s``: its
    exit code and stderr. Killed (and the test failed) if it has not ended within 30 s."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "ONWARD_DATABASE_SCHEMA": schema,
        "ONWARD_BACKEND_TIMEOUT": str(timeout_s),
    }
    child = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "onward", "db", "migrate"),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, stderr = await asyncio.wait_for(child.communicate(), 30)
    except TimeoutError:
        child.kill()
        await child.wait()
        raise AssertionError("`onward db migrate` was still waiting after 30 s") from None
    assert child.returncode is not None
    return child.returncode, stderr.decode()


async def test_migrations_of_other_schemas_do_not_wait_for_each_other(
    database_url: str, new_pg_schema: SchemaFactory
) -> None:
    first, second = await new_pg_schema(migrated=False), await new_pg_schema(migrated=False)
    async with migrating(database_url, first):
        conn = await asyncpg.connect(database_url, server_settings={"search_path": second})
        try:
            applied = await asyncio.wait_for(migrate(conn), 10)
        finally:
            await conn.close()
    assert applied[-1] == "frontiers build 1"


async def test_a_migration_of_the_same_schema_is_waited_for_aloud_then_given_up(
    database_url: str, new_pg_schema: SchemaFactory
) -> None:
    schema = await new_pg_schema(migrated=False)
    async with migrating(database_url, schema) as pid:
        began = time.monotonic()
        code, stderr = await onward_migrate(database_url, schema, 2)
        took = time.monotonic() - began
    assert code == 5, stderr
    assert took < 15
    lock = re.escape(f"the migration lock of PostgreSQL schema {schema}")
    said, refused = stderr.strip().splitlines()[-2:]
    assert re.search(rf"waiting for {lock}, held by backend pid {pid}\b.*, until ", said), said
    assert re.search(rf"{lock} was not free within 2 s \(held by backend pid {pid}\b", refused), (
        refused
    )
    # Once the other migration has ended, the schema is migrated as usual.
    code, stderr = await onward_migrate(database_url, schema, 2)
    assert code == 0, stderr


async def test_migrations_of_one_schema_at_once_all_succeed_with_one_first_build(
    database_url: str, new_pg_schema: SchemaFactory
) -> None:
    # The tables are there but the frontiers projection has no build yet: what every one of
    # them then does at once, after the migrations' lock, is create its first build.
    schema = await new_pg_schema(migrated=False)
    conns = [
        await asyncpg.connect(database_url, server_settings={"search_path": schema})
        for _ in range(4)
    ]
    try:
        await migrate_postgres(conns[0])
        applied = await asyncio.wait_for(asyncio.gather(*(migrate(c) for c in conns)), 20)
        builds = await conns[0].fetch(
            "SELECT build, status FROM onward_projection_builds WHERE projection = 'frontiers'"
        )
    finally:
        for conn in conns:
            await conn.close()
    assert sorted(applied) == [[], [], [], ["frontiers build 1"]]
    assert [(row["build"], row["status"]) for row in builds] == [(1, "active")]


async def test_a_schema_another_session_is_creating_is_waited_for_then_given_up(
    database_url: str,
) -> None:
    """Another session's ``CREATE SCHEMA`` of the same name, not committed yet (a migration
    under way, or a person's open transaction), holds this one's ``CREATE SCHEMA IF NOT
    EXISTS`` until it ends: bounded by nothing, `onward db migrate` waited in silence."""
    schema = f"onward_creating_{uuid.uuid4().hex[:8]}"
    holder = await asyncpg.connect(database_url)
    try:
        transaction = holder.transaction()
        await transaction.start()
        await holder.execute(f'CREATE SCHEMA "{schema}"')
        began = time.monotonic()
        code, stderr = await onward_migrate(database_url, schema, 2)
        took = time.monotonic() - began
        await transaction.rollback()
    finally:
        await holder.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await holder.close()
    assert code == 5, stderr
    assert took < 15
    refused = stderr.strip().splitlines()[-1]
    assert schema in refused, refused
    assert "2 s" in refused, refused


async def test_a_migration_whose_table_another_session_holds_is_given_up(
    database_url: str, new_pg_schema: SchemaFactory
) -> None:
    """An upgrade whose migration alters a table that a session in an open transaction has
    written to (a projector's long write, a person's ``BEGIN``): its statement waited for the
    table's lock bounded by nothing, `onward db migrate` silent for as long as the other stayed
    open, and every write to that table queued behind it meanwhile."""
    schema = await new_pg_schema()
    holder = await asyncpg.connect(database_url, server_settings={"search_path": schema})
    try:
        await holder.execute("DROP INDEX onward_quarantine_by_state")
        await holder.execute("DELETE FROM onward_schema_migrations WHERE version = 21")
        transaction = holder.transaction()
        await transaction.start()
        await holder.execute("LOCK TABLE onward_quarantine IN ROW EXCLUSIVE MODE")
        began = time.monotonic()
        code, stderr = await onward_migrate(database_url, schema, 2)
        took = time.monotonic() - began
        await transaction.rollback()
        applied = await holder.fetchval(
            "SELECT count(*) FROM onward_schema_migrations WHERE version = 21"
        )
    finally:
        await holder.close()
    assert code == 5, stderr
    assert took < 15
    assert applied == 0  # rolled back whole: the next migrate applies it
    refused = stderr.strip().splitlines()[-1]
    assert "0021_quarantine_by_state" in refused, refused
    assert "2 s" in refused, refused
    code, stderr = await onward_migrate(database_url, schema, 2)
    assert code == 0, stderr


async def test_a_first_build_whose_registry_another_session_holds_is_given_up(
    database_url: str, new_pg_schema: SchemaFactory
) -> None:
    """Migrations applied but no frontiers build yet (a first `onward db migrate` stopped
    between the two), and a session in an open transaction holding the build registry (a user
    projection's long write, a person's ``BEGIN``): the first build's lock was waited for
    bounded by nothing, `onward db migrate` silent for as long as the other stayed open."""
    schema = await new_pg_schema(migrated=False)
    holder = await asyncpg.connect(database_url, server_settings={"search_path": schema})
    try:
        await migrate_postgres(holder)
        transaction = holder.transaction()
        await transaction.start()
        await holder.execute("LOCK TABLE onward_projection_builds IN ROW SHARE MODE")
        began = time.monotonic()
        code, stderr = await onward_migrate(database_url, schema, 2)
        took = time.monotonic() - began
        await transaction.rollback()
    finally:
        await holder.close()
    assert code == 5, stderr
    assert took < 15
    refused = stderr.strip().splitlines()[-1]
    assert "frontiers build" in refused, refused
    assert "2 s" in refused, refused
    code, stderr = await onward_migrate(database_url, schema, 2)
    assert code == 0, stderr
