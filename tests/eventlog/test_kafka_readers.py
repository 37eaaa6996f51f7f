"""`KafkaReaders` against a real broker: a long read that keeps making progress ends, and a
consumer whose start is given up on is stopped however often its task is cancelled."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from support.faulty_proxy import FaultyProxy
from support.kafka import broker_redirected

from onward._storage.kafka import KafkaConnection
from onward.errors import BackendUnavailableError, InvalidInputError
from onward.eventlog import KafkaEventLog
from onward.eventlog.kafka import record_of
from onward.eventlog.kafka_readers import KafkaReaders
from onward.testing.eventlog import new_run_id, seqs, step_events

pytestmark = pytest.mark.kafka

READ_TIMEOUT_S = 1.0


@pytest.fixture
def broker_through_proxy(kafka_bootstrap: str) -> Iterator[dict[str, int]]:
    """Clients are told the proxy's address for the broker once the test puts its port here."""
    with broker_redirected(kafka_bootstrap) as proxied:
        yield proxied


def _small_fetch_readers(connection: KafkaConnection) -> KafkaReaders:
    """Readers whose consumers fetch one record batch per round trip, as a big partition's
    read takes many fetches (8 MiB each) in production."""
    return KafkaReaders(
        lambda: connection.consumer(
            role="reader",
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="none",
            isolation_level="read_committed",
            max_partition_fetch_bytes=1024,
            fetch_max_wait_ms=100,
        ),
        size=1,
        read_timeout_s=READ_TIMEOUT_S,
    )


async def _read_run(readers: KafkaReaders, topic: str, run_id: str, end: int) -> list[object]:
    async with readers.lent() as reader:
        return await readers.read(  # type: ignore[return-value]
            reader,
            TopicPartition(topic, 0),
            0,
            end,
            key=run_id.encode(),
            limit=None,
            record_of=record_of,
            run_id=run_id,
        )


async def _other_runs_then(log: KafkaEventLog, run_id: str, batches: int) -> int:
    """``batches`` record batches of other runs, then two events of ``run_id``: the end."""
    for _ in range(batches):
        await log.append(step_events(new_run_id(), 3, body="x" * 300))
    await log.append(step_events(run_id, 2))
    return (await log.bounds(0)).end


async def test_a_read_that_keeps_making_progress_is_not_cut_off_by_the_read_timeout(
    kafka_bootstrap: str, kafka_topic: str, broker_through_proxy: dict[str, int]
) -> None:
    """A run's read from a partition that holds much of other runs' traffic before it (a
    resume whose frontier lags far behind) takes many fetches, each answered well within the
    read timeout. The timeout is for a broker that does not answer: a read that gets records
    all along must end with the run's events, not fail as an outage however often retried."""
    run_id = new_run_id()
    async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=1) as log:
        end = await _other_runs_then(log, run_id, 120)
    host, _, port = kafka_bootstrap.rpartition(":")
    async with FaultyProxy(host, int(port)) as proxy:
        broker_through_proxy["port"] = proxy.port
        readers = _small_fetch_readers(KafkaConnection(f"127.0.0.1:{proxy.port}"))
        await readers.start()
        try:
            proxy.delay(20)  # every round trip takes a while, each far under the timeout
            began = time.monotonic()
            stored = await _read_run(readers, kafka_topic, run_id, end)
            took = time.monotonic() - began
        finally:
            proxy.restore()
            for consumer in readers.consumers:
                await consumer.stop()
    assert seqs(stored) == [1, 2]
    assert took > READ_TIMEOUT_S  # the read as a whole did outlast the timeout


async def test_a_read_that_gets_no_further_fails_after_the_read_timeout(
    kafka_bootstrap: str, kafka_topic: str, broker_through_proxy: dict[str, int]
) -> None:
    """A broker that stops answering mid-read still ends the read, about one read timeout
    after the last record came, as an outage."""
    run_id = new_run_id()
    async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=1) as log:
        end = await _other_runs_then(log, run_id, 40)
    host, _, port = kafka_bootstrap.rpartition(":")
    async with FaultyProxy(host, int(port)) as proxy:
        broker_through_proxy["port"] = proxy.port
        readers = _small_fetch_readers(KafkaConnection(f"127.0.0.1:{proxy.port}"))
        await readers.start()
        try:
            proxy.delay(20)
            reading = asyncio.create_task(_read_run(readers, kafka_topic, run_id, end))
            await asyncio.sleep(0.3)  # part way through
            proxy.hold_replies_after(0)
            began = time.monotonic()
            with pytest.raises(BackendUnavailableError, match="got no further"):
                await asyncio.wait_for(reading, READ_TIMEOUT_S * 5)
            assert time.monotonic() - began < READ_TIMEOUT_S * 3
        finally:
            proxy.restore()
            for consumer in readers.consumers:
                await consumer.stop()


async def test_a_consumer_started_as_the_log_closes_is_stopped_however_often_cancelled(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read starts a consumer, the log closes meanwhile (so the read must stop what it
    started), and the read's task is cancelled at every turn (a cancel scope being left):
    the consumer is stopped all the same, not left connected for as long as the loop lives."""
    connection = KafkaConnection(kafka_bootstrap, request_timeout_s=5.0)
    made: list[AIOKafkaConsumer] = []

    def new_consumer() -> AIOKafkaConsumer:
        made.append(connection.consumer(role="reader", group_id=None))
        return made[-1]

    readers = KafkaReaders(new_consumer, size=1, read_timeout_s=5.0)
    started = asyncio.Event()
    original = AIOKafkaConsumer.start

    async def start(consumer: AIOKafkaConsumer) -> None:
        await original(consumer)
        readers.forget()  # the log closes as the start ends
        started.set()

    monkeypatch.setattr(AIOKafkaConsumer, "start", start)
    starting = asyncio.ensure_future(readers.start())
    async with asyncio.timeout(10):
        await started.wait()
    while not starting.done():
        starting.cancel()
        await asyncio.sleep(0)
    with pytest.raises((asyncio.CancelledError, InvalidInputError)):
        await starting
    (consumer,) = made
    stopped = consumer._closed
    await consumer.stop()
    assert stopped, "the consumer was left running"


async def test_a_read_cancelled_as_a_consumer_comes_back_to_it_passes_the_consumer_on(
    kafka_bootstrap: str,
) -> None:
    """Two reads wait for the one consumer; it comes back, and the read it is handed to is
    cancelled before it takes it (a caller's timeout). The other read takes it: it does not
    wait, with the consumer idle, until some later read happens to return one."""
    connection = KafkaConnection(kafka_bootstrap)
    readers = KafkaReaders(
        lambda: connection.consumer(role="reader", group_id=None),
        size=1,
        read_timeout_s=READ_TIMEOUT_S,
    )
    await readers.start()

    async def read() -> None:
        async with readers.lent():
            pass

    try:
        busy = readers.lent()
        await busy.__aenter__()
        handed = asyncio.create_task(read())
        waiting = asyncio.create_task(read())
        await asyncio.sleep(0.1)  # both wait for the consumer
        await busy.__aexit__(None, None, None)
        handed.cancel()
        done, _ = await asyncio.wait({waiting}, timeout=READ_TIMEOUT_S * 2)
        waiting.cancel()
        assert waiting in done, "the waiting read was left waiting with the consumer idle"
        await waiting
        with pytest.raises(asyncio.CancelledError):
            await handed
    finally:
        for consumer in readers.consumers:
            await consumer.stop()
