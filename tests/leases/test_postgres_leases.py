"""`PostgresLeaseStore`: the conformance suite, plus what only a shared server has."""

from __future__ import annotations

from contextlib import AsyncExitStack

import asyncpg
import pytest
from support.pg import fresh_schema

from onward.errors import BackendUnavailableError, SchemaMismatchError
from onward.runtime.leases import Leaseholder, LeaseStore, PostgresLeaseStore, RunLease
from onward.runtime.leases.presence import default_holder
from onward.testing import LeaseStoreConformance
from onward.testing.eventlog import TENANT, new_run_id
from onward.testing.leases import assert_exactly_one_acquires, policy
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


class AnswerLost(PostgresLeaseStore):
    """The server commits an acquisition or a fence raise, then the connection drops before
    its answer."""

    raise_lost = False

    async def acquire(self, run_id: str, *, tenant: str, holder: str, ttl_s: float) -> RunLease:
        lease = await super().acquire(run_id, tenant=tenant, holder=holder, ttl_s=ttl_s)
        if self.raise_lost:
            return lease
        raise BackendUnavailableError("acquiring the lease: connection lost", run_id=run_id)

    async def raise_fence(self, lease: RunLease, *, above: int) -> RunLease:
        await super().raise_fence(lease, above=above)
        raise BackendUnavailableError("raising the fence: connection lost", run_id=lease.run_id)


async def test_an_acquisition_whose_answer_is_lost_leaves_the_run_free(
    database_url: str,
) -> None:
    async with (
        fresh_schema(database_url) as schema,
        AnswerLost(database_url, schema=schema) as store,
    ):
        run_id = new_run_id()
        with pytest.raises(BackendUnavailableError):
            async with Leaseholder(
                store, run_id, tenant=TENANT, holder=default_holder(), policy=policy(60)
            ):
                pytest.fail("the block must not be entered")
        left = await store.current(run_id)
        assert left is None, f"the failed acquisition left the run held by nobody: {left}"


async def test_a_fence_raise_whose_answer_is_lost_is_kept(database_url: str) -> None:
    """The holder goes on under the fence the server raised, and its release hands the run
    back rather than being refused as superseded."""
    async with (
        fresh_schema(database_url) as schema,
        AnswerLost(database_url, schema=schema) as store,
    ):
        store.raise_lost = True
        run_id = new_run_id()
        async with Leaseholder(
            store, run_id, tenant=TENANT, holder=default_holder(), policy=policy(60)
        ) as held:
            first = held.lease
            raised = await held.raise_fence(first.fence + 10)
            assert raised.fence > first.fence + 10
            assert await store.current(run_id) == raised
        left = await store.current(run_id)
        assert left is None, f"the block left the run held by nobody: {left}"
