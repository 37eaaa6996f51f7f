"""The names `onward.integrations.mcp` exports are its public API; a test pins them."""

from __future__ import annotations

import onward.integrations.mcp as mcp_tools


def test_mcp_exports() -> None:
    assert sorted(mcp_tools.__all__) == [
        "DEFAULT_PREFIX",
        "HttpServer",
        "IDEMPOTENCY_META_KEY",
        "MCPSettings",
        "MCPToolError",
        "MCPToolset",
        "SchemaCache",
        "ServerConfig",
        "ServerSchema",
        "StdioServer",
        "ToolOptions",
        "forget_schemas",
        "load_mcp_settings",
        "schema_digest",
    ]
    for name in mcp_tools.__all__:
        assert hasattr(mcp_tools, name), name
    assert mcp_tools.IDEMPOTENCY_META_KEY == "onward/idempotency-key"
    assert mcp_tools.DEFAULT_PREFIX == "onward:mcp:schema:"
