"""The stores a test writes runs to: embedded SQLite, or Kafka + PostgreSQL + Redis."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, closing
from dataclasses import dataclass
from pathlib import Path

from onward.eventlog import EventLog, KafkaEventLog, SqliteEventLog
from onward.projections import FrontierStore
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.leases import LeaseStore, PostgresLeaseStore, RedisLeaseStore, SqliteLeaseStore


@dataclass(frozen=True, slots=True)
class Stores:
    """A log, its leases and its frontier rows; ``embedded``: fold them from this process."""

    log: EventLog
    leases: LeaseStore
    frontiers: FrontierStore
    embedded: bool


@asynccontextmanager
async def sqlite_stores(path: Path) -> AsyncIterator[Stores]:
    """Log, leases and frontier rows in one SQLite file."""
    async with AsyncExitStack() as stack:
        log = await stack.enter_async_context(SqliteEventLog(path, partitions=4))
        leases = await stack.enter_async_context(SqliteLeaseStore(path))
        frontiers = await stack.enter_async_context(SqliteFrontierStore(path))
        yield Stores(log, leases, frontiers, embedded=True)


@asynccontextmanager
async def kafka_stores(
    bootstrap: str,
    topic: str,
    database_url: str,
    schema: str,
    redis_url: str,
    prefix: str,
    *,
    postgres_leases: bool = False,
) -> AsyncIterator[Stores]:
    """Kafka log, Redis (or PostgreSQL) leases, PostgreSQL frontier rows (no projector runs)."""
    async with AsyncExitStack() as stack:
        log = await stack.enter_async_context(
            KafkaEventLog(bootstrap, topic=topic, partitions=2, create_topic=True)
        )
        leases: LeaseStore = await stack.enter_async_context(
            PostgresLeaseStore(database_url, schema=schema)
            if postgres_leases
            else RedisLeaseStore(redis_url, prefix=prefix)
        )
        frontiers = await stack.enter_async_context(
            PostgresFrontierStore(database_url, schema=schema)
        )
        yield Stores(log, leases, frontiers, embedded=False)


async def sqlite_migrated_back(path: Path, version: int, undo: Sequence[str]) -> None:
    """A migrated SQLite file taken back to before migration ``version`` (the ``undo``
    statements, then its ledger row); the next store to open it migrates it again."""
    async with SqliteFrontierStore(path):
        pass
    with closing(sqlite3.connect(path)) as conn, conn:
        for statement in undo:
            conn.execute(statement)
        conn.execute("DELETE FROM onward_schema_migrations WHERE version = ?", (version,))
