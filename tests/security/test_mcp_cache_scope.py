"""The MCP schema cache is scoped by tenant and run, and its endpoint covers env and headers:
a listing planted by one tenant, or under another token, is never another run's warm start."""

from __future__ import annotations

from pathlib import Path

import pytest
from integrations.mcp_world import listings, stdio_server
from redis.asyncio import Redis

from onward.integrations.mcp import HttpServer, MCPToolset, SchemaCache, StdioServer
from onward.runtime.gc.redis import RedisKeySweeper

pytestmark = pytest.mark.timeout(60)


async def test_a_listing_planted_by_another_tenant_is_not_read(
    tmp_path: Path, mcp_schema_cache: SchemaCache
) -> None:
    """security review #21: tenant evil opens a toolset under acme's run id with a server of
    other tools; acme's run lists its own server instead of using the planted listing."""
    planted = stdio_server(tmp_path / "evil", variant="v2")
    (tmp_path / "evil").mkdir()
    async with MCPToolset([planted], run_id="r1", tenant="evil", cache=mcp_schema_cache) as evil:
        assert "refund" in {t.name for t in evil.tools}
    server = stdio_server(tmp_path)
    async with MCPToolset([server], run_id="r1", tenant="acme", cache=mcp_schema_cache) as acme:
        assert acme.warm == ()
        assert "refund" not in {t.name for t in acme.tools}
    assert listings(tmp_path) == 1
    async with MCPToolset([server], run_id="r1", tenant="acme", cache=mcp_schema_cache) as resumed:
        assert resumed.warm == ("ledger",)  # its own listing still makes its resume warm
    assert listings(tmp_path) == 1
    still_planted = await mcp_schema_cache.load("r1", tenant="evil")
    assert "refund" in {t["name"] for t in still_planted["ledger"].tools}
    own = await mcp_schema_cache.load("r1", tenant="acme")
    assert "refund" not in {t["name"] for t in own["ledger"].tools}


async def test_another_env_token_is_another_endpoint_and_is_not_stored(
    tmp_path: Path, mcp_schema_cache: SchemaCache
) -> None:
    """security review #21: the same command with another token in its env is another
    endpoint (listed again, not served the first token's listing), and no token is stored."""
    base = stdio_server(tmp_path)
    first = StdioServer(
        name="ledger",
        command=base.command,
        args=base.args,
        env={**(base.env or {}), "LEDGER_TOKEN": "tenant-a-SECRET-token"},
    )
    second = StdioServer(
        name="ledger",
        command=base.command,
        args=base.args,
        env={**(base.env or {}), "LEDGER_TOKEN": "tenant-b-SECRET-token"},
    )
    async with MCPToolset([first], run_id="r1", cache=mcp_schema_cache):
        pass
    async with MCPToolset([second], run_id="r1", cache=mcp_schema_cache) as other:
        assert other.warm == ()
    assert listings(tmp_path) == 2
    raw = await mcp_schema_cache.client.hgetall(mcp_schema_cache.key("r1"))
    stored = repr(sorted(raw.items()))
    assert "SECRET" not in stored


def test_another_authorization_header_is_another_endpoint() -> None:
    """security review #21: the same URL with another tenant's Authorization header is another
    endpoint (header names compared case-folded), and the digest holds no header value."""
    url = "https://tools.example/mcp"
    a = HttpServer(name="web", url=url, headers={"Authorization": "Bearer tenant-a"})
    b = HttpServer(name="web", url=url, headers={"Authorization": "Bearer tenant-b"})
    a_again = HttpServer(name="web", url=url, headers={"authorization": "Bearer tenant-a"})
    assert a.endpoint != b.endpoint
    assert a.endpoint == a_again.endpoint
    assert "tenant" not in a.endpoint


async def test_gc_removes_every_tenants_listing_of_a_finished_run(
    tmp_path: Path, mcp_schema_cache: SchemaCache, redis_url: str, redis_prefix: str
) -> None:
    """security review #21: the entries stay where GC's key sweeper looks for them, and its
    sweep removes every tenant's listing of the run."""
    async with MCPToolset(
        [stdio_server(tmp_path)], run_id="r1", tenant="acme", cache=mcp_schema_cache
    ):
        pass
    async with MCPToolset(
        [stdio_server(tmp_path)], run_id="r1", tenant="evil", cache=mcp_schema_cache
    ):
        pass
    async with RedisKeySweeper(
        redis_url, prefix=f"{redis_prefix}gc:", schema_prefix=mcp_schema_cache.prefix
    ) as sweeper:
        assert (await sweeper.sweep(["r1"], delete=True))["schema_cache"] == 1
    client = Redis.from_url(redis_url)
    try:
        assert not await client.exists(mcp_schema_cache.key("r1"))
    finally:
        await client.aclose()
    assert await mcp_schema_cache.load("r1", tenant="acme") == {}
