"""Blob stores: `BlobStoreConformance` on memory, SQLite and PostgreSQL, and connection loss."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.pg import fresh_schema

from onward.runtime.blobs import BlobStore, MemoryBlobStore, PostgresBlobStore, SqliteBlobStore
from onward.testing import BlobStoreConformance
from onward.testing.storage import PostgresConnectionLossConformance


class TestMemoryBlobStore(BlobStoreConformance):
    async def open_store(self) -> BlobStore:
        return MemoryBlobStore()


class TestSqliteBlobStore(BlobStoreConformance):
    """Every store of a test is on one file, as every process of a deployment is."""

    path: Path

    @pytest.fixture(autouse=True)
    def _file(self, tmp_path: Path) -> None:
        self.path = tmp_path / "blobs.db"

    async def open_store(self) -> BlobStore:
        return await SqliteBlobStore.open(self.path)

    async def open_another(self, store: BlobStore) -> BlobStore:
        return await SqliteBlobStore.open(self.path)


class TestPostgresBlobStore(BlobStoreConformance):
    """Every store of a test is on one schema of its own, as every worker of a deployment."""

    database_url: str
    schema: str

    @pytest.fixture(autouse=True)
    def _server(self, database_url: str) -> None:
        self.database_url = database_url

    async def open_store(self) -> BlobStore:
        self.schema = await self.exit_stack.enter_async_context(fresh_schema(self.database_url))
        return await PostgresBlobStore.open(self.database_url, schema=self.schema)

    async def open_another(self, store: BlobStore) -> BlobStore:
        return await PostgresBlobStore.open(self.database_url, schema=self.schema)


class TestPostgresBlobStoreConnectionLoss(PostgresConnectionLossConformance):
    lock_table = "onward_blobs"

    async def open_connected_store(self, database_url: str, schema: str) -> PostgresBlobStore:
        return await PostgresBlobStore.open(database_url, schema=schema)

    async def use_store(self, store: PostgresBlobStore) -> None:
        await store.put(b"a body")
