"""`GarbageCollector()`, `ExecutionManager()` and `CheckpointCompactor()` built with no
arguments work on the stores the environment's settings name, as ``onward gc``, ``onward runs``
and ``onward compact`` do; built with stores, they use those."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from support import cli_agent

from onward.errors import ConfigurationError, InvalidInputError
from onward.projections.memory import MemoryFrontierStore
from onward.runtime import ExecutionManager, GarbageCollector
from onward.runtime.backends import open_backends
from onward.runtime.compaction import CheckpointCompactor
from onward.runtime.settings import Settings

A_YEAR_S = 366 * 86_400.0


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A SQLite deployment named by the environment alone, with a run that finished and one
    waiting on a person."""
    path = tmp_path / "onward.db"
    for variable in ("REDIS_URL", "DATABASE_URL", "CHECKPOINTER_BACKEND", "ENVIRONMENT"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("ONWARD_BACKEND", "sqlite")
    monkeypatch.setenv("ONWARD_SQLITE_PATH", str(path))

    async def runs() -> None:
        async with open_backends(Settings()) as backends:
            booker = backends.runner(cli_agent.booking_model())
            await booker.run(cli_agent.booker(), "go", tenant="acme", run_id="done")
            payer = backends.runner(cli_agent.paying_model())
            await payer.run(cli_agent.payer(), "go", tenant="acme", run_id="waiting")

    asyncio.run(runs())
    return path


async def test_a_garbage_collector_without_stores_collects_from_the_settings(db: Path) -> None:
    now = await GarbageCollector().dry_run()
    assert now.total == 0
    later = GarbageCollector(clock=lambda: time.time() + A_YEAR_S)
    counted = await later.dry_run()
    assert counted.expired == ("done",)
    assert counted.count("frontiers") == 1
    deleted = await later.run()
    assert deleted.counts == counted.counts
    async with open_backends(Settings(), readonly=True) as backends:
        assert await backends.frontiers.get("done") is None
        assert await backends.frontiers.get("waiting") is not None


async def test_an_execution_manager_without_stores_reads_the_settings(db: Path) -> None:
    manager = ExecutionManager()
    try:
        pending = await manager.list_pending()
        assert [(p.summary.run_id, p.attention) for p in pending] == [
            ("waiting", "waiting_on_approval")
        ]
        status = await manager.get_status("done")
        assert status.summary.status == "completed"
    finally:
        await manager.close()
    async with ExecutionManager(tenant="other") as theirs:
        assert await theirs.list_pending() == []


async def test_a_compactor_without_stores_compacts_the_settings_log(db: Path) -> None:
    compactor = CheckpointCompactor(max_checkpoints=1, compaction_interval_mins=60)
    report = await compactor.compact(dry_run=True)
    assert len(report.partitions) == Settings().partitions
    assert report.events_cut == 0  # nothing is cut without an archive
    await compactor.start()
    try:
        for _ in range(100):
            if compactor.last_report is not None or compactor.last_error is not None:
                break
            await asyncio.sleep(0.05)
    finally:
        await compactor.close()
    assert compactor.last_error is None
    assert compactor.last_report is not None
    assert not compactor.last_report.dry_run
    with pytest.raises(InvalidInputError, match="holds none between passes"):
        _ = compactor.log


def test_without_stores_the_memory_backend_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONWARD_BACKEND", "memory")
    for build in (GarbageCollector, ExecutionManager, CheckpointCompactor):
        with pytest.raises(ConfigurationError, match="ONWARD_BACKEND=memory"):
            build()


def test_stores_given_are_used_and_half_of_them_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Settings that could not be read do not matter when the stores are given.
    monkeypatch.setenv("ONWARD_BACKEND", "bogus")
    store = MemoryFrontierStore()
    assert ExecutionManager(store).frontiers is store
    with pytest.raises(InvalidInputError, match="together, or none"):
        CheckpointCompactor(frontiers=store)


async def test_an_execution_manager_without_stores_sees_runs_written_after_it_opened(
    db: Path,
) -> None:
    """Opened while no process had the file open, it still sees a run a worker leaves waiting
    on a person afterwards (while the worker's stores are open, and after), not the file as it
    was at its first question."""
    assert not Path(f"{db}-wal").exists()  # noqa: ASYNC240
    async with ExecutionManager() as manager:
        assert [p.summary.run_id for p in await manager.list_pending()] == ["waiting"]
        async with open_backends(Settings()) as backends:
            payer = backends.runner(cli_agent.paying_model())
            await payer.run(cli_agent.payer(), "go", tenant="acme", run_id="later")
            assert sorted(p.summary.run_id for p in await manager.list_pending()) == [
                "later",
                "waiting",
            ]
        assert (await manager.get_status("later")).summary.status == "waiting"
