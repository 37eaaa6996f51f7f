"""Runs whose views share one session per server (`MCPToolset.for_run`, as `onward worker`
binds them) each check their own listing: a session reporting another server version, or a
``notifications/tools/list_changed``, replaces every run's cached listing whose tools differ,
not only the listing of the run that happened to open the session or make the next call."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from integrations.mcp_world import TENANT, stdio_server, switch
from onward.integrations.mcp import MCPToolset, SchemaCache

pytestmark = pytest.mark.timeout(60)


async def test_a_warm_run_on_a_session_another_run_opened_checks_the_version(
    tmp_path: Path, mcp_schema_cache: SchemaCache
) -> None:
    """The server was upgraded while the worker was down; after the restart another run opened
    the shared session. A resumed run's first call still sees its cached listing is for the
    old version, and replaces it, so its next resume is refused as another revision."""
    toolset = MCPToolset([stdio_server(tmp_path)], cache=mcp_schema_cache)
    try:
        async with toolset.for_run("r1", tenant=TENANT):
            pass
        await toolset.close()  # the worker stops
        switch(tmp_path, "v2")
        async with (
            toolset.for_run("r2", tenant=TENANT) as other,
            toolset.for_run("r1", tenant=TENANT) as resumed,
        ):
            assert (other.warm, resumed.warm) == ((), ("ledger",))
            echo = next(t for t in resumed.tools if t.name == "echo")
            await echo.call({"text": "x"}, idempotency_key="k")
            assert resumed.replaced == ["ledger"]
        cached = (await mcp_schema_cache.load("r1", tenant=TENANT))["ledger"]
        assert cached.server_version == "test-v2"
        assert "refund" in {t["name"] for t in cached.tools}
        assert toolset.connections["ledger"].sessions == 2
    finally:
        await toolset.close()


async def test_a_tools_changed_notification_reaches_every_run(
    tmp_path: Path, mcp_schema_cache: SchemaCache
) -> None:
    toolset = MCPToolset([stdio_server(tmp_path)], cache=mcp_schema_cache)
    try:
        async with (
            toolset.for_run("r1", tenant=TENANT) as first,
            toolset.for_run("r2", tenant=TENANT) as second,
        ):
            connection = toolset.connections["ledger"]
            grow = next(t for t in first.tools if t.name == "grow")
            await grow.call({}, idempotency_key="k1")
            for _ in range(100):
                if connection.list_changes:
                    break
                await asyncio.sleep(0.01)
            for view in (second, first):
                echo = next(t for t in view.tools if t.name == "echo")
                await echo.call({"text": "x"}, idempotency_key="k2")
                assert view.replaced == ["ledger"]
        for run_id in ("r1", "r2"):
            cached = (await mcp_schema_cache.load(run_id, tenant=TENANT))["ledger"]
            assert "extra" in {t["name"] for t in cached.tools}, run_id
    finally:
        await toolset.close()
