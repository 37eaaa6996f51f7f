"""An HTTP server's tool call with no ``call_timeout`` waits as long as the tool does, as
`MCPToolset` documents: the HTTP client under the session has no read bound of its own that
cuts a long call off (and records it as a call that may have acted) at a fixed number of
seconds. Every other request on the session is bounded by the session itself."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from support.processes import kill_if_running

from integrations.mcp_world import TESTS
from onward.integrations.mcp import HttpServer, MCPToolset

pytestmark = pytest.mark.timeout(60)

READ_BOUND = 2.0
"""Seconds any fixed read bound is cut down to here, so a short tool outlasts it."""


@pytest.fixture
def json_server() -> Iterator[str]:
    """The test server over streamable HTTP answering each request with one JSON body (no SSE
    stream, so no keep-alive bytes while a tool runs); yields its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "integrations.mcp_server", "http-json", str(port)],
        env=os.environ | {"PYTHONPATH": str(TESTS)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("the HTTP MCP server did not start")
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        try:
            process.terminate()
            process.wait(timeout=10)
        finally:
            kill_if_running(process)  # one that did not end on SIGTERM would outlive the test


@pytest.fixture
def short_read_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any read bound the transport sets is cut to `READ_BOUND` seconds (none stays none)."""
    real = httpx2.Timeout

    def shortened(*args: Any, read: float | None = None, **kwargs: Any) -> httpx2.Timeout:
        return real(*args, read=None if read is None else min(read, READ_BOUND), **kwargs)

    monkeypatch.setattr(httpx2, "Timeout", shortened)


@pytest.mark.usefixtures("short_read_bounds")
async def test_a_long_http_call_without_call_timeout_gets_its_answer(json_server: str) -> None:
    server = HttpServer(name="web", url=json_server)
    async with MCPToolset([server], call_timeout=None) as toolset:
        wait = next(t for t in toolset.tools if t.name == "wait")
        seconds = READ_BOUND + 2
        slow = asyncio.create_task(wait.call({"seconds": seconds}, idempotency_key="slow"))
        await asyncio.sleep(1)
        # In flight on the same session when a read bound would have cut the slow call off.
        other = await wait.call({"seconds": READ_BOUND}, idempotency_key="other")
        assert other == {"result": f"waited {READ_BOUND:g}s"}
        assert await slow == {"result": f"waited {seconds:g}s"}
        assert toolset.connections["web"].sessions == 1
