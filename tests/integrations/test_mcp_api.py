"""The MCP integration's documented constants. The names `onward.integrations.mcp` exports are
pinned with the rest of the public API (``tests/fixtures/public_api.json``)."""

from __future__ import annotations

import onward.integrations.mcp as mcp_tools


def test_mcp_constants() -> None:
    assert mcp_tools.IDEMPOTENCY_META_KEY == "onward/idempotency-key"
    assert mcp_tools.FENCE_META_KEY == "onward/fence"
    assert mcp_tools.LEASE_EXPIRY_META_KEY == "onward/lease-expires-at"
    assert mcp_tools.DEFAULT_PREFIX == "onward:mcp:schema:"
