"""`SqlProjectionSink` against PostgreSQL alone (no log): its lifecycle and connection loss."""

from __future__ import annotations

import pytest
from support.kinds import KindCounts
from support.pg import fresh_schema

from onward.errors import InvalidInputError
from onward.projections.postgres_sql import SqlProjectionSink
from onward.testing.storage import PostgresConnectionLossConformance


class TestSqlProjectionSink(PostgresConnectionLossConformance):
    lock_table = "onward_projector_positions"

    async def open_connected_store(self, database_url: str, schema: str) -> SqlProjectionSink:
        return await SqlProjectionSink.open(database_url, KindCounts(), schema=schema)

    async def use_store(self, store: SqlProjectionSink) -> None:
        await store.positions()


async def test_a_started_sink_has_a_build_and_no_positions(database_url: str) -> None:
    async with fresh_schema(database_url) as schema:
        sink = await SqlProjectionSink.open(database_url, KindCounts(), schema=schema)
        try:
            assert sink.consumer == "kinds@1"
            assert await sink.positions() == {}
        finally:
            await sink.close()
            await sink.close()


async def test_a_sink_that_was_never_started_says_so(database_url: str) -> None:
    sink = SqlProjectionSink(database_url, KindCounts())
    with pytest.raises(InvalidInputError, match="not started"):
        await sink.positions()
