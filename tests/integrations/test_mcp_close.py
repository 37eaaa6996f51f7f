"""Closing a toolset while its tools or its views are still in use: nothing opened after the
close is left running, and a session asked for during the close is the one every caller gets."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from integrations.mcp_world import TENANT, stdio_server
from onward.errors import BackendUnavailableError, OutcomeUnknownError
from onward.integrations.mcp import MCPToolset
from onward.integrations.mcp.servers import Connection

pytestmark = pytest.mark.timeout(60)

_T = TypeVar("_T")


def _sessions_running() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("mcp:") and not t.done()]


async def test_a_view_called_after_its_toolset_closed_starts_no_server(tmp_path: Path) -> None:
    """A run still in flight when its toolset closes: its next call is refused, unsent, rather
    than starting a server process nothing will stop."""
    toolset = MCPToolset([stdio_server(tmp_path)])
    try:
        async with toolset.for_run("r1", tenant=TENANT) as view:
            echo = next(t for t in view.tools if t.name == "echo")
            assert await echo.call({"text": "a"}, idempotency_key="k1") == {"result": "a"}
            await toolset.close()
            with pytest.raises(BackendUnavailableError, match="closed") as raised:
                await echo.call({"text": "b"}, idempotency_key="k2")
            assert not isinstance(raised.value, OutcomeUnknownError)
            assert not toolset.connections["ledger"].is_open
            assert _sessions_running() == []
        async with toolset.for_run("r2", tenant=TENANT) as again:  # the next run opens anew
            echo = next(t for t in again.tools if t.name == "echo")
            assert await echo.call({"text": "c"}, idempotency_key="k3") == {"result": "c"}
    finally:
        await toolset.close()
    assert _sessions_running() == []


async def test_a_tool_called_after_its_toolset_closed_starts_no_server(tmp_path: Path) -> None:
    async with MCPToolset([stdio_server(tmp_path)]) as toolset:
        echo = next(t for t in toolset.tools if t.name == "echo")
    with pytest.raises(BackendUnavailableError, match="closed"):
        await echo.call({"text": "b"}, idempotency_key="k")
    assert _sessions_running() == []


async def test_a_session_asked_for_during_close_is_the_one_every_caller_gets(
    tmp_path: Path,
) -> None:
    """A caller that waited on the connection while it closed, and one that came after the
    close, share one new session: neither fails, and none is left running after the close."""
    connection = Connection(stdio_server(tmp_path), connect_timeout=10.0)
    try:
        await connection.session()
        closing = asyncio.create_task(connection.close())
        await asyncio.sleep(0)
        waiting = asyncio.create_task(connection.session())
        await closing
        later = asyncio.create_task(connection.session())
        first, second = await asyncio.gather(waiting, later)
        assert first[0] is second[0]
        assert connection.sessions == 2
    finally:
        await connection.close()
    assert _sessions_running() == []


@contextlib.contextmanager
def _loop_in_thread() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _in(loop: asyncio.AbstractEventLoop, work: Coroutine[Any, Any, _T]) -> _T:
    return asyncio.run_coroutine_threadsafe(work, loop).result(30)


async def _sessions_left() -> list[asyncio.Task[object]]:
    """The loop's sessions still running once those told to end had time to."""
    for _ in range(100):
        if not _sessions_running():
            break
        await asyncio.sleep(0.05)
    return _sessions_running()


def test_two_running_loops_opening_a_connection_at_once_each_keep_their_own_session(
    tmp_path: Path,
) -> None:
    """Two threads, each with its own event loop, running runs at the same time on one
    toolset (``query_sync`` from a threaded server): each loop opened its session while the
    other's was in its handshake, and the connection handed one loop the other's session, or
    forgot it and started a third. A call on a session of a loop that then ended was left
    undecided (it was sent). Each loop keeps its own session, and its calls are answered."""
    toolset = MCPToolset([stdio_server(tmp_path)])
    connection = toolset.connections["ledger"]

    async def a_run(run_id: str) -> list[Any]:
        async with toolset.for_run(run_id, tenant=TENANT) as view:
            echo = next(t for t in view.tools if t.name == "echo")
            return [
                await echo.call({"text": f"{run_id}-{n}"}, idempotency_key=f"{run_id}-{n}")
                for n in range(3)
            ]

    with _loop_in_thread() as one, _loop_in_thread() as other:
        first = asyncio.run_coroutine_threadsafe(connection.session(), one)
        second = asyncio.run_coroutine_threadsafe(connection.session(), other)
        mine, theirs = first.result(30), second.result(30)
        assert mine[0] is not theirs[0]
        assert _in(one, connection.session())[0] is mine[0]
        assert _in(other, connection.session())[0] is theirs[0]
        assert connection.sessions == 2
        runs = [
            asyncio.run_coroutine_threadsafe(a_run(run_id), loop)
            for run_id, loop in (("r1", one), ("r2", other))
        ]
        assert [run.result(30) for run in runs] == [
            [{"result": f"{run_id}-{n}"} for n in range(3)] for run_id in ("r1", "r2")
        ]
        assert connection.sessions == 2
        _in(one, toolset.close())
        assert _in(one, _sessions_left()) == []
        assert _in(other, _sessions_left()) == []


def test_a_connection_used_from_two_running_loops_by_turns_leaves_no_session_running(
    tmp_path: Path,
) -> None:
    """Two threads, each with its own event loop, using one toolset's connection by turns:
    every turn opened a session in its loop, and the session the other loop held was left
    running (its server process too) as long as that loop lived, which no close could stop.
    Each loop keeps its own session for its turns, and a close ends both."""
    connection = Connection(stdio_server(tmp_path), connect_timeout=10.0)
    with _loop_in_thread() as one, _loop_in_thread() as other:
        first = _in(one, connection.session())
        _in(other, connection.session())
        assert _in(one, connection.session())[0] is first[0]
        assert connection.sessions == 2
        _in(one, connection.close())
        assert _in(one, _sessions_left()) == []
        assert _in(other, _sessions_left()) == []


async def _dropped(connection: Connection, session: Any) -> None:
    connection.drop(session)


def _a_child_stopped(within_s: float = 10.0) -> None:
    """Wait until a process this one started is stopped (SIGSTOP: a hung server)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if "T" in _child_states().values():
            return
        time.sleep(0.05)
    raise AssertionError("the server did not hang")


def test_a_session_reopened_in_another_loop_during_a_close_is_ended_by_it(
    tmp_path: Path,
) -> None:
    """A loop replacing its broken session (waiting for the old one to end) as another loop
    closed the connection: the close let go of that loop's state without telling it, and the
    session it then opened was left running (its server process too) for as long as the loop
    lived, which no later close could reach."""
    connection = Connection(stdio_server(tmp_path), connect_timeout=10.0)
    with _loop_in_thread() as one, _loop_in_thread() as other:
        _in(one, connection.session())
        broken = _in(other, connection.session())[0]
        # The server hangs: ending its session waits for the process to be killed.
        freezing = asyncio.run_coroutine_threadsafe(broken.call_tool("freeze", {}), other)
        _a_child_stopped()
        _in(other, _dropped(connection, broken))
        reopening = asyncio.run_coroutine_threadsafe(connection.session(), other)
        time.sleep(0.3)  # waiting for the frozen session to end
        assert not reopening.done()
        _in(one, connection.close())
        with contextlib.suppress(BackendUnavailableError):
            reopening.result(30)
        with contextlib.suppress(Exception):
            freezing.result(30)
        assert _in(one, _sessions_left()) == []
        assert _in(other, _sessions_left()) == []
        _in(other, connection.close())


def _let_go_of(connection: Connection, loop: asyncio.AbstractEventLoop) -> None:
    """Wait until a close has let go of what ``connection`` held in ``loop``."""
    deadline = time.monotonic() + 10.0
    while loop in connection._loops:
        if time.monotonic() > deadline:
            raise AssertionError("the close did not let go of the other loop's session")
        time.sleep(0.01)


def test_a_session_opened_in_another_loop_while_a_close_ends_its_own_is_refused(
    tmp_path: Path,
) -> None:
    """A close lets go of the other loops' sessions, then waits for its own to end (a hung
    server: until its process is killed); a view opened before the close asking for a session
    in that wait was given a new one, with its server process, that the close had already
    passed over and left running."""
    connection = Connection(stdio_server(tmp_path), connect_timeout=10.0)
    with _loop_in_thread() as one, _loop_in_thread() as other:
        opened = connection.closes
        hung = _in(one, connection.session())[0]
        _in(other, connection.session(opened))
        freezing = asyncio.run_coroutine_threadsafe(hung.call_tool("freeze", {}), one)
        _a_child_stopped()
        closing = asyncio.run_coroutine_threadsafe(connection.close(), one)
        _let_go_of(connection, other)
        assert not closing.done()
        with pytest.raises(BackendUnavailableError, match="closed"):
            _in(other, connection.session(opened))
        closing.result(30)
        with contextlib.suppress(Exception):
            freezing.result(30)
        assert _in(other, _sessions_left()) == []
        _in(other, connection.close())


def _child_states() -> dict[int, str]:
    """The processes this one started, each with its state letter from ``/proc``. A thread may
    end between the listing of ``/proc/self/task`` and the read of its children (they pass to
    another thread of this process), and a child between the listing and the read of its state."""
    states: dict[int, str] = {}
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            for pid in (task / "children").read_text().split():
                with contextlib.suppress(OSError):
                    stat = Path(f"/proc/{pid}/stat").read_text()
                    states[int(pid)] = stat.rsplit(")", 1)[1].split()[0]
    return states


def _children() -> set[int]:
    """The processes this one started that are still running (not yet exited)."""
    return {pid for pid, state in _child_states().items() if state != "Z"}


async def _alive_after(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running once they had a few seconds to end (a process's end
    is not an event this loop can await)."""
    for _ in range(200):
        if not pids & _children():
            break
        await asyncio.sleep(0.05)
    return pids & _children()


@pytest.mark.parametrize("then_closed", [False, True], ids=["stopped", "closed"])
async def test_a_close_ends_the_server_of_a_loop_that_no_longer_runs(
    tmp_path: Path, then_closed: bool
) -> None:
    """A thread's event loop that was stopped (``loop.stop()``), and maybe closed, without its
    tasks ended holds a session: its task never runs again, so a close that only told that
    loop to end it (or passed over a closed loop) left its server process running for as long
    as this process lived. The close ends the process itself."""
    connection = Connection(stdio_server(tmp_path), connect_timeout=10.0)
    before = _children()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        _in(loop, connection.session())
        server = _children() - before
        assert len(server) == 1
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        assert not loop.is_running()
        if then_closed:
            loop.close()
        await asyncio.wait_for(connection.close(), 30)
        assert await _alive_after(server) == set()
    finally:
        loop.close()
        for pid in _children() - before:  # the old code's leak, not left to later tests
            os.killpg(pid, signal.SIGKILL)
