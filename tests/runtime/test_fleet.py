"""A fleet of `onward worker` processes losing a member: nobody calls resume, nothing runs twice.

Real processes against Kafka, PostgreSQL and Redis: one projector, three workers, runs
submitted through the requests topic. Half the runs book (a tool with a status check), half
charge (no status check), so a worker killed mid-call leaves some charges undecidable: those
runs must be listed as needing a person, not retried. The tools' ledger says what happened.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio
from support.deployment import assigned, balanced, process_env, worker_argv
from support.kafka import delete_topic
from support.processes import spawn_onward, stop_children
from support.servers import REQUEST_KEY, KafkaServers

from onward.eventlog import KafkaEventLog
from onward.projections.postgres import PostgresFrontierStore
from onward.runtime.demo_ledger import Ledger
from onward.runtime.fleet.requests import AnswerRequest, Requests, StartRun, TagRun
from onward.runtime.leases import RedisLeaseStore
from onward.runtime.manager import ExecutionManager
from onward.runtime.signing import RequestSigner
from onward.runtime.tools import idempotency_key

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
PARTITIONS = 6
SIGNER = RequestSigner(REQUEST_KEY)
RUNS = int(os.environ.get("ONWARD_FLEET_TEST_RUNS", "300"))
TENANT = "acme"
MAX_RUNS = 12


@dataclass
class Fleet:
    bootstrap: str
    env: dict[str, str]
    requests_topic: str
    tmp: Path
    log: KafkaEventLog
    frontiers: PostgresFrontierStore
    leases: RedisLeaseStore
    session_timeout_ms: int = 6000
    children: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)

    @property
    def ledger(self) -> Ledger:
        return Ledger(self.tmp / "ledger.jsonl")

    async def spawn(self, name: str, *argv: str) -> None:
        self.children[name] = await spawn_onward(self.tmp / f"{name}.log", self.env, *argv)

    async def worker(self, name: str) -> None:
        argv = worker_argv(
            "support.fleet",
            self.requests_topic,
            name,
            *("--max-runs", str(MAX_RUNS)),
            session_timeout_ms=self.session_timeout_ms,
        )
        await self.spawn(name, *argv)

    def output(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    async def until(self, what: str, check: Callable[[], Awaitable[bool]], within: float) -> None:
        deadline = asyncio.get_running_loop().time() + within
        while True:
            if await check():
                return
            if asyncio.get_running_loop().time() > deadline:
                logs = {n: self.output(n)[-2000:] for n in self.children}
                raise AssertionError(f"timed out waiting for {what}: {logs}")
            await asyncio.sleep(0.25)

    async def submit(self, count: int) -> list[str]:
        run_ids = [f"run-{uuid.uuid4().hex[:10]}" for _ in range(count)]
        async with Requests(
            self.bootstrap, self.requests_topic, partitions=PARTITIONS, signer=SIGNER
        ) as client:
            await client.submit_many(
                [
                    StartRun(
                        run_id=r,
                        tenant=TENANT,
                        agent="booker" if i % 2 else "charger",
                        input=f"job {i}",
                    )
                    for i, r in enumerate(run_ids)
                ]
            )
        return run_ids

    async def statuses(self) -> Counter[str]:
        return Counter(s.status for s in await self.frontiers.runs(tenant=TENANT))

    async def stop_all(self) -> None:
        await stop_children(self.children.values(), within_s=30)


@pytest_asyncio.fixture
async def fleet(
    kafka_servers: KafkaServers, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Fleet]:
    """One projector and three balanced workers; ``request.param`` (indirect) is the workers'
    group session timeout in ms (6,000 unless a test says otherwise)."""
    servers = kafka_servers
    kafka_bootstrap = servers.bootstrap
    env = process_env(
        servers,
        PARTITIONS,
        FLEET_LEDGER=str(tmp_path / "ledger.jsonl"),
        FLEET_SPANS=str(tmp_path / "spans.jsonl"),
        FLEET_STEPS="3",
        FLEET_TOOL_S="0.1",
    )
    requests_topic = f"{servers.topic}.requests"
    async with (
        servers.log(partitions=PARTITIONS) as log,
        servers.frontiers() as frontiers,
        servers.leases() as leases,
    ):
        world = Fleet(kafka_bootstrap, env, requests_topic, tmp_path, log, frontiers, leases)
        world.session_timeout_ms = getattr(request, "param", 6000)
        try:
            await world.spawn("projector", "projector", "--session-timeout-ms", "6000")
            for n in range(3):
                await world.worker(f"w{n}")
            await world.until(
                "three workers with partitions",
                lambda: _all_assigned(world),
                60,
            )
            yield world
        finally:
            await world.stop_all()
            await delete_topic(kafka_bootstrap, requests_topic)


async def _all_assigned(world: Fleet) -> bool:
    """Each worker's latest assignment is its share of a three-member group."""
    return balanced((world.output(f"w{n}") for n in range(3)), PARTITIONS)


async def _settled(world: Fleet, run_ids: list[str]) -> bool:
    statuses = await world.statuses()
    if statuses["completed"] + statuses["running"] + statuses["failed"] < len(run_ids):
        return False
    if statuses["failed"]:
        return True  # fail fast: the assertions below say which
    pending = await ExecutionManager(world.frontiers, world.leases).list_pending(tenant=TENANT)
    left = sum(1 for p in pending if p.attention == "needs_person")
    return statuses["completed"] + left == len(run_ids)


def _repeated_effects(ledger: Ledger) -> Counter[tuple[str, str]]:
    """The side effects done more than once, each with how many times (none, if all is well)."""
    counts = Counter((e["tool"], e["key"]) for e in ledger.entries())
    return Counter({k: n for k, n in counts.items() if n > 1})


def _most_calls_at_once(spans: Path, pid: int) -> int:
    """The most tool calls the process ``pid`` had under way at one moment, from the spans the
    tools wrote: a run makes one call at a time, so each was a different run in flight."""
    moments: list[tuple[float, int]] = []
    for line in spans.read_text().splitlines():
        span = json.loads(line)
        if span["pid"] == pid:
            moments += [(span["began"], 1), (span["ended"], -1)]
    most = under_way = 0
    for _, change in sorted(moments):  # at one instant an end (-1) sorts before a start
        under_way += change
        most = max(most, under_way)
    return most


@pytest.mark.timeout(180)
async def test_a_killed_worker_s_runs_are_carried_on_by_the_others(fleet: Fleet) -> None:
    run_ids = await _under_way(fleet)
    # Killed while it holds a run: one whose runs had all ended would leave nothing to carry on.
    await fleet.until("w0 mid-way through a run", lambda: _mid_way(fleet, run_ids, "w0"), 60)
    victim = _signal(fleet, "w0", signal.SIGKILL)
    await victim.wait()
    await fleet.until(
        "every run completed or left for a person", lambda: _settled(fleet, run_ids), 100
    )

    statuses = await fleet.statuses()
    assert statuses["failed"] == 0, statuses
    assert not _repeated_effects(fleet.ledger), "side effects repeated"
    pending = await ExecutionManager(fleet.frontiers, fleet.leases).list_pending(tenant=TENANT)
    left = {p.summary.run_id: p for p in pending if p.attention == "needs_person"}
    rows = {s.run_id: s for s in await fleet.frontiers.runs(tenant=TENANT)}
    assert set(rows) == set(run_ids)
    for run_id in left:
        assert rows[run_id].agent == "charger"  # booker's status check settles its own calls
    # Runs the dead worker held were carried on by another: claimed after their start.
    carried = [s for s in rows.values() if s.fence > 1]
    assert carried, "no run was carried on"
    assert statuses["completed"] + len(left) == len(run_ids)
    # Left alone, a run left for a person is not claimed again: nobody guesses for it.
    fences = {r: rows[r].fence for r in left}
    await asyncio.sleep(2.5)
    again = {
        s.run_id: s.fence for s in await fleet.frontiers.runs(tenant=TENANT) if s.run_id in left
    }
    assert again == fences


_PARTITIONS_STAY_MS = 90_000


@pytest.mark.parametrize("fleet", [_PARTITIONS_STAY_MS], indirect=True, ids=["session-90s"])
@pytest.mark.timeout(180)
async def test_a_dead_worker_s_runs_move_before_its_partitions_do(fleet: Fleet) -> None:
    """With a 90 s group session timeout the dead worker keeps its partitions for the whole test;
    the runs it was carrying are still carried on by the others, once their leases lapse."""
    run_ids = await _under_way(fleet)
    await fleet.until(
        "a run of w0 after its first step", lambda: _mid_way(fleet, run_ids, "w0"), 60
    )
    assignments = {n: fleet.output(n).count("partitions assigned") for n in ("w1", "w2")}
    owned = assigned(fleet.output("w0"))  # only w0 starts and carries on runs of these
    victim = _signal(fleet, "w0", signal.SIGKILL)
    await victim.wait()
    # Everything w0 wrote is below these ends: once folded, its orphans are its running runs.
    ends = {p: (await fleet.log.bounds(p)).end for p in range(PARTITIONS)}
    await fleet.until("the projector caught up", lambda: _folded_to(fleet, ends), 30)
    held = {
        s.run_id
        for s in await fleet.frontiers.runs(tenant=TENANT, statuses={"running"})
        if s.partition in owned
    }
    assert held, "w0 was carrying no run"

    async def moved_on() -> bool:
        rows = {s.run_id: s for s in await fleet.frontiers.runs(tenant=TENANT) if s.run_id in held}
        pending = await ExecutionManager(fleet.frontiers, fleet.leases).list_pending(tenant=TENANT)
        left = {p.summary.run_id for p in pending if p.attention == "needs_person"}
        return all(rows[r].status == "completed" or r in left for r in held)

    await fleet.until("w0's runs carried on by the others", moved_on, 45)
    # Well inside the session timeout: no partition moved, so recovery did not wait for one.
    assert {n: fleet.output(n).count("partitions assigned") for n in assignments} == assignments
    rows = {s.run_id: s for s in await fleet.frontiers.runs(tenant=TENANT) if s.run_id in held}
    assert {rows[r].holder for r in held} <= {"w1", "w2"}  # each claimed by a survivor
    assert not _repeated_effects(fleet.ledger), "side effects repeated"


async def _folded_to(world: Fleet, ends: dict[int, int]) -> bool:
    stored = await world.frontiers.positions("frontiers")
    return all(stored.get(p, 0) >= end for p, end in ends.items())


@pytest.mark.timeout(180)
async def test_a_sigtermed_worker_drains_and_exits_0_and_its_runs_go_on(fleet: Fleet) -> None:
    run_ids = await _under_way(fleet)
    # Signalled while one of its runs has boundaries ahead: runs started together move in
    # step, so a signal at a random moment can find every run past its last model call.
    await fleet.until(
        "a run of w1 after its first step", lambda: _mid_way(fleet, run_ids, "w1"), 60
    )
    leaving = _signal(fleet, "w1", signal.SIGTERM)
    assert await asyncio.wait_for(leaving.wait(), 30) == 0, fleet.output("w1")
    stopped = re.search(r"(\d+)\s+stopped\s+at\s+a\s+boundary", fleet.output("w1"))
    assert stopped is not None, fleet.output("w1")
    assert int(stopped.group(1)) > 0, "the drain found no run in flight: " + fleet.output("w1")
    # Backpressure: never more than --max-runs in flight; full, the worker paused.
    peak = re.search(
        r"at\s+most\s+(\d+)\s+in\s+flight,\s+paused\s+(\d+)\s+times", fleet.output("w1")
    )
    assert peak is not None, fleet.output("w1")
    assert int(peak.group(1)) <= MAX_RUNS
    assert int(peak.group(2)) > 0
    # The same bound counted by the tools, not by the worker: w1 was given about a third of
    # the runs at once, so without the bound it would have had far more calls under way.
    most = _most_calls_at_once(fleet.tmp / "spans.jsonl", fleet.children["w1"].pid)
    assert 1 < most <= MAX_RUNS, most
    await fleet.until("every run completed", lambda: _completed(fleet, len(run_ids)), 100)
    assert not _repeated_effects(fleet.ledger), "side effects repeated"
    pending = await ExecutionManager(fleet.frontiers, fleet.leases).list_pending(tenant=TENANT)
    assert pending == []


async def _under_way(fleet: Fleet) -> list[str]:
    """Submit ``RUNS`` runs and wait until a third of their effects are done."""
    run_ids = await fleet.submit(RUNS)
    await fleet.until("runs under way", lambda: _effects_at_least(fleet, RUNS // 3), 60)
    return run_ids


def _signal(fleet: Fleet, name: str, signum: signal.Signals) -> asyncio.subprocess.Process:
    child = fleet.children[name]
    child.send_signal(signum)
    return child


async def _mid_way(world: Fleet, run_ids: list[str], name: str) -> bool:
    """Whether worker ``name`` made some run's first call and not yet its second (two more
    model calls to come: the tool alone takes ``FLEET_TOOL_S``, so a signal sent now arrives
    while that run is still under way)."""
    pid = world.children[name].pid
    made = {(e["key"], e["pid"]) for e in world.ledger.entries()}
    keys = {e for e, _ in made}
    return any(
        (idempotency_key(r, "c1"), pid) in made and idempotency_key(r, "c2") not in keys
        for r in run_ids
    )


async def _first_call_just_made(world: Fleet, run_ids: list[str], name: str) -> None:
    """Until worker ``name`` makes some run's first call (seen within 5 ms of its record)."""
    pid = world.children[name].pid
    firsts = {idempotency_key(r, "c1") for r in run_ids}
    seen: set[str] | None = None
    async with asyncio.timeout(60):
        while True:
            made = {e["key"] for e in world.ledger.entries() if e["pid"] == pid} & firsts
            if seen is not None and made - seen:
                return
            seen = made
            await asyncio.sleep(0.005)


async def _effects_at_least(world: Fleet, count: int) -> bool:
    return len(world.ledger.entries()) >= count


async def _completed(world: Fleet, count: int) -> bool:
    return (await world.statuses())["completed"] == count


@pytest.mark.timeout(180)
async def test_answers_and_tags_go_through_the_requests_topic(fleet: Fleet) -> None:
    run_ids = [f"pay-{uuid.uuid4().hex[:8]}" for _ in range(4)]
    async with Requests(
        fleet.bootstrap, fleet.requests_topic, partitions=PARTITIONS, signer=SIGNER
    ) as client:
        await client.submit_many(
            [StartRun(run_id=r, tenant=TENANT, agent="payer", input="pay") for r in run_ids]
        )
        denied, approved = run_ids[0], run_ids[1:]
        answered: set[tuple[str, str]] = set()

        async def answer_each_wait() -> bool:
            rows = {s.run_id: s for s in await fleet.frontiers.runs(tenant=TENANT)}
            for run_id, row in rows.items():
                if row.status != "waiting" or row.waiting_on is None:
                    continue
                if (run_id, row.waiting_on) in answered:
                    continue
                answered.add((run_id, row.waiting_on))
                await client.submit(
                    AnswerRequest(
                        run_id=run_id,
                        tenant=TENANT,
                        request_id=row.waiting_on,
                        approve=run_id != denied,
                        by="ann",
                    )
                )
            done = [
                r for r in run_ids if r in rows and rows[r].status in ("completed", "cancelled")
            ]
            return len(done) == len(run_ids)

        await fleet.until("every payment answered", answer_each_wait, 90)
        await client.submit(TagRun(run_id=approved[0], tenant=TENANT, label="audited", by="ann"))

        async def tagged() -> bool:
            row = await fleet.frontiers.get(approved[0])
            return row is not None and row.frontier is not None and bool(row.frontier.tags)

        await fleet.until("the tag", tagged, 30)
    rows = {s.run_id: s for s in await fleet.frontiers.runs(tenant=TENANT)}
    assert rows[denied].status == "cancelled"
    assert all(rows[r].status == "completed" for r in approved)
    assert Counter(e["tool"] for e in fleet.ledger.entries()) == {"pay": 3 * len(approved)}
    assert not _repeated_effects(fleet.ledger)


@pytest.mark.timeout(180)
async def test_a_second_sigterm_cancels_at_once_and_nothing_runs_twice(fleet: Fleet) -> None:
    run_ids = await _under_way(fleet)
    # Both signals inside one tool call of a run (FLEET_TOOL_S): the drain is still waiting.
    await _first_call_just_made(fleet, run_ids, "w1")
    leaving = _signal(fleet, "w1", signal.SIGTERM)
    await asyncio.sleep(0.02)
    leaving.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(leaving.wait(), 30) == 0, fleet.output("w1")
    assert "second signal" in fleet.output("w1")
    await fleet.until(
        "every run completed or left for a person", lambda: _settled(fleet, run_ids), 100
    )
    assert (await fleet.statuses())["failed"] == 0
    assert not _repeated_effects(fleet.ledger), "side effects repeated"
