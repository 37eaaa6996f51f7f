"""A failure on a session that is no longer the connection's open one (a ``tools/list`` or a
call that was in flight when it broke, reported after another run opened the next session)
leaves the new session alone: the calls every other run has in flight on it go on."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession

from integrations.mcp_world import stdio_server
from onward.errors import BackendUnavailableError, OutcomeUnknownError
from onward.integrations.mcp import MCPToolset

pytestmark = pytest.mark.timeout(60)


async def test_a_listing_that_failed_on_an_old_session_leaves_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    holding, release = asyncio.Event(), asyncio.Event()
    real: Callable[..., Awaitable[Any]] = ClientSession.list_tools
    held: list[ClientSession] = []

    async def list_tools(session: ClientSession, *args: Any, **kwargs: Any) -> Any:
        if not held:  # run A's first listing waits, as on a slow server
            held.append(session)
            holding.set()
            await release.wait()
        return await real(session, *args, **kwargs)

    monkeypatch.setattr(ClientSession, "list_tools", list_tools)
    toolset = MCPToolset([stdio_server(tmp_path)], connect_timeout=10)
    connection = toolset.connections["ledger"]
    try:
        opening_a = asyncio.create_task(toolset.for_run("a").start())
        await holding.wait()
        async with toolset.for_run("b") as b:
            tools = {t.name: t for t in b.tools}
            with pytest.raises(OutcomeUnknownError):  # the server exits: session 1 is over
                await tools["die"].call({}, idempotency_key="k1")
            assert await tools["echo"].call({"text": "x"}, idempotency_key="k2")
            assert connection.sessions == 2
            waiting = asyncio.create_task(tools["wait"].call({"seconds": 1}, idempotency_key="k3"))
            await asyncio.sleep(0.2)  # the call is in flight on session 2
            release.set()  # run A's listing on session 1 now fails
            with pytest.raises(BackendUnavailableError, match="listing tools"):
                await opening_a
            assert await waiting == {"result": "waited 1s"}
            assert connection.is_open
            assert await tools["echo"].call({"text": "y"}, idempotency_key="k4")
            assert connection.sessions == 2
    finally:
        await toolset.close()
