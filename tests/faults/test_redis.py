"""Redis restarted without persistence, and its keys lost, under two workers racing for runs.

The lease store forgets every lease and fence; the runs' logs still have theirs. A worker
whose lease vanished must stop before its next side effect; whoever carries the run on raises
its fence above the log's (`raise_fence`). No run may be carried by two workers at once and no
side effect may happen twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from support.fault_runs import (
    TENANT,
    assert_sound,
    drive_all,
    judge,
    step_agent,
    step_provider,
    until,
)
from support.private_servers import PrivateRedis, running

from onward.errors import OnwardError
from onward.eventlog import KafkaEventLog, RunClaimed, RunStarted, SequenceGuard
from onward.projections.memory import MemoryFrontierStore
from onward.runtime.leases import LeasePolicy, RedisLeaseStore
from onward.runtime.ledger import Ledger
from onward.runtime.runner import AgentRunner

pytestmark = pytest.mark.faults
RUNS = 20
STEPS = 6
POLICY = LeasePolicy(ttl=timedelta(seconds=4))


async def flush(url: str) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        await client.flushall()
    finally:
        await client.aclose()


@pytest_asyncio.fixture
async def private_redis() -> AsyncIterator[PrivateRedis]:
    """A Redis server of this test alone, without persistence."""
    async with running(PrivateRedis()) as server:
        yield server


@pytest.mark.timeout(420)
@pytest.mark.parametrize("fault", ["restart", "flushall"])
async def test_redis_loses_every_lease_under_running_workers(
    fault: str,
    private_redis: PrivateRedis,
    kafka_bootstrap: str,
    kafka_topic: str,
    rng: random.Random,
    tmp_path: Path,
) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    agent = step_agent(ledger, tool_s=0.5)
    run_ids = [f"run-{uuid.uuid4().hex[:8]}" for _ in range(RUNS)]
    prefix = "onward-faults:"
    began = time.time()
    async with (
        KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=4) as log,
        RedisLeaseStore(private_redis.url, prefix=prefix) as leases_a,
        RedisLeaseStore(private_redis.url, prefix=prefix) as leases_b,
    ):
        workers = [
            AgentRunner(
                provider=step_provider(STEPS),
                log=log,
                frontiers=MemoryFrontierStore(),  # no projector here: read from the log
                leases=leases,
                lease_policy=POLICY,
                worker=name,
            )
            for name, leases in (("worker-a", leases_a), ("worker-b", leases_b))
        ]
        done = asyncio.Event()

        async def rival() -> None:
            """Worker b tries to carry on runs it does not hold, all the time."""
            while not done.is_set():
                with contextlib.suppress(OnwardError):
                    await workers[1].resume(agent, rng.choice(run_ids), tenant=TENANT)
                await asyncio.sleep(0.05)

        rivals = [asyncio.create_task(rival()) for _ in range(3)]
        driving = asyncio.create_task(
            drive_all(lambda: rng.choice(workers), agent, run_ids, pause_s=0.3)
        )
        try:
            await until(lambda: len(ledger.entries()) >= RUNS, "the first steps")
            if fault == "restart":
                await asyncio.to_thread(private_redis.kill)
                await asyncio.to_thread(private_redis.start)
            else:
                await flush(private_redis.url)
            lifted = time.time()
            outcomes = await asyncio.wait_for(driving, 300)
        finally:
            done.set()
            driving.cancel()
            await asyncio.gather(*rivals, return_exceptions=True)
        # Two holders of one lease would show as two claims (a start or a resume) under one
        # fence: a store that forgot the run handing out a fence the log already has.
        claims_twice, refused = [], 0
        for run_id in run_ids:
            stored = await log.read_run(run_id)
            fences = [s.event.fence for s in stored if isinstance(s.event, RunStarted | RunClaimed)]
            if len(fences) != len(set(fences)):
                claims_twice.append((run_id, fences))
            guard = SequenceGuard()
            guard.admit_all(stored)
            refused += len(guard.refused)
    verdict = judge(
        f"redis: {'restart without persistence' if fault == 'restart' else 'FLUSHALL (key loss)'}",
        ledger,
        outcomes,
        steps=STEPS,
        lifted_at=lifted,
        began_at=began,
        notes=f"(two workers racing; writes of superseded holders refused {refused})",
    )
    assert_sound(verdict, outcomes)
    assert all(o.status == "completed" for o in outcomes), outcomes
    assert claims_twice == []
