"""Poison records (security review #7): a record anyone on a topic can write never stops a
worker or a projector; it is set aside, named by partition and offset, and what follows it is
acted on. Real Kafka and PostgreSQL, the worker and the projector in this process."""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from support.deployment import kafka_settings
from support.histories import RunScript
from support.servers import KafkaServers
from support.serving import serving as serving_requests

from onward.eventlog import KafkaEventLog, RunFinished
from onward.eventlog.base import partition_for
from onward.projections.base import DEFAULT_CONSUMER
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.kafka import KafkaProjector
from onward.projections.postgres import PostgresFrontierStore
from onward.runtime.agent import Agent
from onward.runtime.backends import open_backends
from onward.runtime.fleet.requests import Requests, StartRun
from onward.runtime.fleet.worker import Worker
from onward.runtime.providers import ScriptedProvider, reply

pytestmark = pytest.mark.kafka
PARTITIONS = 2
TENANT = "acme"
DEEP = 5_000
"""Levels of nesting well past what Python's recursion limit lets msgspec decode."""


def deep_json(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def start_record(run_id: str, **fields: object) -> bytes:
    return msgspec.json.encode(
        {"type": "start", "run_id": run_id, "tenant": TENANT, "agent": "greeter", **fields}
    )


def poison_requests(run_id: str) -> dict[str, bytes | None]:
    """Each kind of bad request record, by what is wrong with it."""
    deep_start = start_record(run_id)[:-1] + b',"input":' + deep_json(DEEP) + b"}"
    return {
        "a null value (tombstone)": None,
        "JSON nested 5000 levels deep": deep_start,
        "not JSON": b"\x00\x01 not json {",
        "a NUL in the tenant": start_record(run_id, tenant="ac\x00me"),
        "options Options refuses": start_record(run_id, options={"max_iterations": 0}),
        "input nested past the limit": start_record(run_id)[:-1]
        + b',"input":'
        + deep_json(150)
        + b"}",
    }


async def produce(bootstrap: str, topic: str, partition: int, key: str, value: bytes | None) -> int:
    """Write one record as anyone who can reach the broker could."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        sent = await producer.send_and_wait(topic, value, key=key.encode(), partition=partition)
    finally:
        await producer.stop()
    return int(sent.offset)


async def committed(bootstrap: str, group: str, topic: str, partition: int) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return next(
        int(meta.offset)
        for tp, meta in offsets.items()
        if tp.partition == partition and tp.topic == topic
    )


async def test_poison_requests_are_set_aside_and_the_next_start_runs(
    kafka_servers: KafkaServers, requests_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """security review #7: a null record, JSON nested past the recursion limit, bytes that are
    not JSON and requests that decode but are out of bounds are each set aside (logged with
    partition, offset and reason, their offsets committed); a good start after them on the same
    partition runs to its end."""
    good = f"good-{uuid.uuid4().hex[:8]}"
    partition = partition_for(good, PARTITIONS)
    settings = kafka_settings(kafka_servers, PARTITIONS, requests_topic=requests_topic)
    group = f"{requests_topic}.workers"
    agent = Agent(name="greeter", instructions="say hello")
    async with kafka_servers.log(partitions=PARTITIONS):
        pass  # the events topic must exist before the backends open
    async with open_backends(settings) as backends:
        worker = Worker(
            backends, ScriptedProvider([reply("hello")]), {"greeter": agent}, backoff_s=0.1
        )
        async with serving_requests(
            worker, kafka_servers.bootstrap, requests_topic, accept_unsigned=True
        ) as serving:
            offsets: dict[str, int] = {}
            with caplog.at_level(logging.WARNING, logger="onward.worker"):
                for what, value in poison_requests(good).items():
                    offsets[what] = await produce(
                        kafka_servers.bootstrap, requests_topic, partition, good, value
                    )
                async with Requests(
                    kafka_servers.bootstrap, requests_topic, partitions=PARTITIONS
                ) as requests:
                    await requests.submit(StartRun(run_id=good, tenant=TENANT, agent="greeter"))
                deadline = asyncio.get_running_loop().time() + 60
                while not any(
                    isinstance(s.event, RunFinished) for s in await backends.log.read_run(good)
                ):
                    assert not serving.done(), serving.exception()
                    assert asyncio.get_running_loop().time() < deadline, caplog.text
                    await asyncio.sleep(0.2)
        assert serving.done()
        assert serving.exception() is None
        assert worker.stats.set_aside == len(offsets)
        (finished,) = [
            s.event for s in await backends.log.read_run(good) if isinstance(s.event, RunFinished)
        ]
        assert (finished.status, finished.output) == ("completed", "hello")
    for what, offset in offsets.items():
        line = f"partition {partition} offset {offset}: set aside"
        assert line in caplog.text, what
    set_aside = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
    assert all("\n" not in line and len(line) < 500 for line in set_aside)
    assert await committed(kafka_servers.bootstrap, group, requests_topic, partition) > max(
        offsets.values()
    )


@dataclass
class Stack:
    log: KafkaEventLog
    store: PostgresFrontierStore
    bootstrap: str
    topic: str


@pytest_asyncio.fixture
async def stack(
    kafka_bootstrap: str, kafka_topic: str, database_url: str, pg_schema: str
) -> AsyncIterator[Stack]:
    async with (
        KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=PARTITIONS) as log,
        PostgresFrontierStore(database_url, schema=pg_schema) as store,
    ):
        yield Stack(log, store, kafka_bootstrap, kafka_topic)


async def fold_to_the_end(stack: Stack) -> None:
    """A new Kafka projector folds until its stored positions reach every partition's end."""
    projector = KafkaProjector(
        stack.bootstrap,
        FrontierProjection(stack.store, stack.log),
        topic=stack.topic,
        partitions=PARTITIONS,
        group_id=f"g-{uuid.uuid4().hex[:8]}",
    )
    ends = {p: (await stack.log.bounds(p)).end for p in range(PARTITIONS)}
    await projector.start()
    try:
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            stored = await projector.projection.positions()
            if all(stored.get(p, 0) >= end for p, end in ends.items()):
                return
            assert asyncio.get_running_loop().time() < deadline, f"stuck at {stored}"
            await projector.step(timeout_ms=200)
    finally:
        await projector.close()


@pytest.mark.parametrize(
    "value", [None, b'{"kind": "run.claimed", "x": ' + deep_json(DEEP) + b"}"], ids=["null", "deep"]
)
async def test_a_null_or_deeply_nested_event_record_quarantines_its_run(
    stack: Stack, rng: random.Random, value: bytes | None
) -> None:
    """security review #7: on the events topic a null-value record or JSON nested past the
    recursion limit sets its run aside in quarantine (PostgreSQL); the projector goes on and
    folds the runs after it."""
    poisoned, other = RunScript(rng), RunScript(rng)
    steps = poisoned.steps()
    await stack.log.append(steps[0])
    partition = partition_for(poisoned.run_id, PARTITIONS)
    offset = await produce(stack.bootstrap, stack.topic, partition, poisoned.run_id, value)
    for step in other.steps():
        await stack.log.append(step)

    await fold_to_the_end(stack)

    row = await stack.store.get(poisoned.run_id)
    assert row is not None
    assert row.quarantined is not None
    (entry,) = await stack.store.quarantined(DEFAULT_CONSUMER)
    assert (entry.run_id, entry.partition, entry.offset) == (poisoned.run_id, partition, offset)
    assert "\n" not in entry.reason
    folded = await stack.store.get(other.run_id)
    assert folded is not None
    assert folded.frontier is not None
    assert folded.frontier.finished


def raw_event(run_id: str, seq: int, kind: str, **fields: object) -> bytes:
    """An event's bytes as a foreign producer writes them, past the codec's own checks."""
    envelope = {"run_id": run_id, "tenant": "acme", "seq": seq, "fence": 1, "at": 1}
    return msgspec.json.encode({"kind": kind, **envelope, **fields})


async def test_a_nul_in_a_stored_name_quarantines_its_run_not_the_partition(
    stack: Stack, rng: random.Random
) -> None:
    """security review #12: an event naming a call with a NUL (which PostgreSQL refuses in a
    text column), written past Onward's own checks, sets its run aside in quarantine; a record
    keyed by a run id holding a NUL is listed under no run; the projector stores every other
    run instead of failing the same batch forever."""
    poisoned, other = RunScript(rng), RunScript(rng)
    await stack.log.append(poisoned.steps()[0])
    partition = partition_for(poisoned.run_id, PARTITIONS)
    offset = await produce(
        stack.bootstrap,
        stack.topic,
        partition,
        poisoned.run_id,
        raw_event(
            poisoned.run_id, 2, "tool.dispatched", call_id="c\x00", tool="t", idempotency_key="k"
        ),
    )
    nul_run = "nul\x00run"
    nul_offset = await produce(
        stack.bootstrap,
        stack.topic,
        partition,
        nul_run,
        raw_event(nul_run, 1, "run.started", agent="a", revision="r"),
    )
    for step in other.steps():
        await stack.log.append(step)

    await fold_to_the_end(stack)

    row = await stack.store.get(poisoned.run_id)
    assert row is not None
    assert row.quarantined is not None
    entries = {e.offset: e for e in await stack.store.quarantined(DEFAULT_CONSUMER)}
    assert entries[offset].run_id == poisoned.run_id
    assert "NUL" in entries[offset].reason
    assert "$.call_id" in entries[offset].reason
    assert entries[nul_offset].run_id is None
    folded = await stack.store.get(other.run_id)
    assert folded is not None
    assert folded.frontier is not None
    assert folded.frontier.finished


async def test_a_nul_in_an_unknown_kind_quarantines_its_run_not_the_partition(
    stack: Stack, rng: random.Random
) -> None:
    """A record whose kind is no kind Onward knows and holds a NUL: the decoder's own words
    for it quote the kind, and the reason stored for it (text, as the row's mark is) must not
    carry the NUL into PostgreSQL, or every write of the batch fails and the partition stops."""
    poisoned, other = RunScript(rng), RunScript(rng)
    await stack.log.append(poisoned.steps()[0])
    partition = partition_for(poisoned.run_id, PARTITIONS)
    offset = await produce(
        stack.bootstrap,
        stack.topic,
        partition,
        poisoned.run_id,
        raw_event(poisoned.run_id, 2, "run.sta\x00rted", agent="a", revision="r"),
    )
    for step in other.steps():
        await stack.log.append(step)

    await fold_to_the_end(stack)

    row = await stack.store.get(poisoned.run_id)
    assert row is not None
    assert row.quarantined is not None
    (entry,) = await stack.store.quarantined(DEFAULT_CONSUMER)
    assert (entry.run_id, entry.offset) == (poisoned.run_id, offset)
    assert "$.kind" in entry.reason
    assert "\x00" not in entry.reason
    folded = await stack.store.get(other.run_id)
    assert folded is not None
    assert folded.frontier is not None
    assert folded.frontier.finished
