"""A fleet whose workers are paused past their leases and killed at random: no effect twice.

Real processes against Kafka, PostgreSQL and Redis: one projector and three `onward worker`
processes with a short lease, runs submitted through the requests topic while a chaos task
picks a worker at random and either stops it (SIGSTOP) for longer than the lease ttl and then
continues it (SIGCONT), or kills it (SIGKILL) and starts a replacement. Half the runs book (a
status-checked tool whose system refuses a fence older than one it has seen for the key), half
charge (a plain tool). What keeps a paused worker's call from taking effect twice differs: the
system's fence rule for bookings, a person for charges (the next worker finds the call
undecided and leaves the run tagged needs-person). Both systems record every effect with its
key and fence, so an effect taken twice shows. The chaos draws from the seeded ``rng``.

A kill waits (a few seconds at most) for the worker's word that a call set out, and the test
fails unless some kill found a call on its way: a kill between calls would say nothing about
a call cut off halfway.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from support.deployment import balanced, process_env, worker_argv
from support.fleet_pauses import BOOKINGS, CHARGES, on_their_way, system
from support.kafka import delete_topic
from support.processes import spawn_onward, stop_children
from support.servers import REQUEST_KEY, KafkaServers

from onward.eventlog import KafkaEventLog, kind_of
from onward.projections.base import RunSummary
from onward.projections.postgres import PostgresFrontierStore
from onward.runtime.fleet.requests import Requests, StartRun
from onward.runtime.leases import RedisLeaseStore
from onward.runtime.manager import ExecutionManager
from onward.runtime.signing import RequestSigner
from onward.runtime.tools import idempotency_key

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
PARTITIONS = 6
SIGNER = RequestSigner(REQUEST_KEY)
TENANT = "acme"
RUNS = int(os.environ.get("ONWARD_PAUSES_TEST_RUNS", "240"))
STEPS = 3
TTL_S = 3.0
WORKERS = 3
SUBMIT_S = 45.0
"""Runs are submitted in batches over this long, so the chaos finds runs in every phase."""
CHAOS_S = 55.0
TOOL_S = 0.4
"""Each call's way to its system, and back: long enough that a worker is often stopped with a
call on its way, and continued while the next holder's call of it is on its way too."""
MAX_ATTEMPTS = 10
"""Claims without progress before a run ends failed: a run may be caught by several pauses
in a row, and giving up is not what this test is about."""


@dataclass
class Chaos:
    """What the chaos task did, for the assertions' messages."""

    pauses: int = 0
    kills: int = 0
    landed: int = 0
    """Kills that found the worker with a call on its way (set out, not back)."""
    actions: list[str] = field(default_factory=list)


@dataclass
class PausedFleet:
    env: dict[str, str]
    bootstrap: str
    requests_topic: str
    tmp: Path
    log: KafkaEventLog
    frontiers: PostgresFrontierStore
    leases: RedisLeaseStore
    children: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    workers: list[str] = field(default_factory=list)
    """The workers alive now, by name."""
    spawned: int = 0

    def output(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    async def spawn(self, name: str, *argv: str) -> None:
        self.children[name] = await spawn_onward(self.tmp / f"{name}.log", self.env, *argv)

    async def worker(self) -> str:
        name = f"w{self.spawned}"
        self.spawned += 1
        argv = worker_argv(
            "support.fleet_pauses",
            self.requests_topic,
            name,
            *("--max-runs", "12", "--max-attempts", str(MAX_ATTEMPTS)),
            lease_ttl_s=TTL_S,
        )
        await self.spawn(name, *argv)
        self.workers.append(name)
        return name

    async def until(self, what: str, check: Any, within: float) -> None:
        deadline = asyncio.get_running_loop().time() + within
        while not await check():
            if asyncio.get_running_loop().time() > deadline:
                logs = {n: self.output(n)[-1500:] for n in self.children}
                raise AssertionError(f"timed out waiting for {what}: {logs}")
            await asyncio.sleep(0.5)

    async def rows(self) -> dict[str, RunSummary]:
        return {s.run_id: s for s in await self.frontiers.runs(tenant=TENANT)}

    async def left_for_a_person(self) -> set[str]:
        pending = await ExecutionManager(self.frontiers, self.leases).list_pending(tenant=TENANT)
        return {p.summary.run_id for p in pending if p.attention == "needs_person"}

    async def history(self, run_id: str) -> list[str]:
        """The run's events as ``seq kind fence [call] [outcome]``, for a failure's message."""
        events = [s.event for s in await self.log.read_run(run_id)]
        return [
            " ".join(
                str(part)
                for part in (
                    e.seq,
                    kind_of(type(e)),
                    e.fence,
                    getattr(e, "call_id", ""),
                    getattr(e, "outcome", ""),
                )
                if part != ""
            )
            for e in events
        ]

    def continue_all(self) -> None:
        for child in self.children.values():
            if child.returncode is None:
                child.send_signal(signal.SIGCONT)


@pytest_asyncio.fixture
async def fleet(kafka_servers: KafkaServers, tmp_path: Path) -> AsyncIterator[PausedFleet]:
    """One projector and three balanced workers, their tools' systems in ``tmp_path``."""
    servers = kafka_servers
    env = process_env(
        servers,
        PARTITIONS,
        FLEET_SYSTEMS=str(tmp_path),
        FLEET_STEPS=str(STEPS),
        FLEET_TOOL_S=str(TOOL_S),
    )
    requests_topic = f"{servers.topic}.requests"
    async with (
        servers.log(partitions=PARTITIONS) as log,
        servers.frontiers() as frontiers,
        servers.leases() as leases,
    ):
        world = PausedFleet(
            env, servers.bootstrap, requests_topic, tmp_path, log, frontiers, leases
        )
        try:
            await world.spawn("projector", "projector", "--session-timeout-ms", "6000")
            for _ in range(WORKERS):
                await world.worker()

            async def ready() -> bool:
                return balanced((world.output(n) for n in world.workers), PARTITIONS)

            await world.until("three workers with partitions", ready, 60)
            yield world
        finally:
            world.continue_all()
            await stop_children(world.children.values(), within_s=20)
            await delete_topic(servers.bootstrap, requests_topic)


async def submit(world: PausedFleet) -> dict[str, str]:
    """Submit ``RUNS`` runs in batches over ``SUBMIT_S``; their agents by run id."""
    runs = {f"run-{uuid.uuid4().hex[:10]}": "booker" if i % 2 else "charger" for i in range(RUNS)}
    batches = 15
    ids = list(runs)
    async with Requests(
        world.bootstrap, world.requests_topic, partitions=PARTITIONS, signer=SIGNER
    ) as client:
        for b in range(batches):
            batch = ids[b * len(ids) // batches : (b + 1) * len(ids) // batches]
            await client.submit_many(
                [StartRun(run_id=r, tenant=TENANT, agent=runs[r], input="go") for r in batch]
            )
            await asyncio.sleep(SUBMIT_S / batches)
    return runs


async def chaos(world: PausedFleet, rng: random.Random, until: float, done: Chaos) -> None:
    """Until the loop's clock reaches ``until``: every so often, pick a worker nobody is acting
    on (at most two at a time, so one keeps going) and pause it past its lease or kill it."""
    busy: set[str] = set()
    actions: set[asyncio.Task[None]] = set()

    async def pause(name: str, for_s: float) -> None:
        child = world.children[name]
        child.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(for_s)
        finally:
            child.send_signal(signal.SIGCONT)
            busy.discard(name)

    async def kill(name: str) -> None:
        child = world.children[name]
        # On the worker's word that a call set out (if one does within 5 s): a kill with no
        # call on its way tests nothing about calls.
        for _ in range(50):
            if on_their_way(world.tmp, child.pid):
                break
            await asyncio.sleep(0.1)
        child.send_signal(signal.SIGKILL)
        await child.wait()
        if on_their_way(world.tmp, child.pid):
            done.landed += 1
        world.workers.remove(name)
        busy.discard(name)
        await world.worker()

    loop = asyncio.get_running_loop()
    try:
        while loop.time() < until:
            await asyncio.sleep(rng.uniform(0.3, 1.5))
            free = [n for n in world.workers if n not in busy]
            if len(busy) >= 2 or not free:
                continue
            name = rng.choice(free)
            busy.add(name)
            if rng.random() < 0.7:
                for_s = TTL_S + rng.uniform(0.5, 2.5)
                done.pauses += 1
                done.actions.append(f"{loop.time():.1f} pause {name} {for_s:.1f}s")
                task = asyncio.create_task(pause(name, for_s))
            else:
                done.kills += 1
                done.actions.append(f"{loop.time():.1f} kill {name}")
                task = asyncio.create_task(kill(name))
            actions.add(task)
            task.add_done_callback(actions.discard)
    finally:
        await asyncio.gather(*actions)


async def twice(world: PausedFleet, name: str, runs: dict[str, str]) -> dict[str, Any]:
    """The calls that took effect more than once in system ``name``: for each, its run, its
    effects (key, fence, worker pid) and its run's events."""
    effects = system(name, world.tmp).effects()
    counts = Counter(e["key"] for e in effects)
    calls = {idempotency_key(r, f"c{n}"): (r, f"c{n}") for r in runs for n in range(1, STEPS + 1)}
    return {
        f"{calls[key]} {key}": {
            "effects": [e for e in effects if e["key"] == key],
            "events": await world.history(calls[key][0]),
        }
        for key, n in counts.items()
        if n > 1
    }


@pytest.mark.timeout(240)
async def test_paused_and_killed_workers_never_take_an_effect_twice(
    fleet: PausedFleet, rng: random.Random
) -> None:
    done = Chaos()
    until = asyncio.get_running_loop().time() + CHAOS_S
    chaotic = asyncio.create_task(chaos(fleet, rng, until, done))
    runs = await submit(fleet)
    await chaotic

    async def settled() -> bool:
        rows = await fleet.rows()
        finished = sum(1 for s in rows.values() if s.status in ("completed", "failed"))
        return finished + len(await fleet.left_for_a_person()) >= len(runs)

    await fleet.until("every run completed, failed or left for a person", settled, 90)

    rows = await fleet.rows()
    left = await fleet.left_for_a_person()
    statuses = Counter(s.status for s in rows.values())
    bookings = system(BOOKINGS, fleet.tmp).read()
    charges = system(CHARGES, fleet.tmp)
    report = (
        f"{len(runs)} runs ({dict(statuses)}), {done.pauses} pauses, {done.kills} kills "
        f"({done.landed} with a call on its way), "
        f"{len(left)} left for a person, {len(bookings['refused'])} stale bookings refused, "
        f"{sum(1 for s in rows.values() if s.fence > 1)} runs carried on; "
        f"chaos: {done.actions}"
    )
    print(report)
    assert done.pauses, report
    assert done.kills, report
    assert done.landed, f"no kill found a call on its way: {report}"
    assert set(rows) == set(runs), f"runs missing: {set(runs) - set(rows)}; {report}"
    doubled = await twice(fleet, BOOKINGS, runs)
    assert not doubled, f"bookings taken twice: {doubled}; {report}"
    doubled = await twice(fleet, CHARGES, runs)
    assert not doubled, f"charges taken twice: {doubled}; {report}"
    bookers = [r for r, agent in runs.items() if agent == "booker"]
    chargers = [r for r, agent in runs.items() if agent == "charger"]
    assert [r for r in bookers if rows[r].status != "completed"] == [], report
    assert [r for r in chargers if rows[r].status != "completed" and r not in left] == [], report
    # A completed run's every call took effect once: none was lost to a pause or a kill.
    made = Counter(e["key"] for e in bookings["effects"]) + Counter(
        e["key"] for e in charges.effects()
    )
    completed = [r for r in runs if rows[r].status == "completed"]
    missing = [
        (r, f"c{n}")
        for r in completed
        for n in range(1, STEPS + 1)
        if made[idempotency_key(r, f"c{n}")] != 1
    ]
    assert missing == [], report
