"""HTTP answers that are no MCP answer: a server that restarted, forgetting its sessions,
answers 404 to the old one (the toolset opens a new session rather than fail every call from
then on); a gateway in front of the server answers 5xx to a call the server may have handled
(the call's outcome is unknown, not a failure the model would make the call again for)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.processes import kill_if_running

from integrations.mcp_world import TESTS, ledger
from onward.errors import BackendUnavailableError, OutcomeUnknownError
from onward.integrations.mcp import HttpServer, MCPToolset

pytestmark = pytest.mark.timeout(60)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class _Server:
    """The test server over streamable HTTP, which a test stops and starts again."""

    def __init__(self, tmp: Path, mode: str = "http") -> None:
        self.mode = mode
        self.port = _free_port()
        self.env = os.environ | {
            "PYTHONPATH": str(TESTS),
            "MCP_TEST_LEDGER": str(tmp / "ledger.jsonl"),
        }
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "integrations.mcp_server", self.mode, str(self.port)],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            for _ in range(200):
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=0.1).close()
                    return
                except OSError:
                    if self.process.poll() is not None:
                        pytest.fail(f"the HTTP MCP server exited with {self.process.returncode}")
                    time.sleep(0.05)
            pytest.fail("the HTTP MCP server did not start")
        except BaseException:
            self.stop()  # a server slow to listen would otherwise serve on after the test
            raise

    def stop(self) -> None:
        if self.process is not None:
            try:
                self.process.terminate()
                self.process.wait(timeout=10)
            finally:
                kill_if_running(self.process)
            self.process = None


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[_Server]:
    server = _Server(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_a_restarted_http_server_gets_a_new_session(
    tmp_path: Path, restartable: _Server
) -> None:
    """The call the restarted server refused was not handled: it is made on a new session,
    once, rather than failed (and every call after it with it)."""
    async with MCPToolset([HttpServer(name="web", url=restartable.url)]) as toolset:
        tools = {t.name: t for t in toolset.tools}
        assert await tools["echo"].call({"text": "x"}, idempotency_key="k1") == {"result": "x"}
        restartable.stop()
        restartable.start()  # a new process: it knows no session
        answer = await tools["charge"].call({"account": "a1", "cents": 5}, idempotency_key="k2")
        assert answer == {"result": "charged a1 5"}
        assert await tools["echo"].call({"text": "y"}, idempotency_key="k3") == {"result": "y"}
        assert toolset.connections["web"].sessions == 2
    assert ledger(tmp_path) == [{"key": "k2", "account": "a1", "cents": 5}]


async def test_a_call_to_a_server_that_is_down_is_known_not_to_have_run(
    tmp_path: Path, restartable: _Server
) -> None:
    """No connection to the server was made, so the call never reached it: the server is
    unavailable, not a call that "may have taken effect" for a person to settle; once the
    server is back the call is made, once."""
    async with MCPToolset([HttpServer(name="web", url=restartable.url)]) as toolset:
        tools = {t.name: t for t in toolset.tools}
        restartable.stop()
        with pytest.raises(BackendUnavailableError, match="'web'") as raised:
            await tools["charge"].call({"account": "a1", "cents": 5}, idempotency_key="k1")
        assert not isinstance(raised.value, OutcomeUnknownError)
        restartable.start()
        answer = await tools["charge"].call({"account": "a1", "cents": 5}, idempotency_key="k1")
        assert answer == {"result": "charged a1 5"}
    assert ledger(tmp_path) == [{"key": "k1", "account": "a1", "cents": 5}]


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[_Server]:
    server = _Server(tmp_path, "http-gateway")
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_a_gateway_error_after_the_call_reached_the_server_is_an_unknown_outcome(
    tmp_path: Path, gateway: _Server
) -> None:
    """A 502 from a gateway says nothing of what the server did: here it charged."""
    async with MCPToolset([HttpServer(name="web", url=gateway.url)]) as toolset:
        tools = {t.name: t for t in toolset.tools}
        with pytest.raises(OutcomeUnknownError, match=r"'web'.*'charge'.*may have taken effect"):
            await tools["charge"].call({"account": "a1", "cents": 5}, idempotency_key="k1")
        assert await tools["echo"].call({"text": "x"}, idempotency_key="k2") == {"result": "x"}
    assert ledger(tmp_path) == [{"key": "k1", "account": "a1", "cents": 5}]
