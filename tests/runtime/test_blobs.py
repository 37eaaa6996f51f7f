"""Blob stores: `BlobStoreConformance` on memory, SQLite and PostgreSQL, and connection loss."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import asyncpg
import msgspec
import pytest
from support.pg import fresh_schema

from onward.errors import HistoryUnavailableError
from onward.eventlog.events import ToolCompleted
from onward.eventlog.references import BLOB_REF
from onward.runtime.blobs import (
    BlobStore,
    ClaimCheck,
    MemoryBlobStore,
    PostgresBlobStore,
    SqliteBlobStore,
)
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


_RESULT = {"amount": 1000, "to": "acct-1", "pad": "x" * 2048}
"""A tool result over the claim check's threshold below."""
_ALTERED = msgspec.json.encode({**_RESULT, "amount": 9000})
"""Its body with one number changed in the store: still JSON, no longer the body stored."""


async def _shrunk(store: BlobStore) -> tuple[ClaimCheck, ToolCompleted, str]:
    claim_check = ClaimCheck(store, threshold=1024)
    event = ToolCompleted(run_id="r-1", tenant="t", seq=4, fence=1, call_id="c1", result=_RESULT)
    shrunk = await claim_check.shrink(event)
    assert isinstance(shrunk, ToolCompleted)
    return claim_check, shrunk, shrunk.result[BLOB_REF]


async def _refused(claim_check: ClaimCheck, shrunk: ToolCompleted, digest: str) -> None:
    with pytest.raises(HistoryUnavailableError) as altered:
        await claim_check.restore(shrunk)
    assert digest in str(altered.value)
    assert "run 'r-1' seq 4" in str(altered.value)


async def _repaired(claim_check: ClaimCheck, shrunk: ToolCompleted) -> None:
    """The same result moved out again (another run, a worker trying again) is read back
    whole: the put that had the body in hand replaced the damaged bytes."""
    again = await claim_check.shrink(
        ToolCompleted(run_id="r-2", tenant="t", seq=6, fence=1, call_id="c1", result=_RESULT)
    )
    assert isinstance(again, ToolCompleted)
    assert again.result == shrunk.result
    restored = await claim_check.restore(again)
    assert isinstance(restored, ToolCompleted)
    assert restored.result == _RESULT
    assert (await claim_check.restore(shrunk)) == msgspec.structs.replace(shrunk, result=_RESULT)


async def test_a_body_altered_in_the_memory_store_is_refused_then_repaired_by_a_put() -> None:
    store = MemoryBlobStore()
    claim_check, shrunk, digest = await _shrunk(store)
    store._bodies[digest] = _ALTERED
    await _refused(claim_check, shrunk, digest)
    await _repaired(claim_check, shrunk)


async def test_a_body_altered_in_the_sqlite_store_is_refused_then_repaired_by_a_put(
    tmp_path: Path,
) -> None:
    path = tmp_path / "blobs.db"
    async with SqliteBlobStore(path) as store:
        claim_check, shrunk, digest = await _shrunk(store)
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE onward_blobs SET body = ? WHERE digest = ?", (_ALTERED, digest))
        await _refused(claim_check, shrunk, digest)
        await _repaired(claim_check, shrunk)


async def test_a_body_altered_in_the_postgres_store_is_refused_then_repaired_by_a_put(
    database_url: str,
) -> None:
    async with (
        fresh_schema(database_url) as schema,
        PostgresBlobStore(database_url, schema=schema) as store,
    ):
        claim_check, shrunk, digest = await _shrunk(store)
        conn = await asyncpg.connect(database_url, server_settings={"search_path": schema})
        try:
            await conn.execute(
                "UPDATE onward_blobs SET body = $1 WHERE digest = $2", _ALTERED, digest
            )
        finally:
            await conn.close()
        await _refused(claim_check, shrunk, digest)
        await _repaired(claim_check, shrunk)
