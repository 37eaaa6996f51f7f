"""The MCP settings come from the one settings loader: `Settings` reads and checks
``MCP_SCHEMA_CACHE_*`` with every other variable, and `MCPSettings` is its MCP part."""

from __future__ import annotations

import pytest

from onward.errors import ConfigurationError
from onward.integrations.mcp import MCPSettings, load_mcp_settings
from onward.runtime.settings import Settings, load_settings


def test_the_mcp_part_of_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://onward:secret@cache:6379/0")
    monkeypatch.setenv("MCP_SCHEMA_CACHE_TTL_HOURS", "2")
    monkeypatch.setenv("MCP_SCHEMA_CACHE_PREFIX", "app:")
    settings = load_settings()
    assert (settings.schema_cache_ttl_hours, settings.schema_cache_enabled) == (2, None)
    assert load_mcp_settings() == MCPSettings.of(settings)
    assert MCPSettings.of(settings).schema_cache_prefix == "app:"
    assert "secret" not in repr(MCPSettings.of(settings))


def test_a_bad_mcp_value_stops_every_command_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read in one place, an MCP variable is checked when anything loads the settings."""
    monkeypatch.setenv("MCP_SCHEMA_CACHE_ENABLED", "perhaps")
    with pytest.raises(ConfigurationError) as raised:
        Settings()
    message = str(raised.value)
    assert "MCP_SCHEMA_CACHE_ENABLED (schema_cache_enabled)" in message
    assert "\n" not in message
    with pytest.raises(ConfigurationError, match="MCP_SCHEMA_CACHE_ENABLED"):
        load_mcp_settings()


@pytest.mark.parametrize("hours", ["inf", "1e12"])
def test_a_ttl_no_timedelta_holds_is_refused_at_start(
    monkeypatch: pytest.MonkeyPatch, hours: str
) -> None:
    """Accepted at start, such a TTL failed the first cache built from the settings with a
    bare OverflowError naming no variable."""
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("MCP_SCHEMA_CACHE_TTL_HOURS", hours)
    with pytest.raises(ConfigurationError, match="MCP_SCHEMA_CACHE_TTL_HOURS"):
        Settings()
    with pytest.raises(ConfigurationError, match="MCP_SCHEMA_CACHE_TTL_HOURS"):
        load_mcp_settings()
    with pytest.raises(ValueError, match="schema_cache_ttl_hours"):
        MCPSettings(schema_cache_ttl_hours=float(hours))


@pytest.mark.parametrize("hours", ["1e-12", "1e-8", "-1", "nan"])
def test_a_ttl_redis_cannot_keep_is_refused_at_start(
    monkeypatch: pytest.MonkeyPatch, hours: str
) -> None:
    """Accepted at start, a TTL under a microsecond failed the first cache built from the
    settings naming no variable, and one under a millisecond went to Redis as ``PEXPIRE 0``,
    deleting each entry as it was written."""
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("MCP_SCHEMA_CACHE_TTL_HOURS", hours)
    with pytest.raises(ConfigurationError, match="MCP_SCHEMA_CACHE_TTL_HOURS"):
        Settings()
    with pytest.raises(ConfigurationError, match="MCP_SCHEMA_CACHE_TTL_HOURS"):
        load_mcp_settings()
    with pytest.raises(ValueError, match="schema_cache_ttl_hours"):
        MCPSettings(schema_cache_ttl_hours=float(hours))
