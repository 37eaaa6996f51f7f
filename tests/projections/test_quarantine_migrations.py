"""The quarantine migrations bring a database of the previous version up to date: the table,
and the `quarantined` column on frontier tables (every PostgreSQL build, and the view)."""

from __future__ import annotations

from pathlib import Path

from support.pg import SchemaFactory, migrates_again
from support.stores import sqlite_migrated_back

from onward.projections.base import FrontierStore, Snapshot
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.sqlite import SqliteFrontierStore
from onward.testing.eventlog import new_run_id
from onward.testing.frontiers import CONSUMER, frontier, poison


async def assert_a_quarantined_row_round_trips(store: FrontierStore) -> None:
    """A row written with a quarantine entry reads back with its mark (the migration is done)."""
    run_id = new_run_id()
    entry = poison(run_id, offset=4)
    await store.write(
        CONSUMER, {1: 5}, [Snapshot.of(frontier(run_id, through=3))], [], quarantine=[entry]
    )
    row = await store.get(run_id)
    assert row is not None
    assert row.quarantined == entry.mark


async def test_postgres_0004_adds_the_table_and_the_column_to_existing_builds(
    database_url: str, new_pg_schema: SchemaFactory
) -> None:
    schema = await new_pg_schema()
    undo = [
        "DROP TABLE onward_quarantine",
        "ALTER TABLE onward_frontiers_1 DROP COLUMN quarantined CASCADE",
        "CREATE VIEW onward_frontiers AS SELECT * FROM onward_frontiers_1",
    ]
    await migrates_again(database_url, schema, "0004_quarantine", undo, "quarantined")
    async with PostgresFrontierStore(database_url, schema=schema) as store:
        await assert_a_quarantined_row_round_trips(store)


async def test_sqlite_0005_adds_the_table_and_the_column(tmp_path: Path) -> None:
    path = tmp_path / "onward.db"
    undo = ["DROP TABLE onward_quarantine", "ALTER TABLE onward_frontiers DROP COLUMN quarantined"]
    await sqlite_migrated_back(path, 5, undo)
    async with SqliteFrontierStore(path) as store:
        await assert_a_quarantined_row_round_trips(store)
