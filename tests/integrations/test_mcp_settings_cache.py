"""The schema cache an agent's `MCPToolset` makes from a deployment's settings (`run_tools`):
when the settings change (another deployment in the process), the cache of the old ones is
closed once no run's view uses it any more, not left to the garbage collector with its Redis
connections open."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Coroutine, Iterator
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


def test_the_cache_of_a_loop_still_running_is_closed_when_another_loop_takes_over(
    tmp_path: Path, redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads, each with its own event loop, running runs by turns: each turn makes a
    cache in its loop, and the other loop's was dropped with its Redis connections open."""
    made: list[SchemaCache] = []
    real = SchemaCache.from_settings.__func__  # type: ignore[attr-defined]

    def from_settings(cls: type[SchemaCache], settings: MCPSettings | None = None) -> Any:
        cache = real(cls, settings)
        made.append(cache)
        return cache

    monkeypatch.setattr(SchemaCache, "from_settings", classmethod(from_settings))
    settings = _settings(redis_url, redis_prefix)
    toolset = MCPToolset([stdio_server(tmp_path)])

    async def a_run(run_id: str) -> None:
        async with toolset.run_tools(run_id, tenant=TENANT, settings=settings):
            pass

    def in_loop(loop: asyncio.AbstractEventLoop, work: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(work, loop).result(30)

    with _loop_in_thread() as one, _loop_in_thread() as other:
        in_loop(one, a_run("r1"))
        in_loop(other, a_run("r2"))
        in_loop(one, a_run("r3"))
        in_loop(other, toolset.close())
        deadline = time.monotonic() + 10
        while any(c.is_open for c in made) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(made) == 3
        assert [c.is_open for c in made] == [False, False, False]
        for loop in (one, other):  # what one loop opened, the other does not stop
            in_loop(loop, toolset.close())


class _Turns:
    """A thread lock that sets ``waiting`` when a thread has to wait for it."""

    def __init__(self, waiting: threading.Event) -> None:
        self._lock = threading.Lock()
        self._waiting = waiting

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=False):
            self._waiting.set()
            self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_two_loops_making_the_cache_at_once_each_get_one_made_in_their_own(
    tmp_path: Path, redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads' loops each starting a run as the other makes the cache: the loop that
    finished first was left marked as the cache's while the cache kept was the other loop's,
    so its next runs used Redis connections of another event loop (every read a miss), and
    the cache it made itself was never closed."""
    made_in: dict[SchemaCache, asyncio.AbstractEventLoop] = {}
    real = SchemaCache.from_settings.__func__  # type: ignore[attr-defined]
    entered, go = threading.Event(), threading.Event()
    waited: list[bool] = []
    settings = _settings(redis_url, redis_prefix)
    toolset = MCPToolset([stdio_server(tmp_path)])
    # The other loop waiting its turn for the cache lets the first go on.
    monkeypatch.setattr(toolset, "_settings_guard", _Turns(go), raising=False)

    def from_settings(cls: type[SchemaCache], wanted: MCPSettings | None = None) -> Any:
        loop = asyncio.get_running_loop()
        if not waited:  # the first loop making one waits while the other gets the cache
            waited.append(True)
            entered.set()
            assert go.wait(30)
        cache = real(cls, wanted)
        made_in[cache] = loop
        return cache

    monkeypatch.setattr(SchemaCache, "from_settings", classmethod(from_settings))

    async def a_run(run_id: str) -> None:
        async with toolset.run_tools(run_id, tenant=TENANT, settings=settings):
            pass

    async def the_cache() -> SchemaCache | None:
        return await toolset._cache_of(settings)

    with _loop_in_thread() as one, _loop_in_thread() as other:
        first = asyncio.run_coroutine_threadsafe(a_run("r1"), one)
        assert entered.wait(30)
        second = asyncio.run_coroutine_threadsafe(a_run("r2"), other)
        second.add_done_callback(lambda _: go.set())  # or its run ends without waiting
        first.result(30)
        second.result(30)
        for loop in (other, one):
            cache = asyncio.run_coroutine_threadsafe(the_cache(), loop).result(30)
            assert cache is not None
            assert made_in[cache] is loop
            asyncio.run_coroutine_threadsafe(toolset.close(), loop).result(30)
        assert [c.is_open for c in made_in] == [False] * len(made_in)
