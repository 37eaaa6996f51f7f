"""The crash matrix: a run killed with SIGKILL at every point of an iteration, resumed elsewhere.

A child process runs the run and kills itself at the point under test; the test (another
process) resumes it. The tools' own ledger says what really happened: no side effect twice; the
call killed between its side effect and `ToolCompleted` is indeterminate unless its tool is
retry-safe or reconciles it; everything else is replayed or dispatched per the resume table.
Runs on embedded SQLite, on PostgreSQL alone and on Kafka + PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from support.crash_world import TENANT, open_world, the_agent, the_runner, until_lapsed
from support.processes import Spares, reaped, spawn_support

from onward.errors import IndeterminateToolCallError
from onward.eventlog import kind_of
from onward.runtime.demo_ledger import Ledger

# (point, the call it applies to, tool variant, expected end, expected bookings)
MATRIX: list[tuple[str, str | None, str, str, int]] = [
    ("model.call", None, "plain", "completed", 1),
    # The answer is written with its dispatches: a crash after it is a crash after dispatching,
    # unless a call waits on approval, which the answer then goes without.
    ("model.answered", None, "plain", "indeterminate", 0),
    ("model.answered", None, "approval", "completed", 1),
    ("tool.dispatched", None, "plain", "indeterminate", 0),
    ("tool.dispatched", None, "reconcile", "completed", 1),
    ("tool.returned", "b", "plain", "indeterminate", 1),
    ("tool.returned", "b", "reconcile", "completed", 1),
    ("tool.returned", "b", "retry_safe", "completed", 2),
    ("tool.completed", "b", "plain", "completed", 1),
    ("turn.settled", None, "plain", "completed", 1),
    ("waiting on approval", None, "approval", "completed", 1),
]
IDS = [f"{p}-{v}" for p, _, v, _, _ in MATRIX]


@pytest_asyncio.fixture(scope="module")
async def warm() -> AsyncIterator[Spares]:
    """Crash children started one case ahead (each case still has a process of its own)."""
    children = Spares(
        lambda: spawn_support(
            "crash_child", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
    )
    try:
        yield children
    finally:
        await children.close()


async def crash_then_resume(
    tmp_path: Path,
    warm: Spares,
    backend: dict[str, str],
    case: tuple[str, str | None, str, str, int],
) -> None:
    point, call_id, variant, expected, bookings = case
    config: dict[str, Any] = {
        **backend,
        "ledger": str(tmp_path / "ledger.jsonl"),
        "run_id": f"run-{uuid.uuid4().hex[:8]}",
        "point": point,
        "call_id": call_id,
        "variant": variant,
    }
    async with reaped() as children:
        child = await warm.take(json.dumps(config))
        children.append(child)
        if point == "waiting on approval":
            assert child.stdout is not None
            line = await asyncio.wait_for(child.stdout.readline(), 60)
            assert json.loads(line) == {"status": "waiting"}
            child.send_signal(signal.SIGKILL)
        await asyncio.wait_for(child.communicate(), 60)  # drains and closes the pipe
    assert child.returncode == -signal.SIGKILL
    ledger = Ledger(config["ledger"])
    async with (
        open_world(config) as world,
        the_runner(config, world, "parent") as runner,
    ):
        # The killed child's lease lapses on the store's clock; only then may another worker on.
        await until_lapsed(runner.leases, config["run_id"])
        agent = the_agent(config)
        if config["variant"] == "approval":
            if point != "waiting on approval":  # killed before it asked: the resume asks
                waiting = await runner.resume(agent, config["run_id"], tenant=TENANT)
                assert waiting.status == "waiting"
            assert ledger.count("book") == 0
            await runner.approve(config["run_id"], "b", tenant=TENANT, by="ann")
        if expected == "indeterminate":
            with pytest.raises(IndeterminateToolCallError) as caught:
                await runner.resume(agent, config["run_id"], tenant=TENANT)
            assert [c.call_id for c in caught.value.calls] == ["b"]
        else:
            result = await runner.resume(agent, config["run_id"], tenant=TENANT)
            assert (result.status, result.output) == ("completed", "booked")
        kinds = [kind_of(type(s.event)) for s in await world.log.read_run(config["run_id"])]
    assert ledger.count("book") == bookings, ledger.entries()
    assert ledger.count("search") <= 2  # a retry-safe search may be repeated; nothing else
    assert "resume.planned" in kinds or config["variant"] == "approval"


@pytest.mark.parametrize("case", MATRIX, ids=IDS)
async def test_crash_matrix_on_sqlite(
    tmp_path: Path, warm: Spares, case: tuple[str, str | None, str, str, int]
) -> None:
    backend = {"backend": "sqlite", "db": str(tmp_path / "onward.db")}
    await crash_then_resume(tmp_path, warm, backend, case)


@pytest.mark.parametrize("case", MATRIX, ids=IDS)
async def test_crash_matrix_on_postgres(
    tmp_path: Path,
    warm: Spares,
    database_url: str,
    pg_schema: str,
    case: tuple[str, str | None, str, str, int],
) -> None:
    backend = {"backend": "postgres", "database_url": database_url, "schema": pg_schema}
    await crash_then_resume(tmp_path, warm, backend, case)


@pytest.mark.kafka
@pytest.mark.parametrize("case", MATRIX, ids=IDS)
async def test_crash_matrix_on_kafka_and_postgres(
    tmp_path: Path,
    warm: Spares,
    kafka_bootstrap: str,
    kafka_topic: str,
    database_url: str,
    pg_schema: str,
    case: tuple[str, str | None, str, str, int],
) -> None:
    backend = {
        "backend": "kafka",
        "bootstrap": kafka_bootstrap,
        "topic": kafka_topic,
        "database_url": database_url,
        "schema": pg_schema,
    }
    await crash_then_resume(tmp_path, warm, backend, case)
