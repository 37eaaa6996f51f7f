"""Onward stores for the LangGraph saver's tests: embedded SQLite, and Kafka + PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from support.stores import Stores, kafka_stores, sqlite_stores

from onward.integrations.langgraph import OnwardSaver, PostgresThreadSummaries, ThreadSummaryStore
from onward.runtime.leases import LeasePolicy
from onward.runtime.spend import PriceTable, SpendLedger

TENANT = "acme"


@dataclass(frozen=True, slots=True)
class World(Stores):
    """The stores one test writes threads to; ``summaries``: where savers keep thread
    summaries (``None``: the log's own, an embedded SQLite file's)."""

    summaries: ThreadSummaryStore | None = field(default=None, kw_only=True)

    def saver(
        self,
        *,
        holder: str | None = None,
        ttl_s: float | None = None,
        renew_within_s: float | None = None,
        spend: SpendLedger | None = None,
        prices: PriceTable | None = None,
        budget_micros: int | None = None,
        tenant_budget_micros: int | None = None,
    ) -> OnwardSaver:
        """A saver on these stores (not yet entered); ``spend`` and the rest as the saver's."""
        policy = (
            LeasePolicy(
                ttl=timedelta(seconds=ttl_s),
                renew_within=timedelta(seconds=renew_within_s) if renew_within_s else None,
            )
            if ttl_s is not None
            else None
        )
        return OnwardSaver(
            self.log,
            self.leases,
            tenant=TENANT,
            frontiers=self.frontiers,
            checkpoint_inline=self.embedded,
            holder=holder,
            policy=policy,
            summaries=self.summaries,
            spend=spend,
            prices=prices,
            budget_micros=budget_micros,
            tenant_budget_micros=tenant_budget_micros,
        )


@asynccontextmanager
async def sqlite_world(path: Path) -> AsyncIterator[World]:
    """Log, leases and frontier rows in one SQLite file."""
    async with sqlite_stores(path) as stores:
        yield World(stores.log, stores.leases, stores.frontiers, stores.embedded)


@asynccontextmanager
async def kafka_world(*places: str, postgres_leases: bool = False) -> AsyncIterator[World]:
    """Kafka log, Redis (or PostgreSQL) leases, PostgreSQL frontier rows and thread summaries
    (no projector runs).

    ``places``: the broker, topic, database URL, schema, Redis URL and prefix (`kafka_stores`).
    """
    _, _, database_url, schema, *_ = places
    async with (
        kafka_stores(*places, postgres_leases=postgres_leases) as stores,
        PostgresThreadSummaries(database_url, schema=schema) as summaries,
    ):
        yield World(
            stores.log, stores.leases, stores.frontiers, stores.embedded, summaries=summaries
        )


def kafka_spec(
    bootstrap: str, topic: str, database_url: str, schema: str, redis_url: str, prefix: str
) -> dict[str, str]:
    """What a child process needs to open the same Kafka world (see `open_world`)."""
    return {
        "kind": "kafka",
        "bootstrap": bootstrap,
        "topic": topic,
        "database_url": database_url,
        "schema": schema,
        "redis_url": redis_url,
        "prefix": prefix,
    }


def sqlite_spec(path: Path) -> dict[str, str]:
    """What a child process needs to open the same SQLite world (see `open_world`)."""
    return {"kind": "sqlite", "path": str(path)}


def open_world(spec: Mapping[str, str]) -> AbstractAsyncContextManager[World]:
    """The world a spec names: for child processes, which get it as JSON."""
    if spec["kind"] == "sqlite":
        return sqlite_world(Path(spec["path"]))
    return kafka_world(
        spec["bootstrap"],
        spec["topic"],
        spec["database_url"],
        spec["schema"],
        spec["redis_url"],
        spec["prefix"],
    )
