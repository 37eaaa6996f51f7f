"""Events of a run garbage collection removed, folded after it went.

GC deletes a finished run's rows and writes its tombstone; its events stay in the log until
compaction cuts them. A projector that meets some of them later (a late append, a projector
folding from an older offset after compaction cut the run's first events) must not write the
run a row of its own: that row has no start (every event is a gap), is never finished, and no
later collection would ever remove it.
"""

from __future__ import annotations

import time
from pathlib import Path

from support.compaction_world import AGENT, TENANT, Script, World, record_sweeper, world_of
from support.servers import KafkaServers

from onward.projections.frontier_projection import FrontierProjection
from onward.projections.log_projector import LogProjector
from onward.runtime.compaction import CheckpointCompactor
from onward.runtime.gc import GarbageCollector

DAY_S = 86_400.0


async def _collect(world: World, folder: Path) -> tuple[str, ...]:
    async with record_sweeper(world, folder) as records:
        report = await GarbageCollector(records, clock=lambda: time.time() + 40 * DAY_S).run()
    return report.expired


async def test_a_late_event_of_a_collected_run_brings_no_row_back(
    clustered: KafkaServers | None, tmp_path: Path
) -> None:
    async with world_of(clustered, tmp_path) as world:
        await world.finished_run("old", turns=1)
        await world.fold()
        assert await _collect(world, tmp_path) == ("old",)
        # A writer that read the run before it was collected (a tag from a runner with no
        # compaction store, so no pin and no second read; a zombie worker) appends now.
        await world.tag_late("old")
        await world.fold()

        assert await world.frontiers.get("old") is None
        assert await _collect(world, tmp_path) == ()


async def test_a_projector_folding_the_tail_of_a_collected_run_brings_no_row_back(
    clustered: KafkaServers | None, tmp_path: Path
) -> None:
    async with world_of(clustered, tmp_path) as world:
        await world.live_run("old", turns=3, done=1)
        await world.fold()
        compactor = CheckpointCompactor(
            world.log, world.frontiers, world.store, no_archive=True, max_checkpoints=1
        )
        await compactor.compact()  # cuts the run's first events while it is live
        await world.runner(Script(3)).resume(AGENT, "old", tenant=TENANT)
        await world.fold()
        assert await _collect(world, tmp_path) == ("old",)

        # A projector of its own (a new consumer, a rebuild) folds what the log still holds,
        # knowingly from its start: the collected run's last events, its first ones cut.
        fresh = FrontierProjection(
            world.frontiers, world.log, consumer="fresh", compaction=world.store
        )
        await LogProjector(world.log, fresh, from_log_start=True).catch_up()

        row = await world.frontiers.get("old")
        assert row is None
        assert await _collect(world, tmp_path) == ()


async def test_a_collected_run_folded_whole_again_comes_back_finished_and_goes_again(
    clustered: KafkaServers | None, tmp_path: Path
) -> None:
    """A fold from the start of a log still holding the whole run (a rebuild): the run comes
    back as it finished, and the next collection removes it again."""
    async with world_of(clustered, tmp_path) as world:
        await world.finished_run("old", turns=1)
        await world.fold()
        assert await _collect(world, tmp_path) == ("old",)

        fresh = FrontierProjection(
            world.frontiers, world.log, consumer="fresh", compaction=world.store
        )
        await LogProjector(world.log, fresh).catch_up()

        row = await world.frontiers.get("old")
        assert row is not None
        assert row.summary.status == "completed"
        assert await _collect(world, tmp_path) == ("old",)
        assert await world.frontiers.get("old") is None
