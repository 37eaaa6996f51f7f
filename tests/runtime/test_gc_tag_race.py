"""Garbage collection and a tag written to the same run at the same moment.

A person tags an old finished run: the tag is pinned, then its `Tagged` event appended; the
run's frontier row says nothing of it until a projector folds that event. A collection in
between must not take the run for one untouched since it finished: it would delete the row
and the pin, and the fold would then find the run gone, lose the tag, and leave a row of a run
with no start that no later collection removes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from support.compaction_world import TENANT, Script, World, record_sweeper, world_of
from support.servers import KafkaServers

from onward.errors import NothingToResumeError
from onward.runtime import AgentRunner
from onward.runtime.gc import GarbageCollector

DAY_S = 86_400.0


async def test_a_run_tagged_but_not_folded_yet_is_not_collected(
    clustered: KafkaServers | None, tmp_path: Path
) -> None:
    async with world_of(clustered, tmp_path) as world:
        await world.finished_run("old", turns=1)
        await world.fold()
        # Tagged by a process that leaves folding to the projector (a person's `onward tag`).
        tagger = AgentRunner(
            provider=Script(0),
            log=world.log,
            frontiers=world.frontiers,
            leases=world.leases,
            checkpoint_inline=False,
            compaction=world.store,
        )
        tagged = await tagger.tag("old", "keep", tenant=TENANT, seq=1)

        async with record_sweeper(world, tmp_path) as records:
            report = await GarbageCollector(records, clock=lambda: time.time() + 40 * DAY_S).run()
        await world.fold()

        assert "old" not in report.expired
        row = await world.frontiers.get("old")
        assert row is not None
        assert row.frontier is not None
        assert row.frontier.status == "completed"
        assert [t.seq for t in row.frontier.tags] == [tagged]
        assert await world.store.pins(["old"]) == {"old": {tagged}}

        # Once the tag is folded, the run ages from it like any other and goes in time.
        async with record_sweeper(world, tmp_path) as records:
            later = await GarbageCollector(records, clock=lambda: time.time() + 40 * DAY_S).run()
        assert later.expired == ("old",)
        assert await world.frontiers.get("old") is None


class CollectedFirst:
    """The world's compaction store, with a collection run just before the tag's pin: it
    removes the run after the tagger read it."""

    def __init__(self, world: World, folder: Path) -> None:
        self.world, self.folder = world, folder

    def __getattr__(self, name: str) -> Any:
        return getattr(self.world.store, name)

    async def pin(self, run_id: str, tenant: str, seq: int) -> None:
        async with record_sweeper(self.world, self.folder) as records:
            report = await GarbageCollector(records, clock=lambda: time.time() + 40 * DAY_S).run()
        assert report.expired == (run_id,)
        await self.world.store.pin(run_id, tenant, seq)


async def test_a_tag_of_a_run_collected_after_it_was_read_is_refused(
    clustered: KafkaServers | None, tmp_path: Path
) -> None:
    async with world_of(clustered, tmp_path) as world:
        await world.finished_run("old", turns=1)
        await world.fold()
        written = len(await world.log.read_run("old"))
        tagger = AgentRunner(
            provider=Script(0),
            log=world.log,
            frontiers=world.frontiers,
            leases=world.leases,
            checkpoint_inline=False,
            compaction=CollectedFirst(world, tmp_path),
        )
        with pytest.raises(NothingToResumeError):
            await tagger.tag("old", "keep", tenant=TENANT, seq=1)
        assert len(await world.log.read_run("old")) == written  # no Tagged event landed


async def test_a_run_tagged_and_folded_between_the_plan_and_the_sweep_is_kept(
    clustered: KafkaServers | None, tmp_path: Path
) -> None:
    async with world_of(clustered, tmp_path) as world:
        await world.finished_run("old", turns=1)
        await world.fold()
        finished = time.time()
        async with record_sweeper(world, tmp_path) as records:
            # 30 days after now: the run finished before every ttl's cutoff, the tag after.
            collector = GarbageCollector(
                records,
                clock=lambda: finished + 30 * DAY_S,
                checkpoint_ttl_days=30,
                redis_key_ttl_hours=30 * 24,
                task_result_ttl_days=30,
            )
            plan, _ = await collector.plan()
            assert plan.expired == ("old",)
            tagged = await world.runner(Script(0)).tag("old", "keep", tenant=TENANT, seq=1)
            await world.fold()
            await records.sweep(plan, delete=True)

        row = await world.frontiers.get("old")
        assert row is not None, "the run was collected right after it was tagged"
        assert row.frontier is not None
        assert [t.seq for t in row.frontier.tags] == [tagged]
