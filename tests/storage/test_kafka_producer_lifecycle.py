"""A Kafka producer's life in `Requests` and `KafkaEventLog`: an open cancelled while the
producer starts leaves nothing behind, and an event log whose producer could not be replaced
after a fatal error appends again once Kafka answers. Real Kafka; `AIOKafkaProducer.start` is
wrapped to hold an open at the moment it is cancelled, a producer's ``send_batch`` to raise
the fatal error (as in tests/eventlog/test_kafka.py), and a `TcpProxy` cuts the broker's way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import OutOfOrderSequenceNumber
from support.kafka import broker_redirected
from support.proxy import TcpProxy

from onward._storage import Resource
from onward.errors import InvalidInputError, ProducerFatalError
from onward.eventlog import KafkaEventLog
from onward.runtime.fleet.requests import Requests
from onward.testing.eventlog import new_run_id, seqs, step_events

pytestmark = pytest.mark.kafka
PARTITIONS = 3


class Held:
    """The producers started since the fixture began, each held once its start connected."""

    def __init__(self) -> None:
        self.producers: list[AIOKafkaProducer] = []
        self.one_started = asyncio.Event()


@pytest.fixture
def started_producers(monkeypatch: pytest.MonkeyPatch) -> Held:
    """Every producer started from now on, once its start has connected, held there until
    the open around it is cancelled."""
    held = Held()
    original = AIOKafkaProducer.start

    async def start(self: AIOKafkaProducer) -> None:
        await original(self)
        held.producers.append(self)
        held.one_started.set()
        await asyncio.Event().wait()  # the open is cancelled here

    monkeypatch.setattr(AIOKafkaProducer, "start", start)
    return held


def _leftovers(producer: AIOKafkaProducer) -> list[str]:
    """What of a producer is still alive: its background tasks and open connections."""
    alive = []
    sender_task = producer._sender.sender_task
    if sender_task is not None and not sender_task.done():
        alive.append("sender task")
    sync_task = producer.client._sync_task
    if sync_task is not None and not sync_task.done():
        alive.append("metadata task")
    conns = producer.client._conns.items()
    return alive + [f"connection {key[1]}" for key, conn in conns if conn.connected()]


async def _cancelled_open(make: Callable[[], Resource], held: Held) -> None:
    resource = make()
    opening = asyncio.create_task(resource.start())
    async with asyncio.timeout(30):
        await held.one_started.wait()
    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening
    await asyncio.sleep(0.1)
    assert not resource.is_open
    (producer,) = held.producers
    left = _leftovers(producer)
    if left:
        await producer.stop()
    assert left == []


async def test_a_requests_sender_whose_open_is_cancelled_leaves_no_producer_running(
    kafka_bootstrap: str, requests_topic: str, started_producers: Held
) -> None:
    """An application's startup cancelled by its server's shutdown (or a timeout around the
    open) while the producer connects: the producer is not stored for `close` to find, so it
    must be stopped there, or its connections and tasks live as long as the event loop."""
    await _cancelled_open(
        lambda: Requests(kafka_bootstrap, requests_topic, partitions=PARTITIONS), started_producers
    )


async def test_an_event_log_whose_open_is_cancelled_leaves_no_producer_running(
    kafka_bootstrap: str, kafka_topic: str, started_producers: Held
) -> None:
    """As for `Requests`: the event log's producer is stored only once it started."""
    await _cancelled_open(
        lambda: KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=PARTITIONS),
        started_producers,
    )


@pytest.fixture
def broker_through_proxy(kafka_bootstrap: str) -> Iterator[dict[str, int]]:
    """Clients are told the proxy's address for the broker (it advertises its own) once the
    test puts the proxy's port in the dict; undone before the topic fixture deletes the topic."""
    with broker_redirected(kafka_bootstrap) as proxied:
        yield proxied


async def test_an_event_log_whose_producer_could_not_be_replaced_appends_once_kafka_is_back(
    kafka_bootstrap: str,
    kafka_topic: str,
    broker_through_proxy: dict[str, int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fatal error while the broker is down: the new producer cannot start. The log stays
    open, and the next append (a resume once Kafka is back) starts one, rather than the log
    refusing every append for good as "not started" until the process restarts."""
    host, _, port = kafka_bootstrap.rpartition(":")
    run_id = new_run_id()
    async with TcpProxy(host, int(port)) as proxy:
        broker_through_proxy["port"] = proxy.port
        log = KafkaEventLog(
            f"127.0.0.1:{proxy.port}", topic=kafka_topic, partitions=2, request_timeout_s=1.0
        )
        async with log:
            await log.append(step_events(run_id, 1))
            broken = log._producer
            assert broken is not None

            async def fatal(*args: object, **kwargs: object) -> object:
                await proxy.cut()  # the broker goes down as the session breaks
                raise OutOfOrderSequenceNumber()

            monkeypatch.setattr(broken, "send_batch", fatal)
            with pytest.raises(ProducerFatalError, match=run_id):
                await log.append(step_events(run_id, 1, first_seq=2))
            await proxy.restore()
            await log.append(step_events(run_id, 1, first_seq=2))
            assert seqs(await log.read_run(run_id)) == [1, 2]
        assert log._producer is None


@pytest.fixture
def every_client(monkeypatch: pytest.MonkeyPatch) -> list[AIOKafkaProducer | AIOKafkaConsumer]:
    """Every producer and consumer started from now on, once its start returned."""
    started: list[AIOKafkaProducer | AIOKafkaConsumer] = []
    for cls in (AIOKafkaProducer, AIOKafkaConsumer):

        def wrapped(original: Callable[..., Any]) -> Callable[..., Any]:
            async def start(self: Any) -> None:
                await original(self)
                started.append(self)

            return start

        monkeypatch.setattr(cls, "start", wrapped(cls.start))
    return started


def _running(clients: list[AIOKafkaProducer | AIOKafkaConsumer]) -> list[str]:
    return [type(client).__name__ for client in clients if not client._closed]


async def test_an_event_log_started_twice_at_once_leaves_nothing_running_once_closed(
    kafka_bootstrap: str,
    kafka_topic: str,
    every_client: list[AIOKafkaProducer | AIOKafkaConsumer],
) -> None:
    """Two parts of an application starting the log they share at the same moment: one set
    of clients, all stopped by the close, not a second set nobody holds any more."""
    log = KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=PARTITIONS)
    await asyncio.gather(log.start(), log.start())
    await log.close()
    left = _running(every_client)
    for client in every_client:
        await client.stop()
    assert left == []


async def test_an_event_log_closed_while_it_starts_is_left_closed_with_nothing_running(
    kafka_bootstrap: str,
    kafka_topic: str,
    every_client: list[AIOKafkaProducer | AIOKafkaConsumer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An application shut down while its log starts (its startup and its shutdown both
    under way): once the close has returned and the start has ended, the log is closed and
    no client of it is left running, whichever ended first."""
    producer_started, go_on = asyncio.Event(), asyncio.Event()
    original = AIOKafkaProducer.start

    async def held_start(self: AIOKafkaProducer) -> None:
        await original(self)
        producer_started.set()
        await go_on.wait()

    monkeypatch.setattr(AIOKafkaProducer, "start", held_start)
    log = KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=PARTITIONS)
    starting = asyncio.create_task(log.start())
    async with asyncio.timeout(30):
        await producer_started.wait()
    await log.close()
    go_on.set()
    with pytest.raises(InvalidInputError, match="closed"):
        await starting
    assert not log.is_open
    left = _running(every_client)
    for client in every_client:
        await client.stop()
    assert left == []
