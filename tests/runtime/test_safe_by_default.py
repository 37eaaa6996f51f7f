"""Safe by default: the README's shortest runner keeps one writer per run, no lease argument."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from support.processes import reaped
from support.workers import TENANT, Ledger, agent, provider

from onward.errors import ConfigurationError
from onward.eventlog import Event, KafkaEventLog, MemoryEventLog, SqliteEventLog
from onward.runtime.leases import MemoryLeaseStore, SqliteLeaseStore
from onward.runtime.runner import AgentRunner

TESTS = Path(__file__).resolve().parents[1]


class StoppedBeforeTheModelCallError(Exception):
    """Stands in for a worker that died once its run started (its lease is released)."""


class _Stop:
    async def appended(self, events: Sequence[Event]) -> None:
        return None

    async def tool_returned(self, call_id: str) -> None:
        return None

    async def before_model_call(self) -> None:
        raise StoppedBeforeTheModelCallError


async def test_two_processes_resuming_one_sqlite_run_with_the_readme_runner_make_one_booking(
    tmp_path: Path,
) -> None:
    db, ledger = tmp_path / "onward.db", Ledger(str(tmp_path / "ledger.jsonl"))
    async with SqliteEventLog(db) as log:
        first = AgentRunner(provider=provider(), log=log, observer=_Stop())
        with pytest.raises(StoppedBeforeTheModelCallError):
            await first.run(agent(ledger), "go", tenant=TENANT, run_id="run-1")
        await first.close()
    async with reaped() as workers:
        for _ in range(2):
            workers.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "support.readme_worker",
                    str(db),
                    str(ledger.path),
                    "run-1",
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    env={**os.environ, "PYTHONPATH": str(TESTS)},
                )
            )
        for worker in workers:
            assert worker.stdout is not None
            assert (await asyncio.wait_for(worker.stdout.readline(), 60)).strip() == b"ready"
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write(b"go\n")
            await worker.stdin.drain()
        outcomes = [json.loads((await asyncio.wait_for(w.communicate(), 120))[0]) for w in workers]
    carried = [o for o in outcomes if o["outcome"] == "carried"]
    conflicts = [o for o in outcomes if o["outcome"] == "conflict"]
    assert len(carried) == 1, outcomes
    assert carried[0]["status"] == "completed"
    assert len(conflicts) == 1, outcomes
    assert conflicts[0]["holder"].startswith("worker-")
    assert (ledger.count("search"), ledger.count("book")) == (1, 1), ledger.entries()


async def test_the_embedded_logs_bring_their_own_lease_store(tmp_path: Path) -> None:
    memory = MemoryEventLog()
    one = AgentRunner(provider=provider(), log=memory)
    other = AgentRunner(provider=provider(), log=memory)
    assert isinstance(one.leases, MemoryLeaseStore)
    assert one.leases is other.leases  # every runner of the process writing to it shares one
    async with (
        SqliteEventLog(tmp_path / "onward.db") as log,
        AgentRunner(provider=provider(), log=log) as runner,
    ):
        assert isinstance(runner.leases, SqliteLeaseStore)
        lease = await runner.leases.acquire("r", tenant=TENANT, holder="w", ttl_s=60)
        async with SqliteLeaseStore(tmp_path / "onward.db") as same_file:
            assert await same_file.current("r") == lease


async def test_a_kafka_log_without_a_lease_store_is_refused_naming_the_stores() -> None:
    log = KafkaEventLog("127.0.0.1:1", topic="never-opened")
    with pytest.raises(ConfigurationError, match=r"RedisLeaseStore.*PostgresLeaseStore"):
        AgentRunner(provider=provider(), log=log)
