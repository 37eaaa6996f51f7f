"""What the pydantic-ai tests in one process share: an embedded SQLite file's stores and a ledger
of the side effects their tools make."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support.stores import Stores, sqlite_stores

from onward.runtime.demo_ledger import Ledger


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[Stores]:
    async with sqlite_stores(tmp_path / "onward.db") as opened:
        yield opened


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.jsonl")
