"""The agent, tools, ledger and stores shared by the crash matrix's parent and child."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from onward.eventlog import KafkaEventLog, PostgresEventLog, SqliteEventLog, ToolCall
from onward.eventlog.base import EventLog
from onward.projections.base import FrontierStore
from onward.projections.postgres import PostgresFrontierStore
from onward.runtime.agent import Agent
from onward.runtime.blobs import BlobStore, PostgresBlobStore, SqliteBlobStore
from onward.runtime.demo_ledger import Ledger
from onward.runtime.leases import LeasePolicy, LeaseStore, PostgresLeaseStore
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.runner import AgentRunner
from onward.runtime.tools import Reconciled, Tool, tool

TENANT = "acme"
CRASHED_LEASE = LeasePolicy(ttl=timedelta(seconds=1))
"""The lease of the worker that is killed: short, so the test waits a second, not five minutes."""


async def until_lapsed(leases: LeaseStore, run_id: str, *, within_s: float = 30.0) -> None:
    """Wait until nobody holds the run's lease (a killed holder's lapses on the store's clock)."""
    deadline = asyncio.get_running_loop().time() + within_s
    while await leases.current(run_id) is not None:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"the lease on {run_id} did not lapse within {within_s}s")
        await asyncio.sleep(0.05)


def tools(config: dict[str, Any]) -> list[Tool]:
    ledger = Ledger(config["ledger"])
    variant = config["variant"]

    @tool(retry_safe=True)
    async def search(query: str, *, idempotency_key: str) -> str:
        ledger.record("search", idempotency_key)
        return f"flights to {query}"

    async def status(key: str) -> Reconciled | None:
        done = ledger.find("book", key) is not None
        return Reconciled("completed", {"seat": "3A"}) if done else Reconciled("never_ran")

    @tool(
        retry_safe=variant == "retry_safe",
        reconcile=status if variant == "reconcile" else None,
        requires_approval=variant == "approval",
    )
    async def book(seat: str, *, idempotency_key: str) -> dict[str, str]:
        await asyncio.sleep(0.1)  # the search's result is written first
        ledger.record("book", idempotency_key)
        return {"seat": seat}

    return [search, book]


def the_agent(config: dict[str, Any]) -> Agent:
    return Agent(name="booker", instructions="book one seat", tools=tools(config))


def search_and_book(said: str, answer: str) -> ScriptedProvider:
    """A model that says ``said`` while it asks for a search and a booking at once, then gives
    ``answer``."""
    return ScriptedProvider(
        [
            reply(
                said,
                ToolCall(call_id="s", tool="search", args={"query": "LIS"}),
                ToolCall(call_id="b", tool="book", args={"seat": "3A"}),
            ),
            reply(answer),
        ]
    )


def the_provider(variant: str) -> ScriptedProvider:
    return search_and_book("searching and booking", "booked")


@dataclass
class World:
    log: EventLog
    blobs: BlobStore
    leases: LeaseStore | None  # None: the embedded log's own
    frontiers: FrontierStore | None = None  # None: the embedded log folds a run from its partition
    inline: bool = False  # the runner folds into ``frontiers`` itself (no projector runs)


def the_runner(config: dict[str, Any], world: World, worker: str, **options: Any) -> AgentRunner:
    return AgentRunner(
        provider=the_provider(config["variant"]),
        log=world.log,
        leases=world.leases,
        blobs=world.blobs,
        frontiers=world.frontiers,
        worker=worker,
        checkpoint_inline=world.inline,
        **options,
    )


@asynccontextmanager
async def open_world(config: dict[str, Any]) -> AsyncIterator[World]:
    if config["backend"] == "sqlite":
        async with SqliteEventLog(config["db"]) as log, SqliteBlobStore(config["db"]) as blobs:
            yield World(log, blobs, None)
    elif config["backend"] == "postgres":
        url, schema = config["database_url"], config["schema"]
        async with (
            PostgresEventLog(url, schema=schema, partitions=2) as plog,
            PostgresBlobStore(url, schema=schema) as pblobs,
            PostgresLeaseStore(url, schema=schema) as pleases,
            PostgresFrontierStore(url, schema=schema) as store,
        ):
            yield World(plog, pblobs, pleases, store, inline=True)
    else:
        async with (
            KafkaEventLog(config["bootstrap"], topic=config["topic"], partitions=2) as klog,
            PostgresBlobStore(config["database_url"], schema=config["schema"]) as pblobs,
            PostgresLeaseStore(config["database_url"], schema=config["schema"]) as pleases,
            PostgresFrontierStore(config["database_url"], schema=config["schema"]) as store,
        ):
            yield World(klog, pblobs, pleases, store)
