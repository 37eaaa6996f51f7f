"""Compaction with the frontiers in Redis (``ONWARD_FRONTIER_STORE=redis``).

The frontiers projector then stores its positions in Redis, beside its rows, not in
PostgreSQL's ``onward_projector_positions`` where the compaction store reads the other
projectors' positions. A pass must still hold each partition at what the Redis frontiers have
folded, even when a PostgreSQL projector (a user SQL projection) is further on.
"""

from __future__ import annotations

import pytest
from support.compaction_world import AGENT, TENANT, Script, World, conversation
from support.deployment import kafka_settings
from support.kinds import KindCounts
from support.servers import KafkaServers

from onward.eventlog.base import partition_for
from onward.projections.base import DEFAULT_CONSUMER
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.log_projector import LogProjector
from onward.projections.postgres_sql import SqlProjectionSink
from onward.projections.redis import RedisFrontierStore
from onward.runtime.backends import open_backends
from onward.runtime.compaction import CheckpointCompactor, compaction_store

PARTITIONS = 2
LIVE = "long"


@pytest.mark.kafka
async def test_a_pass_holds_each_partition_at_the_redis_frontiers_position(
    kafka_servers: KafkaServers,
) -> None:
    """A live run's partition is half folded into the Redis frontiers, the other partition not
    at all; a user SQL projection in PostgreSQL has folded both whole. The pass (built from the
    settings, as ``onward compact`` builds it) must cut no further than the Redis frontiers'
    position, and nothing of the partition they hold no position in; the run, folded on and
    resumed afterwards, carries on with its whole conversation."""
    async with kafka_servers.log(partitions=PARTITIONS):
        pass  # the events topic: open_backends never creates it
    settings = kafka_settings(kafka_servers, PARTITIONS, frontier_store="redis")
    url, schema = kafka_servers.database_url, kafka_servers.schema
    async with (
        open_backends(settings) as backends,
        compaction_store(backends) as store,
        SqlProjectionSink(url, KindCounts(), schema=schema) as sink,
    ):
        assert isinstance(backends.frontiers, RedisFrontierStore)
        world = World(backends.log, backends.frontiers, store, backends.leases, inline=False)
        mine = partition_for(LIVE, PARTITIONS)
        other = next(
            r for r in (f"other-{n}" for n in range(100)) if partition_for(r, PARTITIONS) != mine
        )
        await world.live_run(LIVE, turns=8, done=5)
        await world.finished_run(other, turns=2)
        expected = await conversation(world.log, LIVE)
        ends = [(await world.log.bounds(p)).end for p in range(PARTITIONS)]

        # The Redis frontiers fold the first half of the live run's partition and nothing of
        # the other one; the user projection folds both.
        frontiers = FrontierProjection(world.frontiers, world.log, compaction=store)
        half = LogProjector(world.log, frontiers, batch_size=ends[mine] // 2)
        assert await half.step([mine])
        await half.flush()
        stored = await world.frontiers.positions(DEFAULT_CONSUMER)
        folded = stored[mine]
        assert 0 < folded < ends[mine]
        assert 1 - mine not in stored
        await LogProjector(world.log, sink).catch_up()
        assert await sink.positions() == dict(enumerate(ends))

        report = await CheckpointCompactor(settings=settings, no_archive=True).compact()

        cut_to = [p.watermark for p in report.partitions]
        assert cut_to[mine] <= folded, (
            f"partition {mine} cut to {cut_to[mine]}, past the Redis frontiers' position "
            f"{folded}; report {report.partitions[mine]}"
        )
        assert cut_to[1 - mine] == 0, (
            f"partition {1 - mine} cut to {cut_to[1 - mine]} though the Redis frontiers hold no "
            f"position there; report {report.partitions[1 - mine]}"
        )
        assert report.partitions[mine].cut  # what the Redis frontiers folded is cut
        # The Redis frontiers fold on from where they stopped; the run carries on, no hole.
        await world.fold()
        provider = Script(8)
        result = await world.runner(provider).resume(AGENT, LIVE, tenant=TENANT)
        assert result.status == "completed"
        assert provider.calls[0] == expected
