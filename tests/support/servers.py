"""Where one test's Kafka stack lives: its own topic, schema and Redis key prefix."""

from __future__ import annotations

from typing import NamedTuple


class KafkaServers(NamedTuple):
    """A test's own topic, schema and Redis key prefix, and the servers they are on (the
    ``kafka_servers`` fixture)."""

    bootstrap: str
    topic: str
    database_url: str
    schema: str
    redis_url: str
    redis_prefix: str
