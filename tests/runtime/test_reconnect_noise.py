"""A server that goes away is reported in lines, never in tracebacks.

`onward projector` runs as its own process with PostgreSQL behind a `TcpProxy`; the test cuts
the proxy (PostgreSQL down: connections reset, new ones refused) while events arrive and
restores it. The outage and its end are logged one line per record (the drivers' retries
too), never a traceback, and the projector (without `--exit-on-store-loss`) rides
the outage out: the runs appended while PostgreSQL was away are folded once it is back.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from support.processes import terminated
from support.proxy import TcpProxy

from onward.eventlog import KafkaEventLog, RunStarted

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

TESTS = Path(__file__).resolve().parents[1]
TENANT = "acme"


def started(run_id: str) -> RunStarted:
    return RunStarted(
        run_id=run_id, tenant=TENANT, seq=1, fence=1, at=1, agent="a", revision="r1", input="go"
    )


async def frontier_rows(database_url: str, schema: str, run_ids: list[str]) -> int:
    conn = await asyncpg.connect(database_url, server_settings={"search_path": schema})
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM onward_frontiers WHERE run_id = ANY($1::text[])", run_ids
            )
        )
    finally:
        await conn.close()


async def until_projected(
    database_url: str, schema: str, run_ids: list[str], within_s: float
) -> None:
    deadline = time.monotonic() + within_s
    while await frontier_rows(database_url, schema, run_ids) < len(run_ids):
        if time.monotonic() > deadline:
            raise AssertionError(f"the projector did not fold {run_ids} within {within_s}s")
        await asyncio.sleep(0.3)


async def test_a_postgres_outage_under_the_projector_is_said_in_lines_not_tracebacks(
    kafka_bootstrap: str, database_url: str, kafka_topic: str, pg_schema: str
) -> None:
    parts = urlsplit(database_url)
    assert parts.hostname is not None
    async with TcpProxy(parts.hostname, parts.port or 5432) as proxy:
        user = parts.netloc.rsplit("@", 1)[0]
        proxied = urlunsplit(parts._replace(netloc=f"{user}@127.0.0.1:{proxy.port}"))
        env = {
            **os.environ,
            "PYTHONPATH": str(TESTS),
            "ONWARD_BACKEND": "kafka",
            "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "ONWARD_KAFKA_TOPIC": kafka_topic,
            "ONWARD_PARTITIONS": "1",
            "DATABASE_URL": proxied,
            "ONWARD_DATABASE_SCHEMA": pg_schema,
        }
        async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=1) as log:
            projector = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "onward",
                "projector",
                "--flush-interval",
                "0.2",
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                before = [f"run-{uuid.uuid4().hex[:8]}"]
                await log.append([started(before[0])])
                await until_projected(database_url, pg_schema, before, 30)  # running, caught up
                await proxy.cut()
                during = [f"run-{uuid.uuid4().hex[:8]}" for _ in range(3)]
                for run_id in during:
                    await log.append([started(run_id)])
                    await asyncio.sleep(1)
                await proxy.restore()
                await until_projected(database_url, pg_schema, during, 60)
                assert projector.returncode is None  # it rode the outage out
            finally:
                stdout, stderr = await terminated(projector, within_s=60)
    text = stderr.decode() + stdout.decode()
    assert "Traceback" not in text, text
    assert not any(line.startswith(" ") for line in text.splitlines()), text  # one line each
    assert "store unavailable since" in text, text  # the outage was seen...
    assert "store back after" in text, text  # ...and its end
    assert projector.returncode == 0, text
