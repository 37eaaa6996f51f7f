"""A pydantic-ai run killed with SIGKILL in another process, then resumed: nothing runs twice.

The child starts the booking run and stops itself at a point (SIGSTOP); the test kills it
(SIGKILL), waits for its lease to lapse and resumes the run here, on embedded SQLite and on
Kafka + PostgreSQL + Redis. The tool's ledger file counts bookings.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolDenied
from support.crash_world import until_lapsed

from integrations.pydantic_ai.world import MARKER, PAUSE, booking_agent, durability_on, open_stores
from onward.runtime.demo_ledger import Ledger

TESTS = Path(__file__).resolve().parents[2]
Scenario = Callable[[dict[str, str], Path], Awaitable[None]]


def sqlite_config(tmp_path: Path) -> dict[str, str]:
    """The run's stores in one SQLite file."""
    return {**_places(tmp_path), "backend": "sqlite", "db": str(tmp_path / "onward.db")}


@pytest.fixture
def kafka_config(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """The run's stores: this test's Kafka topic, PostgreSQL schema and Redis prefix."""
    fixtures = {
        "bootstrap": "kafka_bootstrap",
        "topic": "kafka_topic",
        "database_url": "database_url",
        "schema": "pg_schema",
        "redis_url": "redis_url",
        "prefix": "redis_prefix",
    }
    places = {key: request.getfixturevalue(name) for key, name in fixtures.items()}
    return {**_places(tmp_path), "backend": "kafka", **places}


def _places(tmp_path: Path) -> dict[str, str]:
    return {"run_id": "r-crash", "ledger": str(tmp_path / "ledger.jsonl")}


async def kill_at(point: str, config: dict[str, str], tmp_path: Path) -> None:
    """Run the child until it stops itself at ``point``, then kill it with SIGKILL."""
    marker = tmp_path / f"{point}.reached"
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "integrations.pydantic_ai.child",
        json.dumps(config),
        env={**os.environ, "PYTHONPATH": str(TESTS), PAUSE: point, MARKER: str(marker)},
    )
    try:
        async with asyncio.timeout(60):
            while not marker.exists():
                if child.returncode is not None:
                    raise AssertionError(f"the child exited ({child.returncode}) before {point}")
                await asyncio.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()
    assert child.returncode == -signal.SIGKILL


async def killed_after_the_side_effect(config: dict[str, str], tmp_path: Path) -> None:
    """The call whose outcome was lost is not run again: it comes back for a decision."""
    await kill_at("after_effect", config, tmp_path)
    ledger = Ledger(config["ledger"])
    assert len(ledger.entries()) == 1
    async with open_stores(config) as stores:
        await until_lapsed(stores.leases, config["run_id"])
        durability = durability_on(stores, worker="parent")
        agent = booking_agent(durability, ledger)

        waiting = await durability.resume(agent, config["run_id"])

        assert len(ledger.entries()) == 1  # not booked again
        assert waiting.status == "waiting"
        assert isinstance(waiting.output, DeferredToolRequests)
        assert [c.tool_name for c in waiting.output.approvals] == ["book"]
        undecided = waiting.output.metadata["b1"]["onward"]
        assert undecided["idempotency_key"] == ledger.entries()[0]["key"]
        assert waiting.plan is not None
        assert [c.call_id for c in waiting.plan.indeterminate] == ["b1"]

        await durability.decide(
            config["run_id"],
            DeferredToolResults(approvals={"b1": ToolDenied("it went through: seat 3A is yours")}),
            by="alice",
        )
        done = await durability.resume(agent, config["run_id"])

    assert done.status == "completed"
    assert done.output == "done: it went through: seat 3A is yours"
    assert len(ledger.entries()) == 1


async def killed_after_the_outcome(config: dict[str, str], tmp_path: Path) -> None:
    """The recorded outcome is replayed; the tool does not run again."""
    await kill_at("second_answer", config, tmp_path)
    ledger = Ledger(config["ledger"])
    async with open_stores(config) as stores:
        await until_lapsed(stores.leases, config["run_id"])
        durability = durability_on(stores, worker="parent")

        done = await durability.resume(booking_agent(durability, ledger), config["run_id"])

    assert done.status == "completed"
    assert done.output == "done: seat 3A booked"
    assert done.plan is not None
    assert done.plan.safe
    assert len(ledger.entries()) == 1


SCENARIOS = [killed_after_the_side_effect, killed_after_the_outcome]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
async def test_on_sqlite(scenario: Scenario, tmp_path: Path) -> None:
    await scenario(sqlite_config(tmp_path), tmp_path)


@pytest.mark.kafka
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
async def test_on_kafka_postgres_redis(
    scenario: Scenario, kafka_config: dict[str, str], tmp_path: Path
) -> None:
    await scenario(kafka_config, tmp_path)
