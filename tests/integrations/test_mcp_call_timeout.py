"""``call_timeout`` bounds one call: the call that took too long fails, naming the server,
while the session it shares with every other call (of every run of a worker) stays open, so
their calls are not cut off and misreported as a broken connection."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from integrations.mcp_world import stdio_server
from onward.errors import BackendUnavailableError
from onward.integrations.mcp import MCPToolset

pytestmark = pytest.mark.timeout(60)


async def test_a_call_that_times_out_leaves_the_others_on_the_session(tmp_path: Path) -> None:
    async with MCPToolset([stdio_server(tmp_path)], call_timeout=3) as toolset:
        wait = next(t for t in toolset.tools if t.name == "wait")
        slow = asyncio.create_task(wait.call({"seconds": 60}, idempotency_key="slow"))
        await asyncio.sleep(2)
        # Sent before the slow call times out, answered after: on the same session.
        other = await wait.call({"seconds": 2}, idempotency_key="other")
        assert other == {"result": "waited 2s"}
        with pytest.raises(BackendUnavailableError, match=r"'ledger'.*'wait'.*timed out"):
            await slow
        assert toolset.connections["ledger"].sessions == 1


async def test_a_server_that_hangs_is_restarted_after_a_call_times_out(tmp_path: Path) -> None:
    async with MCPToolset([stdio_server(tmp_path)], call_timeout=2, connect_timeout=2) as toolset:
        tools = {t.name: t for t in toolset.tools}
        with pytest.raises(BackendUnavailableError, match=r"'ledger'.*'freeze'.*timed out"):
            await tools["freeze"].call({}, idempotency_key="k1")
        assert await tools["echo"].call({"text": "back"}, idempotency_key="k2") == {
            "result": "back"
        }
        assert toolset.connections["ledger"].sessions == 2
    assert not toolset.connections["ledger"].is_open
