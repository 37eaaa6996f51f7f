"""A stdio server that died while no call was in flight: its session's transport has ended, so
a call is not sent on it (nothing would reach the server) but on a new session, to a server
started again, and made once, rather than failed as one that "may have taken effect"."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from integrations.mcp_world import ledger, stdio_server
from onward.integrations.mcp import MCPToolset

pytestmark = pytest.mark.timeout(60)


async def _killed(pid: int) -> None:
    """Kill the server process ``pid`` and wait until it is gone."""
    os.kill(pid, signal.SIGKILL)
    for _ in range(200):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)  # its stdout's end reaches the session


async def test_a_call_after_the_server_died_idle_goes_to_a_new_server(tmp_path: Path) -> None:
    async with MCPToolset([stdio_server(tmp_path)], connect_timeout=10) as toolset:
        connection = toolset.connections["ledger"]
        (pid,) = map(int, (tmp_path / "ledger.listings").read_text().split())
        await _killed(pid)
        charge = next(t for t in toolset.tools if t.name == "charge")
        answer = await charge.call({"account": "a1", "cents": 5}, idempotency_key="k1")
        assert answer == {"result": "charged a1 5"}
        assert connection.sessions == 2
    assert ledger(tmp_path) == [{"key": "k1", "account": "a1", "cents": 5}]
