"""Latency and a dropped connection between the workers and the broker, through a TCP proxy.

The private broker advertises the proxy's port, so every connection a client makes (bootstrap,
then the partition leader it is told about) goes through the proxy.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from support.fault_runs import kafka_runs_through
from support.faulty_proxy import FaultyProxy
from support.private_servers import PrivateKafka, free_port, running

from onward.runtime.demo_ledger import Ledger
from onward.runtime.leases import RedisLeaseStore

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
    fault: str,
    proxied: tuple[PrivateKafka, FaultyProxy],
    redis_url: str,
    redis_prefix: str,
    database_url: str,
    pg_schema: str,
    rng: random.Random,
    tmp_path: Path,
) -> None:
    broker, proxy = proxied
    ledger = Ledger(tmp_path / "ledger.jsonl")
    if fault == "latency":
        proxy.delay(DELAY_MS)

    async def cut_then_restore() -> None:
        if fault == "cut":
            proxy.cut()
            await asyncio.sleep(CUT_S)
        proxy.restore()

    async with RedisLeaseStore(redis_url, prefix=redis_prefix) as leases:
        window = await kafka_runs_through(
            broker.bootstrap,
            ledger,
            cut_then_restore,
            leases=leases,
            database_url=database_url,
            schema=pg_schema,
            rng=rng,
            runs=RUNS,
            steps=STEPS,
            within_s=240,
        )
    name = (
        f"network: {DELAY_MS} ms latency each way"
        if fault == "latency"
        else f"network: connections reset, {CUT_S:.0f} s cut"
    )
    verdict = window.assert_all_completed(
        name,
        ledger,
        steps=STEPS,
        down=fault == "cut",
        lifted=fault == "cut",
        notes=(
            f"(Redis leases, PostgreSQL frontiers; proxy connections {proxy.connections}, reset "
            f"{proxy.resets}, projector restarts {window.projector_restarts})"
        ),
    )
    assert verdict.side_effects == RUNS * STEPS
