"""The MCP servers, agent and ledger shared by the MCP tests, their child process and the bench."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from onward.eventlog import ToolCall
from onward.integrations.mcp import StdioServer, ToolOptions
from onward.runtime.agent import Agent
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.tools import Tool

TESTS = Path(__file__).resolve().parents[1]
TENANT = "acme"


def stdio_server(
    tmp: Path,
    *,
    name: str = "ledger",
    variant: str = "v1",
    crash: bool = False,
    prefix: str = "",
    tools: Mapping[str, ToolOptions] | None = None,
    key_argument: str | None = None,
) -> StdioServer:
    """The test server over stdio, counting listings and writing its ledger under ``tmp``."""
    env = {
        "PYTHONPATH": str(TESTS),
        "MCP_TEST_LISTINGS": str(tmp / f"{name}.listings"),
        "MCP_TEST_LEDGER": str(tmp / "ledger.jsonl"),
        "MCP_TEST_META": str(tmp / "meta.jsonl"),
        "MCP_TEST_VARIANT": variant,
        "MCP_TEST_SWITCH": str(tmp / f"{name}.switch"),
    }
    if crash:
        env["MCP_TEST_CRASH"] = "1"
    return StdioServer(
        name=name,
        command=sys.executable,
        args=("-m", "integrations.mcp_server"),
        env=env,
        prefix=prefix,
        tools=tools or {},
        key_argument=key_argument,
    )


def switch(tmp: Path, to: Literal["v2", "mute-list", "crash"], *, name: str = "ledger") -> None:
    """Make the server ``name`` under ``tmp`` start as ``to`` from its next session, its
    declaration (and so its cache endpoint) unchanged: an upgrade, or a crash at start."""
    (tmp / f"{name}.switch").write_text(to)


def listings(tmp: Path, name: str = "ledger") -> int:
    """How many ``tools/list`` calls the server named ``name`` answered."""
    path = tmp / f"{name}.listings"
    return len(path.read_text().splitlines()) if path.exists() else 0


def ledger(tmp: Path) -> list[dict[str, Any]]:
    """The side effects of ``charge``, one per call that reached the server."""
    path = tmp / "ledger.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def metas(tmp: Path) -> list[dict[str, Any]]:
    """The ``_meta`` of each ``charge`` call the server received, in order."""
    path = tmp / "meta.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def charging_agent(tools: Sequence[Tool]) -> Agent:
    return Agent(name="biller", instructions="charge the account", tools=tools)


def charging_provider() -> ScriptedProvider:
    return ScriptedProvider(
        [
            reply(
                "charging",
                ToolCall(call_id="c1", tool="charge", args={"account": "a1", "cents": 500}),
            ),
            reply("charged"),
        ]
    )
