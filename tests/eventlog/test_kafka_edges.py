"""The Kafka log where it breaks most easily: a close with appends queued, offsets with gaps,
appends while the producer is replaced. Real broker."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import OutOfOrderSequenceNumber

from onward.errors import ConfigurationError, OnwardError, ProducerFatalError
from onward.eventlog import KafkaEventLog, codec
from onward.eventlog import kafka as kafka_module
from onward.testing.eventlog import new_run_id, runs_in_partition, seqs, step_events


@pytest.mark.kafka
async def test_kafka_close_settles_every_append_still_queued(
    kafka_bootstrap: str, kafka_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends queued behind the record batch in flight when close gives up on the flusher
    are told how they went (refused as closed, or unknown), never left waiting for ever, and
    none is told it was cancelled when nobody cancelled it."""
    monkeypatch.setattr(kafka_module, "_GROUP_COMMIT_BYTES", 1)  # one record batch per append
    log = await KafkaEventLog.open(
        kafka_bootstrap, topic=kafka_topic, partitions=1, request_timeout_s=0.5
    )
    runs = [new_run_id() for _ in range(8000)]
    appends = [asyncio.create_task(log.append(step_events(run, 1))) for run in runs]
    await asyncio.sleep(0)  # every append is queued
    await log.close()
    _, waiting = await asyncio.wait(appends, timeout=10)
    assert not waiting, f"{len(waiting)} appends still wait after close returned"
    cancelled = [t for t in appends if t.cancelled()]
    assert not cancelled, f"{len(cancelled)} appends were cancelled though nobody cancelled them"
    for task in appends:
        error = task.exception()
        assert error is None or isinstance(error, OnwardError), repr(error)
    answered = {run for run, task in zip(runs, appends, strict=True) if task.exception() is None}
    assert 0 < len(answered) < len(runs)  # the close cut in mid-stream, as meant
    async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=1) as reader:
        stored = {s.event.run_id for s in await reader.read_partition(0, 0)}
    assert answered <= stored  # what was answered is durable


@pytest.mark.kafka
async def test_kafka_read_stops_at_its_end_where_offsets_have_gaps(
    kafka_bootstrap: str, kafka_topic: str
) -> None:
    """A transaction's commit marker takes an offset no reader sees: a read up to ``end``
    still returns only records below ``end``."""
    run_a, run_b = new_run_id(), new_run_id()
    async with KafkaEventLog(
        kafka_bootstrap, topic=kafka_topic, partitions=1, read_timeout_s=10
    ) as log:
        (first,) = await log.append(step_events(run_a, 1))  # offset 0
        # A foreign writer's committed transaction: its record at 1, the commit marker at 2.
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka_bootstrap, transactional_id=f"tx-{run_b}"
        )
        await producer.start()
        try:
            async with producer.transaction():
                await producer.send_and_wait(
                    kafka_topic,
                    codec.encode(step_events(run_b, 1)[0]),
                    key=run_b.encode(),
                    partition=0,
                )
        finally:
            await producer.stop()
        for _ in range(100):  # the coordinator writes the commit marker after the commit returns
            if (await log.bounds(0)).end == 3:
                break
            await asyncio.sleep(0.05)
        # The partition's end is past the marker, its last record at 1: read whole, at once.
        whole = await asyncio.wait_for(log.read_partition(0, 0), timeout=5)
        assert [s.position.offset for s in whole] == [0, 1]
        later = await log.append(step_events(run_a, 2, first_seq=2))  # offsets 3 and 4
        assert [p.offset for p in later] == [3, 4]
        end = later[0].offset  # 3: read offsets 0, 1 and 2 only
        in_range = await log.read_partition(0, 0, end)
        assert [s.position.offset for s in in_range] == [0, 1]
        of_a = await log.read_run(run_a, start=first.offset, end=later[1].offset)
        assert [s.position.offset for s in of_a] == [0, 3]


@pytest.mark.kafka
async def test_kafka_append_during_a_producer_replacement_waits_for_the_new_producer(
    kafka_bootstrap: str, kafka_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a fatal error on one partition has the producer replaced, an append of another
    run goes out on the new producer; it is not refused as if the log were closed."""
    (run_a,) = runs_in_partition(0, 1, partitions=2)
    (run_b,) = runs_in_partition(1, 1, partitions=2)
    async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=2) as log:
        await log.append(step_events(run_a, 1))
        broken = log._producer
        assert broken is not None

        async def fail_once(*args: object, **kwargs: object) -> object:
            raise OutOfOrderSequenceNumber()

        # Fault injection as in test_kafka.py: the broker is real, the session failure forced.
        monkeypatch.setattr(broken, "send_batch", fail_once)
        failing = asyncio.create_task(log.append(step_events(run_a, 1, first_seq=2)))
        for _ in range(1000):  # until the replacement is under way
            if log._producer is None:
                break
            await asyncio.sleep(0)
        assert log._producer is None
        (position,) = await log.append(step_events(run_b, 1))
        assert position.partition == 1
        with pytest.raises(ProducerFatalError, match=run_a):
            await failing
        assert log._producer is not broken
        assert seqs(await log.read_run(run_b)) == [1]


@pytest.mark.kafka
async def test_kafka_topic_the_broker_refuses_to_create_says_why_at_once(
    kafka_bootstrap: str, kafka_topic: str
) -> None:
    """A replication factor the cluster cannot give (three replicas on one broker): the broker
    refuses the topic, and the start says so at once, naming the setting, not after ten
    seconds that the topic "has None partitions" and that its partition count is to blame."""
    began = asyncio.get_running_loop().time()
    log = KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=2, replication_factor=3)
    with pytest.raises(ConfigurationError, match="replication") as refused:
        await log.start()
    assert "None partitions" not in str(refused.value)
    assert asyncio.get_running_loop().time() - began < 5
    assert not log.is_open


@pytest.mark.kafka
async def test_kafka_topic_the_broker_will_not_describe_says_why_not_that_it_is_missing(
    kafka_bootstrap: str,
) -> None:
    """A log that may not create its topic, on a topic the broker refuses to describe (here a
    name it does not allow; a missing permission alike): the start says what the broker said,
    not that the topic does not exist and that starting the projector would create it."""
    log = KafkaEventLog(kafka_bootstrap, topic="onward events?", partitions=2, create_topic=False)
    with pytest.raises(ConfigurationError, match="INVALID_TOPIC") as refused:
        await log.start()
    assert "does not exist" not in str(refused.value)
    assert not log.is_open
