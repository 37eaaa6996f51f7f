"""The quarantine migrations bring a database of the previous version up to date: the table,
and the `quarantined` column on frontier tables (every PostgreSQL build, and the view)."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import asyncpg
import pytest
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


async def years_of_quarantine(store: FrontierStore, *, many: int = 2_000) -> None:
    """``many`` entries of a run released and folded again, ``many`` of records that name no
    run (held for ever), and one entry released and not folded again yet."""
    old, new = new_run_id("old"), new_run_id("new")
    entries = [poison(old, offset=n) for n in range(many)]
    entries += [poison(None, offset=many + n) for n in range(many)]
    await store.write(CONSUMER, {1: 2 * many}, [], [], quarantine=entries)
    assert await store.release(CONSUMER, old, by="ops", at=1) == many
    await store.write(CONSUMER, {}, [], [], cleared=[old])
    await store.write(CONSUMER, {}, [], [], quarantine=[poison(new, offset=2 * many)])
    assert await store.release(CONSUMER, new, by="ops", at=2) == 1
    (released,) = await store.quarantined(CONSUMER, states={"released"})
    assert released.run_id == new


def _rows_read(plan: dict[str, Any], table: str) -> int:
    """The rows every scan of ``table`` in an `EXPLAIN (ANALYZE, FORMAT JSON)` plan read."""
    read = 0
    if plan.get("Relation Name") == table:
        read += plan["Actual Rows"] * plan["Actual Loops"] + plan.get("Rows Removed by Filter", 0)
        read += plan.get("Rows Removed by Index Recheck", 0)
    return read + sum(_rows_read(child, table) for child in plan.get("Plans", ()))


async def test_postgres_the_release_poll_reads_only_the_released_entries(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each projector looks for released runs every second: the look reads the entries
    waiting to be folded again, not every entry the quarantine ever held."""
    async with PostgresFrontierStore(database_url, schema=pg_schema) as store:
        await years_of_quarantine(store)
        asked: list[tuple[str, tuple[Any, ...]]] = []
        fetch = asyncpg.Connection.fetch

        async def recorded(self: asyncpg.Connection, query: str, *args: Any, **kw: Any) -> Any:
            asked.append((query, args))
            return await fetch(self, query, *args, **kw)

        monkeypatch.setattr(asyncpg.Connection, "fetch", recorded)
        assert len(await store.quarantined(CONSUMER, states={"released"})) == 1
        monkeypatch.undo()
    (query, args) = next((q, a) for q, a in asked if "onward_quarantine" in q)
    conn = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
    try:
        await conn.execute("ANALYZE onward_quarantine")
        (plan,) = json.loads(await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {query}", *args))
    finally:
        await conn.close()
    assert _rows_read(plan["Plan"], "onward_quarantine") == 1


async def test_sqlite_the_release_poll_reads_only_the_released_entries(tmp_path: Path) -> None:
    """An embedded fold looks for released runs on every catch-up: the look searches the
    entries waiting to be folded again, not every entry the quarantine ever held."""
    async with SqliteFrontierStore(tmp_path / "onward.db") as store:
        await years_of_quarantine(store)
        asked: list[str] = []
        await store._db.read(lambda conn: conn.set_trace_callback(asked.append), "tracing")
        assert len(await store.quarantined(CONSUMER, states={"released"})) == 1
        await store._db.read(lambda conn: conn.set_trace_callback(None), "tracing")
    query = next(q for q in asked if "onward_quarantine" in q)
    with closing(sqlite3.connect(tmp_path / "onward.db")) as conn:
        plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {query}")]
    assert any("state=?" in step for step in plan), plan
