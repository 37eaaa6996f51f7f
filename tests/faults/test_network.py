"""Latency and a dropped connection between the workers and the broker, through a TCP proxy.

The private broker advertises the proxy's port, so every connection a client makes (bootstrap,
then the partition leader it is told about) goes through the proxy.
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
from support.fault_runs import assert_sound, drive_all, judge, step_agent, step_provider, until
from support.faulty_proxy import FaultyProxy
from support.private_servers import PrivateKafka, free_port, running

from onward.eventlog import KafkaEventLog
from onward.projections.memory import MemoryFrontierStore
from onward.runtime.leases import LeasePolicy, MemoryLeaseStore
from onward.runtime.ledger import Ledger
from onward.runtime.runner import AgentRunner

pytestmark = pytest.mark.faults
RUNS = 20
STEPS = 4
CUT_S = 5.0
DELAY_MS = 200


@pytest_asyncio.fixture
async def proxied() -> AsyncIterator[tuple[PrivateKafka, FaultyProxy]]:
    """A private broker that advertises a proxy in front of it, and the proxy."""
    port = free_port()
    broker = PrivateKafka(advertise=port)
    async with FaultyProxy("127.0.0.1", broker.port, port=port) as proxy, running(broker):
        yield broker, proxy


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fault", ["latency", "cut"])
async def test_latency_and_a_dropped_connection_to_the_broker(
    fault: str, proxied: tuple[PrivateKafka, FaultyProxy], tmp_path: Path
) -> None:
    broker, proxy = proxied
    ledger = Ledger(tmp_path / "ledger.jsonl")
    agent = step_agent(ledger, tool_s=0.3)
    run_ids = [f"run-{uuid.uuid4().hex[:8]}" for _ in range(RUNS)]
    began = time.time()
    async with (
        KafkaEventLog(broker.bootstrap, topic="onward.faults", partitions=4) as log,
        MemoryLeaseStore() as leases,
    ):
        runner = AgentRunner(
            provider=step_provider(STEPS),
            log=log,
            frontiers=MemoryFrontierStore(),  # no projector here: runs are read from the log
            leases=leases,
            lease_policy=LeasePolicy(ttl=timedelta(seconds=10)),
        )
        if fault == "latency":
            proxy.delay(DELAY_MS)
        driving = asyncio.create_task(drive_all(lambda: runner, agent, run_ids))
        try:
            await until(lambda: len(ledger.entries()) >= RUNS, "the first steps")
            down = time.time()
            if fault == "cut":
                proxy.cut()
                await asyncio.sleep(CUT_S)
            proxy.restore()
            lifted = time.time()
            outcomes = await asyncio.wait_for(driving, 240)
        finally:
            driving.cancel()
    name = (
        f"network: {DELAY_MS} ms latency each way"
        if fault == "latency"
        else f"network: connections reset, {CUT_S:.0f} s cut"
    )
    verdict = judge(
        name,
        ledger,
        outcomes,
        steps=STEPS,
        lifted_at=lifted if fault == "cut" else None,
        began_at=began,
        down_at=down if fault == "cut" else None,
        notes=f"(proxy connections {proxy.connections}, reset {proxy.resets})",
    )
    assert_sound(verdict, outcomes)
    assert all(o.status == "completed" for o in outcomes), outcomes
    assert verdict.side_effects == RUNS * STEPS
