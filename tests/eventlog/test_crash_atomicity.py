"""SIGKILL in the middle of an atomic append leaves the whole batch or none of it.

A child process appends 800 KB batches of 40 events back to back and prints each run id once
its append returned. It is killed at a random moment, several times. Afterwards every run in the
log has all 40 events or none, and every run the child saw acknowledged is there whole.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections import defaultdict
from pathlib import Path

import pytest
from support.processes import spawn_support

from onward.eventlog import KafkaEventLog, SqliteEventLog
from onward.eventlog.base import EventLog

KILLS = 6
EVENTS_PER_BATCH = 40


async def _run_and_kill(argv: list[str], rng: random.Random) -> list[str]:
    """Start the child, let it acknowledge at least one batch, SIGKILL it; return acked runs."""
    child = await spawn_support("append_child", *argv, stdout=asyncio.subprocess.PIPE)
    assert child.stdout is not None
    first = (await asyncio.wait_for(child.stdout.readline(), 60)).decode().strip()
    if not first:
        await child.wait()
        pytest.fail(f"the appending child exited ({child.returncode}) before its first append")
    acknowledged = [first]
    await asyncio.sleep(rng.uniform(0.0, 0.3))
    os.kill(child.pid, signal.SIGKILL)
    rest, _ = await child.communicate()
    acknowledged += rest.decode().split()
    assert child.returncode == -signal.SIGKILL
    return [a for a in acknowledged if a]


async def _check_all_or_nothing(log: EventLog, acknowledged: list[str]) -> None:
    by_run: dict[str, list[int]] = defaultdict(list)
    for partition in range(log.partitions):
        bounds = await log.bounds(partition)
        for stored in await log.read_partition(partition, bounds.start):
            by_run[stored.event.run_id].append(stored.event.seq)
    partial = {r: len(s) for r, s in by_run.items() if s != list(range(1, EVENTS_PER_BATCH + 1))}
    assert partial == {}, f"runs with part of their batch: {partial}"
    missing = set(acknowledged) - set(by_run)
    assert missing == set(), f"acknowledged appends lost: {sorted(missing)}"
    assert len(by_run) >= len(acknowledged)


async def test_sqlite_batch_is_all_or_nothing_under_sigkill(
    tmp_path: Path, rng: random.Random
) -> None:
    path = tmp_path / "events.db"
    acknowledged: list[str] = []
    for kill in range(KILLS):
        acknowledged += await _run_and_kill(["sqlite", str(path), f"kill{kill}"], rng)
    async with SqliteEventLog(path, partitions=4) as log:
        await _check_all_or_nothing(log, acknowledged)


@pytest.mark.kafka
async def test_kafka_batch_is_all_or_nothing_under_sigkill(
    kafka_bootstrap: str, kafka_topic: str, rng: random.Random
) -> None:
    acknowledged: list[str] = []
    for kill in range(KILLS):
        acknowledged += await _run_and_kill(
            ["kafka", kafka_bootstrap, kafka_topic, f"k{kill}"], rng
        )
    async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=4) as log:
        await _check_all_or_nothing(log, acknowledged)
