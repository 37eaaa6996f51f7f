"""`KafkaProjector.run` over a cut network to PostgreSQL: it waits and folds on once the store
answers again (exactly once), or gives up after ``store_loss_limit_s``.

The cut is a proxy between the projector's store and the shared PostgreSQL (connections reset,
new ones refused), so the server itself keeps serving every other test; the fault suite stops a
private server under the real command (tests/faults/test_projector_outage.py).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import pytest
import pytest_asyncio
from support.faulty_proxy import FaultyProxy
from support.histories import (
    append_all,
    assert_stored_is_the_direct_fold,
    assert_stored_is_what_the_scripts_wrote,
    run_ids_of,
    workload,
)

from onward.errors import BackendUnavailableError
from onward.eventlog import KafkaEventLog
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.kafka import KafkaProjector
from onward.projections.postgres import PostgresFrontierStore

pytestmark = pytest.mark.kafka
PARTITIONS = 4
LOST = "store unavailable since"
BACK = "store back after"


@pytest_asyncio.fixture
async def proxy(database_url: str) -> AsyncIterator[FaultyProxy]:
    parts = urlsplit(database_url)
    async with FaultyProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as running:
        yield running


def through(database_url: str, proxy: FaultyProxy) -> str:
    parts = urlsplit(database_url)
    netloc = parts.netloc.rpartition("@")[0] + f"@127.0.0.1:{proxy.port}"
    return urlunsplit(parts._replace(netloc=netloc))


async def stored_to_the_end(store: PostgresFrontierStore, log: KafkaEventLog) -> bool:
    stored = await store.positions("frontiers")
    ends = [(await log.bounds(p)).end for p in range(PARTITIONS)]
    return all(stored.get(p, 0) >= end for p, end in enumerate(ends))


async def until_stored(
    store: PostgresFrontierStore, log: KafkaEventLog, running: asyncio.Task[None]
) -> None:
    deadline = time.monotonic() + 60
    while not await stored_to_the_end(store, log):
        assert not running.done(), running
        assert time.monotonic() < deadline, "the projector did not catch up within 60s"
        await asyncio.sleep(0.1)


def said(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(text in r.getMessage() for r in caplog.records if r.name == "onward.projector")


async def test_run_waits_for_a_lost_store_and_folds_on_exactly_once(
    kafka_bootstrap: str,
    kafka_topic: str,
    database_url: str,
    pg_schema: str,
    proxy: FaultyProxy,
    rng: random.Random,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="onward.projector")
    steps = workload(rng, 90)
    thirds = len(steps) // 3
    async with (
        KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=PARTITIONS) as log,
        PostgresFrontierStore(database_url, schema=pg_schema) as direct,
        PostgresFrontierStore(through(database_url, proxy), schema=pg_schema, timeout_s=2) as store,
    ):
        projector = KafkaProjector(
            kafka_bootstrap,
            FrontierProjection(store, log, write_behind=True),
            topic=kafka_topic,
            partitions=PARTITIONS,
            group_id=f"g-{uuid.uuid4().hex[:8]}",
        )
        stop = asyncio.Event()
        await projector.start()
        running = asyncio.create_task(projector.run(stop))
        try:
            await append_all(log, steps[:thirds])
            await until_stored(direct, log, running)

            proxy.cut()
            await append_all(log, steps[thirds : 2 * thirds])
            deadline = time.monotonic() + 30
            while not said(caplog, LOST):
                assert time.monotonic() < deadline, "the store's loss was not noticed"
                await asyncio.sleep(0.1)
            await asyncio.sleep(3)  # several attempts, each failing
            assert not running.done()
            proxy.restore()

            await append_all(log, steps[2 * thirds :])
            await until_stored(direct, log, running)
            stop.set()
            await asyncio.wait_for(running, 30)
        finally:
            stop.set()
            if not running.done():
                running.cancel()
            await projector.close()
        await assert_stored_is_the_direct_fold(direct, log, run_ids_of(steps))
        await assert_stored_is_what_the_scripts_wrote(direct, steps)
    assert said(caplog, LOST) == 1
    assert said(caplog, BACK) == 1


async def test_run_gives_up_once_the_store_was_lost_for_the_limit(
    kafka_bootstrap: str,
    kafka_topic: str,
    database_url: str,
    pg_schema: str,
    proxy: FaultyProxy,
    rng: random.Random,
) -> None:
    limit_s = 1.5
    steps = workload(rng, 20)
    async with (
        KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=PARTITIONS) as log,
        PostgresFrontierStore(through(database_url, proxy), schema=pg_schema, timeout_s=2) as store,
    ):
        projector = KafkaProjector(
            kafka_bootstrap,
            FrontierProjection(store, log),
            topic=kafka_topic,
            partitions=PARTITIONS,
            group_id=f"g-{uuid.uuid4().hex[:8]}",
            store_loss_limit_s=limit_s,
        )
        await projector.start()
        running = asyncio.create_task(projector.run(asyncio.Event()))
        try:
            proxy.cut()
            cut = time.monotonic()
            await append_all(log, steps)  # met at the next store
            with pytest.raises(BackendUnavailableError, match="unavailable for"):
                await asyncio.wait_for(running, limit_s + 30)
            took = time.monotonic() - cut
        finally:
            if not running.done():
                running.cancel()
            await projector.close()
    assert limit_s <= took < limit_s + 3


async def test_run_stopped_while_the_store_is_lost_returns_at_once(
    kafka_bootstrap: str,
    kafka_topic: str,
    database_url: str,
    pg_schema: str,
    proxy: FaultyProxy,
    rng: random.Random,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="onward.projector")
    async with (
        KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=PARTITIONS) as log,
        PostgresFrontierStore(through(database_url, proxy), schema=pg_schema, timeout_s=2) as store,
    ):
        projector = KafkaProjector(
            kafka_bootstrap,
            FrontierProjection(store, log),
            topic=kafka_topic,
            partitions=PARTITIONS,
            group_id=f"g-{uuid.uuid4().hex[:8]}",
        )
        stop = asyncio.Event()
        await projector.start()
        running = asyncio.create_task(projector.run(stop))
        try:
            proxy.cut()
            await append_all(log, workload(rng, 10))
            deadline = time.monotonic() + 30
            while not said(caplog, LOST):
                assert time.monotonic() < deadline, "the store's loss was not noticed"
                await asyncio.sleep(0.1)
            stop.set()
            stopped = time.monotonic()
            await asyncio.wait_for(running, 10)  # no error: nothing unstored is lost
            assert time.monotonic() - stopped < 2.5  # a store attempt in flight, at most
        finally:
            if not running.done():
                running.cancel()
            await projector.close()
