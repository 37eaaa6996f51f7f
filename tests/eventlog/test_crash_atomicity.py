"""SIGKILL in the middle of an atomic append leaves the whole batch or none of it.

A child process appends 800 KB batches of 40 events back to back, saying on stdout as each
append starts and once it returned. The test kills it as it reads that an append started, several
times. From the child's last line it knows which kills landed inside an append; if none did, the
test proves nothing and fails. Afterwards every run in the log has all 40 events or none, and
every run the child saw acknowledged is there whole.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.append_child import APPENDED, APPENDING
from support.processes import kill_running, spawn_support

from onward.eventlog import KafkaEventLog, PostgresEventLog, SqliteEventLog
from onward.eventlog.base import EventLog

KILLS = 6
EVENTS_PER_BATCH = 40


@dataclass
class Killed:
    acknowledged: list[str]
    inside: str | None
    """The run whose append the kill interrupted (the child's last line began it), if any."""


async def _run_and_kill(argv: list[str], rng: random.Random) -> Killed:
    """Start the child; once it acknowledged an append, SIGKILL it as it says it begins another
    (the first, second or third after that, chosen by ``rng``)."""
    child = await spawn_support("append_child", *argv, stdout=asyncio.subprocess.PIPE)
    assert child.stdout is not None
    seen: list[list[str]] = []
    starts_to_let_by = rng.randint(0, 2)
    try:
        while True:
            line = (await asyncio.wait_for(child.stdout.readline(), 60)).decode().split()
            if not line:
                await child.wait()
                pytest.fail(f"the appending child exited ({child.returncode}) early: {seen[-3:]}")
            seen.append(line)
            if line[0] != APPENDING or not any(s[0] == APPENDED for s in seen):
                continue
            if starts_to_let_by == 0:
                break
            starts_to_let_by -= 1
    except BaseException:
        await kill_running([child])  # it would append on after the test
        raise
    os.kill(child.pid, signal.SIGKILL)
    rest, _ = await child.communicate()
    seen += [line.split() for line in rest.decode().splitlines() if line.strip()]
    assert child.returncode == -signal.SIGKILL
    last = seen[-1]
    return Killed(
        acknowledged=[run for said, run in seen if said == APPENDED],
        inside=last[1] if last[0] == APPENDING else None,
    )


async def _check_all_or_nothing(log: EventLog, kills: list[Killed]) -> None:
    by_run: dict[str, list[int]] = defaultdict(list)
    for partition in range(log.partitions):
        bounds = await log.bounds(partition)
        for stored in await log.read_partition(partition, bounds.start):
            by_run[stored.event.run_id].append(stored.event.seq)
    partial = {r: len(s) for r, s in by_run.items() if s != list(range(1, EVENTS_PER_BATCH + 1))}
    assert partial == {}, f"runs with part of their batch: {partial}"
    acknowledged = {run for kill in kills for run in kill.acknowledged}
    missing = acknowledged - set(by_run)
    assert missing == set(), f"acknowledged appends lost: {sorted(missing)}"
    inside = [kill.inside for kill in kills if kill.inside is not None]
    assert inside, f"none of the {len(kills)} kills landed inside an append: nothing was tested"


async def test_sqlite_batch_is_all_or_nothing_under_sigkill(
    tmp_path: Path, rng: random.Random
) -> None:
    path = tmp_path / "events.db"
    kills = [await _run_and_kill(["sqlite", str(path), f"kill{k}"], rng) for k in range(KILLS)]
    async with SqliteEventLog(path, partitions=4) as log:
        await _check_all_or_nothing(log, kills)


@pytest.mark.kafka
async def test_kafka_batch_is_all_or_nothing_under_sigkill(
    kafka_bootstrap: str, kafka_topic: str, rng: random.Random
) -> None:
    kills = [
        await _run_and_kill(["kafka", kafka_bootstrap, kafka_topic, f"k{k}"], rng)
        for k in range(KILLS)
    ]
    async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=4) as log:
        await _check_all_or_nothing(log, kills)


async def test_postgres_batch_is_all_or_nothing_under_sigkill(
    database_url: str, pg_schema: str, rng: random.Random
) -> None:
    kills = [
        await _run_and_kill(["postgres", database_url, pg_schema, f"k{k}"], rng)
        for k in range(KILLS)
    ]
    async with PostgresEventLog(database_url, schema=pg_schema, partitions=4) as log:
        await _check_all_or_nothing(log, kills)
