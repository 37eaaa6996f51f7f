"""`/readyz` of an `onward worker` while its PostgreSQL is stopped, and after it is back.

The cluster is private (the shared one serves other tests); Kafka and Redis are the shared
ones. Health stays 200 throughout: the process's loop answers, only a store does not.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest
from support.deployment import process_env, worker_argv
from support.kafka import delete_topic
from support.pg import create_schema
from support.private_servers import PrivatePostgres
from support.processes import spawn_onward, stop_children
from support.servers import KafkaServers

pytestmark = [pytest.mark.faults, pytest.mark.kafka]
PARTITIONS = 2
SERVING = re.compile(r"metrics on (http://127\.0\.0\.1:\d+)/metrics")


async def get(url: str) -> tuple[int, str]:
    async with httpx.AsyncClient() as http:
        answer = await http.get(url, timeout=10)
    return answer.status_code, answer.text


async def until_answer(url: str, code: int, within: float) -> str:
    """Poll ``url`` until it answers ``code``; return the body."""
    deadline = asyncio.get_running_loop().time() + within
    last: tuple[int, str] | None = None
    while True:
        try:
            last = await get(url)
        except httpx.HTTPError as exc:
            last = (0, repr(exc))
        if last[0] == code:
            return last[1]
        assert asyncio.get_running_loop().time() < deadline, f"{url}: {last}"
        await asyncio.sleep(0.25)


async def test_a_worker_is_not_ready_while_postgres_is_stopped_and_ready_after(
    private_postgres: PrivatePostgres, kafka_servers: KafkaServers, tmp_path: Path
) -> None:
    schema = await create_schema(private_postgres.url)  # thrown away with the cluster
    env = process_env(
        kafka_servers,
        PARTITIONS,
        DATABASE_URL=private_postgres.url,
        ONWARD_DATABASE_SCHEMA=schema,
        FLEET_LEDGER=str(tmp_path / "ledger.jsonl"),
    )
    requests_topic = f"{kafka_servers.topic}.requests"
    output = tmp_path / "worker.log"
    argv = worker_argv("support.fleet", requests_topic, "w0", "--metrics-port", "0")
    async with kafka_servers.log(partitions=PARTITIONS):
        pass  # the events topic, made as a deployment makes it before its workers start
    worker = await spawn_onward(output, env, *argv)
    try:
        url = await serving(worker, output)
        assert await until_answer(f"{url}/readyz", 200, 60) == "ready\n"

        await asyncio.to_thread(private_postgres.stop, "immediate")
        reason = await until_answer(f"{url}/readyz", 503, 30)
        assert reason.startswith("the frontier store"), reason
        assert reason.count("\n") == 1, reason
        assert await get(f"{url}/healthz") == (200, "ok\n")

        await asyncio.to_thread(private_postgres.start)
        assert await until_answer(f"{url}/readyz", 200, 60) == "ready\n"
        assert worker.returncode is None
    finally:
        await stop_children([worker], within_s=30)
        await delete_topic(kafka_servers.bootstrap, requests_topic)
    assert worker.returncode == 0, output.read_text(errors="replace")


async def test_a_projector_is_not_ready_while_postgres_is_stopped_and_ready_after(
    private_postgres: PrivatePostgres, kafka_servers: KafkaServers, tmp_path: Path
) -> None:
    """The projector waits the outage out (it does not exit); readiness says why meanwhile."""
    schema = await create_schema(private_postgres.url)  # thrown away with the cluster
    env = process_env(
        kafka_servers, PARTITIONS, DATABASE_URL=private_postgres.url, ONWARD_DATABASE_SCHEMA=schema
    )
    output = tmp_path / "projector.log"
    argv = ["projector", "--session-timeout-ms", "6000", "--metrics-port", "0"]
    projector = await spawn_onward(output, env, *argv)
    try:
        url = await serving(projector, output)
        assert await until_answer(f"{url}/readyz", 200, 60) == "ready\n"

        await asyncio.to_thread(private_postgres.stop, "immediate")
        reason = await until_answer(f"{url}/readyz", 503, 30)
        assert reason.startswith("PostgreSQL"), reason
        assert reason.count("\n") == 1, reason
        assert await get(f"{url}/healthz") == (200, "ok\n")

        await asyncio.to_thread(private_postgres.start)
        assert await until_answer(f"{url}/readyz", 200, 60) == "ready\n"
        assert projector.returncode is None
    finally:
        await stop_children([projector], within_s=30)
    assert projector.returncode == 0, output.read_text(errors="replace")


async def serving(child: asyncio.subprocess.Process, output: Path) -> str:
    """Where ``child`` serves metrics, once it says so."""
    deadline = asyncio.get_running_loop().time() + 60
    while not (found := SERVING.search(said(output))):
        assert child.returncode is None, said(output)
        assert asyncio.get_running_loop().time() < deadline, said(output)
        await asyncio.sleep(0.2)
    return found.group(1)


def said(output: Path) -> str:
    return output.read_text(errors="replace")
