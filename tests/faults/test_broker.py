"""The Kafka broker killed, frozen and restarted under twenty runs, on a private broker.

Each run takes several tool steps; the ledger the tool writes says what really happened.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest
from support.fault_runs import kafka_runs_through
from support.private_servers import PrivateKafka

from onward.runtime.demo_ledger import Ledger
from onward.runtime.leases import PostgresLeaseStore, RedisLeaseStore

pytestmark = pytest.mark.faults
RUNS = 20
STEPS = 4
PRODUCER_REQUEST_TIMEOUT_S = 40.0
"""How long the broker stays frozen, less five seconds: past the log's bounded wait
(``ONWARD_BACKEND_TIMEOUT``, 30 s), so appends fail with `BackendUnavailableError` and the runs
are resumed once the broker thaws; an unacknowledged batch may still land, and its writer is
then fenced. No tool runs while the broker is frozen."""


@pytest.mark.timeout(420)
async def test_broker_sigkill_mid_load_then_restart(
    private_kafka: PrivateKafka,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
    pg_schema: str,
    rng: random.Random,
    tmp_path: Path,
) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    killed_with, restart = 0, 0.0

    async def kill_then_restart() -> None:
        nonlocal killed_with, restart
        await asyncio.to_thread(private_kafka.kill)
        killed_with = len(ledger.entries())
        await asyncio.sleep(5.0)
        restart = time.time()
        await asyncio.to_thread(private_kafka.start)

    async with RedisLeaseStore(redis_url, prefix=redis_prefix) as leases:
        window = await kafka_runs_through(
            private_kafka.bootstrap,
            ledger,
            kill_then_restart,
            leases=leases,
            database_url=database_url,
            schema=pg_schema,
            rng=rng,
            runs=RUNS,
            steps=STEPS,
            within_s=300,
        )
    verdict = window.assert_all_completed(
        "kafka: broker SIGKILL, restart after 5 s",
        ledger,
        steps=STEPS,
        notes=(
            f"(Redis leases, PostgreSQL frontiers; effects before kill {killed_with}, broker boot "
            f"{window.lifted - restart:.1f}s, projector restarts {window.projector_restarts})"
        ),
    )
    assert verdict.side_effects == RUNS * STEPS


@pytest.mark.timeout(420)
async def test_broker_sigstop_past_the_request_timeout_then_sigcont(
    private_kafka: PrivateKafka,
    database_url: str,
    pg_schema: str,
    rng: random.Random,
    tmp_path: Path,
) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")

    async def stop_then_continue() -> None:
        private_kafka.pause()
        try:
            await asyncio.sleep(PRODUCER_REQUEST_TIMEOUT_S + 5.0)
        finally:
            private_kafka.resume()

    async with PostgresLeaseStore(database_url, schema=pg_schema) as leases:
        window = await kafka_runs_through(
            private_kafka.bootstrap,
            ledger,
            stop_then_continue,
            leases=leases,
            database_url=database_url,
            schema=pg_schema,
            rng=rng,
            runs=RUNS,
            steps=STEPS,
            within_s=300,
        )
    outcomes = window.outcomes
    failures = [f for o in outcomes for f in o.failures]
    window.assert_all_completed(
        f"kafka: broker SIGSTOP {PRODUCER_REQUEST_TIMEOUT_S + 5:.0f} s, SIGCONT",
        ledger,
        steps=STEPS,
        notes=(
            "(PostgreSQL leases and frontiers; runs stopped by an error then resumed: "
            f"{sum(1 for o in outcomes if o.failures)}, projector restarts "
            f"{window.projector_restarts})"
        ),
    )
    # An append the frozen broker never acknowledged fails after the request timeout and may
    # still land once it thaws; the holder that wrote it then learns it was superseded.
    assert set(failures) <= {
        "BackendUnavailableError",
        "FencedError",
        "ResumeConflictError",
    }, failures
