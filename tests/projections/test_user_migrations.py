"""The frontier-user migrations bring a database of the previous version up to date: the
`user_id` column (every PostgreSQL build, and the view) that "who is waiting" filters on."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import msgspec
from support.pg import SchemaFactory, migrates_again
from support.stores import sqlite_migrated_back

from onward.projections.base import FrontierStore, Snapshot
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.sqlite import SqliteFrontierStore
from onward.testing.eventlog import new_run_id
from onward.testing.frontiers import CONSUMER, frontier


async def _a_users_run_is_found_by_user(store: FrontierStore) -> None:
    run_id = new_run_id()
    row = msgspec.structs.replace(frontier(run_id, through=3), user_id="ann")
    await store.write(CONSUMER, {1: 4}, [Snapshot.of(row)], [])
    assert [s.run_id for s in await store.runs(user="ann")] == [run_id]
    assert await store.runs(user="bob") == []


async def test_postgres_0008_adds_the_column_to_existing_builds_and_the_view(
    database_url: str, new_pg_schema: SchemaFactory
) -> None:
    schema = await new_pg_schema()
    dropped = "ALTER TABLE onward_frontiers_1 DROP COLUMN user_id CASCADE"
    view = "CREATE VIEW onward_frontiers AS SELECT * FROM onward_frontiers_1"
    await migrates_again(database_url, schema, "0008_frontier_user", [dropped, view], "user_id")
    index = "SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexname = $2"
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval(index, schema, "onward_frontiers_1_by_user_status") == 1
    finally:
        await conn.close()
    async with PostgresFrontierStore(database_url, schema=schema) as store:
        await _a_users_run_is_found_by_user(store)


async def test_sqlite_0009_adds_the_column(tmp_path: Path) -> None:
    path = tmp_path / "onward.db"
    undo = [
        "DROP INDEX onward_frontiers_by_user_status",
        "ALTER TABLE onward_frontiers DROP COLUMN user_id",
    ]
    await sqlite_migrated_back(path, 9, undo)
    async with SqliteFrontierStore(path) as store:
        await _a_users_run_is_found_by_user(store)
