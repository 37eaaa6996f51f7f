"""`/readyz` of an `onward projector` says it is not ready until it is in its consumer group.

Before its first assignment a projector has no partition, so no lag: ready by the lag alone,
though it has folded nothing. A rolling deploy that waits for readiness would then take the old
projectors down while the new one is still joining. Real Kafka.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from onward.eventlog import KafkaEventLog
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.kafka import KafkaProjector
from onward.projections.memory import MemoryFrontierStore
from onward.runtime.cli._health import ProjectorHealth
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
