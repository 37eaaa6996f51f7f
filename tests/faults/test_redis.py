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
from datetime import timedelta
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from support.fault_runs import (
    TENANT,
    Folding,
    drive_all,
    new_run_ids,
    step_agent,
    step_runner,
    through_fault,
)
from support.histories import assert_stored_is_the_direct_fold
from support.private_servers import PrivateRedis

from onward.errors import OnwardError
from onward.eventlog import KafkaEventLog, RunClaimed, RunStarted, SequenceGuard
from onward.projections.postgres import PostgresFrontierStore
from onward.runtime.demo_ledger import Ledger
from onward.runtime.leases import LeasePolicy, RedisLeaseStore

pytestmark = [pytest.mark.faults, pytest.mark.kafka]
RUNS = 20
STEPS = 6
POLICY = LeasePolicy(ttl=timedelta(seconds=4))


async def flush(url: str) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        await client.flushall()
    finally:
        await client.aclose()


@pytest.mark.timeout(420)
@pytest.mark.parametrize("fault", ["restart", "flushall"])
async def test_redis_loses_every_lease_under_running_workers(
    fault: str,
    private_redis: PrivateRedis,
    kafka_bootstrap: str,
    kafka_topic: str,
    database_url: str,
    pg_schema: str,
    rng: random.Random,
    tmp_path: Path,
) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    agent = step_agent(ledger, tool_s=0.5)
    run_ids = new_run_ids(rng, RUNS)
    prefix = "onward-faults:"
    began = time.time()
    async with (
        KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=4) as log,
        RedisLeaseStore(private_redis.url, prefix=prefix) as leases_a,
        RedisLeaseStore(private_redis.url, prefix=prefix) as leases_b,
        PostgresFrontierStore(database_url, schema=pg_schema) as frontiers,
        Folding(kafka_bootstrap, log, frontiers) as folding,
    ):
        workers = [
            step_runner(log, leases, frontiers, STEPS, POLICY, worker=name)
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

        async def lose_every_lease() -> None:
            if fault == "restart":
                await asyncio.to_thread(private_redis.kill)
                await asyncio.to_thread(private_redis.start)
            else:
                await flush(private_redis.url)

        driving = drive_all(lambda: rng.choice(workers), agent, run_ids, pause_s=0.3)
        try:
            window = await through_fault(
                driving, ledger, RUNS, lose_every_lease, began=began, within_s=300
            )
        finally:
            done.set()
            await asyncio.gather(*rivals, return_exceptions=True)
        await folding.caught_up()
        await assert_stored_is_the_direct_fold(frontiers, log, run_ids)
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
    window.assert_all_completed(
        f"redis: {'restart without persistence' if fault == 'restart' else 'FLUSHALL (key loss)'}",
        ledger,
        steps=STEPS,
        down=False,
        notes=(
            f"(two workers racing, PostgreSQL frontiers; writes of superseded holders refused "
            f"{refused}, projector restarts {folding.restarts})"
        ),
    )
    assert claims_twice == []
