"""Warm restart: a resume's time to its first model call with stdio MCP servers, cache on and off.

Each sample starts a run whose process "dies" just before its first model call (the run's tools
come from ``--servers`` stdio MCP servers, each a Python process), then times a resume from
scratch: open the `MCPToolset` for the run (cache on: the listings come from Redis and no server
is started; cache off: every server is started, shakes hands and lists its tools), build the
agent, and `AgentRunner.resume` up to the model call. The time to the end of the run (one
tool call, whose server a warm resume starts only then) is reported too. The setup run always
lists (it is the run's first start). The servers are the test server of ``tests/integrations``.

    python bench/mcp_warm.py                      # 5 servers, 5 samples per mode
    python bench/mcp_warm.py --servers 5 --samples 3

Needs ``REDIS_URL``; keys go under a prefix of their own and are removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from onward.eventlog import SqliteEventLog, ToolCall
from onward.integrations.mcp import MCPToolset, SchemaCache, StdioServer
from onward.runtime.agent import Agent
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.runner import AgentRunner

ROOT = Path(__file__).resolve().parents[1]
TENANT = "bench"


class Died(BaseException):
    """Stands in for the process dying before its first model call."""


class FirstModelCall:
    """Notes when the model is first called; in the setup run, dies there."""

    def __init__(self, *, die: bool) -> None:
        self.die = die
        self.at: float | None = None

    async def appended(self, events: Any) -> None:
        return None

    async def tool_returned(self, call_id: str) -> None:
        return None

    async def before_model_call(self) -> None:
        if self.at is None:
            self.at = time.perf_counter()
        if self.die:
            raise Died


def servers(count: int, listings: Path) -> list[StdioServer]:
    return [
        StdioServer(
            name=f"s{i}",
            command=sys.executable,
            args=("-m", "integrations.mcp_server"),
            env={
                "PYTHONPATH": str(ROOT / "tests"),
                "MCP_TEST_LISTINGS": str(listings),
                "MCP_TEST_LEDGER": os.devnull,
            },
            prefix=f"s{i}_",
        )
        for i in range(count)
    ]


def provider() -> ScriptedProvider:
    return ScriptedProvider(
        [reply("", ToolCall(call_id="e", tool="s0_echo", args={"text": "x"})), reply("done")]
    )


async def sample(
    log: SqliteEventLog, declared: list[StdioServer], cache: SchemaCache | None, listings: Path
) -> tuple[float, float, int]:
    """One crashed run, then one timed resume.

    Returns:
        Seconds to the first model call, seconds to the end of the run (which calls one tool,
        so with the cache on it pays that server's start), and ``tools/list`` calls made.
    """
    run_id = f"run-{uuid.uuid4().hex}"
    async with (
        MCPToolset(declared, run_id=run_id, cache=cache) as toolset,
        AgentRunner(provider=provider(), log=log, observer=FirstModelCall(die=True)) as runner,
    ):
        agent = Agent(name="bench", instructions="i", tools=toolset.tools)
        with contextlib.suppress(Died):
            await runner.run(agent, "go", tenant=TENANT, run_id=run_id)
    before = _count(listings)
    observer = FirstModelCall(die=False)
    start = time.perf_counter()
    async with (
        MCPToolset(declared, run_id=run_id, cache=cache) as toolset,
        AgentRunner(provider=provider(), log=log, observer=observer) as runner,
    ):
        agent = Agent(name="bench", instructions="i", tools=toolset.tools)
        result = await runner.resume(agent, run_id, tenant=TENANT)
        assert result.status == "completed", result
        ended = time.perf_counter()
    assert observer.at is not None
    return observer.at - start, ended - start, _count(listings) - before


def _count(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--servers", type=int, default=5)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL"))
    parser.add_argument("--json", type=Path, default=ROOT / "bench/results/mcp_warm.json")
    args = parser.parse_args()
    if not args.redis_url:
        parser.error("REDIS_URL is not set")

    prefix = f"onward-bench:{uuid.uuid4().hex}:mcp:schema:"
    results: dict[str, Any] = {"servers": args.servers, "samples": args.samples}
    with tempfile.TemporaryDirectory() as tmp:
        listings = Path(tmp) / "listings"
        declared = servers(args.servers, listings)
        cache = SchemaCache.from_url(args.redis_url, prefix=prefix, ttl=timedelta(hours=1))
        async with SqliteEventLog(Path(tmp) / "log.db") as log, cache:
            try:
                for mode, used in (("cache off", None), ("cache on", cache)):
                    seconds: list[float] = []
                    to_end: list[float] = []
                    listed: list[int] = []
                    for _ in range(args.samples):
                        elapsed, whole, count = await sample(log, declared, used, listings)
                        seconds.append(elapsed)
                        to_end.append(whole)
                        listed.append(count)
                    results[mode] = {
                        "median_ms": statistics.median(seconds) * 1000,
                        "min_ms": min(seconds) * 1000,
                        "max_ms": max(seconds) * 1000,
                        "run_end_median_ms": statistics.median(to_end) * 1000,
                        "tools_list_calls_per_resume": statistics.mean(listed),
                    }
            finally:
                keys = [k async for k in cache.client.scan_iter(match=f"{prefix}*")]
                if keys:
                    await cache.client.delete(*keys)
    results["speedup"] = results["cache off"]["median_ms"] / results["cache on"]["median_ms"]

    table = Table(title=f"resume to first model call, {args.servers} stdio MCP servers")
    columns = (
        "schema cache",
        "median ms",
        "min ms",
        "max ms",
        "tools/list per resume",
        "to run end, median ms",
    )
    for column in columns:
        table.add_column(column, justify="right")
    for mode in ("cache off", "cache on"):
        row = results[mode]
        table.add_row(
            mode,
            f"{row['median_ms']:.1f}",
            f"{row['min_ms']:.1f}",
            f"{row['max_ms']:.1f}",
            f"{row['tools_list_calls_per_resume']:g}",
            f"{row['run_end_median_ms']:.1f}",
        )
    console = Console()
    console.print(table)
    console.print(f"speedup (median, off/on): {results['speedup']:.1f}x")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
