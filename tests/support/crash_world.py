"""The agent, tools, ledger and stores shared by the crash matrix's parent and child."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from onward.eventlog import KafkaEventLog, SqliteEventLog, ToolCall
from onward.eventlog.base import EventLog
from onward.runtime.agent import Agent
from onward.runtime.history import BlobStore, PostgresBlobStore, SqliteBlobStore
from onward.runtime.ledger import Ledger
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.runner import AgentRunner
from onward.runtime.tools import Reconciled, Tool, tool

TENANT = "acme"


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


def the_provider(variant: str) -> ScriptedProvider:
    return ScriptedProvider(
        [
            reply(
                "searching and booking",
                ToolCall(call_id="s", tool="search", args={"query": "LIS"}),
                ToolCall(call_id="b", tool="book", args={"seat": "3A"}),
            ),
            reply("booked"),
        ]
    )


@dataclass
class World:
    log: EventLog
    blobs: BlobStore


def the_runner(config: dict[str, Any], world: World, worker: str, **options: Any) -> AgentRunner:
    return AgentRunner(
        provider=the_provider(config["variant"]),
        log=world.log,
        blobs=world.blobs,
        worker=worker,
        **options,
    )


@asynccontextmanager
async def open_world(config: dict[str, Any]) -> AsyncIterator[World]:
    if config["backend"] == "sqlite":
        async with SqliteEventLog(config["db"]) as log, SqliteBlobStore(config["db"]) as blobs:
            yield World(log, blobs)
    else:
        async with (
            KafkaEventLog(config["bootstrap"], topic=config["topic"], partitions=2) as klog,
            PostgresBlobStore(config["database_url"], schema=config["schema"]) as pblobs,
        ):
            yield World(klog, pblobs)
