"""A Kafka client whose start is cancelled while it waits for the cluster's metadata leaves no
connection open.

aiokafka's bootstrap closes its first connection on every failure but a cancellation, and
nothing else holds that connection: cancelled there (an app closed while a reader started, a
startup cut short), its socket and reader task lived as long as the event loop, and the test
run's unraisable-warning check failed on it at random. Real Kafka behind a `FaultyProxy` that
passes each connection's first answer (the API versions) and holds the metadata answer, so the
cancellation lands exactly there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from support.faulty_proxy import FaultyProxy

from onward._storage.kafka import KafkaConnection
from onward.eventlog.kafka_readers import KafkaReaders

pytestmark = pytest.mark.kafka

REQUEST_TIMEOUT_S = 2.0


def _connection_start(connection: KafkaConnection) -> Awaitable[None]:
    return connection.start(connection.consumer(role="reader", group_id=None))


def _readers_start(connection: KafkaConnection) -> Awaitable[None]:
    readers = KafkaReaders(
        lambda: connection.consumer(role="reader", group_id=None),
        size=1,
        read_timeout_s=REQUEST_TIMEOUT_S,
    )
    return readers.start()


@pytest.mark.parametrize(
    "start", [_connection_start, _readers_start], ids=["connection", "readers"]
)
async def test_a_start_cancelled_while_it_waits_for_metadata_leaves_no_connection_open(
    kafka_bootstrap: str, start: Callable[[KafkaConnection], Awaitable[None]]
) -> None:
    host, port = kafka_bootstrap.rsplit(":", 1)
    async with FaultyProxy(host, int(port)) as proxy:
        proxy.hold_replies_after(1)
        connection = KafkaConnection(f"127.0.0.1:{proxy.port}", request_timeout_s=REQUEST_TIMEOUT_S)
        starting = asyncio.ensure_future(start(connection))
        async with asyncio.timeout(10):
            await proxy.reply_held.wait()
        assert not proxy.idle.is_set()
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        async with asyncio.timeout(REQUEST_TIMEOUT_S * 3):
            await proxy.idle.wait()


async def _cancelled_at_every_turn(task: asyncio.Future[None]) -> None:
    """Cancel ``task`` at each turn of the event loop until it ends: what a cancel scope that
    cancels again until it is left does (anyio's, which the MCP SDK and ASGI servers use)."""
    while not task.done():
        task.cancel()
        await asyncio.sleep(0)


@pytest.mark.parametrize(
    "start", [_connection_start, _readers_start], ids=["connection", "readers"]
)
async def test_a_start_cancelled_again_and_again_leaves_no_connection_open(
    kafka_bootstrap: str, start: Callable[[KafkaConnection], Awaitable[None]]
) -> None:
    """Each further cancellation lands in what the first one left to do (waiting for the start
    to end, stopping the client): none of it may be cut short, or the client's connections
    stay open as long as the event loop lives."""
    host, port = kafka_bootstrap.rsplit(":", 1)
    async with FaultyProxy(host, int(port)) as proxy:
        proxy.hold_replies_after(1)
        connection = KafkaConnection(f"127.0.0.1:{proxy.port}", request_timeout_s=REQUEST_TIMEOUT_S)
        starting = asyncio.ensure_future(start(connection))
        async with asyncio.timeout(10):
            await proxy.reply_held.wait()
        assert not proxy.idle.is_set()
        await _cancelled_at_every_turn(starting)
        with pytest.raises(asyncio.CancelledError):
            await starting
        async with asyncio.timeout(REQUEST_TIMEOUT_S * 4):
            await proxy.idle.wait()


async def test_a_reader_start_cancelled_waits_for_the_request_timeout_not_the_read_timeout(
    kafka_bootstrap: str,
) -> None:
    """A reader's start ends by itself within the consumer's request timeout: a cancelled one
    waited only the (shorter) read timeout, cut the start short there and left its bootstrap
    connection open."""
    host, port = kafka_bootstrap.rsplit(":", 1)
    async with FaultyProxy(host, int(port)) as proxy:
        proxy.hold_replies_after(1)
        connection = KafkaConnection(f"127.0.0.1:{proxy.port}", request_timeout_s=REQUEST_TIMEOUT_S)
        readers = KafkaReaders(
            lambda: connection.consumer(role="reader", group_id=None),
            size=1,
            read_timeout_s=0.2,
        )
        starting = asyncio.ensure_future(readers.start())
        async with asyncio.timeout(10):
            await proxy.reply_held.wait()
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        async with asyncio.timeout(REQUEST_TIMEOUT_S * 3):
            await proxy.idle.wait()


async def test_a_group_consumer_start_cancelled_ends_within_the_connection_request_timeout(
    kafka_bootstrap: str,
) -> None:
    """A group member's requests may wait the rebalance timeout and more (15 s by default),
    for the broker's JoinGroup; its start waited that long too when cancelled, so a worker or
    projector told to stop while it connected to a silent broker outlived
    ``ONWARD_BACKEND_TIMEOUT`` (and a grace period). It still leaves no connection open."""
    host, port = kafka_bootstrap.rsplit(":", 1)
    async with FaultyProxy(host, int(port)) as proxy:
        proxy.hold_replies_after(1)
        connection = KafkaConnection(f"127.0.0.1:{proxy.port}", request_timeout_s=REQUEST_TIMEOUT_S)
        consumer = connection.consumer(role="member", group_id="a-group")
        starting = asyncio.ensure_future(connection.start(consumer))
        async with asyncio.timeout(10):
            await proxy.reply_held.wait()
        starting.cancel()
        await asyncio.wait([starting], timeout=REQUEST_TIMEOUT_S * 3)
        assert starting.done(), "the cancelled start outlived the connection's request timeout"
        with pytest.raises(asyncio.CancelledError):
            await starting
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            await proxy.idle.wait()


@pytest.mark.parametrize(
    "start", [_connection_start, _readers_start], ids=["connection", "readers"]
)
async def test_a_cancelled_start_ends_at_once_and_leaves_no_connection_open(
    kafka_bootstrap: str, start: Callable[[KafkaConnection], Awaitable[None]]
) -> None:
    """Cancelled, the start was waited out until its request timeout failed it: a worker or
    projector stopped while it connected to a broker that does not answer took the whole
    ``ONWARD_BACKEND_TIMEOUT`` (30 s by default, a pod's whole grace period) to end."""
    host, port = kafka_bootstrap.rsplit(":", 1)
    async with FaultyProxy(host, int(port)) as proxy:
        proxy.hold_replies_after(1)
        connection = KafkaConnection(f"127.0.0.1:{proxy.port}", request_timeout_s=30)
        starting = asyncio.ensure_future(start(connection))
        async with asyncio.timeout(10):
            await proxy.reply_held.wait()
        starting.cancel()
        await asyncio.wait([starting], timeout=3)
        assert starting.done(), "the cancelled start still waits on the broker"
        assert starting.cancelled()
        async with asyncio.timeout(1):
            await proxy.idle.wait()
