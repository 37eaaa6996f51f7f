"""A server that answers the handshake but never its ``tools/list`` is a named error within the
toolset's ``connect_timeout``, at open and when a call lists it again: never a wait without end
(a worker's slot, and the run's lease renewed in the background, held for good)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from integrations.mcp_world import stdio_server, switch
from onward.errors import BackendUnavailableError
from onward.integrations.mcp import MCPToolset, SchemaCache

pytestmark = pytest.mark.timeout(60)

BOUND_S = 20.0
"""Far longer than the toolsets' ``connect_timeout`` here; a test waiting this long failed."""


@pytest.fixture
async def cache(redis_url: str, redis_prefix: str) -> AsyncIterator[SchemaCache]:
    async with SchemaCache.from_url(redis_url, prefix=f"{redis_prefix}mcp:schema:") as schemas:
        yield schemas


async def test_a_server_that_never_lists_its_tools_is_a_named_timeout(tmp_path: Path) -> None:
    toolset = MCPToolset([stdio_server(tmp_path, variant="mute-list")], connect_timeout=2)
    with pytest.raises(BackendUnavailableError, match=r"'ledger'.*listing tools"):
        await asyncio.wait_for(toolset.start(), BOUND_S)
    assert not toolset.connections["ledger"].is_open  # the server was stopped


async def test_a_call_that_lists_a_server_again_is_bounded(
    tmp_path: Path, cache: SchemaCache
) -> None:
    """A warm toolset lists the server again before a call when a new session reports another
    version; a server that then never answers fails the call, naming it."""
    async with MCPToolset([stdio_server(tmp_path)], run_id="r1", cache=cache):
        pass
    switch(tmp_path, "mute-list")
    async with MCPToolset(
        [stdio_server(tmp_path)], run_id="r1", cache=cache, connect_timeout=2
    ) as resumed:
        assert resumed.warm == ("ledger",)
        echo = next(t for t in resumed.tools if t.name == "echo")
        with pytest.raises(BackendUnavailableError, match=r"'ledger'.*listing tools"):
            await asyncio.wait_for(echo.call({"text": "x"}, idempotency_key="k"), BOUND_S)
