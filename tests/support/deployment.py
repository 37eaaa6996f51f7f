"""A test's Kafka stack (`KafkaServers`) as processes and in-process code of a fleet see it."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

from onward.runtime.settings import SecretUrl, Settings
from support.processes import TESTS
from support.servers import REQUEST_KEY, KafkaServers

ASSIGNED = re.compile(r"partitions assigned: \[([0-9, ]*)\]")
"""What a worker logs each time its group hands it partitions."""


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
        database_url=SecretUrl(servers.database_url),
        database_schema=servers.schema,
        redis_url=SecretUrl(servers.redis_url),
        redis_prefix=servers.redis_prefix,
        **{"request_key": REQUEST_KEY, **fields},
    )


def postgres_fleet_settings(database_url: str, schema: str, partitions: int = 4) -> Settings:
    """A fleet app's settings on PostgreSQL alone (requests in its table), signing requests."""
    return Settings.model_validate(
        {
            "ONWARD_BACKEND": "postgres",
            "DATABASE_URL": database_url,
            "ONWARD_DATABASE_SCHEMA": schema,
            "ONWARD_PARTITIONS": str(partitions),
            "ONWARD_REQUEST_KEY": REQUEST_KEY,
            "ONWARD_APP_MODE": "fleet",
        }
    )


def worker_argv(
    module: str,
    requests_topic: str,
    name: str,
    *extra: str,
    lease_ttl_s: float = 3,
    session_timeout_ms: int = 6000,
) -> list[str]:
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
        *("--lease-ttl", str(lease_ttl_s), "--recheck", "1", "--backoff", "0.2"),
        *("--session-timeout-ms", str(session_timeout_ms), *extra),
    ]


def assigned(output: str) -> set[int]:
    """The partitions a worker's output says it was assigned last (none if it says nothing)."""
    found = ASSIGNED.findall(output)
    return {int(p) for p in found[-1].split(",")} if found and found[-1] else set()


def balanced(outputs: Iterable[str], partitions: int) -> bool:
    """Whether the workers whose outputs are given each hold partitions by their latest
    assignment, and together every partition once."""
    latest = [assigned(output) for output in outputs]
    if not all(latest):
        return False
    everything = set(range(partitions))
    return sum(map(len, latest)) == len(everything) and set().union(*latest) == everything
