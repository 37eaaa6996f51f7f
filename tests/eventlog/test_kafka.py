"""What only the Kafka backend has: topic layout, headers a foreign client sees, recovery."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import subprocess
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import OutOfOrderSequenceNumber
from aiokafka.partitioner import murmur2 as aiokafka_murmur2

from onward.errors import (
    BackendUnavailableError,
    ConfigurationError,
    InvalidInputError,
    ProducerFatalError,
)
from onward.eventlog import KafkaEventLog, partition_for
from onward.eventlog.base import LogRecord, murmur2
from onward.eventlog.kafka import record_of
from onward.eventlog.kafka_readers import KafkaReaders
from onward.testing.eventlog import new_run_id, seqs, step_events

pytestmark = pytest.mark.kafka


@pytest_asyncio.fixture
async def admin(kafka_bootstrap: str) -> AsyncIterator[AIOKafkaAdminClient]:
    client = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await client.start()
    yield client
    await client.close()


async def test_topic_is_created_with_delete_policy_and_infinite_retention(
    kafka_bootstrap: str, admin: AIOKafkaAdminClient, kafka_topic: str
) -> None:
    async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=3):
        pass
    (described,) = await admin.describe_topics([kafka_topic])
    assert len(described["partitions"]) == 3
    (response,) = await admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, kafka_topic)]
    )
    configs = {name: value for name, value, *_ in response.resources[0][4]}
    assert configs["cleanup.policy"] == "delete"
    assert configs["retention.ms"] == "-1"


async def test_a_topic_with_another_partition_count_is_refused(
    kafka_bootstrap: str, admin: AIOKafkaAdminClient, kafka_topic: str
) -> None:
    await admin.create_topics([NewTopic(kafka_topic, 2, 1)])
    log = KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=4)
    with pytest.raises(ConfigurationError, match="has 2 partitions, the configuration says 4"):
        await log.start()


async def test_a_missing_topic_is_refused_when_creation_is_off(
    kafka_bootstrap: str, kafka_topic: str
) -> None:
    log = KafkaEventLog(kafka_bootstrap, topic=kafka_topic, create_topic=False)
    with pytest.raises(ConfigurationError, match="does not exist"):
        await log.start()


async def test_an_unreachable_broker_is_a_retryable_unavailable_error() -> None:
    log = KafkaEventLog("127.0.0.1:1", topic="onward.events")
    with pytest.raises(BackendUnavailableError, match=r"127\.0\.0\.1:1") as caught:
        await log.start()
    assert caught.value.retryable


async def test_kcat_reads_json_with_run_kind_fence_and_format_headers(
    kafka_bootstrap: str, kafka_topic: str
) -> None:
    kcat = shutil.which("kcat")
    assert kcat, "kcat is missing; scripts/services.sh up installs it (apt-get install kcat)"
    run_id = new_run_id()
    async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=2) as log:
        (position,) = await log.append(step_events(run_id, 1, fence=7))
    argv = [kcat, "-b", kafka_bootstrap, "-C", "-t", kafka_topic, "-p", str(position.partition)]
    argv += ["-o", str(position.offset), "-c", "1", "-e", "-J", "-q"]
    result = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=60, check=True
    )
    record = json.loads(result.stdout.strip().splitlines()[0])
    headers = dict(zip(record["headers"][::2], record["headers"][1::2], strict=True))
    assert headers == {
        "onward.run_id": run_id,
        "onward.kind": "run.started",
        "onward.fence": "7",
        "onward.format": "1",
    }
    assert record["key"] == run_id
    body = json.loads(record["payload"])
    assert (body["kind"], body["run_id"], body["seq"], body["fence"]) == (
        "run.started",
        run_id,
        1,
        7,
    )


async def test_the_producer_waits_for_every_in_sync_replica_and_is_idempotent(
    kafka_bootstrap: str, kafka_topic: str
) -> None:
    """The producer appends go through and its replacement after a fatal error both ask for
    ``acks=all`` (-1 on the wire: every in-sync replica has the batch before the broker
    answers) and hold a producer id the broker assigned (idempotence: a retried batch is
    written once). Either setting dropped would pass every test that kills clients, not
    brokers."""
    async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=2) as log:
        await log.append(step_events(new_run_id(), 1))
        first = log._producer
        assert first is not None
        await log._replace_producer(first)
        await log.append(step_events(new_run_id(), 1))
        for producer in (first, log._producer):
            assert producer is not None
            assert producer._sender._acks == -1
            assert producer._txn_manager is not None
            assert producer._txn_manager.has_pid()
        assert log._producer is not first


async def test_producer_is_replaced_after_a_fatal_error(
    kafka_bootstrap: str, kafka_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = new_run_id()
    async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=2) as log:
        await log.append(step_events(run_id, 2))
        broken = log._producer
        assert broken is not None

        async def fail_once(*args: object, **kwargs: object) -> object:
            raise OutOfOrderSequenceNumber()

        # Fault injection: the broker is real; the session failure is forced on our side.
        monkeypatch.setattr(broken, "send_batch", fail_once)
        generation = log.producer_generation
        with pytest.raises(ProducerFatalError, match=run_id):
            await log.append(step_events(run_id, 1, first_seq=3))
        assert log.producer_generation == generation + 1
        assert log._producer is not broken
        await log.append(step_events(run_id, 1, first_seq=3))
        assert seqs(await log.read_run(run_id)) == [1, 2, 3]


async def test_runs_land_where_the_java_partitioner_puts_their_key(
    kafka_bootstrap: str, kafka_topic: str
) -> None:
    # Computed with Kafka 3.9's own org.apache.kafka.common.utils.Utils.murmur2 and toPositive.
    java_partitions = {"run-1": 1, "run-2": 5, "acme/booking-42": 11, "ünï": 11, "21": 0}
    assert {k: partition_for(k, 12) for k in java_partitions} == java_partitions
    async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=5) as log:
        for run_id in [new_run_id() for _ in range(10)]:
            (position,) = await log.append(step_events(run_id, 1))
            assert position.partition == partition_for(run_id, 5)


def test_murmur2_is_aiokafkas_for_every_length_and_byte() -> None:
    """Onward's own murmur2 (kept out of aiokafka so SQLite processes need not import it) hashes
    every key as aiokafka's does: every length 0 to 64 (each tail of 0 to 3 bytes), every byte
    value, and keys in UTF-8, so a run never moves partition."""
    rng = random.Random(20261207)
    keys = [rng.randbytes(length) for length in range(65) for _ in range(200)]
    keys += [bytes([b]) * n for b in range(256) for n in (1, 2, 3, 4, 7)]
    keys += [f"run-{i}-ünï-{'✓' * (i % 5)}".encode() for i in range(2000)]
    assert [murmur2(key) for key in keys] == [aiokafka_murmur2(key) for key in keys]


async def test_concurrent_appends_to_one_partition_each_land_whole_and_in_order(
    kafka_bootstrap: str, kafka_topic: str
) -> None:
    runs = [new_run_id() for _ in range(200)]
    async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=1) as log:

        async def run_steps(run_id: str) -> list[int]:
            offsets: list[int] = []
            for first in (1, 4, 7):
                positions = await log.append(step_events(run_id, 3, first_seq=first))
                offsets += [p.offset for p in positions]
                assert [p.offset for p in positions] == list(
                    range(positions[0].offset, positions[0].offset + 3)
                )
            return offsets

        results = await asyncio.gather(*(run_steps(r) for r in runs))
        every = [o for offsets in results for o in offsets]
        assert len(set(every)) == len(every) == 200 * 9
        for run_id, offsets in zip(runs, results, strict=True):
            stored = await log.read_run(run_id)
            assert seqs(stored) == list(range(1, 10))
            assert [s.position.offset for s in stored] == offsets


async def test_a_read_does_not_wait_for_another_read_in_progress(
    kafka_bootstrap: str, kafka_topic: str
) -> None:
    """While one consumer is lent to a read, the next read gets another, up to ``readers``;
    past that it waits for one to come back. Reads of both runs see every event."""
    async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=3, readers=2) as log:
        runs = [new_run_id() for _ in range(2)]
        for run_id in runs:
            await log.append(step_events(run_id, 3))
        readers = log._live_readers()
        async with readers.lent() as first:
            async with asyncio.timeout(10):
                async with readers.lent() as second:
                    assert second is not first
                    waiting = asyncio.create_task(_lend_and_return(readers))
                    await asyncio.sleep(0.3)
                    assert not waiting.done(), "a third read did not wait: past the limit"
            await asyncio.wait_for(waiting, 10)  # the second came back: the third took it
            assert len(readers.consumers) == 2
            reads = await asyncio.wait_for(
                asyncio.gather(*(log.read_run(run_id) for run_id in runs)), 10
            )
        assert [seqs(read) for read in reads] == [[1, 2, 3], [1, 2, 3]]


async def _lend_and_return(readers: KafkaReaders) -> None:
    async with readers.lent():
        pass


class _ConsumerStartingOnCue(AIOKafkaConsumer):  # type: ignore[misc]
    """A real consumer whose start waits for ``go`` before connecting: a start under way."""

    def __init__(self, starting: asyncio.Event, go: asyncio.Event, **config: object) -> None:
        super().__init__(**config)
        self._starting = starting
        self._go = go

    async def start(self) -> None:
        self._starting.set()
        await self._go.wait()
        await super().start()


async def test_a_consumer_started_while_the_log_closes_is_stopped_and_the_read_refused(
    kafka_bootstrap: str,
) -> None:
    """A read that needs a new consumer starts one; if the log forgets its consumers (closes)
    before that start ends, the new consumer is stopped there and the read refused, rather than
    left connected and out of reach of anyone's stop."""
    starting, go = asyncio.Event(), asyncio.Event()
    built: list[AIOKafkaConsumer] = []

    def new_consumer() -> AIOKafkaConsumer:
        if built:
            consumer = _ConsumerStartingOnCue(starting, go, bootstrap_servers=kafka_bootstrap)
        else:
            consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap)
        built.append(consumer)
        return consumer

    readers = KafkaReaders(new_consumer, size=2, read_timeout_s=5)
    await readers.start()
    async with readers.lent():
        reading = asyncio.create_task(_lend_and_return(readers))
        await asyncio.wait_for(starting.wait(), 10)
        being_stopped = readers.consumers
        readers.forget()
        for consumer in being_stopped:
            await consumer.stop()
        go.set()
        with pytest.raises(InvalidInputError, match="closed during this read"):
            await asyncio.wait_for(reading, 10)
    assert len(built) == 2
    assert built[1] not in being_stopped
    assert not any(_connected(consumer) for consumer in built), "a consumer was left connected"


class _ConsumerFetchingOnCue(AIOKafkaConsumer):  # type: ignore[misc]
    """A real consumer whose fetches wait for ``go`` first: a read under way."""

    def __init__(self, fetching: asyncio.Event, go: asyncio.Event, **config: object) -> None:
        super().__init__(**config)
        self._fetching = fetching
        self._go = go

    async def getmany(self, *partitions: TopicPartition, **options: object) -> object:
        self._fetching.set()
        await self._go.wait()
        return await super().getmany(*partitions, **options)


async def test_a_read_whose_consumer_the_closing_log_stops_is_refused_as_closed(
    kafka_bootstrap: str, kafka_topic: str
) -> None:
    """A read under way when the log closes fails as one started after the close does, not as
    an outage (`BackendUnavailableError`) that a caller would retry only to be refused then."""
    async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=1) as log:
        run_id = new_run_id()
        await log.append(step_events(run_id, 3))
    fetching, go = asyncio.Event(), asyncio.Event()
    readers = KafkaReaders(
        lambda: _ConsumerFetchingOnCue(fetching, go, bootstrap_servers=kafka_bootstrap),
        size=1,
        read_timeout_s=5,
    )
    await readers.start()
    tp = TopicPartition(kafka_topic, 0)

    async def read_all() -> list[LogRecord]:
        async with readers.lent() as reader:
            return await readers.read(
                reader, tp, 0, 3, key=None, limit=None, record_of=record_of, run_id=None
            )

    reading = asyncio.create_task(read_all())
    await asyncio.wait_for(fetching.wait(), 10)
    being_stopped = readers.consumers
    readers.forget()
    for consumer in being_stopped:
        await consumer.stop()
    go.set()
    with pytest.raises(InvalidInputError, match="closed during this read"):
        await asyncio.wait_for(reading, 10)


def _connected(consumer: AIOKafkaConsumer) -> bool:
    """Whether any of the consumer's broker connections is still open."""
    return any(conn.connected() for conn in consumer._client._conns.values())


async def test_a_read_waiting_for_a_consumer_when_the_log_closes_is_refused(
    kafka_bootstrap: str, kafka_topic: str
) -> None:
    """Every consumer lent and the log closed: the read waiting for one is told the log closed
    when the lent one comes back, not handed a stopped consumer."""
    log = await KafkaEventLog.open(kafka_bootstrap, topic=kafka_topic, partitions=3, readers=1)
    readers = log._live_readers()
    async with readers.lent():
        waiting = asyncio.create_task(_lend_and_return(readers))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await log.close()
    with pytest.raises(InvalidInputError, match="closed during this read"):
        await asyncio.wait_for(waiting, 10)


async def test_every_read_waiting_for_a_consumer_when_the_log_closes_is_refused(
    kafka_bootstrap: str, kafka_topic: str
) -> None:
    """More reads waiting than consumers lent: each one is told the log closed, none is left
    waiting for a consumer that will never come back."""
    log = await KafkaEventLog.open(kafka_bootstrap, topic=kafka_topic, partitions=3, readers=1)
    readers = log._live_readers()
    async with readers.lent():
        waiting = [asyncio.create_task(_lend_and_return(readers)) for _ in range(3)]
        await asyncio.sleep(0.2)
        assert not any(task.done() for task in waiting)
        await log.close()
    for task in waiting:
        with pytest.raises(InvalidInputError, match="closed during this read"):
            await asyncio.wait_for(task, 10)


async def test_a_close_cancelled_while_the_producer_stops_still_stops_every_reader(
    kafka_bootstrap: str, kafka_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shutdown that gives up on the close (a timeout around it, a second Ctrl-C) while the
    producer stops: the readers' consumers, already taken from the log where no later close
    finds them, are stopped all the same rather than left connected as long as the loop."""
    log = await KafkaEventLog.open(kafka_bootstrap, topic=kafka_topic, partitions=1)
    consumers = log._live_readers().consumers
    assert consumers
    producer = log._producer
    assert producer is not None
    stopping = asyncio.Event()
    stop = producer.stop

    async def slow_stop() -> None:
        stopping.set()
        await asyncio.sleep(0.5)  # a broker slow to answer
        await stop()

    monkeypatch.setattr(producer, "stop", slow_stop)
    closing = asyncio.create_task(log.close())
    await asyncio.wait_for(stopping.wait(), 10)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert not any(_connected(consumer) for consumer in consumers), "a reader was left connected"
    assert all(consumer._closed for consumer in consumers), "a reader was never stopped"


async def test_a_read_from_the_start_cut_between_its_bounds_and_its_fetch_reads_what_is_left(
    kafka_bootstrap: str, kafka_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that names no start reads from wherever the partition starts: compaction moving
    that start between the read's look at the bounds and its fetch is no truncation of what
    it asked for (`LogTruncatedError` is for a named start below the partition's)."""
    async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=1) as log:
        cut, kept = new_run_id(), new_run_id()
        await log.append(step_events(cut, 2))
        await log.append(step_events(kept, 3))
        readers = log._live_readers()
        bounds = readers.bounds
        cuts = 0

        async def bounds_then_cut(reader: object, tp: TopicPartition) -> object:
            nonlocal cuts
            found = await bounds(reader, tp)  # type: ignore[arg-type]
            if not cuts:
                cuts += 1
                await log.truncate_before(0, 2)  # lands before the fetch
            return found

        monkeypatch.setattr(readers, "bounds", bounds_then_cut)
        assert seqs(await log.read_run(kept)) == [1, 2, 3]
        assert cuts == 1
