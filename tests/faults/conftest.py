"""Private servers for the fault tests: each test breaks its own, never the shared ones.

Every fixture starts its server on free loopback ports in a temporary directory and, whatever
the test did to it (SIGKILL, SIGSTOP, a restart) and however the test ended, kills its
process group and removes the directory afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest_asyncio
from support.private_servers import PrivateKafka, PrivatePostgres, PrivateRedis


@pytest_asyncio.fixture
async def private_kafka() -> AsyncIterator[PrivateKafka]:
    """A single-node KRaft broker of this test alone, started."""
    broker = PrivateKafka()
    try:
        await asyncio.to_thread(broker.start)
        yield broker
    finally:
        await asyncio.to_thread(broker.close)


@pytest_asyncio.fixture
async def private_postgres() -> AsyncIterator[PrivatePostgres]:
    """A PostgreSQL cluster of this test alone, started, with role and database ``onward``."""
    cluster = PrivatePostgres()
    try:
        await asyncio.to_thread(cluster.start)
        yield cluster
    finally:
        await asyncio.to_thread(cluster.close)


@pytest_asyncio.fixture
async def private_redis() -> AsyncIterator[PrivateRedis]:
    """A Redis server of this test alone, without persistence, started."""
    server = PrivateRedis()
    try:
        await asyncio.to_thread(server.start)
        yield server
    finally:
        await asyncio.to_thread(server.close)
