"""`SqliteLeaseStore`: the conformance suite, plus what only a shared file has."""

from __future__ import annotations

import sqlite3
from contextlib import AsyncExitStack, closing
from pathlib import Path

import pytest

from onward.errors import SchemaMismatchError
from onward.runtime.leases import LeaseStore, SqliteLeaseStore
from onward.testing import LeaseStoreConformance
from onward.testing.eventlog import TENANT, new_run_id
from onward.testing.leases import assert_exactly_one_acquires


class TestSqliteLeaseStore(LeaseStoreConformance):
    path: Path

    @pytest.fixture(autouse=True)
    def _file(self, tmp_path: Path) -> None:
        self.path = tmp_path / "leases.db"

    async def open_store(self) -> LeaseStore:
        return await SqliteLeaseStore.open(self.path)

    async def wiped(self, store: LeaseStore, run_id: str) -> LeaseStore:
        """A store on a new file: the leases file lost, or never there when the run began."""
        self.path = self.path.with_name("wiped.db")
        return await super().wiped(store, run_id)


async def test_stores_on_one_file_let_exactly_one_acquire(tmp_path: Path) -> None:
    # Each store has its own connection and thread, as separate processes would.
    async with AsyncExitStack() as stack:
        stores = [
            await stack.enter_async_context(SqliteLeaseStore(tmp_path / "shared.db"))
            for _ in range(8)
        ]
        await assert_exactly_one_acquires(stores, contenders=8)


async def test_the_fence_survives_reopening_the_file(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    run_id = new_run_id()
    async with SqliteLeaseStore(path) as store:
        first = await store.acquire(run_id, tenant=TENANT, holder="w1", ttl_s=30)
        await store.release(first)
    async with SqliteLeaseStore(path) as store:
        second = await store.acquire(run_id, tenant=TENANT, holder="w2", ttl_s=30)
    assert second.fence > first.fence


async def test_a_released_row_keeps_its_fence_and_clears_holder_and_expiry(
    tmp_path: Path,
) -> None:
    path = tmp_path / "leases.db"
    run_id = new_run_id()
    async with SqliteLeaseStore(path) as store:
        lease = await store.acquire(run_id, tenant=TENANT, holder="w1", ttl_s=30)
        await store.release(lease)
    with closing(sqlite3.connect(path)) as conn:
        row = conn.execute(
            "SELECT holder, fence, expires_at FROM onward_leases WHERE run_id = ?", (run_id,)
        ).fetchone()
    assert row == (None, lease.fence, None)


async def test_an_unmigrated_file_is_refused_without_migrate(tmp_path: Path) -> None:
    with pytest.raises(SchemaMismatchError):
        await SqliteLeaseStore.open(tmp_path / "empty.db", migrate=False)
