"""`/readyz` of an `onward projector` says it is not ready until it is in its consumer group.

Before its first assignment a projector has no partition, so no lag: ready by the lag alone,
though it has folded nothing. A rolling deploy that waits for readiness would then take the old
projectors down while the new one is still joining. Real Kafka.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from aiokafka import TopicPartition

from onward.errors import LogTruncatedError
from onward.eventlog import KafkaEventLog
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.kafka import KafkaProjector
from onward.projections.memory import MemoryFrontierStore
from onward.runtime.cli._health import ProjectorHealth
from onward.runtime.observability.server import PROBE_WITHIN_S
from onward.testing.eventlog import new_run_id, step_events

pytestmark = pytest.mark.kafka


async def test_a_projector_is_ready_only_once_in_its_consumer_group(
    kafka_bootstrap: str, kafka_topic: str
) -> None:
    async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=2) as log:
        await log.append(step_events(new_run_id(), 3))
        projector: KafkaProjector[Any] = KafkaProjector(
            kafka_bootstrap,
            FrontierProjection(MemoryFrontierStore(), log),
            topic=kafka_topic,
            partitions=2,
            group_id=f"g-{uuid.uuid4().hex[:8]}",
        )
        await projector.start()
        try:
            health = ProjectorHealth(projector, max_lag=1_000, store="memory")
            assert await health.ready() == (
                "not in the projectors' consumer group yet (or rebalancing)"
            )
            for _ in range(100):
                await projector.step(timeout_ms=200)
                if projector.joined:
                    break
            assert await health.ready() is None
        finally:
            await projector.close()


async def test_a_projector_whose_unfolded_records_were_deleted_is_not_ready_and_says_so(
    kafka_bootstrap: str, kafka_topic: str
) -> None:
    """Retention moved a partition's start past where the projector reads (its turn came late,
    or it was far behind): it cannot fold on. Readiness says so, and not that it is ready by a
    lag under the bound; the fold fails saying what to do, not with the client's error."""
    async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=1) as log:
        await log.append(step_events(new_run_id(), 3))
        projector: KafkaProjector[Any] = KafkaProjector(
            kafka_bootstrap,
            FrontierProjection(MemoryFrontierStore(), log),
            topic=kafka_topic,
            partitions=1,
            group_id=f"g-{uuid.uuid4().hex[:8]}",
        )
        await projector.start()
        try:
            health = ProjectorHealth(projector, max_lag=1_000, store="memory")
            for _ in range(100):
                await projector.step(timeout_ms=200)
                if projector.joined and await projector.projection.positions() == {0: 3}:
                    break
                await projector.flush()
            assert await health.ready() is None
            # Not fetched meanwhile, as a partition waiting for its turn is not.
            partition = TopicPartition(kafka_topic, 0)
            projector._live().pause(partition)
            await asyncio.sleep(1.0)  # a fetch under way when it paused ends
            await log.append(step_events(new_run_id(), 3))
            await log.truncate_before(0, 6)
            why = await health.ready()
            assert why is not None
            assert "below the partition's start 6" in why, why
            projector._live().resume(partition)
            with pytest.raises(LogTruncatedError, match="Rebuild the projection"):
                await _fold_on(projector)
            why = await health.ready()
            assert why is not None
            assert "below the partition's start 6" in why, why
            assert "unreachable" not in why
        finally:
            await projector.close()


async def _fold_on(projector: KafkaProjector[Any]) -> None:
    for _ in range(20):
        await projector.step(timeout_ms=200)


async def test_a_projector_whose_store_answers_slowly_but_in_time_is_ready(
    kafka_bootstrap: str, kafka_topic: str
) -> None:
    """A store answering each read within the probe's bound: readiness read its positions
    again under Kafka's probe, twice, and said Kafka did not answer (Kafka had)."""
    async with KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=1) as log:
        await log.append(step_events(new_run_id(), 3))
        projection = FrontierProjection(MemoryFrontierStore(), log)
        projector: KafkaProjector[Any] = KafkaProjector(
            kafka_bootstrap,
            projection,
            topic=kafka_topic,
            partitions=1,
            group_id=f"g-{uuid.uuid4().hex[:8]}",
        )
        await projector.start()
        try:
            health = ProjectorHealth(projector, max_lag=1_000, store="memory")
            for _ in range(100):
                await projector.step(timeout_ms=200)
                if projector.joined and await projection.positions() == {0: 3}:
                    break
                await projector.flush()
            assert await health.ready() is None
            positions = projection.positions

            async def slow_positions() -> dict[int, int]:
                await asyncio.sleep(PROBE_WITHIN_S * 0.6)
                return await positions()

            projection.positions = slow_positions  # type: ignore[method-assign]
            assert await health.ready() is None
            assert health.lag == {0: 0}
        finally:
            await projector.close()
