"""A compaction pass killed with SIGKILL loses nothing, and a rerun finishes its job.

The pass runs in a child process that stops at a step of a cut and is killed there: once the
archive holds a range and nothing is cut yet (``archived``), and once the first partition is
cut and the second not (``cut``). On SQLite and on Kafka + PostgreSQL + Redis, with two
partitions holding finished runs and a live one. Afterwards the log is whole or cut only below
what the archive holds; a rerun in this process cuts the rest, the archive then holds every
record cut exactly once, and archive plus log folds to the frontiers and ``tool_calls`` rows of
before.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
from support.compaction_world import (
    World,
    kafka_stores,
    log_sizes,
    partition,
    refolded,
    rows,
    sqlite_world,
)
from support.processes import reaped, spawn_support
from support.servers import KafkaServers

from onward.eventlog.archive import DirectoryArchive
from onward.eventlog.archived import ArchivedEventLog
from onward.runtime.compaction import CheckpointCompactor

PARTITIONS = 2
MAX_CHECKPOINTS = 2


async def _write(world: World) -> list[str]:
    """Finished runs in both partitions and a live one; returns every run id."""
    names = [f"run-{n}" for n in range(12)]
    by_partition = {p: [r for r in names if partition(world.log, r) == p] for p in (0, 1)}
    finished = [*by_partition[0][:2], *by_partition[1][:2]]
    for run_id in finished:
        await world.finished_run(run_id, turns=2)
    live = by_partition[0][2]
    await world.live_run(live, turns=8, done=6)
    await world.fold()
    return [*finished, live]


async def _killed_then_rerun(
    open_world: AbstractAsyncContextManager[World], config: dict[str, object], archive: Path
) -> None:
    async with open_world as world:
        runs = await _write(world)
        before = await rows(world.frontiers, runs)
        sizes = await log_sizes(world.log)
        async with reaped() as children:
            child = await spawn_support(
                "compaction_child", json.dumps(config), stdout=asyncio.subprocess.PIPE
            )
            children.append(child)
            assert child.stdout is not None
            line = (await asyncio.wait_for(child.stdout.readline(), 60)).decode()
            assert line.startswith(f"paused at {config['pause_at']}"), line
            child.send_signal(signal.SIGKILL)
            assert await child.wait() == -signal.SIGKILL

        archived = DirectoryArchive(archive)
        ranges = await archived.ranges()
        assert ranges, "the archive holds the range before anything is cut"
        for (start, end), (was_start, was_end) in zip(
            await log_sizes(world.log), sizes, strict=True
        ):
            assert end == was_end
            # Cut, if at all, only below what the archive holds.
            assert start == was_start or any(
                r.start <= was_start and r.end >= start for r in ranges
            )

        report = await CheckpointCompactor(
            world.log,
            world.frontiers,
            world.store,
            archive=archived,
            max_checkpoints=MAX_CHECKPOINTS,
        ).compact()
        after = await log_sizes(world.log)
        assert all(now[0] > was[0] for now, was in zip(after, sizes, strict=True))
        cut = sum(now[0] - was[0] for now, was in zip(after, sizes, strict=True))
        assert all(p.watermark == now[0] for p, now in zip(report.partitions, after, strict=True))
        final = await archived.ranges()
        assert sum(r.events for r in final) == cut
        for p in range(PARTITIONS):
            spans = sorted((r.start, r.end) for r in final if r.partition == p)
            assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), spans  # no gap
        assert await refolded(ArchivedEventLog(world.log, archived), runs) == before


def _config(archive: Path, pause_at: str, **where: object) -> dict[str, object]:
    """What the child opens (``where``: the deployment) and where it stops."""
    return {
        **where,
        "partitions": PARTITIONS,
        "archive": str(archive),
        "pause_at": pause_at,
        "max_checkpoints": MAX_CHECKPOINTS,
    }


@pytest.mark.parametrize("pause_at", ["archived", "cut"])
async def test_sqlite_compaction_killed_loses_nothing(tmp_path: Path, pause_at: str) -> None:
    archive = tmp_path / "archive"
    config = _config(archive, pause_at, kind="sqlite", folder=str(tmp_path))
    await _killed_then_rerun(sqlite_world(tmp_path, partitions=PARTITIONS), config, archive)


@pytest.mark.kafka
@pytest.mark.parametrize("pause_at", ["archived", "cut"])
async def test_kafka_compaction_killed_loses_nothing(
    tmp_path: Path, kafka_servers: KafkaServers, pause_at: str
) -> None:
    archive = tmp_path / "archive"
    config = _config(archive, pause_at, kind="kafka", servers=list(kafka_servers))
    world = kafka_stores(kafka_servers, partitions=PARTITIONS)
    await _killed_then_rerun(world, config, archive)
