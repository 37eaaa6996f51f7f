"""The Kafka broker killed, frozen and restarted under twenty runs, on a private broker.

Each run takes several tool steps; the ledger the tool writes says what really happened.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
import pytest_asyncio
from support.fault_runs import (
    assert_sound,
    drive_all,
    judge,
    step_agent,
    step_provider,
    until,
)
from support.private_servers import PrivateKafka, running

from onward.eventlog import KafkaEventLog
from onward.projections.memory import MemoryFrontierStore
from onward.runtime.leases import LeasePolicy, MemoryLeaseStore
from onward.runtime.ledger import Ledger
from onward.runtime.runner import AgentRunner

pytestmark = pytest.mark.faults
RUNS = 20
STEPS = 4
POLICY = LeasePolicy(ttl=timedelta(seconds=10))
PRODUCER_REQUEST_TIMEOUT_S = 40.0
"""How long the broker stays frozen, less five seconds: past the log's bounded wait
(``ONWARD_BACKEND_TIMEOUT``, 30 s), so appends fail with `BackendUnavailableError` and the runs
are resumed once the broker thaws; an unacknowledged batch may still land, and its writer is
then fenced. No tool runs while the broker is frozen."""


@pytest_asyncio.fixture
async def private_kafka() -> AsyncIterator[PrivateKafka]:
    """A single-node KRaft broker of this test alone."""
    async with running(PrivateKafka()) as server:
        yield server


@pytest.mark.timeout(420)
async def test_broker_sigkill_mid_load_then_restart(
    private_kafka: PrivateKafka, tmp_path: Path
) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    agent = step_agent(ledger, tool_s=0.3)
    run_ids = [f"run-{uuid.uuid4().hex[:8]}" for _ in range(RUNS)]
    began = time.time()
    async with (
        KafkaEventLog(private_kafka.bootstrap, topic="onward.faults", partitions=4) as log,
        MemoryLeaseStore() as leases,
    ):
        runner = AgentRunner(
            provider=step_provider(STEPS),
            log=log,
            leases=leases,
            frontiers=MemoryFrontierStore(),  # no projector here: runs are read from the log
            lease_policy=POLICY,
        )
        driving = asyncio.create_task(drive_all(lambda: runner, agent, run_ids))
        try:
            await until(lambda: len(ledger.entries()) >= RUNS, "the first steps")
            down = time.time()
            await asyncio.to_thread(private_kafka.kill)
            killed_with = len(ledger.entries())
            await asyncio.sleep(5.0)
            restart = time.time()
            await asyncio.to_thread(private_kafka.start)
            lifted = time.time()
            outcomes = await asyncio.wait_for(driving, 300)
        finally:
            driving.cancel()
    verdict = judge(
        "kafka: broker SIGKILL, restart after 5 s",
        ledger,
        outcomes,
        steps=STEPS,
        lifted_at=lifted,
        began_at=began,
        down_at=down,
        notes=f"(effects before kill {killed_with}, broker boot {lifted - restart:.1f}s)",
    )
    assert_sound(verdict, outcomes)
    assert all(o.status == "completed" for o in outcomes), outcomes
    assert verdict.side_effects == RUNS * STEPS


@pytest.mark.timeout(420)
async def test_broker_sigstop_past_the_request_timeout_then_sigcont(
    private_kafka: PrivateKafka, tmp_path: Path
) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    agent = step_agent(ledger, tool_s=0.3)
    run_ids = [f"run-{uuid.uuid4().hex[:8]}" for _ in range(RUNS)]
    began = time.time()
    async with (
        KafkaEventLog(private_kafka.bootstrap, topic="onward.faults", partitions=4) as log,
        MemoryLeaseStore() as leases,
    ):
        runner = AgentRunner(
            provider=step_provider(STEPS),
            log=log,
            leases=leases,
            frontiers=MemoryFrontierStore(),  # no projector here: runs are read from the log
            lease_policy=POLICY,
        )
        driving = asyncio.create_task(drive_all(lambda: runner, agent, run_ids))
        try:
            await until(lambda: len(ledger.entries()) >= RUNS, "the first steps")
            down = time.time()
            private_kafka.pause()
            try:
                await asyncio.sleep(PRODUCER_REQUEST_TIMEOUT_S + 5.0)
            finally:
                private_kafka.resume()
            lifted = time.time()
            outcomes = await asyncio.wait_for(driving, 300)
        finally:
            driving.cancel()
    failures = [f for o in outcomes for f in o.failures]
    verdict = judge(
        f"kafka: broker SIGSTOP {PRODUCER_REQUEST_TIMEOUT_S + 5:.0f} s, SIGCONT",
        ledger,
        outcomes,
        steps=STEPS,
        lifted_at=lifted,
        began_at=began,
        down_at=down,
        notes=f"(runs stopped by an error then resumed: {sum(1 for o in outcomes if o.failures)})",
    )
    assert_sound(verdict, outcomes)
    assert all(o.status == "completed" for o in outcomes), outcomes
    # An append the frozen broker never acknowledged fails after the request timeout and may
    # still land once it thaws; the holder that wrote it then learns it was superseded.
    assert set(failures) <= {
        "BackendUnavailableError",
        "FencedError",
        "ResumeConflictError",
    }, failures
