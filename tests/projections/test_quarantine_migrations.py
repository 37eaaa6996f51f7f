"""The quarantine migrations bring a database of the previous version up to date: the table,
and the `quarantined` column on frontier tables (every PostgreSQL build, and the view)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import asyncpg
from support.pg import SchemaFactory

from onward.projections.base import Snapshot
from onward.projections.postgres import PostgresFrontierStore, migrate
from onward.projections.sqlite import SqliteFrontierStore
from onward.testing.eventlog import new_run_id
from onward.testing.frontiers import CONSUMER, frontier, poison


async def test_postgres_0004_adds_the_table_and_the_column_to_existing_builds(
    database_url: str, new_pg_schema: SchemaFactory
) -> None:
    schema = await new_pg_schema()
    conn = await asyncpg.connect(database_url, server_settings={"search_path": schema})
    try:
        # Back to version 3, as a database migrated before this change is.
        await conn.execute("DROP TABLE onward_quarantine")
        await conn.execute("ALTER TABLE onward_frontiers_1 DROP COLUMN quarantined CASCADE")
        await conn.execute("CREATE VIEW onward_frontiers AS SELECT * FROM onward_frontiers_1")
        await conn.execute("DELETE FROM onward_schema_migrations WHERE version = 4")
        assert await migrate(conn) == ["0004_quarantine"]
        columns = await conn.fetch(
            "SELECT table_name FROM information_schema.columns WHERE table_schema = $1 "
            "AND column_name = 'quarantined' ORDER BY table_name",
            schema,
        )
        assert [r["table_name"] for r in columns] == ["onward_frontiers", "onward_frontiers_1"]
    finally:
        await conn.close()
    run_id = new_run_id()
    async with PostgresFrontierStore(database_url, schema=schema) as store:
        entry = poison(run_id, offset=4)
        await store.write(
            CONSUMER, {1: 5}, [Snapshot.of(frontier(run_id, through=3))], [], quarantine=[entry]
        )
        row = await store.get(run_id)
        assert row is not None
        assert row.quarantined == entry.mark


async def test_sqlite_0005_adds_the_table_and_the_column(tmp_path: Path) -> None:
    path = tmp_path / "onward.db"
    async with SqliteFrontierStore(path):
        pass
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("DROP TABLE onward_quarantine")
        conn.execute("ALTER TABLE onward_frontiers DROP COLUMN quarantined")
        conn.execute("DELETE FROM onward_schema_migrations WHERE version = 5")
    run_id = new_run_id()
    async with SqliteFrontierStore(path) as store:
        entry = poison(run_id, offset=4)
        await store.write(
            CONSUMER, {1: 5}, [Snapshot.of(frontier(run_id, through=3))], [], quarantine=[entry]
        )
        row = await store.get(run_id)
        assert row is not None
        assert row.quarantined == entry.mark
