"""What an MCP tool is sent as arguments, against a strict server (one that refuses arguments
its input schema does not declare): the key goes as ``key_argument`` only to the tools that
declare that argument, and an argument of the server's own named like a keyword Onward passes
(``idempotency_key``) is the model's, like any other."""

from __future__ import annotations

import json
import sys

import pytest

from integrations.mcp_world import TESTS
from onward.integrations.mcp import MCPToolset, StdioServer
from onward.runtime.tools import Tool

pytestmark = pytest.mark.timeout(60)


def _strict(key_argument: str | None = None) -> StdioServer:
    return StdioServer(
        name="strict",
        command=sys.executable,
        args=("-m", "integrations.mcp_strict_server"),
        env={"PYTHONPATH": str(TESTS)},
        key_argument=key_argument,
    )


def _tool(toolset: MCPToolset, name: str) -> Tool:
    return next(t for t in toolset.tools if t.name == name)


async def test_the_key_argument_goes_only_to_the_tools_that_declare_it() -> None:
    async with MCPToolset([_strict(key_argument="request_key")]) as toolset:
        keyed, note = _tool(toolset, "keyed"), _tool(toolset, "note")
        assert "request_key" not in keyed.parameters["properties"]
        sent = await keyed.call({"text": "t"}, idempotency_key="k1")
        assert json.loads(sent) == {"request_key": "k1", "text": "t"}
        sent = await note.call({"text": "n"}, idempotency_key="k2")
        assert json.loads(sent) == {"text": "n"}


async def test_an_argument_named_idempotency_key_stays_the_models() -> None:
    async with MCPToolset([_strict()]) as toolset:
        stamp = _tool(toolset, "stamp")
        assert "idempotency_key" in stamp.parameters["properties"]
        sent = await stamp.call({"text": "t", "idempotency_key": "mine"}, idempotency_key="k3")
        assert json.loads(sent) == {"idempotency_key": "mine", "text": "t"}
