from __future__ import annotations

import pytest
from support.pg import SchemaFactory

from onward.projections.base import FrontierStore, Snapshot
from onward.projections.frontier import Frontier
from onward.projections.postgres import PostgresFrontierStore
from onward.testing import FrontierStoreConformance
from onward.testing.storage import PostgresConnectionLossConformance


class TestPostgresFrontierStore(FrontierStoreConformance, PostgresConnectionLossConformance):
    database_url: str
    new_schema: SchemaFactory
    lock_table = "onward_projector_positions"

    @pytest.fixture(autouse=True)
    def _schemas(self, database_url: str, new_pg_schema: SchemaFactory) -> None:
        self.database_url = database_url
        self.new_schema = new_pg_schema

    async def open_store(self) -> FrontierStore:
        schema = await self.new_schema()
        return await PostgresFrontierStore.open(self.database_url, schema=schema)

    async def open_connected_store(self, database_url: str, schema: str) -> PostgresFrontierStore:
        return await PostgresFrontierStore.open(database_url, schema=schema)

    async def use_store(self, store: PostgresFrontierStore) -> None:
        await store.positions("frontiers")


class TestPostgresFrontierStoreWithoutSynchronousCommit(TestPostgresFrontierStore):
    """The same contract for the store as projectors open it: commits not waiting for disk."""

    async def open_store(self) -> FrontierStore:
        schema = await self.new_schema()
        return await PostgresFrontierStore.open(
            self.database_url, schema=schema, synchronous_commit=False, max_size=1
        )

    async def test_the_setting_stays_inside_the_write(self) -> None:
        store = await self.open_store()
        assert isinstance(store, PostgresFrontierStore)
        try:
            frontier = Frontier.empty("r-1", "acme")
            await store.write("frontiers", {0: 1}, [Snapshot.of(frontier)], [])
            # The pool's one connection wrote; it must not carry the setting to other work.
            async with store._live_pool().acquire() as conn:
                assert await conn.fetchval("SHOW synchronous_commit") == "on"
            assert (await store.positions("frontiers")) == {0: 1}
            stored = await store.get("r-1")
            assert stored is not None
            assert stored.frontier == frontier
        finally:
            await store.close()
