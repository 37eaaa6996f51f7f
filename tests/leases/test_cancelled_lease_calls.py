"""A `Leaseholder` cancelled while the store answers it leaves nothing the store did behind.

An acquisition the store may still grant, with nobody left to hold it, is handed back rather
than left to keep the run for a whole ttl; a fence raise the store made is kept, so the holder's
release still hands the run back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from onward.errors import ResumeConflictError
from onward.runtime.leases import (
    Leaseholder,
    LeaseStore,
    PostgresLeaseStore,
    RedisLeaseStore,
    RunLease,
    SqliteLeaseStore,
)
from onward.testing.eventlog import TENANT, new_run_id
from onward.testing.leases import policy

TTL_S = 60.0
ANSWER_LATE_S = 0.2


@pytest_asyncio.fixture
async def redis_store(redis_url: str, redis_prefix: str) -> AsyncIterator[RedisLeaseStore]:
    async with RedisLeaseStore(redis_url, prefix=redis_prefix) as opened:
        yield opened


async def _free_for_another(store: LeaseStore, run_id: str) -> None:
    """Another worker takes the run within a few seconds, not a ttl."""
    try:
        async with asyncio.timeout(5):
            while True:
                try:
                    lease = await store.acquire(run_id, tenant=TENANT, holder="w2", ttl_s=TTL_S)
                except ResumeConflictError:
                    await asyncio.sleep(0.05)
                    continue
                break
    except TimeoutError:
        pytest.fail(f"the cancelled acquisition left the run held: {await store.current(run_id)}")
    assert lease.holder == "w2"


async def _cancel_while_acquiring(store: LeaseStore, run_id: str, acquiring: asyncio.Event) -> None:
    async def work() -> None:
        async with Leaseholder(store, run_id, tenant=TENANT, holder="w1", policy=policy(TTL_S)):
            pytest.fail("the block must not be entered")

    working = asyncio.create_task(work())
    await acquiring.wait()
    working.cancel()
    with pytest.raises(asyncio.CancelledError):
        await working


async def test_redis_acquisition_sent_then_cancelled(
    redis_store: RedisLeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script is queued when the caller is cancelled; Redis runs it all the same."""
    run_id = new_run_id()
    acquiring = asyncio.Event()
    acquire = redis_store.acquire

    async def acquire_then_tell(run_id: str, **kwargs: object) -> RunLease:
        acquiring.set()  # the script is queued in this same step, before the caller can resume
        return await acquire(run_id, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(redis_store, "acquire", acquire_then_tell)
    await _cancel_while_acquiring(redis_store, run_id, acquiring)
    monkeypatch.undo()
    await _free_for_another(redis_store, run_id)


async def _acquire_answered_late(
    store: LeaseStore, run_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store grants the lease, and its answer is on its way when the caller is cancelled."""
    acquiring = asyncio.Event()
    acquire = store.acquire

    async def granted_then_late(run_id: str, **kwargs: object) -> RunLease:
        lease = await acquire(run_id, **kwargs)  # type: ignore[arg-type]
        acquiring.set()
        await asyncio.sleep(ANSWER_LATE_S)
        return lease

    monkeypatch.setattr(store, "acquire", granted_then_late)
    await _cancel_while_acquiring(store, run_id, acquiring)
    monkeypatch.undo()
    await _free_for_another(store, run_id)


async def test_sqlite_acquisition_answered_after_cancel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await SqliteLeaseStore.open(tmp_path / "leases.db") as store:
        await _acquire_answered_late(store, new_run_id(), monkeypatch)


async def test_postgres_acquisition_answered_after_cancel(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await PostgresLeaseStore.open(database_url, schema=pg_schema) as store:
        await _acquire_answered_late(store, new_run_id(), monkeypatch)


async def _cancel_while_raising(store: LeaseStore, raising: asyncio.Event) -> None:
    """Cancel a block in its fence raise; the run must be free once the block is over."""
    run_id = new_run_id()
    held = Leaseholder(store, run_id, tenant=TENANT, holder="w1", policy=policy(TTL_S))

    async def work() -> None:
        async with held:
            await held.raise_fence(held.lease.fence + 10)

    working = asyncio.create_task(work())
    await raising.wait()
    working.cancel()
    with pytest.raises(asyncio.CancelledError):
        await working

    left = await store.current(run_id)
    assert left is None, f"the cancelled block left the run held: {left} (holder had {held.lease})"


async def test_redis_raise_sent_then_cancelled(
    redis_store: RedisLeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script is queued when the caller is cancelled; Redis runs it all the same."""
    raising = asyncio.Event()
    raise_fence = redis_store.raise_fence

    async def raise_fence_then_tell(lease: RunLease, *, above: int) -> RunLease:
        raising.set()  # the script is queued in this same step, before the caller can resume
        return await raise_fence(lease, above=above)

    monkeypatch.setattr(redis_store, "raise_fence", raise_fence_then_tell)
    await _cancel_while_raising(redis_store, raising)


async def _raise_answered_late(store: LeaseStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store raises the fence, and its answer is on its way when the caller is cancelled."""
    raising = asyncio.Event()
    raise_fence = store.raise_fence

    async def raised_then_late(lease: RunLease, *, above: int) -> RunLease:
        raised = await raise_fence(lease, above=above)
        raising.set()
        await asyncio.sleep(ANSWER_LATE_S)
        return raised

    monkeypatch.setattr(store, "raise_fence", raised_then_late)
    await _cancel_while_raising(store, raising)


async def test_sqlite_raise_answered_after_cancel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await SqliteLeaseStore.open(tmp_path / "leases.db") as store:
        await _raise_answered_late(store, monkeypatch)


async def test_postgres_raise_answered_after_cancel(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await PostgresLeaseStore.open(database_url, schema=pg_schema) as store:
        await _raise_answered_late(store, monkeypatch)
