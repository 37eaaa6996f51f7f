"""Projector processes killed with SIGKILL, and a consumer group losing a member.

Each projector here is a real `python -m onward projector` process against real Kafka and
PostgreSQL. At the end every frontier must equal the fold computed directly from the log, and
every `tool_calls` row must be the one the direct fold gives, once.
"""

from __future__ import annotations

import asyncio
import random
import re
import signal
import uuid

import asyncpg
import pytest
from support.histories import append_all, direct_fold, run_ids_of, workload
from support.projector_world import ProjectorWorld, world_fixture

from onward.eventlog import Event

pytestmark = pytest.mark.kafka
PARTITIONS = 4
ALL = set(range(PARTITIONS))
ASSIGNED = "onward.projector assigned "


class World(ProjectorWorld):
    async def spawn(self, group: str, name: str) -> asyncio.subprocess.Process:
        options = ["--group", group, "--batch", "400", "--session-timeout-ms", "6000"]
        return await self.start_projector(name, *options)

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


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_exactly_once_under_twenty_sigkills(world: World, rng: random.Random) -> None:
    steps = big_workload(rng, 50_000)
    writer = asyncio.create_task(append_all(world.log, steps, concurrency=48))
    kills = 0
    while kills < 20:
        child = await world.spawn(f"crash-{uuid.uuid4().hex[:8]}", f"crash{kills}")
        await asyncio.sleep(rng.uniform(0.8, 3.0))
        if child.returncode is not None:
            pytest.fail(f"projector exited by itself:\n{world.output(f'crash{kills}')}")
        child.kill()
        await child.wait()
        kills += 1
    await writer
    assert sum(len(s) for s in steps) >= 50_000
    final = await world.spawn(f"final-{uuid.uuid4().hex[:8]}", "final")
    # The killed projectors may have folded everything already: wait until this one is up
    # (it has its partitions, so its SIGTERM handler is installed) before asking it to stop.
    await world.wait_for_output("final", ASSIGNED, within=120)
    await world.wait_caught_up(within=240)
    final.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(final.wait(), 60) == 0, world.output("final")
    assert "projector stopped cleanly" in world.output("final")
    await assert_projection_is_the_direct_fold(world, steps)


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
