"""The embedded world most saver tests write threads to."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from .worlds import KafkaServers, World, sqlite_world


@pytest_asyncio.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    """Log, leases and frontier rows in one fresh SQLite file."""
    async with sqlite_world(tmp_path / "onward.db") as opened:
        yield opened


@pytest.fixture
def kafka_servers(
    kafka_bootstrap: str,
    kafka_topic: str,
    database_url: str,
    pg_schema: str,
    redis_url: str,
    redis_prefix: str,
) -> KafkaServers:
    """A fresh topic, schema and Redis prefix on the shared servers, in `kafka_world`'s order."""
    return KafkaServers(
        kafka_bootstrap, kafka_topic, database_url, pg_schema, redis_url, redis_prefix
    )
