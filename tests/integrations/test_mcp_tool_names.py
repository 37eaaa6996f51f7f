"""A server whose listing Onward cannot take (a tool name it cannot store, a name listed
twice) is refused naming the server and the name, so a user with several servers knows which
one to fix."""

from __future__ import annotations

import json
import sys

import pytest

from integrations.mcp_world import TESTS
from onward.errors import ConfigurationError
from onward.integrations.mcp import MCPToolset, StdioServer

pytestmark = pytest.mark.timeout(60)


def _listing(name: str, *extra: str) -> StdioServer:
    return StdioServer(
        name=name,
        command=sys.executable,
        args=("-m", "integrations.mcp_strict_server"),
        env={"PYTHONPATH": str(TESTS), "MCP_STRICT_EXTRA_TOOLS": json.dumps(extra)},
        prefix=f"{name}_",
    )


@pytest.mark.parametrize("bad", ["two\nlines", "nul\x00"])
async def test_a_tool_name_onward_cannot_store_names_its_server(bad: str) -> None:
    servers = [_listing("fine"), _listing("broken", bad)]
    with pytest.raises(ConfigurationError) as raised:
        await MCPToolset.open(servers, connect_timeout=10)
    message = str(raised.value)
    assert "MCP server 'broken'" in message
    assert repr(bad) in message


async def test_a_tool_listed_twice_by_one_server_is_said_so() -> None:
    with pytest.raises(ConfigurationError) as raised:
        await MCPToolset.open([_listing("broken", "note")], connect_timeout=10)
    message = str(raised.value)
    assert "MCP server 'broken' lists tool 'note' twice" in message
    assert "prefix" not in message
