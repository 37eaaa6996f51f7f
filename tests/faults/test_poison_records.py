"""One bad record never stops a partition: the Kafka projector, as a real process.

For each kind of poison record (not JSON, an unknown kind, a newer format), written by a raw
producer under run A into a partition A shares with 99 other runs: `onward projector` keeps
running, the 99 runs' frontiers are the direct fold, A is listed by `onward quarantine list`
with its reason, `onward replay A` shows A's readable events and the bad record in its place,
and `onward inspect A` refuses the run (exit 4).
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import sys

import pytest
from aiokafka import AIOKafkaProducer
from support.histories import append_all
from support.poison import (
    BAD_RECORDS,
    KIND_HEADERS,
    REASONS,
    PoisonedPartition,
    poisoned_partition,
    tolerant_direct_fold,
)
from support.projector_world import ProjectorWorld, world_fixture

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.slow]
PARTITIONS = 2
SHARED = 1
TENANT = "acme"


class World(ProjectorWorld):
    def env(self) -> dict[str, str]:
        return {**super().env(), "REDIS_URL": ""}  # leases in this test's own schema

    async def spawn_projector(self) -> asyncio.subprocess.Process:
        options = ["--batch", "400", "--session-timeout-ms", "6000"]
        return await self.start_projector("projector", *options)

    def projector_output(self) -> str:
        return self.output("projector")

    async def wait_for_output(self, text: str, times: int, within: float) -> None:
        deadline = asyncio.get_running_loop().time() + within
        while self.projector_output().count(text) < times:
            assert asyncio.get_running_loop().time() < deadline, self.projector_output()
            await asyncio.sleep(0.2)

    async def onward(self, *args: str) -> tuple[int, str, str]:
        """Run one `onward` command as a process: exit code, stdout, stderr."""
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "onward",
            *args,
            env={**self.env(), "COLUMNS": "200"},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        self.children.append(child)  # killed after the test if it never ended
        out, err = await asyncio.wait_for(child.communicate(), 60)
        assert child.returncode is not None
        return child.returncode, out.decode(), err.decode()

    async def wait_caught_up(self, child: asyncio.subprocess.Process, within: float) -> None:
        deadline = asyncio.get_running_loop().time() + within
        while True:
            assert child.returncode is None, self.projector_output()
            stored = await self.store.positions("frontiers")
            ends = [(await self.log.bounds(p)).end for p in range(PARTITIONS)]
            if all(stored.get(p, 0) >= end for p, end in enumerate(ends)):
                return
            assert asyncio.get_running_loop().time() < deadline, self.projector_output()
            await asyncio.sleep(0.25)


world = world_fixture(World, PARTITIONS)


async def produce_raw(world: World, run_id: str, value: bytes, kind: str | None) -> int:
    """Write one record as a foreign producer would: keyed by the run, Onward's headers."""
    headers = [("onward.run_id", run_id.encode())]
    if kind is not None:
        headers.append(("onward.kind", kind.encode()))
    producer = AIOKafkaProducer(bootstrap_servers=world.bootstrap)
    await producer.start()
    try:
        sent = await producer.send_and_wait(
            world.topic, value, key=run_id.encode(), partition=SHARED, headers=headers
        )
    finally:
        await producer.stop()
    return int(sent.offset)


async def write(world: World, scene: PoisonedPartition, bad: str) -> int:
    for step in scene.a_steps[: scene.before]:
        await world.log.append(step)
    half = len(scene.others) // 2
    await append_all(world.log, scene.others[:half])
    offset = await produce_raw(
        world, scene.a, BAD_RECORDS[bad](scene.a, scene.bad_seq), KIND_HEADERS[bad]
    )
    await append_all(world.log, scene.others[half:])
    for step in scene.a_steps[scene.before :]:
        await world.log.append(step)
    return offset


@pytest.mark.parametrize("bad", sorted(BAD_RECORDS))
async def test_a_poison_record_never_stops_the_projector(
    world: World, rng: random.Random, bad: str
) -> None:
    scene = poisoned_partition(rng, partition=SHARED, partitions=PARTITIONS)
    offset = await write(world, scene, bad)

    projector = await world.spawn_projector()
    await world.wait_caught_up(projector, within=90)
    await asyncio.sleep(1.5)  # well past the second in which it used to exit
    assert projector.returncode is None, world.projector_output()

    expected, _ = await tolerant_direct_fold(world.log, scene.other_ids)
    loaded = await world.store.load(scene.other_ids)
    assert {r: row.frontier for r, row in loaded.items()} == expected
    row = await world.store.get(scene.a)
    assert row is not None
    assert row.quarantined is not None
    assert f"offset {offset}" in row.quarantined

    code, out, err = await world.onward("quarantine", "list", "--json")
    assert code == 0, err
    (listed,) = [json.loads(line) for line in out.splitlines()]
    assert (listed["run_id"], listed["partition"], listed["offset"], listed["state"]) == (
        scene.a,
        SHARED,
        offset,
        "held",
    )
    assert REASONS[bad] in listed["reason"]
    assert "hunter2" not in out

    code, out, err = await world.onward("replay", scene.a, "--tenant", TENANT, "--json")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    readable = [line for line in lines if not line["unreadable"]]
    assert len(readable) == scene.a_events(slice(None))
    (hole,) = [line for line in lines if line["unreadable"]]
    assert hole["offset"] == offset
    assert REASONS[bad] in hole["detail"]
    assert [line["offset"] for line in lines] == sorted(line["offset"] for line in lines)
    assert "hunter2" not in out

    code, out, err = await world.onward("replay", scene.a, "--tenant", TENANT)
    assert code == 0, err
    assert "UNREADABLE" in out
    assert str(offset) in out

    code, out, err = await world.onward("inspect", scene.a, "--tenant", TENANT)
    assert code == 4, (out, err)
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err

    assert world.projector_output().count("quarantined the record") == 1

    # Released with no newer Onward: the running projector folds A again, holds it again once.
    code, out, err = await world.onward("quarantine", "release", scene.a, "--by", "ops")
    assert code == 0, err
    assert "next pass" in out
    await world.wait_for_output("quarantined the record", 2, within=30)
    (entry,) = await world.store.quarantined("frontiers")
    assert (entry.state, entry.released_by) == ("held", "ops")
    await asyncio.sleep(2.5)  # several more passes: nothing more is folded or held
    assert world.projector_output().count("quarantined the record") == 2
    assert await world.store.quarantined("frontiers") == [entry]

    assert projector.returncode is None
    projector.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(projector.wait(), 30) == 0, world.projector_output()
    assert "Traceback" not in world.projector_output()


async def test_a_record_that_names_no_run_is_dismissed_by_its_position(world: World) -> None:
    """A foreign producer's value that is not JSON, with no key and no headers: nothing names
    its run, so `onward quarantine release` cannot clear it. `onward quarantine dismiss` does,
    and the running projector leaves it dismissed."""
    producer = AIOKafkaProducer(bootstrap_servers=world.bootstrap)
    await producer.start()
    try:
        sent = await producer.send_and_wait(world.topic, b"\x00\x01 not json {", partition=SHARED)
    finally:
        await producer.stop()
    offset = int(sent.offset)
    projector = await world.spawn_projector()
    await world.wait_caught_up(projector, within=90)
    await world.wait_for_output("quarantined the record", 1, within=30)

    code, out, err = await world.onward("quarantine", "list", "--json")
    assert code == 0, err
    (listed,) = [json.loads(line) for line in out.splitlines()]
    assert (listed["run_id"], listed["partition"], listed["offset"], listed["state"]) == (
        None,
        SHARED,
        offset,
        "held",
    )

    where = ["--partition", str(SHARED), "--offset", str(offset)]
    code, out, err = await world.onward("quarantine", "dismiss", *where, "--by", "ops")
    assert code == 0, err
    assert f"dismissed the record at partition {SHARED} offset {offset}" in out
    await asyncio.sleep(2.5)  # several passes of the running projector
    code, out, err = await world.onward("quarantine", "list", "--json")
    assert (code, out) == (0, ""), err
    (entry,) = await world.store.quarantined("frontiers")
    assert (entry.run_id, entry.state, entry.released_by) == (None, "cleared", "ops")

    assert projector.returncode is None
    projector.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(projector.wait(), 30) == 0, world.projector_output()
    assert "Traceback" not in world.projector_output()
