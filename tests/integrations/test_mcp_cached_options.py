"""A resume whose cached listing predates a tool its options now name (the server was upgraded
and the declaration with it while the run was down) lists the server again, rather than
refusing the options of a tool the server has: the cached listing is what is out of date."""

from __future__ import annotations

from pathlib import Path

import pytest

from integrations.mcp_world import TENANT, listings, stdio_server, switch
from onward.errors import ConfigurationError
from onward.integrations.mcp import MCPToolset, SchemaCache, ToolOptions

pytestmark = pytest.mark.timeout(60)


async def test_options_naming_a_tool_the_cached_listing_lacks_list_again(
    tmp_path: Path, mcp_schema_cache: SchemaCache
) -> None:
    async with MCPToolset(
        [stdio_server(tmp_path)], run_id="r1", tenant=TENANT, cache=mcp_schema_cache
    ):
        pass
    switch(tmp_path, "v2")  # adds `refund`
    upgraded = stdio_server(tmp_path, tools={"refund": ToolOptions(requires_approval=True)})
    async with MCPToolset(
        [upgraded], run_id="r1", tenant=TENANT, cache=mcp_schema_cache
    ) as resumed:
        assert resumed.warm == ()
        refund = next(t for t in resumed.tools if t.name == "refund")
        assert refund.requires_approval
    assert listings(tmp_path) == 2
    assert "refund" in {
        t["name"] for t in (await mcp_schema_cache.load("r1", tenant=TENANT))["ledger"].tools
    }


async def test_options_naming_a_tool_the_server_lacks_are_still_refused_after_listing(
    tmp_path: Path, mcp_schema_cache: SchemaCache
) -> None:
    async with MCPToolset(
        [stdio_server(tmp_path)], run_id="r1", tenant=TENANT, cache=mcp_schema_cache
    ):
        pass
    wrong = stdio_server(tmp_path, tools={"nothing": ToolOptions()})
    with pytest.raises(ConfigurationError, match=r"'ledger' has no tools \['nothing'\]"):
        await MCPToolset.open([wrong], run_id="r1", tenant=TENANT, cache=mcp_schema_cache)
    assert listings(tmp_path) == 2
