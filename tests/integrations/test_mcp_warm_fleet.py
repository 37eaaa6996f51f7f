"""Warm restart by default: `onward worker` and `onward.open` bind an agent's MCP toolsets to
each run (run id, tenant, the schema cache of the settings), so with ``REDIS_URL`` set a
resume after a crash builds its tools from the cache and lists no server."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from support.processes import reaped

from integrations.mcp_world import TENANT, TESTS, ledger, listings, stdio_server
from onward.errors import ConfigurationError
from onward.eventlog import MemoryEventLog
from onward.integrations.mcp import MCPToolset
from onward.runtime.agent import Agent
from onward.runtime.backends import open_backends
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.runner import AgentRunner
from onward.runtime.settings import Settings
from onward.runtime.toolsets import agent_for_run, close_toolsets

pytestmark = pytest.mark.timeout(120)


def _settings(**values: Any) -> Settings:
    return Settings.model_validate({"ONWARD_BACKEND": "memory", **values})


async def _bind_twice(toolset: MCPToolset, settings: Settings) -> list[str]:
    """Bind an agent with ``toolset`` to one run twice (a start, then a resume); the revision
    each binding gets."""
    agent = Agent(name="biller", instructions="charge", toolsets=[toolset])
    revisions = []
    try:
        for _ in range(2):
            async with agent_for_run(agent, "r1", tenant=TENANT, settings=settings) as bound:
                assert bound.tool("charge") is not None
                assert bound.toolsets == ()
                revisions.append(bound.revision)
    finally:
        await close_toolsets([agent])
    return revisions


async def test_with_redis_a_second_binding_of_a_run_lists_nothing(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    toolset = MCPToolset([stdio_server(tmp_path)])
    settings = _settings(REDIS_URL=redis_url, MCP_SCHEMA_CACHE_PREFIX=f"{redis_prefix}mcp:")
    first, second = await _bind_twice(toolset, settings)
    assert first == second
    assert listings(tmp_path) == 1
    assert toolset.connections["ledger"].sessions == 1  # the runs' views share one session


@pytest.mark.parametrize("values", [{}, {"MCP_SCHEMA_CACHE_ENABLED": "false"}])
async def test_without_warm_restart_every_binding_lists(
    values: dict[str, str],
    tmp_path: Path,
    redis_url: str,
    redis_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)  # settings also read the environment
    monkeypatch.delenv("MCP_SCHEMA_CACHE_ENABLED", raising=False)
    if values:  # Redis is there, but warm restart is turned off
        values |= {"REDIS_URL": redis_url, "MCP_SCHEMA_CACHE_PREFIX": f"{redis_prefix}mcp:"}
    first, second = await _bind_twice(MCPToolset([stdio_server(tmp_path)]), _settings(**values))
    assert first == second
    assert listings(tmp_path) == 2


def test_a_toolset_declared_at_import_serves_one_event_loop_after_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As with `onward.query_sync`, each call its own ``asyncio.run``: runs that wait on one
    another for the shared session in one loop leave nothing bound to it for the next."""
    monkeypatch.delenv("REDIS_URL", raising=False)
    agent = Agent(name="adder", instructions="add", toolsets=[MCPToolset([stdio_server(tmp_path)])])

    async def run(n: int) -> Any:
        async with agent_for_run(agent, f"r{n}", tenant=TENANT, settings=_settings()) as bound:
            add = bound.tool("add")
            assert add is not None
            return await add.call({"a": n, "b": 1}, idempotency_key=f"k{n}")

    async def runs() -> list[Any]:
        try:
            return await asyncio.gather(*(run(n) for n in range(3)))
        finally:
            await close_toolsets([agent])

    for _ in range(2):
        assert asyncio.run(runs()) == [{"sum": 1}, {"sum": 2}, {"sum": 3}]


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_toolset_declared_at_import_serves_a_second_event_loop_without_a_close_between(
    cached: bool,
    tmp_path: Path,
    redis_url: str,
    redis_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A script binding runs in one ``asyncio.run``, then in another, closing the toolsets
    only at the end: the second loop's runs get a new session (and schema cache), not an
    error about the first loop, which is gone."""
    monkeypatch.delenv("REDIS_URL", raising=False)
    values = {"REDIS_URL": redis_url, "MCP_SCHEMA_CACHE_PREFIX": f"{redis_prefix}mcp:"}
    settings = _settings(**(values if cached else {}))
    agent = Agent(name="adder", instructions="add", toolsets=[MCPToolset([stdio_server(tmp_path)])])

    async def run(n: int) -> Any:
        async with agent_for_run(agent, f"r{n}", tenant=TENANT, settings=settings) as bound:
            add = bound.tool("add")
            assert add is not None
            return await add.call({"a": n, "b": 1}, idempotency_key=f"k{n}")

    async def runs() -> list[Any]:
        return await asyncio.gather(*(run(n) for n in range(3)))

    try:
        for _ in range(2):
            assert asyncio.run(runs()) == [{"sum": 1}, {"sum": 2}, {"sum": 3}]
    finally:
        asyncio.run(close_toolsets([agent]))
        # The first loop's Redis connections, which nothing closed before it ended, cannot be
        # closed from another loop: collected here, their warnings are this test's.
        gc.collect()


async def test_a_runner_refuses_an_agent_whose_toolsets_are_not_bound(tmp_path: Path) -> None:
    agent = Agent(name="biller", instructions="charge", toolsets=[MCPToolset([])])
    async with AgentRunner(provider=ScriptedProvider([reply("hi")]), log=MemoryEventLog()) as r:
        with pytest.raises(ConfigurationError, match="toolsets"):
            await r.run(agent, "go", tenant=TENANT)


# -- across processes killed mid-run ---------------------------------------------------------------


def _env(tmp_path: Path, redis_url: str, redis_prefix: str, **more: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(TESTS),
        "ONWARD_BACKEND": "sqlite",
        "ONWARD_SQLITE_PATH": str(tmp_path / "runs.db"),
        "ONWARD_PARTITIONS": "4",
        "REDIS_URL": redis_url,
        "MCP_SCHEMA_CACHE_PREFIX": f"{redis_prefix}mcp:",
        "MCP_FLEET_TMP": str(tmp_path),
        **more,
    }


async def _worker(
    env: dict[str, str], name: str, children: list[asyncio.subprocess.Process]
) -> asyncio.subprocess.Process:
    """An `onward worker` of ``integrations.mcp_fleet``'s agent, once it says it is ready;
    put in ``children`` before it is waited for, so a worker that never says so is killed."""
    argv = ["-m", "onward", "worker", "--agent", "integrations.mcp_fleet:agent"]
    argv += ["--provider", "integrations.mcp_fleet:provider", "--name", name]
    argv += ["--lease-ttl", "2", "--recheck", "0.3", "--backoff", "0.1"]
    worker = await asyncio.create_subprocess_exec(
        sys.executable, *argv, env=env, stderr=asyncio.subprocess.PIPE
    )
    children.append(worker)
    assert worker.stderr is not None
    first = await asyncio.wait_for(worker.stderr.readline(), 60)
    assert b"ready" in first, first
    return worker


async def _status(env: dict[str, str], run_id: str) -> str | None:
    names = ("ONWARD_BACKEND", "ONWARD_SQLITE_PATH", "ONWARD_PARTITIONS")
    settings = Settings.model_validate({name: env[name] for name in names})
    async with open_backends(settings) as backends:
        row = await backends.frontiers.get(run_id)
    return row.summary.status if row is not None else None


async def test_a_run_killed_twice_is_resumed_without_listing_the_server(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    """``onward.open`` starts a run and dies after its first charge; an `onward worker`
    carries it on and dies after the second; another finishes it. The server was listed once,
    at the start: neither worker's resume asked it for its tools."""
    async with reaped() as children:
        starter = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "integrations.mcp_fleet",
            "r1",
            env=_env(tmp_path, redis_url, redis_prefix, MCP_FLEET_KILL_AT="1"),
        )
        children.append(starter)
        assert await asyncio.wait_for(starter.wait(), 60) == -signal.SIGKILL
        assert (listings(tmp_path), len(ledger(tmp_path))) == (1, 1)

        killed_at_2 = _env(tmp_path, redis_url, redis_prefix, MCP_FLEET_KILL_AT="2")
        first = await _worker(killed_at_2, "w1", children)
        assert await asyncio.wait_for(first.wait(), 60) == -signal.SIGKILL
        assert (listings(tmp_path), len(ledger(tmp_path))) == (1, 2)

        env = _env(tmp_path, redis_url, redis_prefix)
        second = await _worker(env, "w2", children)
        try:
            status = None
            for _ in range(300):
                status = await _status(env, "r1")
                if status == "completed":
                    break
                await asyncio.sleep(0.1)
        finally:
            second.send_signal(signal.SIGTERM)
            _, said = await asyncio.wait_for(second.communicate(), 30)
    assert second.returncode == 0, said
    assert status == "completed", said
    assert listings(tmp_path) == 1  # no tools/list from either worker's resume
    keys = [entry["key"] for entry in ledger(tmp_path)]
    assert len(keys) == len(set(keys)) == 3  # each charge once
