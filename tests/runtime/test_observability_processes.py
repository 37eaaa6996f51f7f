"""`onward worker` and `onward projector` with ``--metrics-port``: scraped while they work.

Real processes on Kafka, PostgreSQL and Redis. Runs go through the worker; its counters move
by exactly the work done (steps, tool calls by disposition, leases), the projector's lag gauge
goes to 0 once it has caught up and its folded-events counter moves with the log, and both
answer health and readiness.
"""

from __future__ import annotations

import asyncio
import random
import re
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import httpx
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families
from support.deployment import balanced, process_env, worker_argv
from support.histories import append_all, workload
from support.kafka import delete_topic
from support.processes import spawn_onward, stop_children
from support.proxy import TcpProxy
from support.servers import KafkaServers

from onward.eventlog import KafkaEventLog
from onward.projections.postgres import PostgresFrontierStore
from onward.runtime.fleet.requests import Requests, StartRun

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
PARTITIONS = 4
STEPS = 2
RUNS = 12
SERVING = re.compile(r"metrics on (http://127\.0\.0\.1:\d+)/metrics")

T = TypeVar("T")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class Deployment:
    servers: KafkaServers
    env: dict[str, str]
    requests_topic: str
    tmp: Path
    log: KafkaEventLog
    frontiers: PostgresFrontierStore
    children: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)

    async def spawn(self, name: str, *argv: str) -> str:
        """Start ``onward *argv`` with a metrics port of its choosing; return where it serves."""
        log = self.tmp / f"{name}.log"
        self.children[name] = await spawn_onward(log, self.env, *argv, "--metrics-port", "0")
        return await until(f"{name} serving metrics", lambda: self._served(name), 60)

    async def _served(self, name: str) -> str | None:
        found = SERVING.search(self.output(name))
        return found.group(1) if found else None

    def output(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")


async def until(what: str, check: Callable[[], Awaitable[T | None]], within: float) -> T:
    """Poll ``check`` until it returns something truthy, and return that."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        found = await check()
        if found:
            return found
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def scrape(url: str) -> Samples:
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"{url}/metrics", timeout=10)
    answer.raise_for_status()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def status(url: str, path: str) -> tuple[int, str]:
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"{url}{path}", timeout=10)
    return answer.status_code, answer.text


@pytest_asyncio.fixture
async def deployment(kafka_servers: KafkaServers, tmp_path: Path) -> AsyncIterator[Deployment]:
    env = process_env(
        kafka_servers,
        PARTITIONS,
        FLEET_LEDGER=str(tmp_path / "ledger.jsonl"),
        FLEET_STEPS=str(STEPS),
        FLEET_TOOL_S="0.01",
    )
    requests_topic = f"{kafka_servers.topic}.requests"
    async with (
        kafka_servers.log(partitions=PARTITIONS) as log,
        kafka_servers.frontiers() as frontiers,
    ):
        world = Deployment(kafka_servers, env, requests_topic, tmp_path, log, frontiers)
        try:
            yield world
        finally:
            await stop_children(world.children.values(), within_s=30)
            await delete_topic(kafka_servers.bootstrap, requests_topic)


async def test_worker_and_projector_metrics_move_with_the_work_done(
    deployment: Deployment,
) -> None:
    projector = await deployment.spawn(
        "projector", "projector", "--session-timeout-ms", "6000", "--ready-max-lag", "0"
    )
    worker = await deployment.spawn(
        "worker", *worker_argv("support.fleet", deployment.requests_topic, "w0")
    )
    assert await status(worker, "/healthz") == (200, "ok\n")
    assert await status(projector, "/healthz") == (200, "ok\n")
    await until(
        "the worker in its group",
        lambda: _answers(worker, "/readyz", 200),
        60,
    )
    assert balanced([deployment.output("worker")], PARTITIONS)
    await until("the projector ready", lambda: _answers(projector, "/readyz", 200), 60)
    worker_before = await scrape(worker)
    projector_before = await scrape(projector)

    run_ids = [f"run-{uuid.uuid4().hex[:10]}" for _ in range(RUNS)]
    async with Requests(
        deployment.servers.bootstrap,
        deployment.requests_topic,
        partitions=PARTITIONS,
        signer=deployment.servers.signer(),
    ) as requests:
        await requests.submit_many(
            [StartRun(run_id=r, tenant="acme", agent="booker", input="go") for r in run_ids]
        )

    async def all_completed() -> bool:
        runs = await deployment.frontiers.runs(tenant="acme")
        return sum(1 for r in runs if r.status == "completed") == RUNS

    await until("every run completed and folded", all_completed, 120)
    ends = {p: (await deployment.log.bounds(p)).end for p in range(PARTITIONS)}

    async def caught_up() -> Samples | None:
        samples = await scrape(projector)
        lags = {p: value(samples, "onward_projector_lag_events", partition=str(p)) for p in ends}
        present = all(
            ("onward_projector_lag_events", (("partition", str(p)),)) in samples for p in ends
        )
        return samples if present and not any(lags.values()) else None

    projector_after = await until("the lag gauge at 0", caught_up, 60)
    worker_after = await scrape(worker)

    def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    # Each run: STEPS turns of one call each, and STEPS + 1 model calls.
    assert moved(worker_before, worker_after, "onward_run_steps_total", step="model") == RUNS * (
        STEPS + 1
    )
    assert moved(worker_before, worker_after, "onward_run_steps_total", step="tools") == (
        RUNS * STEPS
    )
    tool_calls = {
        d: moved(worker_before, worker_after, "onward_tool_calls_total", disposition=d)
        for d in ("completed", "error", "reconciled", "indeterminate", "interrupted")
    }
    assert tool_calls == {
        "completed": RUNS * STEPS,
        "error": 0,
        "reconciled": 0,
        "indeterminate": 0,
        "interrupted": 0,
    }
    assert moved(worker_before, worker_after, "onward_lease_claims_total") >= RUNS
    assert moved(worker_before, worker_after, "onward_worker_runs_started_total") == RUNS
    assert (
        moved(worker_before, worker_after, "onward_worker_runs_finished_total", status="completed")
        == RUNS
    )
    assert value(worker_after, "onward_fenced_writes_refused_total") == 0
    # The topic is the test's own: every event in it went through the projector's fold, once.
    folded = moved(projector_before, projector_after, "onward_projector_events_folded_total")
    assert folded == sum(ends.values())
    assert folded >= RUNS * (3 * STEPS + 3)
    assert await status(projector, "/readyz") == (200, "ready\n")


async def test_the_lag_gauge_shows_a_backlog_and_readiness_waits_for_it(
    deployment: Deployment, rng: random.Random
) -> None:
    """A projector stopped (SIGSTOP) while events are written: once it goes on, the gauge
    says how far behind it is, /readyz is 503 while that is over --ready-max-lag, and both
    clear once it has folded the backlog."""
    projector = await deployment.spawn(
        "projector",
        "projector",
        *("--session-timeout-ms", "30000", "--batch", "200", "--ready-max-lag", "100"),
    )
    await until("the projector ready", lambda: _answers(projector, "/readyz", 200), 60)
    child = deployment.children["projector"]
    child.send_signal(signal.SIGSTOP)
    try:
        steps = workload(rng, 300)
        await append_all(deployment.log, steps)
        # Both questions are asked while it is stopped (the kernel queues them), so it answers
        # them together as it wakes, before its first store: asked one after the other, the
        # store between them (once a second) could fold the backlog under the bound.
        scraped = asyncio.ensure_future(scrape(projector))
        readiness = asyncio.ensure_future(status(projector, "/readyz"))
        await asyncio.sleep(0.5)
    finally:
        child.send_signal(signal.SIGCONT)
    samples, (code, reason) = await asyncio.gather(scraped, readiness)
    behind = sum(
        value(samples, "onward_projector_lag_events", partition=str(p)) for p in range(PARTITIONS)
    )
    assert behind > 100
    assert code == 503
    assert "events behind, over --ready-max-lag 100" in reason

    async def caught_up() -> bool:
        samples = await scrape(projector)
        return not any(
            value(samples, "onward_projector_lag_events", partition=str(p))
            for p in range(PARTITIONS)
        )

    await until("the backlog folded", caught_up, 120)
    assert await status(projector, "/readyz") == (200, "ready\n")
    written = sum(len(step) for step in steps)
    assert value(await scrape(projector), "onward_projector_events_folded_total") == written


async def test_a_projector_on_redis_names_redis_when_it_does_not_answer(
    deployment: Deployment,
) -> None:
    """With ONWARD_FRONTIER_STORE=redis, the store /readyz probes is Redis: the line that says
    why it is not ready names Redis, not a PostgreSQL that is up."""
    parts = urlsplit(deployment.servers.redis_url)
    assert parts.hostname is not None
    assert parts.port is not None
    async with TcpProxy(parts.hostname, parts.port) as proxy:
        through = deployment.servers.redis_url.replace(
            f"{parts.hostname}:{parts.port}", f"127.0.0.1:{proxy.port}"
        )
        deployment.env.update(ONWARD_FRONTIER_STORE="redis", REDIS_URL=through)
        projector = await deployment.spawn("projector", "projector", "--session-timeout-ms", "6000")
        await until("the projector ready", lambda: _answers(projector, "/readyz", 200), 60)
        await proxy.cut()
        code, reason = await status(projector, "/readyz")
    assert code == 503
    assert reason.startswith("Redis"), reason
    assert "PostgreSQL" not in reason


async def _answers(url: str, path: str, code: int) -> bool:
    try:
        return (await status(url, path))[0] == code
    except httpx.HTTPError:
        return False
