"""A test's Kafka stack (`KafkaServers`) as processes and in-process code of a fleet see it."""

from __future__ import annotations

import os
from typing import Any

from onward.runtime.settings import Settings
from support.processes import TESTS
from support.servers import KafkaServers


def process_env(servers: KafkaServers, partitions: int, **extra: str) -> dict[str, str]:
    """The environment of an ``onward`` process (or a support module) on ``servers``."""
    return {
        **os.environ,
        "PYTHONPATH": str(TESTS),
        **servers.env(partitions=partitions),
        **extra,
    }


def kafka_settings(servers: KafkaServers, partitions: int, **fields: Any) -> Settings:
    """The same deployment as `Settings`, for code in the test's own process."""
    return Settings(
        backend="kafka",
        kafka_bootstrap_servers=servers.bootstrap,
        kafka_topic=servers.topic,
        partitions=partitions,
        database_url=servers.database_url,
        database_schema=servers.schema,
        redis_url=servers.redis_url,
        redis_prefix=servers.redis_prefix,
        **fields,
    )


def worker_argv(module: str, requests_topic: str, name: str, *extra: str) -> list[str]:
    """``onward worker`` arguments for a test fleet: agents and provider from ``module``
    (``agents``, ``provider``), quick lease ttl, recheck, backoff and session timeout."""
    return [
        "worker",
        "--agent",
        f"{module}:agents",
        "--provider",
        f"{module}:provider",
        "--requests-topic",
        requests_topic,
        "--group",
        f"{requests_topic}.workers",
        "--name",
        name,
        *("--lease-ttl", "3", "--recheck", "1", "--backoff", "0.2"),
        *("--session-timeout-ms", "6000", *extra),
    ]
