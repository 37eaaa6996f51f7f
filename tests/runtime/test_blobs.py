"""Blob stores: a body stored once by digest, a missing one refused, connection loss survived."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import pytest_asyncio
from support.pg import fresh_schema

from onward.errors import HistoryUnavailableError
from onward.runtime.blobs import (
    BlobStore,
    MemoryBlobStore,
    PostgresBlobStore,
    SqliteBlobStore,
    digest_of,
)
from onward.testing.storage import PostgresConnectionLossConformance


@pytest_asyncio.fixture(params=["memory", "sqlite", "postgres"])
async def blobs(
    request: pytest.FixtureRequest, tmp_path: Path, database_url: str
) -> AsyncIterator[BlobStore]:
    async with AsyncExitStack() as stack:
        store: BlobStore
        if request.param == "memory":
            store = MemoryBlobStore()
        elif request.param == "sqlite":
            store = await stack.enter_async_context(SqliteBlobStore(tmp_path / "blobs.db"))
        else:
            schema = await stack.enter_async_context(fresh_schema(database_url))
            store = await stack.enter_async_context(PostgresBlobStore(database_url, schema=schema))
        yield store
        await store.close()


async def test_a_body_is_stored_once_under_its_digest(blobs: BlobStore) -> None:
    body = b'{"rows": 1}' * 100
    digest = await blobs.put(body)
    assert digest == digest_of(body)
    assert await blobs.put(body) == digest
    assert await blobs.get(digest) == body


async def test_a_missing_body_is_history_unavailable(blobs: BlobStore) -> None:
    with pytest.raises(HistoryUnavailableError, match="not in the blob store"):
        await blobs.get(digest_of(b"never stored"))


async def test_closing_twice_is_harmless(blobs: BlobStore) -> None:
    await blobs.close()
    await blobs.close()


class TestPostgresBlobStoreConnectionLoss(PostgresConnectionLossConformance):
    lock_table = "onward_blobs"

    async def open_connected_store(self, database_url: str, schema: str) -> PostgresBlobStore:
        return await PostgresBlobStore.open(database_url, schema=schema)

    async def use_store(self, store: PostgresBlobStore) -> None:
        await store.put(b"a body")
