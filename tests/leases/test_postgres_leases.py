"""`PostgresLeaseStore`: the conformance suite, plus what only a shared server has."""

from __future__ import annotations

from contextlib import AsyncExitStack

import asyncpg
import pytest
from support.pg import fresh_schema

from onward.errors import BackendUnavailableError, SchemaMismatchError
from onward.runtime.leases import LeaseStore, PostgresLeaseStore
from onward.testing import LeaseStoreConformance
from onward.testing.eventlog import TENANT, new_run_id
from onward.testing.leases import assert_exactly_one_acquires
from onward.testing.storage import PostgresConnectionLossConformance


class TestPostgresLeaseStore(LeaseStoreConformance, PostgresConnectionLossConformance):
    """Every store it opens has a schema of its own, so a second one is a wiped store."""

    database_url: str
    lock_table = "onward_leases"

    @pytest.fixture(autouse=True)
    def _server(self, database_url: str) -> None:
        self.database_url = database_url

    async def open_store(self) -> LeaseStore:
        schema = await self.exit_stack.enter_async_context(fresh_schema(self.database_url))
        return await PostgresLeaseStore.open(self.database_url, schema=schema)

    async def open_connected_store(self, database_url: str, schema: str) -> PostgresLeaseStore:
        return await PostgresLeaseStore.open(database_url, schema=schema)

    async def use_store(self, store: PostgresLeaseStore) -> None:
        await store.current(new_run_id())


async def test_stores_with_their_own_pools_let_exactly_one_acquire(database_url: str) -> None:
    async with fresh_schema(database_url) as schema, AsyncExitStack() as stack:
        stores = [
            await stack.enter_async_context(
                PostgresLeaseStore(database_url, schema=schema, max_size=2)
            )
            for _ in range(5)
        ]
        await assert_exactly_one_acquires(stores, contenders=20)


async def test_a_released_row_keeps_its_fence(database_url: str) -> None:
    async with fresh_schema(database_url) as schema:
        async with PostgresLeaseStore(database_url, schema=schema) as store:
            run_id = new_run_id()
            lease = await store.acquire(run_id, tenant=TENANT, holder="w1", ttl_s=30)
            await store.release(lease)
        conn = await asyncpg.connect(database_url, server_settings={"search_path": schema})
        try:
            row = await conn.fetchrow(
                "SELECT holder, fence, expires_at FROM onward_leases WHERE run_id = $1", run_id
            )
        finally:
            await conn.close()
    assert row is not None
    assert (row["holder"], row["fence"], row["expires_at"]) == (None, lease.fence, None)


async def test_an_unmigrated_schema_is_refused(database_url: str, empty_pg_schema: str) -> None:
    with pytest.raises(SchemaMismatchError):
        await PostgresLeaseStore.open(database_url, schema=empty_pg_schema)


async def test_an_unreachable_server_is_retryable() -> None:
    with pytest.raises(BackendUnavailableError) as failed:
        await PostgresLeaseStore.open("postgresql://onward:onward@127.0.0.1:1/onward")
    assert failed.value.retryable
