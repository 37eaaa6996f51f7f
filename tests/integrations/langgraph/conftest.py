"""The embedded world most saver tests write threads to."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from .worlds import World, sqlite_world


@pytest_asyncio.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    """Log, leases and frontier rows in one fresh SQLite file."""
    async with sqlite_world(tmp_path / "onward.db") as opened:
        yield opened
