"""LangGraph's own conformance suite (`langgraph-checkpoint-conformance`) against `OnwardSaver`.

Every base capability and every optional one the saver implements must pass, on embedded SQLite
and on Kafka + PostgreSQL + Redis.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import (
    BASE_CAPABILITIES,
    Capability,
    DetectedCapabilities,
)
from langgraph.checkpoint.conformance.report import CapabilityReport
from support.servers import KafkaServers

from .worlds import World, kafka_world, sqlite_world

# What OnwardSaver implements beyond the base: every extended capability. The test fails if this
# drifts from the class.
IMPLEMENTED = {c.value for c in BASE_CAPABILITIES} | {
    Capability.COPY_THREAD.value,
    Capability.DELETE_FOR_RUNS.value,
    Capability.PRUNE.value,
}


async def _validate(world: World) -> CapabilityReport:
    @checkpointer_test(name=f"OnwardSaver-{type(world.log).__name__}")
    async def onward_saver() -> AsyncIterator[BaseCheckpointSaver[str]]:
        async with world.saver() as saver:
            yield saver

    return await validate(onward_saver)


def _check(report: CapabilityReport) -> None:
    failures = {
        name: result.failures
        for name, result in report.results.items()
        if result.detected and result.passed is not True
    }
    assert failures == {}
    detected = {name for name, result in report.results.items() if result.detected}
    assert detected == IMPLEMENTED
    assert report.passed_all_base()
    assert all(report.results[name].tests_passed > 0 for name in IMPLEMENTED)


def test_detected_capabilities_are_the_implemented_ones(tmp_path: Path) -> None:
    from onward.integrations.langgraph import OnwardSaver  # noqa: PLC0415

    detected = DetectedCapabilities.from_instance(
        OnwardSaver.__new__(OnwardSaver)  # capability detection looks at the class only
    )
    assert {c.value for c in detected.detected} == IMPLEMENTED


async def test_conformance_on_sqlite(tmp_path: Path) -> None:
    async with sqlite_world(tmp_path / "onward.db") as world:
        _check(await _validate(world))


@pytest.mark.kafka
@pytest.mark.parametrize("leases", ["redis", "postgres"])
async def test_conformance_on_kafka_and_postgres(kafka_servers: KafkaServers, leases: str) -> None:
    async with kafka_world(*kafka_servers, postgres_leases=leases == "postgres") as world:
        _check(await _validate(world))
