"""The schema cache an agent's `MCPToolset` makes from a deployment's settings (`run_tools`):
when the settings change (another deployment in the process), the cache of the old ones is
closed once no run's view uses it any more, not left to the garbage collector with its Redis
connections open."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from integrations.mcp_world import TENANT, stdio_server
from onward.integrations.mcp import MCPSettings, MCPToolset, SchemaCache
from onward.runtime.settings import Settings

pytestmark = pytest.mark.timeout(60)


def _settings(redis_url: str, prefix: str) -> Settings:
    return Settings.model_validate(
        {"ONWARD_BACKEND": "memory", "REDIS_URL": redis_url, "MCP_SCHEMA_CACHE_PREFIX": prefix}
    )


async def test_the_cache_of_old_settings_is_closed_once_its_runs_are_over(
    tmp_path: Path, redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[SchemaCache] = []
    real = SchemaCache.from_settings.__func__  # type: ignore[attr-defined]

    def from_settings(cls: type[SchemaCache], settings: MCPSettings | None = None) -> Any:
        cache = real(cls, settings)
        made.append(cache)
        return cache

    monkeypatch.setattr(SchemaCache, "from_settings", classmethod(from_settings))
    first = _settings(redis_url, f"{redis_prefix}a:")
    second = _settings(redis_url, f"{redis_prefix}b:")
    toolset = MCPToolset([stdio_server(tmp_path)])
    try:
        async with toolset.run_tools("r1", tenant=TENANT, settings=first):
            async with toolset.run_tools("r2", tenant=TENANT, settings=second):
                assert len(made) == 2
                assert [c.is_open for c in made] == [True, True]  # r1 uses the first
            assert [c.is_open for c in made] == [True, True]
        assert [c.is_open for c in made] == [False, True]  # the second serves the next runs
        async with toolset.run_tools("r3", tenant=TENANT, settings=second):
            pass
        assert len(made) == 2
    finally:
        await toolset.close()
    assert [c.is_open for c in made] == [False, False]
