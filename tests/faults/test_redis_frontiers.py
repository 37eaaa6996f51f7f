"""A Redis frontier store killed (SIGKILL) and restarted under a running projector.

With AOF (``appendfsync always``) Redis keeps every write it acknowledged, so the README's
promise holds: the projector waits the outage out, seeks every partition back to the
positions stored with the rows, and ends with the direct fold, each run's calls and transcript
once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid

import pytest
from support.histories import (
    append_all,
    assert_stored_is_the_direct_fold,
    assert_stored_is_what_the_scripts_wrote,
    run_ids_of,
    workload,
)
from support.private_servers import PrivateRedis, _wait, port_open, running

from onward.eventlog import KafkaEventLog
from onward.projections.base import DEFAULT_CONSUMER
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.kafka import KafkaProjector
from onward.projections.redis import RedisFrontierStore

pytestmark = [pytest.mark.faults, pytest.mark.kafka]
PARTITIONS = 4


class AofRedis(PrivateRedis):
    """A private ``redis-server`` that appends every write to its AOF before answering."""

    def start(self) -> None:
        self._process.spawn(
            [
                "redis-server", "--bind", "127.0.0.1", "--port", str(self.port),
                "--save", "", "--appendonly", "yes", "--appendfsync", "always",
                "--dir", str(self.dir),
            ],
            self.log,
        )  # fmt: skip
        _wait(lambda: self._process.alive and port_open(self.port), "private Redis", self.log)


async def stored_through(store: RedisFrontierStore, log: KafkaEventLog, within: float) -> None:
    """Wait until the stored positions reach every partition's end (an outage is waited out)."""
    ends = {p: (await log.bounds(p)).end for p in range(PARTITIONS)}
    stored: dict[int, int] = {}
    async with asyncio.timeout(within):
        while not all(stored.get(p, 0) >= end for p, end in ends.items()):
            await asyncio.sleep(0.2)
            with contextlib.suppress(Exception):
                stored = await store.positions(DEFAULT_CONSUMER)


@pytest.mark.timeout(300)
async def test_a_projector_rides_out_a_redis_killed_with_aof(
    kafka_bootstrap: str, kafka_topic: str, rng: random.Random, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="onward.projector")
    first, second = workload(rng, 30), workload(rng, 30)
    async with (
        running(AofRedis()) as redis_server,
        KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=PARTITIONS) as log,
        RedisFrontierStore(redis_server.url, timeout_s=2) as store,
    ):
        projector = KafkaProjector(
            kafka_bootstrap,
            FrontierProjection(store, log),
            topic=kafka_topic,
            partitions=PARTITIONS,
            group_id=f"g-{uuid.uuid4().hex[:8]}",
        )
        await projector.start()
        stop = asyncio.Event()
        folding = asyncio.create_task(projector.run(stop))
        try:
            await append_all(log, first)
            await stored_through(store, log, within=60)
            before_kill = await store.positions(DEFAULT_CONSUMER)
            await asyncio.to_thread(redis_server.kill)
            await append_all(log, second)
            await asyncio.sleep(2)  # the projector folds the second half and fails to store it
            await asyncio.to_thread(redis_server.start)
            # Read before the projector's backoff ends: what Redis kept across the SIGKILL.
            after_restart = await store.positions(DEFAULT_CONSUMER)
            assert all(after_restart.get(p, 0) >= o for p, o in before_kill.items()), (
                before_kill,
                after_restart,
            )
            await stored_through(store, log, within=120)
        finally:
            stop.set()
            await folding
            await projector.close()
        assert any("store unavailable" in r.getMessage() for r in caplog.records)
        assert any("store back" in r.getMessage() for r in caplog.records)
        steps = first + second
        await assert_stored_is_the_direct_fold(store, log, run_ids_of(steps))
        await assert_stored_is_what_the_scripts_wrote(store, steps)


@pytest.mark.timeout(300)
async def test_a_redis_restarted_without_its_keys_between_two_stores_is_folded_again(
    kafka_bootstrap: str, kafka_topic: str, rng: random.Random
) -> None:
    """Redis restarts without its keys (no persistence; AOF ``everysec`` loses the last
    second the same way) while the projector makes no call, so no call of it fails. The next
    store must not lay positions over the rows Redis forgot: the projector folds them again
    from the log, as the README promises, and ends with the direct fold of every run."""
    first, second = workload(rng, 20), workload(rng, 20)
    async with (
        running(PrivateRedis()) as redis_server,
        KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=PARTITIONS) as log,
        RedisFrontierStore(redis_server.url, timeout_s=5) as store,
    ):
        # Looking for released runs only once an hour: idle, the projector calls nothing, so
        # the restart falls between two of its calls (with the default it does so by chance).
        projection = FrontierProjection(store, log, release_poll=3600.0)
        projector = KafkaProjector(
            kafka_bootstrap,
            projection,
            topic=kafka_topic,
            partitions=PARTITIONS,
            group_id=f"g-{uuid.uuid4().hex[:8]}",
        )
        await projector.start()
        stop = asyncio.Event()
        folding = asyncio.create_task(projector.run(stop))
        try:
            await append_all(log, first)
            await stored_through(store, log, within=60)
            await asyncio.to_thread(redis_server.kill)
            await asyncio.to_thread(redis_server.start)
            await append_all(log, second)
            await stored_through(store, log, within=120)
        finally:
            stop.set()
            await folding
            await projector.close()
        steps = first + second
        await assert_stored_is_the_direct_fold(store, log, run_ids_of(steps))
        await assert_stored_is_what_the_scripts_wrote(store, steps)
