"""A Kafka worker that stops serving leaves its consumer group, however serving ends.

A consumer left open keeps heartbeating: the group goes on giving it partitions whose requests
nobody reads, for as long as the process lives. So the worker leaves the group when the
``on_ready`` callback it was given raises, and when its serving task is cancelled twice in a
row (Python 3.11's `asyncio.wait_for` cancels a stop that has not begun yet).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from support.fault_runs import until
from support.faulty_proxy import FaultyProxy
from support.kafka import group_members
from support.private_servers import PrivateKafka

from onward._storage.kafka import KafkaConnection
from onward.errors import ConfigurationError
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.fleet.requests import ensure_requests_topic
from onward.runtime.fleet.worker import _LEAVE_S, Worker, _leaving
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.settings import Settings

pytestmark = pytest.mark.kafka
LOOK_S = 8.0
"""How long the group is watched for a member left behind (a first join takes about 3 s: the
broker's initial rebalance delay)."""


@pytest_asyncio.fixture
async def backends(tmp_path: Path) -> AsyncIterator[Backends]:
    settings = Settings.model_validate(
        {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "leaves.db")}
    )
    async with open_backends(settings) as opened:
        yield opened


async def no_member_stays(bootstrap: str, group: str) -> None:
    """Fail as soon as the group has a member while ``LOOK_S`` pass."""
    ends = time.monotonic() + LOOK_S
    while time.monotonic() < ends:
        assert await group_members(bootstrap, group) == 0, (
            "the worker's consumer is still in its group"
        )
        await asyncio.sleep(0.5)


async def until_empty(bootstrap: str, group: str) -> None:
    """Until the group has no member; fail once ``LOOK_S`` pass."""
    ends = time.monotonic() + LOOK_S
    while await group_members(bootstrap, group):
        assert time.monotonic() < ends, "the worker's consumer is still in its group"
        await asyncio.sleep(0.2)


def worker_of(backends: Backends) -> Worker:
    agent = Agent(name="writer", instructions="w")
    return Worker(backends, ScriptedProvider([reply("done")]), {"writer": agent}, recheck_s=60)


def serve(
    worker: Worker,
    stop: asyncio.Event,
    bootstrap_servers: str | KafkaConnection,
    topic: str,
    **options: Any,
) -> Coroutine[Any, Any, None]:
    """``worker`` serving ``topic`` in the group ``<topic>.workers``, with a 6 s session
    timeout and unsigned requests taken, as every test here serves."""
    return worker.serve_kafka(
        stop,
        bootstrap_servers=bootstrap_servers,
        topic=topic,
        group_id=f"{topic}.workers",
        session_timeout_ms=6000,
        accept_unsigned=True,
        **options,
    )


async def test_a_worker_whose_on_ready_raises_leaves_its_group(
    kafka_bootstrap: str, requests_topic: str, backends: Backends
) -> None:
    group = f"{requests_topic}.workers"

    def on_ready() -> None:
        raise RuntimeError("the readiness file could not be written")

    with pytest.raises(RuntimeError, match="readiness file"):
        await serve(
            worker_of(backends), asyncio.Event(), kafka_bootstrap, requests_topic, on_ready=on_ready
        )
    await no_member_stays(kafka_bootstrap, group)


async def test_a_worker_cancelled_twice_leaves_its_group(
    kafka_bootstrap: str, requests_topic: str, backends: Backends
) -> None:
    group = f"{requests_topic}.workers"
    worker = worker_of(backends)
    served = asyncio.create_task(serve(worker, asyncio.Event(), kafka_bootstrap, requests_topic))
    await until(lambda: worker.joined, "the worker in its group")
    assert await group_members(kafka_bootstrap, group) == 1
    served.cancel()
    await asyncio.sleep(0)  # the serving task is in its ``finally`` now, leaving the group
    served.cancel()
    with pytest.raises(asyncio.CancelledError):
        await served
    await until_empty(kafka_bootstrap, group)


LEAVES = {
    "failed": (
        KafkaError("the coordinator went away"),
        "failed: KafkaError: the coordinator went away",
    ),
    "cut": (asyncio.CancelledError(), "was cut (its stop was cancelled)"),
}
"""How the consumer's stop ends, and the words the worker's leave says of it."""


@pytest.mark.parametrize("cause", list(LEAVES))
async def test_a_worker_whose_leave_did_not_end_says_how_in_its_own_words(
    kafka_bootstrap: str,
    requests_topic: str,
    backends: Backends,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    cause: str,
) -> None:
    """The consumer's stop raised a Kafka error, or ended cancelled though the worker was
    not: the worker says which, naming the group and its session timeout, and not the words
    of the other (an operator reads "failed" as the broker's refusal, "was cut" as a
    cancellation), nor that it left."""
    raised, words = LEAVES[cause]
    stop_for_real = AIOKafkaConsumer.stop

    async def stop_ending_so(consumer: AIOKafkaConsumer) -> None:
        await stop_for_real(consumer)
        raise raised

    monkeypatch.setattr(AIOKafkaConsumer, "stop", stop_ending_so)
    group = f"{requests_topic}.workers"
    stop = asyncio.Event()
    worker = worker_of(backends)
    with caplog.at_level(logging.INFO, logger="onward.worker"):
        served = asyncio.ensure_future(serve(worker, stop, kafka_bootstrap, requests_topic))
        await until(lambda: worker.joined, "the worker in its group")
        stop.set()
        async with asyncio.timeout(_LEAVE_S + 10):
            await served  # returns: the leave's outcome is said, not raised
    said = [record.getMessage() for record in caplog.records]
    [left] = [line for line in said if line.startswith(f"leaving the group {group} ")]
    assert left == (
        f"leaving the group {group} {words}; the group drops this worker after its session "
        "timeout (6s)"
    ), left
    [other] = [other for name, (_, other) in LEAVES.items() if name != cause]
    assert other not in left, left
    assert f"left the group {group}" not in said, said


async def test_a_worker_stopped_while_it_joins_returns_and_leaves_no_connection_open(
    kafka_bootstrap: str, requests_topic: str, backends: Backends
) -> None:
    """SIGTERM to a worker whose broker does not answer yet (a pod stopped during a rollout):
    it waited out the whole connect and then raised `BackendUnavailableError` (exit 5), as
    though Kafka had failed, rather than stop."""
    host, port = kafka_bootstrap.rsplit(":", 1)
    async with FaultyProxy(host, int(port)) as proxy:
        proxy.hold_replies_after(1)
        stop = asyncio.Event()
        through_proxy = KafkaConnection(f"127.0.0.1:{proxy.port}", request_timeout_s=2)
        served = asyncio.ensure_future(
            serve(worker_of(backends), stop, through_proxy, requests_topic)
        )
        async with asyncio.timeout(10):
            await proxy.reply_held.wait()
        stop.set()
        await asyncio.wait([served], timeout=6)
        assert served.done(), "the stopped worker still waits on the broker"
        assert served.result() is None
        async with asyncio.timeout(2):
            await proxy.idle.wait()


async def test_a_worker_refused_its_requests_topic_leaves_no_consumer_unclosed(
    kafka_bootstrap: str, requests_topic: str, backends: Backends
) -> None:
    """The requests topic has another partition count than the log: the worker is refused
    (`ConfigurationError`) before it joins, and closes the consumer it built for the group,
    which left open was reported as an error ("Unclosed AIOKafkaConsumer") once collected."""
    await ensure_requests_topic(kafka_bootstrap, requests_topic, backends.log.partitions + 1)
    reported: list[str] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: reported.append(str(context.get("message"))))
    try:
        with pytest.raises(ConfigurationError, match="partition"):
            await worker_of(backends).serve_kafka(
                asyncio.Event(),
                bootstrap_servers=kafka_bootstrap,
                topic=requests_topic,
                group_id=f"{requests_topic}.workers",
                accept_unsigned=True,
            )
        gc.collect()
    finally:
        loop.set_exception_handler(None)
    assert reported == []


@dataclass
class Serving:
    """A worker serving a private broker, joined to its group."""

    stop: asyncio.Event
    task: asyncio.Future[None]
    group: str


@asynccontextmanager
async def serving_on_a_paused_broker(
    private_kafka: PrivateKafka, backends: Backends
) -> AsyncIterator[Serving]:
    """A worker joined to its group on ``private_kafka``, which is paused for the block and
    resumed after it, however the block ends."""
    topic = f"requests-{uuid.uuid4().hex[:8]}"
    group = f"{topic}.workers"
    stop = asyncio.Event()
    worker = worker_of(backends)
    task = asyncio.ensure_future(serve(worker, stop, private_kafka.bootstrap, topic))
    await until(lambda: worker.joined, "the worker in its group")
    private_kafka.pause()
    try:
        yield Serving(stop, task, group)
    finally:
        private_kafka.resume()


@pytest.mark.faults  # freezes a private broker: run by `make test-faults`
@pytest.mark.slow
async def test_a_worker_whose_broker_stops_answering_says_it_did_not_leave_its_group(
    private_kafka: PrivateKafka, backends: Backends, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker stopped while its broker does not answer gives up leaving its group after
    `_LEAVE_S` and says so: it logged "left the group", so an operator looking for why the
    group still counted it for a session timeout was told it had left."""
    async with serving_on_a_paused_broker(private_kafka, backends) as serving:
        with caplog.at_level(logging.INFO, logger="onward.worker"):
            serving.stop.set()
            async with asyncio.timeout(_LEAVE_S + 10):
                await serving.task
    said = [record.getMessage() for record in caplog.records]
    assert "left the group" not in said, said
    assert any(line.startswith("leaving the group") and "gave up" in line for line in said), said


def kafka_client_tasks() -> list[str]:
    """The running tasks of this loop that run aiokafka's code (its clients' own tasks)."""
    running = []
    for task in asyncio.all_tasks():
        coro = task.get_coro()
        code = getattr(coro, "cr_code", None)
        if not task.done() and code is not None and "aiokafka" in code.co_filename:
            running.append(code.co_qualname)
    return running


@pytest.mark.faults  # freezes a private broker: run by `make test-faults`
@pytest.mark.slow
async def test_a_worker_whose_leave_gave_up_names_its_group_and_leaves_no_client_task_running(
    private_kafka: PrivateKafka, backends: Backends, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker whose leave gave up on a broker that does not answer names the group and the
    session timeout after which the group drops it, and ends every task its consumer started:
    the client's metadata task and the connections' readers ran on (and the coordinator's
    heartbeat, were it still going, kept the member in the group) for as long as an
    application embedding the worker lived."""
    async with serving_on_a_paused_broker(private_kafka, backends) as serving:
        with caplog.at_level(logging.INFO, logger="onward.worker"):
            serving.stop.set()
            async with asyncio.timeout(_LEAVE_S * 2 + 10):
                await serving.task
    (gave_up,) = [r.getMessage() for r in caplog.records if "gave up" in r.getMessage()]
    assert serving.group in gave_up, gave_up
    assert "session timeout (6s)" in gave_up, gave_up
    await until(lambda: not kafka_client_tasks(), "the consumer's tasks ending", within_s=5)


@pytest.mark.faults  # freezes a private broker: run by `make test-faults`
@pytest.mark.slow
async def test_a_worker_cancelled_while_its_leave_waits_leaves_no_client_task_running(
    private_kafka: PrivateKafka, backends: Backends
) -> None:
    """A worker cancelled while it leaves its group with the broker not answering (a shutdown
    bounded by a timeout) lets its consumer's stop go on in a task of its own, and that stop is
    bounded as the caller's wait was: its tasks and connections are ended once `_LEAVE_S`
    passed, not left running for as long as the broker stays away."""
    async with serving_on_a_paused_broker(private_kafka, backends) as serving:
        before = set(_leaving)
        serving.stop.set()
        await until(lambda: bool(_leaving - before), "the worker leaving its group")
        serving.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await serving.task
        await until(
            lambda: not kafka_client_tasks(), "the consumer's tasks ending", within_s=_LEAVE_S + 5
        )
