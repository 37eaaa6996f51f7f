"""A projector registered in PostgreSQL that has stored no position yet holds the log.

A user SQL projection has its build as soon as it starts, but stores its first position only
with its first batch: one joining a deployment, or one whose first batch failed (a bug in its
SQL) and is fixed later. Until then it has read nothing, and starts from each partition's
start: a pass that cut meanwhile would take records it never folded, silently.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.compaction_world import kafka_stores
from support.kinds import KindCounts
from support.servers import KafkaServers

from onward.eventlog.archive import DirectoryArchive
from onward.projections.log_projector import LogProjector
from onward.projections.postgres_sql import SqlProjectionSink
from onward.runtime.compaction import CheckpointCompactor


@pytest.mark.kafka
async def test_a_user_projection_that_stored_no_position_holds_the_log(
    kafka_servers: KafkaServers, tmp_path: Path
) -> None:
    async with (
        kafka_stores(kafka_servers) as world,
        SqlProjectionSink(
            kafka_servers.database_url, KindCounts(), schema=kafka_servers.schema
        ) as sink,
    ):
        for n in range(5):
            await world.finished_run(f"done-{n}", turns=2)
        await world.fold()
        assert await sink.positions() == {}
        written = (await world.log.bounds(0)).end

        report = await CheckpointCompactor(
            world.log, world.frontiers, world.store, archive=DirectoryArchive(tmp_path / "a")
        ).compact()

        (part,) = report.partitions
        assert not part.cut, part
        assert part.held_by == "the projectors' positions"
        # The projection then folds every event, none cut before it read it.
        await LogProjector(world.log, sink).catch_up()
        async with sink._connection("counting") as conn:
            folded = await conn.fetchval(f"SELECT sum(events) FROM {sink.table}")
        assert folded == written
