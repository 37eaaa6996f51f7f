"""A compaction pass and garbage collection of a run the pass planned.

The pass plans a finished run's truncation point (and copies of its tagged events) from its
row; a collection removes the run before the pass writes them. Written anyway, they would
outlive the run for good (nothing lists a run without a row again), and a run given its id
later would start from the collected run's point: its own first events taken as compacted.
"""

from __future__ import annotations

import time
from pathlib import Path

from support.compaction_world import TENANT, record_sweeper, world_of
from support.servers import KafkaServers

from onward.runtime.compaction import CheckpointCompactor
from onward.runtime.gc import GarbageCollector
from onward.runtime.providers import NoModel

DAY_S = 86_400.0


async def test_a_run_collected_while_a_pass_plans_it_keeps_no_compaction_rows(
    clustered: KafkaServers | None, tmp_path: Path
) -> None:
    async with world_of(clustered, tmp_path) as world:
        await world.finished_run("old", turns=2)
        await world.fold()
        await world.runner(NoModel()).tag("old", "keep", tenant=TENANT, seq=1)
        await world.fold()

        async def collect(step: str, partition: int) -> None:
            if step == "planned":
                async with record_sweeper(world, tmp_path) as records:
                    gc = GarbageCollector(records, clock=lambda: time.time() + 40 * DAY_S)
                    assert (await gc.run()).expired == ("old",)

        compactor = CheckpointCompactor(
            world.log, world.frontiers, world.store, no_archive=True, pause=collect
        )
        report = await compactor.compact()
        assert report.partitions[0].cut
        assert await world.store.truncations(["old"]) == {}
        assert await world.store.retained("old") == []
