"""Projector processes killed with SIGKILL, and a consumer group losing a member.

Each projector here is a real `python -m onward projector` process against real Kafka and
PostgreSQL. At the end every frontier must equal the fold computed directly from the log, and
every `tool_calls` row must be the one the direct fold gives, once.

The SIGKILL test kills each projector as it says (on a pipe, `support.marked_projector`) that
its store began writing a batch's rows, and counts the kills that landed inside a write: the
projector's last word was that write, and the positions it was storing are not stored. It fails
if none did, since a kill before any write, or between writes, proves nothing about a write
interrupted halfway.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import sys
import uuid
from dataclasses import dataclass

import asyncpg
import pytest
from support.histories import append_all, direct_fold, run_ids_of, workload
from support.marked_projector import WRITING
from support.processes import TESTS
from support.projector_world import ProjectorWorld, world_fixture

from onward.eventlog import Event

pytestmark = pytest.mark.kafka
PARTITIONS = 4
ALL = set(range(PARTITIONS))
ASSIGNED = "onward.projector assigned "


OPTIONS = ["--batch", "400", "--session-timeout-ms", "6000", "--cache-mib", "1"]
"""A one-MiB frontier budget: the SIGKILL test's thousands of runs do not fit, so frontiers are
dropped from memory and loaded again, and stores come due as the budget fills."""


@dataclass
class Marked:
    """A projector saying where its store's writes are, and the stream it says it on."""

    child: asyncio.subprocess.Process
    said: asyncio.StreamReader
    pipe: asyncio.ReadTransport


class World(ProjectorWorld):
    async def spawn(self, group: str, name: str) -> asyncio.subprocess.Process:
        return await self.start_projector(name, "--group", group, *OPTIONS)

    async def spawn_marked(self, group: str, name: str) -> Marked:
        """A projector as `spawn` starts it, saying where its store's writes are on a pipe."""
        reading, writing = os.pipe()
        argv = ["-m", "support.marked_projector", str(writing), "projector", "--group", group]
        env = {**self.env(), "PYTHONPATH": str(TESTS)}
        try:
            with (self.tmp / f"{name}.log").open("wb") as out:
                child = await asyncio.create_subprocess_exec(
                    sys.executable,
                    *argv,
                    *OPTIONS,
                    env=env,
                    stdout=out,
                    stderr=out,
                    pass_fds=(writing,),
                )
        finally:
            os.close(writing)
        self.children.append(child)
        said = asyncio.StreamReader()
        pipe, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(said), os.fdopen(reading, "rb", buffering=0)
        )
        return Marked(child, said, pipe)

    async def caught_up(self) -> bool:
        stored = await self.store.positions("frontiers")
        ends = [(await self.log.bounds(p)).end for p in range(PARTITIONS)]
        return all(stored.get(p, 0) >= end for p, end in enumerate(ends))

    async def wait_for_output(self, name: str, text: str, within: float) -> None:
        deadline = asyncio.get_running_loop().time() + within
        while text not in self.output(name):
            assert asyncio.get_running_loop().time() < deadline, self.output(name)
            await asyncio.sleep(0.1)

    def held(self, name: str) -> set[int]:
        """The partitions of the last assignment this projector sought (none before the first)."""
        lines = [line for line in self.output(name).splitlines() if ASSIGNED in line]
        if not lines:
            return set()
        return {int(p) for p in re.findall(r"(\d+):", lines[-1].split(ASSIGNED, 1)[1])}

    async def wait_until_split(self, names: tuple[str, str], within: float) -> None:
        """Wait for a generation in which both projectors hold partitions and none is shared."""
        deadline = asyncio.get_running_loop().time() + within
        while True:
            first, second = (self.held(name) for name in names)
            if first and second and first.isdisjoint(second) and first | second == ALL:
                return
            assert asyncio.get_running_loop().time() < deadline, (first, second)
            await asyncio.sleep(0.1)

    async def wait_caught_up(self, within: float) -> None:
        deadline = asyncio.get_running_loop().time() + within
        while not await self.caught_up():
            assert asyncio.get_running_loop().time() < deadline, "the projector did not catch up"
            await asyncio.sleep(0.25)


world = world_fixture(World, PARTITIONS)


async def assert_projection_is_the_direct_fold(world: World, steps: list[list[Event]]) -> None:
    run_ids = run_ids_of(steps)
    expected, expected_calls = await direct_fold(world.log, run_ids)
    loaded = await world.store.load(run_ids)
    mismatched = [r for r in run_ids if r not in loaded or loaded[r].frontier != expected[r]]
    assert mismatched == [], f"{len(mismatched)} frontiers differ, e.g. {mismatched[:3]}"
    conn = await asyncpg.connect(world.database_url, server_settings={"search_path": world.schema})
    try:
        rows = await conn.fetch("SELECT run_id, call_id, outcome, fence FROM onward_tool_calls")
    finally:
        await conn.close()
    keys = [(r["run_id"], r["call_id"]) for r in rows]
    assert len(keys) == len(set(keys)), "duplicate tool_calls rows"
    assert {k: (r["outcome"], r["fence"]) for k, r in zip(keys, rows, strict=True)} == {
        k: (v.outcome, v.fence) for k, v in expected_calls.items()
    }


def big_workload(rng: random.Random, at_least: int) -> list[list[Event]]:
    steps: list[list[Event]] = []
    while sum(len(s) for s in steps) < at_least:
        steps += workload(rng, 500)
    return steps


async def append_in_bursts(world: World, steps: list[list[Event]], bursts: int) -> None:
    """Append ``steps`` in ``bursts`` parts, a quarter of a second apart."""
    for b in range(bursts):
        await append_all(
            world.log, steps[b * len(steps) // bursts : (b + 1) * len(steps) // bursts]
        )
        await asyncio.sleep(0.25)


async def kill_inside_a_write(
    world: World, marked: Marked, name: str, writes_to_let_by: int, writer: asyncio.Task[None]
) -> dict[int, int] | None:
    """SIGKILL the projector as it says a write began (after ``writes_to_let_by`` others), or
    once it has said nothing for 5 s after ``writer`` finished (it has folded everything and
    has nothing left to write); the positions of the write the kill interrupted, if its last
    word was that a write began."""
    said: list[list[str]] = []
    quiet_s = 0
    while True:
        try:
            line = await asyncio.wait_for(marked.said.readline(), 1)
        except TimeoutError:
            quiet_s = quiet_s + 1 if writer.done() else 0
            if quiet_s >= 5:
                break
            continue
        if not line:
            await marked.child.wait()
            pytest.fail(f"projector exited by itself:\n{world.output(name)}")
        said.append(line.decode().split())
        if said[-1][0] == WRITING:
            if writes_to_let_by == 0:
                break
            writes_to_let_by -= 1
    marked.child.kill()
    await marked.child.wait()
    said += [line.split() for line in (await marked.said.read()).decode().splitlines()]
    marked.pipe.close()
    if not said or said[-1][0] != WRITING:
        return None
    return {int(p): int(o) for p, o in (at.split(":") for at in said[-1][2:])}


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_exactly_once_under_twenty_sigkills(world: World, rng: random.Random) -> None:
    steps = big_workload(rng, 50_000)
    assert sum(len(s) for s in steps) >= 50_000
    # Appended a twentieth while each projector runs, in eight bursts, so each has several
    # stores to write (appended at once, the first projector would fold it all in one store
    # and the others would be killed idle).
    kills = 20
    parts = [steps[k * len(steps) // kills : (k + 1) * len(steps) // kills] for k in range(kills)]
    interrupted: list[dict[int, int]] = []
    for kill, part in enumerate(parts):
        marked = await world.spawn_marked(f"crash-{uuid.uuid4().hex[:8]}", f"crash{kill}")
        writer = asyncio.create_task(append_in_bursts(world, part, bursts=8))
        let_by = rng.randint(0, 3)
        positions = await kill_inside_a_write(world, marked, f"crash{kill}", let_by, writer)
        stored = await world.store.positions("frontiers")
        if positions and any(stored.get(p, 0) < o for p, o in positions.items()):
            interrupted.append(positions)
        await writer
    # Writes were interrupted on top of stored ones, not only before the first store.
    assert await world.store.positions("frontiers"), "the killed projectors stored nothing"
    final = await world.spawn(f"final-{uuid.uuid4().hex[:8]}", "final")
    # The killed projectors may have folded everything already: wait until this one is up
    # (it has its partitions, so its SIGTERM handler is installed) before asking it to stop.
    await world.wait_for_output("final", ASSIGNED, within=120)
    await world.wait_caught_up(within=240)
    final.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(final.wait(), 60) == 0, world.output("final")
    assert "projector stopped cleanly" in world.output("final")
    await assert_projection_is_the_direct_fold(world, steps)
    print(f"{len(interrupted)} of {kills} kills landed inside a write of the store")
    assert interrupted, "no kill landed inside a write of the store: nothing was tested"


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_a_surviving_member_takes_over_a_killed_members_partitions(
    world: World, rng: random.Random
) -> None:
    steps = big_workload(rng, 6_000)
    group = f"pair-{uuid.uuid4().hex[:8]}"
    first = await world.spawn(group, "a")
    second = await world.spawn(group, "b")
    half = len(steps) // 2
    await append_all(world.log, steps[:half])
    # A member that joins late may fold nothing until the next generation: wait until the two
    # really share the partitions, so that killing one leaves partitions to take over.
    await world.wait_until_split(("a", "b"), within=60)
    await world.wait_caught_up(within=120)
    first.kill()
    await first.wait()
    await append_all(world.log, steps[half:])
    await world.wait_caught_up(within=120)
    assert world.held("b") == ALL, world.output("b")
    second.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(second.wait(), 60) == 0
    await assert_projection_is_the_direct_fold(world, steps)
