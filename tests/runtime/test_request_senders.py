"""`RequestSenderConformance` on both transports of the fleet's requests: the Kafka topic
(`Requests`) and the PostgreSQL table (`PostgresRequests`), each read back as its workers read it.
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from support.pg import fresh_schema

from onward.runtime.fleet.requests import Requests, RequestSender
from onward.runtime.fleet.requests_postgres import PostgresRequests
from onward.runtime.signing import SIGNATURE_HEADER, RequestSigner
from onward.testing.requests import Delivered, RequestSenderConformance

PARTITIONS = 3
_WAIT_S = 20.0


@pytest.mark.kafka
class TestKafkaRequests(RequestSenderConformance):
    """Each test on a requests topic of its own, read from the start of every partition."""

    bootstrap: str
    topic: str

    @pytest.fixture(autouse=True)
    def _topic(self, kafka_bootstrap: str, requests_topic: str) -> None:
        self.bootstrap, self.topic = kafka_bootstrap, requests_topic

    async def open_sender(self, signer: RequestSigner | None) -> RequestSender:
        sender = Requests(self.bootstrap, self.topic, partitions=PARTITIONS, signer=signer)
        return await self.exit_stack.enter_async_context(sender)

    async def closed_sender(self) -> RequestSender:
        return Requests(self.bootstrap, self.topic, partitions=PARTITIONS)

    async def delivered(self, count: int) -> list[Delivered]:
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            parts = [TopicPartition(self.topic, p) for p in range(PARTITIONS)]
            consumer.assign(parts)
            await consumer.seek_to_beginning(*parts)
            got: list[Delivered] = []
            async with asyncio.timeout(_WAIT_S):
                while len(got) < count:
                    for records in (await consumer.getmany(timeout_ms=500)).values():
                        got += [_delivered(r.key, r.value, r.headers) for r in records]
            return got[:count]
        finally:
            await consumer.stop()


def _delivered(key: bytes, value: bytes, headers: tuple[tuple[str, bytes], ...]) -> Delivered:
    signatures = [v for k, v in headers if k == SIGNATURE_HEADER]
    return Delivered(key.decode(), value, signatures[0] if signatures else None)


class TestPostgresRequests(RequestSenderConformance):
    """Each test on a schema of its own, read back as a worker claims rows."""

    database_url: str
    schema: str

    @pytest.fixture(autouse=True)
    def _server(self, database_url: str) -> None:
        self.database_url = database_url

    async def open_sender(self, signer: RequestSigner | None) -> RequestSender:
        self.schema = await self.exit_stack.enter_async_context(fresh_schema(self.database_url))
        sender = PostgresRequests(self.database_url, schema=self.schema, signer=signer)
        return await self.exit_stack.enter_async_context(sender)

    async def closed_sender(self) -> RequestSender:
        return PostgresRequests(self.database_url)

    async def delivered(self, count: int) -> list[Delivered]:
        got: list[Delivered] = []
        async with PostgresRequests(self.database_url, schema=self.schema) as table:
            async with asyncio.timeout(_WAIT_S):
                while len(got) < count:
                    claimed = await table.claim("conformance", count - len(got))
                    got += [Delivered(r.run_id, r.value, r.signature) for r in claimed]
                    # Acted on, as a worker would: a run's later requests wait for its start.
                    await table.finish("conformance", [r.id for r in claimed])
                    if not claimed:
                        await asyncio.sleep(0.05)
        return got
