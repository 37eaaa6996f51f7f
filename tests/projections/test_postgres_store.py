from __future__ import annotations

import pytest
from support.pg import SchemaFactory

from onward.errors import BackendError
from onward.projections.base import FrontierStore, Snapshot
from onward.projections.frontier import Frontier
from onward.projections.postgres import PostgresFrontierStore
from onward.testing import FrontierStoreConformance
from onward.testing.eventlog import new_run_id
from onward.testing.frontiers import CONSUMER, call_row, frontier
from onward.testing.storage import PostgresConnectionLossConformance

REFUSE_AT_COMMIT = """
CREATE FUNCTION refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'refused at commit: %', NEW.run_id; END $$;
CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT OR UPDATE ON {table}
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.run_id LIKE 'refused-%')
EXECUTE FUNCTION refuse_at_commit();
"""
"""A constraint checked at COMMIT, after every statement of the write has run: the write's
last moment to fail, as a server crash before the commit would make it fail."""


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

    async def test_a_write_refused_at_commit_stores_none_of_it(self) -> None:
        """Positions stored by the time of the COMMIT on any connection but the write's own
        would outlive the rows' rollback; the conformance suite's failures all come before the
        last statement, so only a failing COMMIT shows it."""
        store = await self.open_store()
        assert isinstance(store, PostgresFrontierStore)
        try:
            async with store._live_pool().acquire() as conn:
                await conn.execute(REFUSE_AT_COMMIT.format(table=f"onward_frontiers_{store.build}"))
            run_id, refused = new_run_id(), new_run_id("refused")
            before = frontier(run_id, through=3)
            first_call = call_row(run_id, "c1", through=3, outcome=None)
            await store.write(CONSUMER, {1: 4}, [Snapshot.of(before)], [first_call])
            newer = [Snapshot.of(frontier(r, through=9, iteration=7)) for r in (run_id, refused)]
            later_call = call_row(run_id, "c1", through=9, outcome="completed")
            with pytest.raises(BackendError, match="refused at commit"):
                await store.write(CONSUMER, {1: 10, 2: 10}, newer, [later_call])
            stored = await store.get(run_id)
            assert stored is not None
            assert stored.frontier == before
            assert await store.get(refused) is None
            assert await store.tool_calls(run_id) == [first_call]
            assert await store.positions(CONSUMER) == {1: 4}
        finally:
            await store.close()


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
