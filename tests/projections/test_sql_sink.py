"""`SqlProjectionSink` against PostgreSQL alone (no log): its lifecycle and connection loss."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest
import pytest_asyncio
from support.kinds import KindCounts
from support.pg import fresh_schema

from onward.errors import InvalidInputError
from onward.projections.sql import SqlProjectionSink
from onward.testing.storage import PostgresConnectionLossConformance


class TestSqlProjectionSink(PostgresConnectionLossConformance):
    database_url: str
    stack: AsyncExitStack
    lock_table = "onward_projector_positions"

    @pytest_asyncio.fixture(autouse=True)
    async def _schema(self, database_url: str) -> AsyncIterator[None]:
        self.database_url = database_url
        async with AsyncExitStack() as stack:
            self.stack = stack
            yield

    async def open_connected_store(self) -> tuple[SqlProjectionSink, str]:
        schema = await self.stack.enter_async_context(fresh_schema(self.database_url))
        sink = await SqlProjectionSink.open(self.database_url, KindCounts(), schema=schema)
        return sink, schema

    async def use_store(self, store: SqlProjectionSink) -> None:
        await store.positions()

    async def test_a_started_sink_has_a_build_and_no_positions(self) -> None:
        sink, _ = await self.open_connected_store()
        try:
            assert sink.consumer == "kinds@1"
            assert await sink.positions() == {}
        finally:
            await sink.close()
            await sink.close()

    async def test_a_sink_that_was_never_started_says_so(self) -> None:
        sink = SqlProjectionSink(self.database_url, KindCounts())
        with pytest.raises(InvalidInputError, match="not started"):
            await sink.positions()
