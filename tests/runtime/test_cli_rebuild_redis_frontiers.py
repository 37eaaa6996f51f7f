"""`onward projections rebuild frontiers` with the frontiers in Redis.

With ``ONWARD_FRONTIER_STORE=redis`` the frontiers are one set of keys, with no builds (README:
rebuilds "no"), which the projector, `onward runs` and every runner read. A rebuild would fold
the log into a PostgreSQL build nothing reads, say it is active, and leave its positions in
PostgreSQL, where compaction takes them for a projector's and never cuts past them: it is
refused, and nothing is written.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from support.histories import append_all, workload
from support.servers import KafkaServers
from typer.testing import CliRunner

from onward.projections.compaction import PostgresCompactionStore
from onward.projections.postgres import PostgresFrontierStore
from onward.runtime.cli import app

pytestmark = pytest.mark.kafka
PARTITIONS = 2


async def test_a_frontiers_rebuild_is_refused_and_writes_nothing(
    kafka_servers: KafkaServers, rng: random.Random
) -> None:
    async with kafka_servers.log(partitions=PARTITIONS) as log:
        await append_all(log, workload(rng, 4))
    env = {**kafka_servers.env(partitions=PARTITIONS), "ONWARD_FRONTIER_STORE": "redis"}
    result = await asyncio.to_thread(
        CliRunner().invoke, app, ["projections", "rebuild", "frontiers"], env=env
    )
    assert result.exit_code == 2, result.output
    assert "ONWARD_FRONTIER_STORE=redis" in result.stderr
    url, schema = kafka_servers.database_url, kafka_servers.schema
    async with PostgresFrontierStore(url, schema=schema) as frontiers:
        assert frontiers.build == 1
    async with PostgresCompactionStore(url, schema=schema) as compaction:
        # The first build (the migration's) and no position stored, by it or another build.
        assert await compaction.positions() == {"frontiers@1": {}}
