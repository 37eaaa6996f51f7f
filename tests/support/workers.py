"""Worker processes for the one-worker-per-run tests: a shared world, a child entry point.

Usage (child): PYTHONPATH=tests python -m support.workers MODE CONFIG_JSON
MODE: ``start`` (run, SIGKILL itself right after the first model answer), ``resume`` (try to
carry the run on; print what happened), ``zombie`` (run; pause inside the first append after
the first turn settled, printing ``paused``, so the test can SIGSTOP it there).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from onward.errors import FencedError, ResumeConflictError
from onward.eventlog import Event, KafkaEventLog, Position, StoredEvent, ToolCall, kind_of
from onward.eventlog.base import EventLog, LogRecord
from onward.projections.postgres import PostgresFrontierStore
from onward.runtime.agent import Agent
from onward.runtime.demo_ledger import Ledger
from onward.runtime.leases import LeasePolicy, LeaseStore, PostgresLeaseStore, RedisLeaseStore
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.runner import AgentRunner
from onward.runtime.tools import Tool, tool
from onward.testing.eventlog import WrappedEventLog

__all__ = [
    "POLICY",
    "TENANT",
    "CountingLog",
    "Ledger",
    "PausingLog",
    "World",
    "agent",
    "child",
    "open_world",
    "provider",
    "runner",
    "tools",
]

TENANT = "acme"
POLICY = LeasePolicy(ttl=timedelta(seconds=3), renew_within=timedelta(seconds=1))
SLOW_TOOL_S = 2.0
"""Tools are slow, so the worker that wins a race holds the run while the others try."""


def tools(ledger: Ledger) -> list[Tool]:
    @tool
    async def search(query: str, *, idempotency_key: str) -> str:
        ledger.record("search", idempotency_key, pid=os.getpid())
        await asyncio.sleep(SLOW_TOOL_S)
        return f"flights to {query}"

    @tool
    async def book(seat: str, *, idempotency_key: str) -> str:
        ledger.record("book", idempotency_key, pid=os.getpid())
        await asyncio.sleep(SLOW_TOOL_S)
        return f"seat {seat}"

    return [search, book]


def agent(ledger: Ledger) -> Agent:
    return Agent(name="booker", instructions="search, then book", tools=tools(ledger))


def provider() -> ScriptedProvider:
    return ScriptedProvider(
        [
            reply("searching", ToolCall(call_id="s", tool="search", args={"query": "LIS"})),
            reply("booking", ToolCall(call_id="b", tool="book", args={"seat": "3A"})),
            reply("booked"),
        ]
    )


class CountingLog(WrappedEventLog):
    """An `EventLog` that counts reads, to show a loser read nothing, and remembers where each
    read of a run started."""

    def __init__(self, inner: EventLog) -> None:
        super().__init__(inner)
        self.reads = 0
        self.starts: list[int | None] = []
        self.runs: list[str] = []

    async def read_run(
        self, run_id: str, *, start: int | None = None, end: int | None = None
    ) -> list[StoredEvent]:
        self.reads += 1
        self.starts.append(start)
        self.runs.append(run_id)
        return await super().read_run(run_id, start=start, end=end)

    async def read_partition(self, *args: Any, **options: Any) -> list[StoredEvent]:
        self.reads += 1
        return await super().read_partition(*args, **options)

    async def read_records(self, *args: Any, **options: Any) -> list[LogRecord]:
        self.reads += 1
        return await super().read_records(*args, **options)


@dataclass
class World:
    log: CountingLog
    frontiers: PostgresFrontierStore
    leases: LeaseStore


@asynccontextmanager
async def open_world(config: dict[str, Any]) -> AsyncIterator[World]:
    leases: LeaseStore
    if config["leases"] == "redis":
        leases = await RedisLeaseStore.open(config["redis_url"], prefix=config["redis_prefix"])
    else:
        leases = await PostgresLeaseStore.open(config["database_url"], schema=config["schema"])
    try:
        async with (
            KafkaEventLog(config["bootstrap"], topic=config["topic"], partitions=2) as log,
            PostgresFrontierStore(config["database_url"], schema=config["schema"]) as frontiers,
        ):
            yield World(CountingLog(log), frontiers, leases)
    finally:
        await leases.close()


def runner(world: World, ledger: Ledger, worker: str, **options: Any) -> AgentRunner:
    return AgentRunner(
        provider=provider(),
        log=world.log,
        frontiers=world.frontiers,
        leases=world.leases,
        lease_policy=POLICY,
        worker=worker,
        **options,
    )


class _DieBeforeTheModelCall:
    """Kills the worker once its run is started, before the model is called: nothing of the
    run has been done, so whoever resumes it does all of it (and books once)."""

    async def appended(self, events: Sequence[Event]) -> None:
        return None

    async def tool_returned(self, call_id: str) -> None:
        return None

    async def before_model_call(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class PausingLog(CountingLog):
    """Pauses inside the first append after the first turn settled: after the worker checked
    its lease and before the write reaches the log, the window a zombie writes through.
    """

    def __init__(self, inner: EventLog) -> None:
        super().__init__(inner)
        self.settled = False
        self.paused = False

    async def append(self, events: Sequence[Event]) -> list[Position]:
        if self.settled and not self.paused:
            self.paused = True
            print("paused", flush=True)
            await asyncio.sleep(1.0)  # the test stops this process with SIGSTOP in here
        positions = await self.inner.append(events)
        self.settled = self.settled or any(kind_of(type(e)) == "turn.settled" for e in events)
        return positions


async def child(mode: str, config: dict[str, Any]) -> None:
    ledger = Ledger(config["ledger"])
    worker = f"{mode}-{os.getpid()}"
    async with open_world(config) as world:
        if mode == "start":
            the_runner = runner(world, ledger, worker, observer=_DieBeforeTheModelCall())
            await the_runner.run(agent(ledger), "go", tenant=TENANT, run_id=config["run_id"])
        elif mode == "resume":
            print("ready", flush=True)
            sys.stdin.readline()  # every worker starts resuming at the same moment
            try:
                result = await runner(world, ledger, worker).resume(
                    agent(ledger), config["run_id"], tenant=TENANT
                )
                carried = result.plan is not None  # it claimed the run and planned
                outcome: dict[str, object] = {
                    "outcome": "carried" if carried else "found it finished",
                    "status": result.status,
                    "fence": result.fence,
                }
            except ResumeConflictError as exc:
                outcome = {"outcome": "conflict", "holder": exc.holder, "reads": world.log.reads}
            print(json.dumps(outcome), flush=True)
        elif mode == "zombie":
            world.log = PausingLog(world.log.inner)
            try:
                await runner(world, ledger, worker).run(
                    agent(ledger), "go", tenant=TENANT, run_id=config["run_id"]
                )
                print(json.dumps({"outcome": "finished"}), flush=True)
            except FencedError as exc:
                print(json.dumps({"outcome": "fenced", "error": str(exc)}), flush=True)


if __name__ == "__main__":
    asyncio.run(child(sys.argv[1], json.loads(sys.argv[2])))
