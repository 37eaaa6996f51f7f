"""The event log's record batches are zstd-compressed on the broker's disk by default.

Measured where the bytes are: the topic's log segments in the broker's own data folders (the
test servers run on this machine), for the same events appended once compressed and once with
``KAFKA_COMPRESSION_TYPE=none``. kcat reading the compressed topic is covered by
``test_kafka.py``'s kcat test, which runs on the default.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from support.kafka import fresh_topic

from onward._storage import KafkaConnection
from onward.errors import ConfigurationError
from onward.eventlog import KafkaEventLog, StoredEvent
from onward.runtime.settings import Settings
from onward.testing.eventlog import new_run_id, step_events

pytestmark = pytest.mark.kafka

BODY = "the 08:40 from Paris Nord reaches Berlin Hbf at 16:52, seat 42, fare 119 EUR; " * 12
"""About 1 KB of text, repetitive as tool results and model answers are."""


@pytest_asyncio.fixture
async def second_topic(kafka_bootstrap: str) -> AsyncIterator[str]:
    async with fresh_topic(kafka_bootstrap) as topic:
        yield topic


async def broker_log_dirs(bootstrap: str) -> list[Path]:
    """The broker's ``log.dirs``; the test servers' single broker runs on this machine."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (broker,) = (await admin.describe_cluster())["brokers"]
        (response,) = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.BROKER, str(broker["node_id"]), {"log.dirs": None})]
        )
    finally:
        await admin.close()
    entries = {entry[0]: entry[1] for entry in response.resources[0][4]}
    dirs = [Path(d) for d in str(entries["log.dirs"]).split(",")]
    assert any(d.is_dir() for d in dirs), f"the broker's log.dirs {dirs} are not on this machine"
    return dirs


def segment_bytes(dirs: list[Path], topic: str) -> int:
    folders = [p for d in dirs for p in d.glob(f"{topic}-*")]
    return sum(f.stat().st_size for p in folders for f in p.glob("*.log"))


async def append_runs(log: KafkaEventLog, runs: list[str]) -> list[StoredEvent]:
    for run_id in runs:
        for first in range(1, 41, 5):
            await log.append(step_events(run_id, 5, first_seq=first, body=BODY))
    read: list[StoredEvent] = []
    for run_id in runs:
        read += await log.read_run(run_id)
    return read


async def test_batches_are_stored_compressed_and_read_back_whole(
    kafka_bootstrap: str, kafka_topic: str, second_topic: str
) -> None:
    runs = [new_run_id() for _ in range(6)]
    compressed = KafkaEventLog(KafkaConnection(kafka_bootstrap), topic=kafka_topic, partitions=2)
    plain = KafkaEventLog(
        KafkaConnection(kafka_bootstrap, compression_type="none"), topic=second_topic, partitions=2
    )
    async with compressed, plain:
        from_compressed = await append_runs(compressed, runs)
        from_plain = await append_runs(plain, runs)
    assert [s.event for s in from_compressed] == [s.event for s in from_plain]
    assert len(from_compressed) == 6 * 40
    dirs = await broker_log_dirs(kafka_bootstrap)
    compressed_bytes = segment_bytes(dirs, kafka_topic)
    plain_bytes = segment_bytes(dirs, second_topic)
    assert plain_bytes > 100 * len(BODY), plain_bytes
    assert compressed_bytes * 3 < plain_bytes, (compressed_bytes, plain_bytes)


async def producer_compression(settings: Settings) -> str | None:
    """What a producer made from ``settings`` asks the broker to keep (aiokafka's own field)."""
    producer = settings.kafka_connection().producer()
    try:
        return producer._compression_type  # type: ignore[no-any-return]
    finally:
        await producer.stop()


async def test_the_setting_reaches_every_producer_and_a_bad_value_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ONWARD_BACKEND", "kafka")
    assert await producer_compression(Settings()) == "zstd"
    monkeypatch.setenv("KAFKA_COMPRESSION_TYPE", "none")
    assert await producer_compression(Settings()) is None
    monkeypatch.setenv("KAFKA_COMPRESSION_TYPE", "lz4")
    assert "compression_type='lz4'" in repr(Settings().kafka_connection())
    with pytest.raises(ConfigurationError, match="KAFKA_COMPRESSION_TYPE is 'brotli'"):
        KafkaConnection("127.0.0.1:9092", compression_type="brotli")
    monkeypatch.setenv("KAFKA_COMPRESSION_TYPE", "brotli")
    with pytest.raises(ConfigurationError, match="KAFKA_COMPRESSION_TYPE"):
        Settings()
