"""A Kafka log and its PostgreSQL frontier store, and the `onward projector` processes a test
starts against them (each writing to a log file of its own in the test's directory)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest_asyncio

from onward.eventlog import KafkaEventLog
from onward.projections.postgres import PostgresFrontierStore


@dataclass
class ProjectorWorld:
    bootstrap: str
    database_url: str
    topic: str
    schema: str
    log: KafkaEventLog
    store: PostgresFrontierStore
    tmp: Path
    children: list[asyncio.subprocess.Process] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        """The environment that points `onward` at this log and schema."""
        return {
            **os.environ,
            "ONWARD_BACKEND": "kafka",
            "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
            "DATABASE_URL": self.database_url,
            "ONWARD_DATABASE_SCHEMA": self.schema,
            "ONWARD_KAFKA_TOPIC": self.topic,
            "ONWARD_PARTITIONS": str(self.log.partitions),
        }

    async def start_projector(self, name: str, *options: str) -> asyncio.subprocess.Process:
        """``python -m onward projector *options``, its output in ``<name>.log``."""
        argv = ["-m", "onward", "projector", *options]
        with (self.tmp / f"{name}.log").open("wb") as out:
            child = await asyncio.create_subprocess_exec(
                sys.executable, *argv, env=self.env(), stdout=out, stderr=out
            )
        self.children.append(child)
        return child

    def output(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")


WorldT = TypeVar("WorldT", bound=ProjectorWorld)


def world_fixture(kind: type[WorldT], partitions: int) -> Any:
    """A ``world`` fixture: a ``kind`` on the test's own topic (of ``partitions``) and schema;
    the processes it started are killed after the test."""

    @pytest_asyncio.fixture(name="world")
    async def world(
        kafka_bootstrap: str, kafka_topic: str, database_url: str, pg_schema: str, tmp_path: Path
    ) -> AsyncIterator[WorldT]:
        async with (
            KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=partitions) as log,
            PostgresFrontierStore(database_url, schema=pg_schema) as store,
        ):
            made = kind(kafka_bootstrap, database_url, kafka_topic, pg_schema, log, store, tmp_path)
            try:
                yield made
            finally:
                for child in made.children:
                    if child.returncode is None:
                        child.kill()
                        await child.wait()

    return world
