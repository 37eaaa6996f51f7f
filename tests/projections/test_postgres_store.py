from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest_asyncio
from support.pg import fresh_schema

from onward.projections.base import FrontierStore
from onward.projections.postgres import PostgresFrontierStore
from onward.testing import FrontierStoreConformance


class TestPostgresFrontierStore(FrontierStoreConformance):
    database_url: str
    stack: AsyncExitStack

    @pytest_asyncio.fixture(autouse=True)
    async def _schema(self, database_url: str) -> AsyncIterator[None]:
        self.database_url = database_url
        async with AsyncExitStack() as stack:
            self.stack = stack
            yield

    async def open_store(self) -> FrontierStore:
        schema = await self.stack.enter_async_context(fresh_schema(self.database_url))
        return await PostgresFrontierStore.open(self.database_url, schema=schema)
