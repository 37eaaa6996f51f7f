"""Where one test's Kafka stack lives: its own topic, schema and Redis key prefix."""

from __future__ import annotations

from typing import NamedTuple

from onward.eventlog import KafkaEventLog
from onward.projections.postgres import PostgresFrontierStore
from onward.runtime import RedisLeaseStore
from onward.runtime.signing import RequestSigner

REQUEST_KEY = "test-request-key-" + "k" * 32
"""The key a test stack's applications sign requests with and its workers check them with."""


class KafkaServers(NamedTuple):
    """A test's own topic, schema and Redis key prefix, and the servers they are on (the
    ``kafka_servers`` fixture)."""

    bootstrap: str
    topic: str
    database_url: str
    schema: str
    redis_url: str
    redis_prefix: str

    def env(self, *, partitions: int = 3) -> dict[str, str]:
        """The environment `onward` reads to open this stack's stores."""
        return {
            "ONWARD_BACKEND": "kafka",
            "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
            "ONWARD_KAFKA_TOPIC": self.topic,
            "ONWARD_PARTITIONS": str(partitions),
            "DATABASE_URL": self.database_url,
            "ONWARD_DATABASE_SCHEMA": self.schema,
            "REDIS_URL": self.redis_url,
            "ONWARD_REDIS_PREFIX": self.redis_prefix,
            "ONWARD_REQUEST_KEY": REQUEST_KEY,
        }

    def signer(self) -> RequestSigner:
        """Signs requests as this stack's workers check them."""
        return RequestSigner(REQUEST_KEY)

    def log(self, *, partitions: int = 3) -> KafkaEventLog:
        """The events topic (created if missing), to be opened with ``async with``."""
        return KafkaEventLog(self.bootstrap, topic=self.topic, partitions=partitions)

    def leases(self) -> RedisLeaseStore:
        """The Redis lease store under the test's prefix."""
        return RedisLeaseStore(self.redis_url, prefix=self.redis_prefix)

    def frontiers(self) -> PostgresFrontierStore:
        """The frontier store in the test's schema."""
        return PostgresFrontierStore(self.database_url, schema=self.schema)
