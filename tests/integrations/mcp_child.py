"""Runs one charging run on an MCP tool and kills itself with SIGKILL once the tool returned.

Usage: PYTHONPATH=tests python -m integrations.mcp_child CONFIG_JSON
CONFIG: {"db": path, "tmp": dir, "run_id": ..., "redis_url": ..., "prefix": ...}
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from support.crash_world import CRASHED_LEASE

from integrations.mcp_world import TENANT, charging_agent, charging_provider, stdio_server
from onward.eventlog import Event, SqliteEventLog
from onward.integrations.mcp import MCPToolset, SchemaCache
from onward.runtime.runner import AgentRunner


class KillAfterTool:
    async def appended(self, events: Sequence[Event]) -> None:
        return None

    async def tool_returned(self, call_id: str) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    async def before_model_call(self) -> None:
        return None


async def main(config: dict[str, str]) -> None:
    server = stdio_server(Path(config["tmp"]))
    async with (
        SqliteEventLog(config["db"]) as log,
        SchemaCache.from_url(config["redis_url"], prefix=config["prefix"]) as cache,
        MCPToolset([server], run_id=config["run_id"], cache=cache) as toolset,
        AgentRunner(
            provider=charging_provider(),
            log=log,
            worker="child",
            observer=KillAfterTool(),
            lease_policy=CRASHED_LEASE,
        ) as runner,
    ):
        await runner.run(
            charging_agent(toolset.tools), "go", tenant=TENANT, run_id=config["run_id"]
        )


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
