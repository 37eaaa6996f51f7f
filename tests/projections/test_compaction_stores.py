"""`CompactionStoreConformance` on every backend: memory, SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest
from support.pg import SchemaFactory

from onward.projections.base import FrontierStore
from onward.projections.builds import create_build, switch_build
from onward.projections.compaction import (
    CompactionStore,
    LogCut,
    MemoryCompactionStore,
    PostgresCompactionStore,
    SqliteCompactionStore,
)
from onward.projections.memory import MemoryFrontierStore
from onward.projections.postgres import FRONTIERS, PostgresFrontierStore
from onward.projections.sqlite import SqliteFrontierStore
from onward.testing import CompactionStoreConformance


class TestMemoryCompactionStore(CompactionStoreConformance):
    async def open_stores(self) -> tuple[CompactionStore, FrontierStore]:
        frontiers = MemoryFrontierStore()
        return MemoryCompactionStore(frontiers), frontiers


class TestSqliteCompactionStore(CompactionStoreConformance):
    @pytest.fixture(autouse=True)
    def _folder(self, tmp_path: Path) -> None:
        self.db = tmp_path / "onward.db"

    async def open_stores(self) -> tuple[CompactionStore, FrontierStore]:
        frontiers = await SqliteFrontierStore.open(self.db)
        return await SqliteCompactionStore.open(self.db, sharing=frontiers), frontiers


async def test_a_read_only_sqlite_store_sees_what_was_written_after_it_opened(
    tmp_path: Path,
) -> None:
    """Opened on a quiet file (no ``-wal`` file: read ``immutable``), a read-only store (a
    dry run's, `ExecutionManager()`'s) sees what writers stored afterwards at its next read,
    not the file as it was when it opened it."""
    db = tmp_path / "onward.db"
    async with SqliteFrontierStore(db) as frontiers:
        await frontiers.write("frontiers", {0: 5}, [], [])
    async with SqliteCompactionStore(db, readonly=True) as reader:
        assert await reader.positions() == {"frontiers": {0: 5}}
        assert await reader.cuts() == []
        async with SqliteFrontierStore(db) as frontiers:
            await frontiers.write("frontiers", {0: 9}, [], [])
        assert await reader.positions() == {"frontiers": {0: 9}}
        cut = LogCut(partition=0, start=0, end=9, events=9, archive=None, at=1)
        async with SqliteCompactionStore(db) as store:
            await store.record_cut(cut)
        assert await reader.cuts() == [cut]


class TestPostgresCompactionStore(CompactionStoreConformance):
    @pytest.fixture(autouse=True)
    def _schemas(self, database_url: str, new_pg_schema: SchemaFactory) -> None:
        self.database_url = database_url
        self.new_schema = new_pg_schema

    async def open_stores(self) -> tuple[CompactionStore, FrontierStore]:
        self.schema = await self.new_schema()
        frontiers = await PostgresFrontierStore.open(self.database_url, schema=self.schema)
        store = await PostgresCompactionStore.open(self.database_url, schema=self.schema)
        return store, frontiers

    async def test_a_retired_builds_positions_do_not_count(
        self, stores: tuple[CompactionStore, FrontierStore]
    ) -> None:
        store, frontiers = stores
        await frontiers.write("frontiers", {0: 5}, [], [])
        conn = await asyncpg.connect(self.database_url)
        try:
            await conn.execute(f"SET search_path TO {self.schema}")
            build = await create_build(conn, FRONTIERS)
            await conn.execute(
                "INSERT INTO onward_projector_positions (consumer, partition, next_offset) "
                "VALUES ($1, 0, 9)",
                f"frontiers@{build}",
            )
            assert await store.positions() == {"frontiers@1": {0: 5}, f"frontiers@{build}": {0: 9}}
            await switch_build(conn, FRONTIERS, build)
        finally:
            await conn.close()
        assert await store.positions() == {f"frontiers@{build}": {0: 9}}
