"""One worker per run: twenty workers race to resume one run, and a paused worker wakes up late.

Real processes against Kafka, PostgreSQL and Redis (or PostgreSQL leases); the tools' own ledger
says what really happened.
"""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis
from support.processes import kill_running, reaped, spawn_support
from support.servers import KafkaServers
from support.workers import POLICY, TENANT, Ledger, agent, open_world, runner

from onward.eventlog import RunClaimed, SequenceGuard
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.log_projector import LogProjector
from onward.testing.leases import until_lapsed

pytestmark = pytest.mark.kafka
TTL_S = POLICY.ttl.total_seconds()


async def spawn(mode: str, config: dict[str, Any]) -> asyncio.subprocess.Process:
    return await spawn_support(
        "workers",
        mode,
        json.dumps(config),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )


async def read_line(child: asyncio.subprocess.Process, within: float = 60) -> str:
    assert child.stdout is not None
    return (await asyncio.wait_for(child.stdout.readline(), within)).decode().strip()


async def start_then_die(config: dict[str, Any]) -> None:
    """A first worker starts the run and is SIGKILLed in the middle of it."""
    async with reaped() as children:
        first = await spawn("start", config)
        children.append(first)
        await asyncio.wait_for(first.communicate(), 60)
    assert first.returncode == -signal.SIGKILL


async def go(worker: asyncio.subprocess.Process) -> None:
    """Tell a ready worker to resume the run."""
    assert worker.stdin is not None
    worker.stdin.write(b"go\n")
    await worker.stdin.drain()


@pytest.fixture(params=["redis", "postgres"])
def config(
    request: pytest.FixtureRequest, kafka_servers: KafkaServers, tmp_path: Path
) -> dict[str, Any]:
    return {
        "leases": request.param,
        **kafka_servers._asdict(),
        "ledger": str(tmp_path / "ledger.jsonl"),
        "run_id": f"run-{uuid.uuid4().hex[:8]}",
    }


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_twenty_workers_resume_one_run_and_exactly_one_carries_it(
    config: dict[str, Any],
) -> None:
    await start_then_die(config)
    async with open_world(config) as world:
        # The projector has caught up, so resumers read a frontier row and a short tail.
        await LogProjector(world.log, FrontierProjection(world.frontiers, world.log)).catch_up()
    workers = [await spawn("resume", config) for _ in range(20)]
    try:
        for worker in workers:
            assert await read_line(worker) == "ready"
        async with open_world(config) as world:  # the killed worker's lease, on the store's clock
            await until_lapsed(world.leases, config["run_id"], ttl_s=TTL_S)
        for worker in workers:
            await go(worker)
        outcomes = [json.loads(await read_line(worker, 120)) for worker in workers]
    finally:
        try:
            for worker in workers:
                if worker.returncode is None:
                    await asyncio.wait_for(worker.communicate(), 60)
        finally:
            await kill_running(workers)  # one that did not end in time would outlive the test
    carried = [o for o in outcomes if o["outcome"] == "carried"]
    conflicts = [o for o in outcomes if o["outcome"] == "conflict"]
    # A loser that only got to try once the winner had finished and released the run finds
    # it finished (it claims nothing and plans nothing): a slow host, not a second carrier.
    finished = [o for o in outcomes if o["outcome"] == "found it finished"]
    assert len(carried) == 1, outcomes
    assert carried[0]["status"] == "completed"
    assert len(conflicts) + len(finished) == 19, outcomes
    assert conflicts, "no worker raced the winner: " + json.dumps(outcomes)
    assert all(o["status"] == "completed" for o in finished), outcomes
    assert all(o["holder"] and o["holder"].startswith("resume-") for o in conflicts)
    assert all(o["reads"] == 0 for o in conflicts), "a loser read the run"
    ledger = Ledger(config["ledger"])
    assert (ledger.count("search"), ledger.count("book")) == (1, 1), ledger.entries()


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_worker_paused_past_its_ttl_is_fenced_and_its_writes_refused(
    config: dict[str, Any],
) -> None:
    zombie = await spawn("zombie", config)
    assert await read_line(zombie) == "paused"
    zombie.send_signal(signal.SIGSTOP)
    try:
        ledger = Ledger(config["ledger"])
        async with open_world(config) as world:
            await until_lapsed(world.leases, config["run_id"], ttl_s=TTL_S)  # the store's clock
            result = await runner(world, ledger, "worker-b").resume(
                agent(ledger), config["run_id"], tenant=TENANT
            )
            assert result.status == "completed"
            zombie.send_signal(signal.SIGCONT)
            told = json.loads(await read_line(zombie, 60))
            assert told["outcome"] == "fenced", told
            await asyncio.wait_for(zombie.communicate(), 60)

            stored = await world.log.read_run(config["run_id"])
            guard = SequenceGuard()
            admitted = guard.admit_all(stored)
            claim_at = next(
                i
                for i, s in enumerate(admitted)
                if isinstance(s.event, RunClaimed) and s.event.fence == 2
            )
            assert {s.event.fence for s in admitted[claim_at:]} == {2}
            history = [(type(x.event).__name__, x.event.seq, x.event.fence) for x in stored]
            assert guard.refused, f"the paused worker wrote nothing after waking up: {history}"
            assert {r.stored.event.fence for r in guard.refused} == {1}

            await LogProjector(world.log, FrontierProjection(world.frontiers, world.log)).catch_up()
            row = await world.frontiers.get(config["run_id"])
            assert row is not None
            assert row.frontier is not None
            assert (row.frontier.status, row.frontier.holder, row.frontier.fence) == (
                "completed",
                "worker-b",
                2,
            )
            assert row.summary.refused == len(guard.refused)
            later = await runner(world, ledger, "worker-c").resume(
                agent(ledger), config["run_id"], tenant=TENANT
            )
            assert later.status == "completed"
        assert (ledger.count("search"), ledger.count("book")) == (1, 1), ledger.entries()
    finally:
        if zombie.returncode is None:
            zombie.send_signal(signal.SIGCONT)
            zombie.kill()
            await zombie.communicate()


async def wipe_leases(config: dict[str, Any]) -> None:
    """Lose every lease and fence the store had: Redis restarted without persistence, say."""
    if config["leases"] == "redis":
        client = aioredis.Redis.from_url(config["redis_url"])
        try:
            keys = [k async for k in client.scan_iter(f"{config['redis_prefix']}*")]
            assert keys, "the killed worker's lease should have been in Redis"
            await client.delete(*keys)
        finally:
            await client.aclose()
    else:
        conn = await asyncpg.connect(config["database_url"])
        try:
            deleted = await conn.execute(f"DELETE FROM {config['schema']}.onward_leases")
            assert deleted != "DELETE 0", "the killed worker's lease should have been stored"
        finally:
            await conn.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_run_whose_lease_store_was_wiped_resumes_above_every_fence_in_its_log(
    config: dict[str, Any],
) -> None:
    await start_then_die(config)
    await wipe_leases(config)
    worker = await spawn("resume", config)
    try:
        assert await read_line(worker) == "ready"
        await go(worker)
        outcome = json.loads(await read_line(worker, 120))
    finally:
        try:
            await asyncio.wait_for(worker.communicate(), 60)
        finally:
            await kill_running([worker])
    assert outcome["outcome"] == "carried", outcome
    assert outcome["status"] == "completed"
    async with open_world(config) as world:
        stored = await world.log.read_run(config["run_id"])
        guard = SequenceGuard()
        admitted = guard.admit_all(stored)
        assert not guard.refused, "the resumed run's writes were refused"
        claim_at = next(i for i, s in enumerate(admitted) if isinstance(s.event, RunClaimed))
        claim_fence = admitted[claim_at].event.fence
        assert claim_fence == outcome["fence"]
        assert all(s.event.fence < claim_fence for s in admitted[:claim_at])
        assert {s.event.fence for s in admitted[claim_at:]} == {claim_fence}
        later = await world.leases.acquire(config["run_id"], tenant=TENANT, holder="x", ttl_s=5)
        assert later.fence > outcome["fence"]  # the store remembers the raised fence
    ledger = Ledger(config["ledger"])
    assert (ledger.count("search"), ledger.count("book")) == (1, 1), ledger.entries()
