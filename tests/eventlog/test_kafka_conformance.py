from __future__ import annotations

import pytest
from aiokafka import AIOKafkaProducer

from onward.eventlog import KafkaEventLog, Position, partition_for
from onward.eventlog.base import EventLog
from onward.testing import PersistentEventLogConformance

pytestmark = pytest.mark.kafka


class TestKafkaEventLog(PersistentEventLogConformance):
    bootstrap: str
    topic: str

    @pytest.fixture(autouse=True)
    def _fresh_topic(self, kafka_bootstrap: str, kafka_topic: str) -> None:
        """Each test gets its own topic, deleted afterwards, so partition-level tests are exact."""
        self.bootstrap = kafka_bootstrap
        self.topic = kafka_topic

    async def open_log(self) -> EventLog:
        return await KafkaEventLog.open(
            self.bootstrap, topic=self.topic, partitions=self.partitions
        )

    async def reopen(self, log: EventLog) -> EventLog:
        return await KafkaEventLog.open(
            self.bootstrap, topic=self.topic, partitions=self.partitions, create_topic=False
        )

    async def write_raw(self, log: EventLog, run_id: str, record: bytes) -> Position:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        await producer.start()
        try:
            partition = partition_for(run_id, self.partitions)
            metadata = await producer.send_and_wait(
                self.topic, record, key=run_id.encode(), partition=partition
            )
        finally:
            await producer.stop()
        return Position(partition, metadata.offset)
