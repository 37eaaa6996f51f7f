"""A tag given on a run the app's own worker is driving is written, even when the app closes
before the run's lease is free.

`RunMessage.tag` on a run being driven returns at once; the tag is written "once its lease is
free" (README, the application API). In process the app's worker keeps it until then, and
closing the app lets the run reach its next boundary and hand its lease back: the tag must be
written then, not dropped with the worker. Runs on the embedded SQLite file, memory,
PostgreSQL, and Kafka + PostgreSQL + Redis.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import pytest_asyncio
from support.appapi import GatedModel, agents
from support.deployment import kafka_settings
from support.servers import KafkaServers

import onward
from onward.eventlog import Tagged
from onward.runtime.settings import Settings

PARTITIONS = 3


@pytest.fixture(
    params=["sqlite", "memory", "postgres", pytest.param("kafka", marks=pytest.mark.kafka)]
)
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    if request.param == "kafka":
        return kafka_settings(request.getfixturevalue("kafka_servers"), PARTITIONS)
    if request.param == "postgres":
        return Settings(
            backend="postgres",
            database_url=request.getfixturevalue("database_url"),
            database_schema=request.getfixturevalue("pg_schema"),
        )
    return Settings(backend=request.param, sqlite_path=tmp_path / "onward.db")


@pytest_asyncio.fixture
async def deployed(settings: Settings, request: pytest.FixtureRequest) -> Settings:
    """The settings, with the events topic made as a deployment makes it on Kafka."""
    if settings.backend == "kafka":
        servers: KafkaServers = request.getfixturevalue("kafka_servers")
        async with servers.log(partitions=PARTITIONS):
            pass
    return settings


async def test_a_tag_on_a_run_being_driven_is_written_when_the_app_closes(
    deployed: Settings,
) -> None:
    settings = deployed
    model = GatedModel()
    app = onward.open(settings, agents=agents, provider=model)
    async with app:
        stream = app.query("work", {"agent": "stepper", "run_id": "tagged-at-close"})
        async for message in stream:
            if message.is_checkpoint and message.boundary == "after_tool_result":
                break
        await asyncio.wait_for(model.asked.wait(), 30)  # the run is held, in its second turn
        await message.tag("first turn")
        memory_log = app.backends.log  # the memory stores live only as long as these objects
        closing = asyncio.create_task(app.close())
        await asyncio.sleep(0.2)
        model.gate.set()  # the turn in flight ends; the run stops at its boundary
        await asyncio.wait_for(closing, 30)
    if settings.backend == "memory":
        events = [s.event for s in await memory_log.read_run(stream.run_id)]
    else:
        async with onward.open(settings, agents=agents, provider=GatedModel()) as again:
            events = [s.event for s in await again.backends.log.read_run(stream.run_id)]
    tags = [(e.target_seq, e.label) for e in events if isinstance(e, Tagged)]
    assert tags == [(message.seq, "first turn")]
