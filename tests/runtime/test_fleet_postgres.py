"""`onward worker` processes on PostgreSQL alone (``ONWARD_BACKEND=postgres``): they find runs by
their frontier rows, which every process folds inline, and take them by their leases. Two
workers, one SIGKILLed mid-load: the other carries its runs on, and no side effect happens
twice."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Sequence
from pathlib import Path

import pytest
from support.fleet import agents, script
from support.processes import TESTS, kill_running, ready_workers

from onward.eventlog import Message
from onward.runtime.backends import Backends, open_backends
from onward.runtime.demo_ledger import Ledger
from onward.runtime.manager import ExecutionManager
from onward.runtime.providers import ModelReply, ScriptedProvider
from onward.runtime.settings import Settings

TENANT = "acme"
STEPS = 6


def _env(database_url: str, schema: str) -> dict[str, str]:
    return {
        "ONWARD_BACKEND": "postgres",
        "DATABASE_URL": database_url,
        "ONWARD_DATABASE_SCHEMA": schema,
        "ONWARD_PARTITIONS": "4",
    }


async def _interrupted_runs(settings: Settings, names: Sequence[str]) -> list[str]:
    """Runs of these agents whose model fails at the second turn: running, nobody holding them."""

    def flaky(messages: Sequence[Message]) -> ModelReply:
        if sum(1 for m in messages if m.role == "assistant") == 1:
            raise ConnectionError("the model went away")
        return script(messages)

    run_ids = []
    async with open_backends(settings) as backends:
        runner = backends.runner(ScriptedProvider(flaky))
        for i, name in enumerate(names):
            run_id = f"run-{i}"
            with pytest.raises((ConnectionError, RuntimeError)):
                await runner.run(agents[name], f"job {i}", tenant=TENANT, run_id=run_id)
            run_ids.append(run_id)
    return run_ids


async def _start_workers(env: dict[str, str], count: int) -> list[asyncio.subprocess.Process]:
    """``count`` `onward worker` processes on the deployment, each ready (signals handled)."""
    argv = ["-m", "onward", "worker", "--agent", "support.fleet:agents"]
    argv += ["--provider", "support.fleet:provider", "--lease-ttl", "2", "--recheck", "0.3"]
    argv += ["--backoff", "0.1", "--max-attempts", "2"]
    child_env = {**os.environ, **env, "PYTHONPATH": str(TESTS)}
    return await ready_workers(argv, [f"p{n}" for n in range(count)], child_env)


async def _until_runs_rest(backends: Backends, run_ids: Sequence[str], within: float) -> None:
    """Poll until every run completed, failed, or waits on a person (or ``within`` passes)."""
    deadline = asyncio.get_running_loop().time() + within
    manager = ExecutionManager(backends.frontiers, backends.leases)
    while asyncio.get_running_loop().time() < deadline:
        rows = {s.run_id: s for s in await backends.frontiers.runs(tenant=TENANT)}
        pending = await manager.list_pending(tenant=TENANT)
        for_person = {p.summary.run_id for p in pending if p.attention == "needs_person"}
        if all(r in rows for r in run_ids) and all(
            rows[r].status in ("completed", "failed") or r in for_person for r in run_ids
        ):
            return
        await asyncio.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_a_killed_worker_s_runs_are_carried_on_by_the_other(
    database_url: str, pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    env = {
        **_env(database_url, pg_schema),
        "FLEET_LEDGER": str(ledger),
        "FLEET_STEPS": str(STEPS),
        "FLEET_TOOL_S": "0.3",
    }
    monkeypatch.setenv("FLEET_LEDGER", str(ledger))
    settings = Settings.model_validate(env)
    run_ids = await _interrupted_runs(settings, ["booker", "booker", "charger"] * 6)
    workers = await _start_workers(env, 2)
    try:
        expected_effects = STEPS * len(run_ids)
        for _ in range(600):
            if len(Ledger(ledger).entries()) >= expected_effects // 3:
                break
            await asyncio.sleep(0.1)
        victim = workers[0]
        victim.send_signal(signal.SIGKILL)
        await victim.wait()
        async with open_backends(settings) as backends:
            await _until_runs_rest(backends, run_ids, within=150)
            rows = {s.run_id: s for s in await backends.frontiers.runs(tenant=TENANT)}
            manager = ExecutionManager(backends.frontiers, backends.leases)
            pending = await manager.list_pending(tenant=TENANT)
    finally:
        try:
            for worker in workers:
                if worker.returncode is None:
                    worker.send_signal(signal.SIGTERM)
            outputs = [await asyncio.wait_for(w.communicate(), 30) for w in workers]
        finally:
            await kill_running(workers)  # one that did not end in time would outlive the test
    assert workers[1].returncode == 0, outputs[1]
    left = {p.summary.run_id for p in pending if p.attention == "needs_person"}
    statuses = {r: rows[r].status for r in run_ids if r not in left}
    assert statuses == dict.fromkeys(statuses, "completed"), (statuses, outputs)
    assert all(rows[r].agent == "charger" for r in left), left  # booker settles its own calls
    keys = [(e["tool"], e["key"]) for e in Ledger(ledger).entries()]
    assert len(keys) == len(set(keys)), "a side effect happened twice"
    booked = {(e["tool"], e["key"]) for e in Ledger(ledger).entries() if e["tool"] == "book"}
    assert len(booked) == STEPS * sum(1 for r in run_ids if rows[r].agent == "booker")
    assert any(rows[r].fence > 2 for r in run_ids), "no run of the dead worker was carried on"
