"""What an application sending requests to a Kafka fleet (`Requests`) is told when a request
cannot go: one too large for the producer, and a broker that stops answering. Real Kafka; the
broker is made silent by a `TcpProxy` in front of it, never touched itself.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import OutOfOrderSequenceNumber
from support.kafka import broker_redirected
from support.proxy import TcpProxy

from onward._storage import KafkaConnection
from onward.errors import (
    BackendUnavailableError,
    ConfigurationError,
    PayloadTooLargeError,
    ProducerFatalError,
)
from onward.eventlog import partition_for
from onward.runtime.fleet.requests import (
    MAX_REQUEST_BYTES,
    Request,
    Requests,
    ResumeRun,
    StartRun,
    decode_request,
    ensure_requests_topic,
)

pytestmark = pytest.mark.kafka
PARTITIONS = 3
BOUND_S = 1.0
"""The request timeout of the senders cut off from the broker."""
GIVES_UP_WITHIN_S = 2 * BOUND_S + 2.0
"""The bound, and room for a loaded machine."""


async def _delivered(bootstrap: str, topic: str, count: int) -> list[Request]:
    """The first ``count`` requests on the topic, waiting a few seconds for them."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        got: list[Request] = []
        async with asyncio.timeout(20):
            while len(got) < count:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    got += [decode_request(r.value) for r in records]
        return got
    finally:
        await consumer.stop()


async def test_a_batch_holding_a_request_too_large_sends_nothing_and_names_the_run(
    kafka_bootstrap: str, requests_topic: str
) -> None:
    """The producer refuses a record over its limit only once those before it were queued:
    the caller, told the batch failed, would not know that the runs before it start anyway."""
    small = StartRun(run_id="small", tenant="acme", agent="booker", input="go")
    large = StartRun(run_id="large", tenant="acme", agent="booker", input="x" * MAX_REQUEST_BYTES)
    marker = ResumeRun(run_id="marker", tenant="acme")
    async with Requests(kafka_bootstrap, requests_topic, partitions=PARTITIONS) as sender:
        with pytest.raises(PayloadTooLargeError) as refused:
            await sender.submit(small, large)
        await sender.submit(marker)
    await asyncio.sleep(0.5)  # what was queued before the refusal has landed by now, if sent
    assert await _delivered(kafka_bootstrap, requests_topic, 1) == [marker]
    assert str(refused.value).startswith("run 'large': the start request is ")
    assert refused.value.limit == MAX_REQUEST_BYTES


async def test_a_batch_the_topic_refuses_in_part_says_which_runs_were_sent(
    kafka_bootstrap: str, requests_topic: str
) -> None:
    """A topic whose own ``max.message.bytes`` is below the producer's limit: the broker
    refuses one partition's batch and stores the others'. The caller must hear which requests
    were refused and which were sent (a start it would submit again would run twice)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        limit = {"max.message.bytes": "20000"}
        await admin.create_topics([NewTopic(requests_topic, PARTITIONS, 1, topic_configs=limit)])
    finally:
        await admin.close()
    big, small = (
        next(f"run-{i}" for i in range(100) if partition_for(f"run-{i}", PARTITIONS) == p)
        for p in (0, 1)
    )
    incompressible = secrets.token_urlsafe(45_000)  # over the topic's limit once compressed
    large = StartRun(run_id=big, tenant="acme", agent="booker", input=incompressible)
    marker = ResumeRun(run_id=small, tenant="acme")
    async with Requests(kafka_bootstrap, requests_topic, partitions=PARTITIONS) as sender:
        with pytest.raises(PayloadTooLargeError) as refused:
            await sender.submit(large, marker)
    assert await _delivered(kafka_bootstrap, requests_topic, 1) == [marker]
    message = str(refused.value)
    assert f"refused the start request of run {big!r}" in message
    assert f"sent those of runs {small!r}" in message


@pytest.fixture
def broker_through_proxy(kafka_bootstrap: str, requests_topic: str) -> Iterator[dict[str, int]]:
    """Clients are told the proxy's address for the broker (it advertises its own), while the
    test puts a port in the dict; undone before the topic fixture's admin client deletes it."""
    with broker_redirected(kafka_bootstrap) as proxied:
        yield proxied


async def test_a_submit_to_a_silent_broker_fails_in_bounded_time_and_closes(
    kafka_bootstrap: str, requests_topic: str, broker_through_proxy: dict[str, int]
) -> None:
    """The idempotent producer retries a batch for as long as the broker is silent: the caller
    (an application starting a run, `onward cancel`) is told within the request timeout, and
    closing the sender does not wait on the batch either."""
    host, _, port = kafka_bootstrap.rpartition(":")
    async with TcpProxy(host, int(port)) as proxy:
        broker_through_proxy["port"] = proxy.port
        connection = KafkaConnection(f"127.0.0.1:{proxy.port}", request_timeout_s=BOUND_S)
        sender = Requests(connection, requests_topic, partitions=PARTITIONS)
        await sender.start()
        try:
            await sender.submit(ResumeRun(run_id="before", tenant="acme"))
            await proxy.cut(silent=True)
            began = time.monotonic()
            with pytest.raises(BackendUnavailableError, match="did not acknowledge within 1s"):
                async with asyncio.timeout(5 * GIVES_UP_WITHIN_S):
                    await sender.submit(StartRun(run_id="r", tenant="acme", agent="booker"))
            assert time.monotonic() - began < GIVES_UP_WITHIN_S
        finally:
            began = time.monotonic()
            async with asyncio.timeout(5 * GIVES_UP_WITHIN_S):
                await sender.close()
        assert time.monotonic() - began < GIVES_UP_WITHIN_S
        await proxy.restore()


async def test_a_producer_whose_session_broke_is_replaced_before_the_caller_hears(
    kafka_bootstrap: str, requests_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ProducerFatalError` says the producer was replaced: the next submit must go out on a
    sound session, not fail the same way until the application restarts."""
    first = ResumeRun(run_id="first", tenant="acme")
    after = ResumeRun(run_id="after", tenant="acme")
    async with Requests(kafka_bootstrap, requests_topic, partitions=PARTITIONS) as sender:
        broken = sender._producer
        assert broken is not None

        async def session_broken(*args: object, **kwargs: object) -> object:
            raise OutOfOrderSequenceNumber()

        # Fault injection: the broker is real; the session failure is forced on our side.
        monkeypatch.setattr(broken, "send", session_broken)
        with pytest.raises(ProducerFatalError):
            await sender.submit(first)
        assert sender._producer is not broken
        await sender.submit(after)
    assert await _delivered(kafka_bootstrap, requests_topic, 1) == [after]


async def test_a_requests_topic_the_broker_refuses_to_create_says_why_at_once(
    kafka_bootstrap: str, requests_topic: str
) -> None:
    """A name that collides with a topic the cluster has (``.`` and ``_`` are one to Kafka's
    metrics): the broker refuses the topic, and the start says what it said at once, not after
    ten seconds that the topic "has None partitions" and that the partition counts differ."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(requests_topic, 1, 1)])
    finally:
        await admin.close()
    began = asyncio.get_running_loop().time()
    with pytest.raises(ConfigurationError, match="refused to create") as refused:
        await ensure_requests_topic(kafka_bootstrap, requests_topic.replace(".", "_"), PARTITIONS)
    assert "collides" in str(refused.value)
    assert "None partitions" not in str(refused.value)
    assert asyncio.get_running_loop().time() - began < 5
