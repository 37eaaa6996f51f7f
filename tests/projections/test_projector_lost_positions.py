"""A Kafka projector whose store holds no position for a partition compaction has cut.

Compaction cuts a partition only below every live projector's stored position, so a store
with no position there while the partition no longer starts at 0 has lost its positions (Redis
restarted without persistence) or is not the store compaction read. Folding from the
partition's start would then fold runs from the middle of their history, their first events
gone, and store frontiers that are not theirs: the projector refuses instead, as it refuses a
stored position below the start.
"""

from __future__ import annotations

import uuid

import pytest
from support.redis import delete_prefix

from onward.errors import LogTruncatedError
from onward.eventlog import KafkaEventLog
from onward.projections.base import DEFAULT_CONSUMER
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.kafka import KafkaProjector
from onward.projections.log_projector import LogProjector
from onward.projections.redis import RedisFrontierStore
from onward.testing.eventlog import new_run_id, step_events

pytestmark = pytest.mark.kafka


async def fold_a_while(projector: KafkaProjector[FrontierProjection]) -> None:
    """Step the projector as long as a fold of the whole partition takes, and more."""
    for _ in range(50):
        await projector.step(timeout_ms=200)


async def test_a_projector_refuses_a_cut_partition_its_redis_store_lost_the_position_of(
    kafka_bootstrap: str, kafka_topic: str, redis_url: str, redis_prefix: str
) -> None:
    run_id = new_run_id()
    async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=1) as log:
        await log.append(step_events(run_id, 8))
        async with RedisFrontierStore(redis_url, prefix=redis_prefix) as first:
            await LogProjector(log, FrontierProjection(first, log)).catch_up()
            assert await first.positions(DEFAULT_CONSUMER) == {0: (await log.bounds(0)).end}
        # Compaction cuts below the stored position (the run's first events are gone from the
        # log); Redis restarts without its keys, and so does the projector.
        await log.truncate_before(0, 3)
        await delete_prefix(redis_url, redis_prefix)
        async with RedisFrontierStore(redis_url, prefix=redis_prefix) as store:
            projector = KafkaProjector(
                kafka_bootstrap,
                FrontierProjection(store, log),
                topic=kafka_topic,
                partitions=1,
                group_id=f"g-{uuid.uuid4().hex[:8]}",
            )
            await projector.start()
            try:
                with pytest.raises(LogTruncatedError) as refused:
                    await fold_a_while(projector)
            finally:
                await projector.close()
            stored = await store.get(run_id)
            assert stored is None, (
                f"a frontier folded from the middle of the run was stored: {stored}"
            )
            assert await store.positions(DEFAULT_CONSUMER) == {}
        assert (refused.value.partition, refused.value.start) == (0, 3)
        assert "no position" in str(refused.value)


async def test_a_log_projector_refuses_it_too(
    kafka_bootstrap: str, kafka_topic: str, redis_url: str, redis_prefix: str
) -> None:
    """The catch-up fold reading the topic itself refuses as the consumer-group one does."""
    run_id = new_run_id()
    async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=1) as log:
        await log.append(step_events(run_id, 8))
        await log.truncate_before(0, 3)
        async with RedisFrontierStore(redis_url, prefix=redis_prefix) as store:
            with pytest.raises(LogTruncatedError) as refused:
                await LogProjector(log, FrontierProjection(store, log)).catch_up()
            assert await store.get(run_id) is None
            assert await store.positions(DEFAULT_CONSUMER) == {}
    assert (refused.value.partition, refused.value.start) == (0, 3)
    assert "no position" in str(refused.value)
