"""Tools from MCP servers, with their schemas cached in Redis for warm restart.

Needs the ``mcp`` package: ``pip install 'onward[mcp]'``.

    servers = [StdioServer(name="files", command="files-mcp", tools={"rm": ToolOptions(
        requires_approval=True)})]
    async with SchemaCache.from_url(redis_url) as cache, MCPToolset(
        servers, run_id=run_id, tenant="acme", cache=cache
    ) as toolset:
        agent = Agent("ops", "...", tools=toolset.tools)
        await runner.run(agent, "tidy up", tenant="acme", run_id=run_id)
"""

from __future__ import annotations

try:
    import mcp as _mcp  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "onward.integrations.mcp needs the mcp package: pip install 'onward[mcp]'"
    ) from exc

from .cache import (
    DEFAULT_PREFIX,
    MCPSettings,
    SchemaCache,
    ServerSchema,
    forget_schemas,
    load_mcp_settings,
    schema_digest,
)
from .servers import (
    FENCE_META_KEY,
    IDEMPOTENCY_META_KEY,
    LEASE_EXPIRY_META_KEY,
    HttpServer,
    ServerConfig,
    StdioServer,
    ToolOptions,
)
from .toolset import MCPToolError, MCPToolset

__all__ = [
    "DEFAULT_PREFIX",
    "FENCE_META_KEY",
    "IDEMPOTENCY_META_KEY",
    "LEASE_EXPIRY_META_KEY",
    "HttpServer",
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
