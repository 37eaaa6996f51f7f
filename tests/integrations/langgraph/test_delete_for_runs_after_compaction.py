"""`adelete_for_runs` finds a thread whose events compaction cut out of the log.

Compaction keeps every event of a LangGraph thread (they are read from its first one) and cuts
the partition past it: the thread lives on in the compaction store's retained copies. Removing
a LangGraph run's checkpoints must find it there too, or its checkpoints silently stay.
Embedded SQLite and Kafka + PostgreSQL + Redis.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)
from support.compaction_world import TENANT, World, world_of
from support.servers import KafkaServers

from onward.errors import ConfigurationError
from onward.eventlog.archive import DirectoryArchive
from onward.integrations.langgraph import OnwardSaver
from onward.runtime.compaction import CheckpointCompactor


@pytest_asyncio.fixture
async def world(clustered: KafkaServers | None, tmp_path: Path) -> AsyncIterator[World]:
    async with world_of(clustered, tmp_path) as opened:
        yield opened


def saver_of(world: World, *, tenant: str = TENANT) -> OnwardSaver:
    return OnwardSaver(
        world.log,
        world.leases,
        tenant=tenant,
        frontiers=world.frontiers,
        checkpoint_inline=world.inline,
        compaction=world.store,
    )


async def test_a_compacted_thread_loses_the_checkpoints_of_a_deleted_run(
    world: World, tmp_path: Path
) -> None:
    async with saver_of(world) as saver:
        config = generate_config("thread")
        for run_id in ("run-gone", "run-gone", "run-kept"):
            metadata = generate_metadata(run_id=run_id)
            config = await saver.aput(config, generate_checkpoint(), metadata, {})
    # Other traffic after the thread, so the cut goes past all of it.
    async with saver_of(world, tenant="other") as other:
        for n in range(30):
            await other.aput(generate_config(f"other-{n}"), generate_checkpoint(), {}, {})
    await world.fold()
    compactor = CheckpointCompactor(
        world.log, world.frontiers, world.store, archive=DirectoryArchive(tmp_path / "archive")
    )
    report = await compactor.compact()
    assert report.partitions[0].cut
    assert (await world.store.truncations(["thread"]))["thread"].whole

    # Without frontier rows nothing names the threads only compaction's copies hold: refused.
    blind = OnwardSaver(world.log, world.leases, tenant=TENANT, compaction=world.store)
    async with blind:
        with pytest.raises(ConfigurationError, match="frontier rows"):
            await blind.adelete_for_runs(["run-gone"])

    async with saver_of(world) as saver:
        await saver.adelete_for_runs(["run-gone"])
        left = [t.metadata.get("run_id") async for t in saver.alist(generate_config("thread"))]
    assert left == ["run-kept"]
