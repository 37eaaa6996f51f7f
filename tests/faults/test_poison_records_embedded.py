"""One bad record never stops a partition, embedded: SQLite log, SQLite frontiers, inline fold.

The same scene as test_poison_records.py without Kafka: a bad row in the SQLite log under run A,
in a partition A shares with 99 other runs. The runner's `Checkpointer` folds after every
append and never fails; the 99 runs are the direct fold; A is listed, replayed with the hole in
place, refused by inspect; a release folds A again at once and, the record still unreadable,
holds it again.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from pathlib import Path

import pytest
from support.poison import (
    BAD_RECORDS,
    REASONS,
    PoisonedPartition,
    poisoned_partition,
    tolerant_direct_fold,
)
from support.processes import reaped

from onward.eventlog import Event, SqliteEventLog
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.checkpoint import Checkpointer

pytestmark = [pytest.mark.faults, pytest.mark.slow]
PARTITIONS = 2
SHARED = 0
TENANT = "acme"


async def onward(path: Path, *args: str) -> tuple[int, str, str]:
    """Run one `onward` command on the embedded file as a process: exit code, stdout, stderr."""
    env = {
        **os.environ,
        "ONWARD_BACKEND": "sqlite",
        "ONWARD_SQLITE_PATH": str(path),
        "ONWARD_PARTITIONS": str(PARTITIONS),
        "COLUMNS": "200",
    }
    async with reaped() as children:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "onward",
            *args,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        children.append(child)
        out, err = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode is not None
    return child.returncode, out.decode(), err.decode()


async def write(
    log: SqliteEventLog, checkpointer: Checkpointer, scene: PoisonedPartition, bad: str
) -> int:
    """Append as the runner does, folding inline after each append; the bad row mid-way."""

    async def append(step: list[Event]) -> None:
        positions = await log.append(step)
        await checkpointer.after_append(step, positions)
        assert checkpointer.last_error is None

    for step in scene.a_steps[: scene.before]:
        await append(step)
    half = len(scene.others) // 2
    for step in scene.others[:half]:
        await append(step)
    position = log.write_raw(scene.a, BAD_RECORDS[bad](scene.a, scene.bad_seq))
    for step in scene.others[half:]:
        await append(step)
    for step in scene.a_steps[scene.before :]:
        await append(step)
    await checkpointer.catch_up()
    return position.offset


@pytest.mark.parametrize("bad", sorted(BAD_RECORDS))
async def test_a_poison_row_never_stops_the_embedded_fold(
    tmp_path: Path, rng: random.Random, bad: str
) -> None:
    path = tmp_path / "onward.db"
    scene = poisoned_partition(rng, partition=SHARED, partitions=PARTITIONS)
    async with (
        SqliteEventLog(path, partitions=PARTITIONS) as log,
        SqliteFrontierStore(path) as store,
    ):
        checkpointer = Checkpointer(store, log)
        offset = await write(log, checkpointer, scene, bad)
        assert checkpointer.projection.stats.quarantined == 1
        assert checkpointer.projection.stats.quarantine_skipped > 0

        expected, _ = await tolerant_direct_fold(log, scene.other_ids)
        loaded = await store.load(scene.other_ids)
        assert {r: row.frontier for r, row in loaded.items()} == expected
        row = await store.get(scene.a)
        assert row is not None
        assert row.quarantined is not None
        assert f"offset {offset}" in row.quarantined

    code, out, err = await onward(path, "quarantine", "list", "--json")
    assert code == 0, err
    (listed,) = [json.loads(line) for line in out.splitlines()]
    assert (listed["run_id"], listed["offset"], listed["state"]) == (scene.a, offset, "held")
    assert REASONS[bad] in listed["reason"]
    assert "hunter2" not in out

    code, out, err = await onward(path, "replay", scene.a, "--tenant", TENANT, "--json")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert len([line for line in lines if not line["unreadable"]]) == scene.a_events(slice(None))
    (hole,) = [line for line in lines if line["unreadable"]]
    assert hole["offset"] == offset
    assert "cannot be read" in err

    code, out, err = await onward(path, "inspect", scene.a, "--tenant", TENANT)
    assert code == 4, (out, err)
    assert len(err.strip().splitlines()) == 1

    code, out, err = await onward(path, "quarantine", "release", scene.a, "--by", "ops", "--json")
    assert code == 0, err
    released = json.loads(out)
    assert (released["run"], released["folded"]) == (scene.a, True)
    assert released["held"].startswith("record at partition ")
    code, out, err = await onward(path, "quarantine", "list", "--json")
    (listed,) = [json.loads(line) for line in out.splitlines()]
    assert listed["state"] == "held"

    code, out, err = await onward(path, "quarantine", "release", "no-such-run", "--by", "ops")
    assert code == 1, (out, err)
