"""Session fixtures: real servers, found from the environment.

A URL in the environment wins. Without one, and with a Docker engine answering, testcontainers
starts the server. With neither the session stops at once and says what to run; no test is ever
skipped for a missing server.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

START_COMMAND = 'eval "$(scripts/services.sh up)"   # or: make test'


def _docker_answers() -> bool:
    try:
        import docker  # type: ignore[import-untyped]  # noqa: PLC0415

        docker.from_env(timeout=3).ping()
    except Exception:
        return False
    return True


def _no_server(variable: str) -> None:
    pytest.exit(
        f"{variable} is not set and no Docker engine answers, so there is no server to test "
        f"against. Start the project's servers first:\n    {START_COMMAND}",
        returncode=3,
    )


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """``host:port`` of a real Kafka broker."""
    url = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if url:
        yield url
        return
    if not _docker_answers():
        _no_server("KAFKA_BOOTSTRAP_SERVERS")
    from testcontainers.kafka import KafkaContainer  # noqa: PLC0415

    with KafkaContainer("confluentinc/cp-kafka:7.7.1").with_kraft() as container:
        yield container.get_bootstrap_server()


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A PostgreSQL URL (``postgresql://user:password@host:port/database``)."""
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    if not _docker_answers():
        _no_server("DATABASE_URL")
    from testcontainers.postgres import PostgresContainer  # noqa: PLC0415

    with PostgresContainer("postgres:15", driver=None) as container:
        yield container.get_connection_url()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis URL (``redis://host:port/db``)."""
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    if not _docker_answers():
        _no_server("REDIS_URL")
    from testcontainers.community.redis import RedisContainer  # noqa: PLC0415

    with RedisContainer("redis:7") as container:
        host = container.get_container_host_ip()
        yield f"redis://{host}:{container.get_exposed_port(6379)}/0"
