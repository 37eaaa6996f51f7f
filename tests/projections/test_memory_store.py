from __future__ import annotations

from onward.projections.base import FrontierStore
from onward.projections.memory import MemoryFrontierStore
from onward.testing import FrontierStoreConformance


class TestMemoryFrontierStore(FrontierStoreConformance):
    async def open_store(self) -> FrontierStore:
        return MemoryFrontierStore()
