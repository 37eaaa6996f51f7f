"""An agent that declares an MCP toolset, and its model, for `onward worker` and `onward.open`
in other processes (``--agent integrations.mcp_fleet:agent``).

Every run charges the account ``CHARGES`` times on the test MCP server, one call per turn, then
answers. Environment:
    MCP_FLEET_TMP: the directory of the server's counters and ledger (`mcp_world.stdio_server`).
    MCP_FLEET_KILL_AT: this process SIGKILLs itself at the model call that follows that many
        charges: a worker dying mid-run, between turns.

``python -m integrations.mcp_fleet RUN_ID`` starts one run through ``onward.open`` (settings
from the environment) and follows it, so a test can kill the application mid-run.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import onward
from integrations.mcp_world import TENANT, stdio_server
from onward.eventlog import Message, ToolCall
from onward.integrations.mcp import MCPToolset
from onward.runtime.agent import Agent
from onward.runtime.leases.base import LeasePolicy
from onward.runtime.providers import ModelReply, ScriptedProvider, reply

CHARGES = 3

agent = Agent(
    name="biller",
    instructions="charge the account, once per turn",
    toolsets=[MCPToolset([stdio_server(Path(os.environ.get("MCP_FLEET_TMP", ".")))])],
)


def script(messages: Sequence[Message]) -> ModelReply:
    """One ``charge`` per turn for ``CHARGES`` turns, then the answer; dies where told to."""
    charged = sum(1 for m in messages if m.role == "tool")
    if os.environ.get("MCP_FLEET_KILL_AT") == str(charged):
        os.kill(os.getpid(), signal.SIGKILL)
    if charged >= CHARGES:
        return reply(f"charged {charged} times")
    call = ToolCall(call_id=f"c{charged + 1}", tool="charge", args={"account": "a1", "cents": 100})
    return reply(f"charge {charged + 1}", call)


def provider() -> ScriptedProvider:
    return ScriptedProvider(script)


async def _start(run_id: str) -> None:
    async with onward.open(
        agents=agent, provider=provider(), lease_policy=LeasePolicy(ttl=timedelta(seconds=2))
    ) as app:
        await app.query("go", {"run_id": run_id, "tenant": TENANT}).collect()


if __name__ == "__main__":
    asyncio.run(_start(sys.argv[1]))
