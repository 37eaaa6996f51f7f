"""`onward projector` when PostgreSQL or Kafka goes away under it: it waits and carries on by
default, and exits 5 after ``--exit-on-store-loss SECONDS``.

The server that goes away is private (stopping a shared one would break every other test); the
other is the shared one, with a topic or schema of the test's own. Events are appended before,
during (PostgreSQL) and after the outage, and afterwards every frontier must equal the fold
computed directly from the log.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from support.fault_runs import until
from support.histories import (
    append_all,
    assert_stored_is_the_direct_fold,
    assert_stored_is_what_the_scripts_wrote,
    run_ids_of,
    workload,
)
from support.pg import create_schema, fresh_schema
from support.private_servers import PrivateKafka, PrivatePostgres

from onward._storage import KafkaConnection
from onward.errors import BackendError
from onward.eventlog import KafkaEventLog
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.kafka import KafkaProjector
from onward.projections.postgres import PostgresFrontierStore

pytestmark = pytest.mark.faults
PARTITIONS = 4
DOWN_S = 60.0
LOST = "store unavailable since"
BACK = "store back after"
ASSIGNED = "onward.projector assigned "


class Projector:
    """``python -m onward projector`` in a process of its own, its output in a file."""

    def __init__(self, env: dict[str, str], output: Path, *options: str) -> None:
        self.env = env
        self.output = output
        self.options = options
        self.child: asyncio.subprocess.Process | None = None

    def text(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def lines(self, containing: str) -> list[str]:
        return [line for line in self.text().splitlines() if containing in line]

    async def start(self) -> None:
        argv = ["-m", "onward", "projector", "--group", "outage", "--batch", "400"]
        with self.output.open("wb") as out:
            self.child = await asyncio.create_subprocess_exec(
                sys.executable, *argv, *self.options, env=self.env, stdout=out, stderr=out
            )

    @property
    def running(self) -> bool:
        return self.child is not None and self.child.returncode is None

    async def stop(self) -> int:
        assert self.child is not None
        self.child.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.child.wait(), 60)

    async def kill(self) -> None:
        if self.child is not None and self.child.returncode is None:
            self.child.kill()
            await self.child.wait()


def projector_env(database_url: str, schema: str, kafka: str, topic: str) -> dict[str, str]:
    return {
        **os.environ,
        "ONWARD_BACKEND": "kafka",
        "KAFKA_BOOTSTRAP_SERVERS": kafka,
        "DATABASE_URL": database_url,
        "ONWARD_DATABASE_SCHEMA": schema,
        "ONWARD_KAFKA_TOPIC": topic,
        "ONWARD_PARTITIONS": str(PARTITIONS),
    }


async def caught_up(store: PostgresFrontierStore, log: KafkaEventLog) -> bool:
    try:
        stored = await store.positions("frontiers")
    except BackendError:
        return False
    ends = [(await log.bounds(p)).end for p in range(PARTITIONS)]
    return all(stored.get(p, 0) >= end for p, end in enumerate(ends))


async def until_caught_up(
    store: PostgresFrontierStore, log: KafkaEventLog, projector: Projector, within_s: float
) -> None:
    deadline = time.monotonic() + within_s
    while not await caught_up(store, log):
        assert time.monotonic() < deadline, projector.text()[-3000:]
        assert projector.running, projector.text()[-3000:]
        await asyncio.sleep(0.2)


@pytest.mark.timeout(420)
@pytest.mark.kafka
async def test_the_projector_rides_out_a_postgres_outage(
    private_postgres: PrivatePostgres,
    kafka_bootstrap: str,
    kafka_topic: str,
    rng: random.Random,
    tmp_path: Path,
) -> None:
    steps = workload(rng, 300)
    thirds = len(steps) // 3
    # Thrown away with the private cluster.
    schema = await create_schema(private_postgres.url)
    env = projector_env(private_postgres.url, schema, kafka_bootstrap, kafka_topic)
    projector = Projector(env, tmp_path / "projector.log")
    async with (
        KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=PARTITIONS) as log,
        PostgresFrontierStore(private_postgres.url, schema=schema) as store,
    ):
        try:
            await projector.start()
            await append_all(log, steps[:thirds])
            await until(lambda: ASSIGNED in projector.text(), "the projector's assignment")
            await until_caught_up(store, log, projector, within_s=120)

            await asyncio.to_thread(private_postgres.stop, "immediate")
            down_since = time.monotonic()
            await append_all(log, steps[thirds : 2 * thirds])  # to fold while the store is away
            await until(lambda: bool(projector.lines(LOST)), "the store-lost line", within_s=30)
            while time.monotonic() - down_since < DOWN_S:
                assert projector.running, projector.text()[-3000:]
                await asyncio.sleep(1)
            await asyncio.to_thread(private_postgres.start)

            await append_all(log, steps[2 * thirds :])
            await until_caught_up(store, log, projector, within_s=120)
            assert await projector.stop() == 0, projector.text()[-3000:]
            await assert_stored_is_the_direct_fold(store, log, run_ids_of(steps))
            await assert_stored_is_what_the_scripts_wrote(store, steps)
        finally:
            await projector.kill()
    output = projector.text()
    assert len(projector.lines(LOST)) == 1, output[-5000:]
    assert len(projector.lines(BACK)) == 1, output[-5000:]
    assert "Traceback" not in output, output[-5000:]


@pytest.mark.timeout(300)
@pytest.mark.kafka
async def test_exit_on_store_loss_exits_5_once_the_store_was_away_that_long(
    private_postgres: PrivatePostgres,
    kafka_bootstrap: str,
    kafka_topic: str,
    rng: random.Random,
    tmp_path: Path,
) -> None:
    bound_s = 2.0
    steps = workload(rng, 60)
    half = len(steps) // 2
    schema = await create_schema(private_postgres.url)
    env = projector_env(private_postgres.url, schema, kafka_bootstrap, kafka_topic)
    projector = Projector(env, tmp_path / "projector.log", "--exit-on-store-loss", f"{bound_s:g}")
    async with (
        KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=PARTITIONS) as log,
        PostgresFrontierStore(private_postgres.url, schema=schema) as store,
    ):
        try:
            await projector.start()
            await append_all(log, steps[:half])
            await until(lambda: ASSIGNED in projector.text(), "the projector's assignment")
            await until_caught_up(store, log, projector, within_s=120)

            await asyncio.to_thread(private_postgres.stop, "immediate")
            stopped = time.monotonic()
            await append_all(log, steps[half:])  # the projector meets the outage storing these
            assert projector.child is not None
            code = await asyncio.wait_for(projector.child.wait(), bound_s + 30)
            exited = time.monotonic()
            exited_at = time.time()
        finally:
            await projector.kill()
    output = projector.text()
    assert code == 5, output[-3000:]
    # Within the bound plus a little: the store is met at the next write (at once here) and
    # given up on once the bound has passed since.
    assert exited - stopped < bound_s + 3, output[-3000:]
    (lost,) = projector.lines(LOST)
    lost_at = datetime.strptime(lost[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    assert exited_at - lost_at >= bound_s - 0.1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert output.strip().splitlines()[-1].startswith("BackendUnavailableError: "), output


@pytest.mark.timeout(420)
async def test_the_projector_rides_out_a_kafka_outage(
    private_kafka: PrivateKafka,
    database_url: str,
    rng: random.Random,
    tmp_path: Path,
) -> None:
    steps = workload(rng, 200)
    half = len(steps) // 2
    topic = "onward.outage"
    async with fresh_schema(database_url) as schema:
        env = projector_env(database_url, schema, private_kafka.bootstrap, topic)
        projector = Projector(env, tmp_path / "projector.log")
        try:
            async with (
                KafkaEventLog(private_kafka.bootstrap, topic=topic, partitions=PARTITIONS) as log,
                PostgresFrontierStore(database_url, schema=schema) as store,
            ):
                await projector.start()
                await append_all(log, steps[:half])
                await until(lambda: ASSIGNED in projector.text(), "the projector's assignment")
                await until_caught_up(store, log, projector, within_s=120)
            await asyncio.to_thread(private_kafka.kill)
            down_since = time.monotonic()
            while time.monotonic() - down_since < DOWN_S / 2:
                assert projector.running, projector.text()[-3000:]
                await asyncio.sleep(1)
            await asyncio.to_thread(private_kafka.start)
            async with (
                KafkaEventLog(private_kafka.bootstrap, topic=topic, partitions=PARTITIONS) as log,
                PostgresFrontierStore(database_url, schema=schema) as store,
            ):
                await append_all(log, steps[half:])
                await until_caught_up(store, log, projector, within_s=180)
                assert await projector.stop() == 0, projector.text()[-3000:]
                await assert_stored_is_the_direct_fold(store, log, run_ids_of(steps))
                await assert_stored_is_what_the_scripts_wrote(store, steps)
        finally:
            await projector.kill()
    output = projector.text()
    assert "Traceback" not in output, output[-5000:]
    assert len(projector.lines(LOST)) == len(projector.lines(BACK)) <= 1, output[-5000:]
    # The client logs each failure at every reconnect attempt, many a second: shown once each.
    client_lines = projector.lines(" aiokafka")
    assert len(client_lines) < 60, "\n".join(client_lines[-100:])


class _HeldSeek(FrontierProjection):
    """A projection whose first positions read (the one a member's seek to its stored offsets
    makes as partitions are assigned) waits until ``go`` is set: the test freezes the broker
    in that moment, between the read and the ask for where the partitions start."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked = asyncio.Event()
        self.go = asyncio.Event()

    async def positions(self) -> dict[int, int]:
        if not self.asked.is_set():
            self.asked.set()
            await self.go.wait()
        return await super().positions()


@pytest.mark.timeout(240)
async def test_a_broker_frozen_as_partitions_are_assigned_is_ridden_out(
    private_kafka: PrivateKafka,
    database_url: str,
    rng: random.Random,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Assigned partitions are sought to their stored offsets, which asks the broker where
    each starts. A broker that stops answering right then fails the ask after the request
    timeout: an outage `run` rides out, as a store's, not the client's own exception ending
    the projector (a supervisor would only restart it into the same wait)."""
    caplog.set_level(logging.INFO, logger="onward.projector")
    steps = workload(rng, 40)
    topic = "onward.seek-outage"
    async with (
        fresh_schema(database_url) as schema,
        KafkaEventLog(private_kafka.bootstrap, topic=topic, partitions=PARTITIONS) as log,
        PostgresFrontierStore(database_url, schema=schema) as store,
    ):
        await append_all(log, steps)
        projection = _HeldSeek(store, log, write_behind=True)
        projector = KafkaProjector(
            KafkaConnection(private_kafka.bootstrap, request_timeout_s=3),
            projection,
            topic=topic,
            partitions=PARTITIONS,
            group_id="seek-outage",
            session_timeout_ms=6_000,  # the least a broker takes: requests time out after 11 s
        )
        stop = asyncio.Event()

        async def project() -> None:
            await projector.start()
            await projector.run(stop)

        running = asyncio.create_task(project())
        try:
            asked = asyncio.create_task(projection.asked.wait())
            await asyncio.wait([asked, running], timeout=60, return_when=asyncio.FIRST_COMPLETED)
            assert projection.asked.is_set(), running
            await asyncio.to_thread(private_kafka.pause)
            try:
                projection.go.set()
                await asyncio.sleep(15)  # past the ask's timeout, frozen all along
                assert not running.done(), running
            finally:
                await asyncio.to_thread(private_kafka.resume)
            deadline = time.monotonic() + 120
            while not await _stored_to_the_end(store, log):
                assert not running.done(), running
                assert time.monotonic() < deadline, "the projector did not catch up"
                await asyncio.sleep(0.2)
            stop.set()
            await asyncio.wait_for(running, 60)
        finally:
            stop.set()
            if not running.done():
                running.cancel()
            await projector.close()
        await assert_stored_is_the_direct_fold(store, log, run_ids_of(steps))
    lost = [r.getMessage() for r in caplog.records if LOST in r.getMessage()]
    assert lost, "the broker's outage was not noticed"
    assert "reading where onward.seek-outage's partitions start" in lost[0], lost


async def _stored_to_the_end(store: PostgresFrontierStore, log: KafkaEventLog) -> bool:
    stored = await store.positions("frontiers")
    ends = [(await log.bounds(p)).end for p in range(PARTITIONS)]
    return all(stored.get(p, 0) >= end for p, end in enumerate(ends))
