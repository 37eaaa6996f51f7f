"""Another tenant's request must not touch a run before its tenant is checked.

Real embedded stores (SQLite); the worker is built in the test's process.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.appapi import agents, provider, until

from onward.errors import HistoryUnavailableError, NothingToResumeError
from onward.eventlog import MemoryEventLog
from onward.eventlog.base import partition_for
from onward.projections.memory import MemoryFrontierStore
from onward.runtime.agent import Agent
from onward.runtime.backends import open_backends
from onward.runtime.demo_ledger import Ledger
from onward.runtime.fleet.requests import CancelRun, StartRun
from onward.runtime.fleet.worker import Worker
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.runner import AgentRunner
from onward.runtime.settings import Settings

TENANT = "acme"


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    return Ledger(tmp_path / "ledger.jsonl")


async def test_another_tenants_cancel_does_not_stop_a_run_the_worker_drives(
    tmp_path: Path, ledger: Ledger
) -> None:
    """A CancelRun naming tenant ``evil`` for acme's run is refused as no such run; before the
    fix it first stopped acme's run at its next boundary and released its lease."""
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")
    async with open_backends(settings) as backends:
        worker = Worker(backends, provider(), agents, backoff_s=0.1)
        worker.submit(StartRun(run_id="loop-1", tenant=TENANT, agent="looper"))

        async def ticks(n: int) -> bool:
            return ledger.count("tick") >= n

        await until(lambda: ticks(3), "the run going")
        refused: list[bool] = []
        worker.submit(CancelRun(run_id="loop-1", tenant="evil", by="mallory"), refused.append)

        async def cancel_handled() -> bool:
            return bool(refused)

        await until(cancel_handled, "the cancel handled")
        lease = await backends.leases.current("loop-1")
        stopped = worker.stats.stopped
        carrying = worker.carrying("loop-1")
        worker.drain()
        await worker.drained()
        assert stopped == 0, "another tenant's cancel stopped acme's run"
        assert carrying
        assert lease is not None
        assert lease.tenant == TENANT


async def test_a_hole_in_another_tenants_run_reads_as_no_run() -> None:
    """A run whose log was cut past its row (retention) is a hole to its own tenant, and no
    run to another: before the fix ``inspect`` for tenant ``evil`` raised the hole, naming the
    run's partition and offsets, so confirming acme's run was there."""
    log, store = MemoryEventLog(), MemoryFrontierStore()
    reader = AgentRunner(
        log=log,
        worker="w",
        provider=ScriptedProvider([reply("hi")]),
        frontiers=store,
        checkpoint_inline=True,
    )
    await reader.run(Agent(name="n", instructions="i"), "go", tenant=TENANT, run_id="r")
    rowless = AgentRunner(log=log, worker="w2", provider=ScriptedProvider([]))
    for label in ("one", "two"):  # appended past the row, which stays behind them
        await rowless.tag("r", label, tenant=TENANT, seq=1)
    partition = partition_for("r", log.partitions)
    await log.truncate_before(partition, (await log.bounds(partition)).end - 1)
    with pytest.raises(HistoryUnavailableError):
        await reader.inspect("r", tenant=TENANT)
    with pytest.raises(NothingToResumeError, match="no run 'r' for tenant 'evil'"):
        await reader.inspect("r", tenant="evil")
