"""Child processes running a module of tests/support, as the crash and worker tests need."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]


async def spawn_support(module: str, *args: str, **options: Any) -> asyncio.subprocess.Process:
    """``python -m support.<module> *args`` with tests/ on its path; ``options`` as for asyncio."""
    env = {**os.environ, **options.pop("env", {}), "PYTHONPATH": str(TESTS)}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", f"support.{module}", *args, env=env, **options
    )


class Spares:
    """Children started one use ahead: the next one imports what it needs while the current one
    is used, so a test waits for no Python to start. Each child is used once, and ran nothing
    before it was given its one line on stdin (what it is to do). A spare starts with the
    environment and directory of the test running then, not of the test that takes it: give a
    child everything it needs in its line."""

    def __init__(self, start: Callable[[], Awaitable[asyncio.subprocess.Process]]) -> None:
        self._start = start  # a child with stdin piped, waiting for its line
        self.spare: asyncio.subprocess.Process | None = None

    async def take(self, line: str) -> asyncio.subprocess.Process:
        """A child given ``line``; the next one starts now."""
        child = self.spare or await self._start()
        self.spare = await self._start()
        assert child.stdin is not None
        child.stdin.write(line.encode() + b"\n")
        await child.stdin.drain()
        child.stdin.close()
        return child

    async def close(self) -> None:
        """Kill the spare nobody took, or it would outlive the tests."""
        if self.spare is not None:
            await kill_running([self.spare])
            self.spare = None


async def spawn_onward(log: Path, env: dict[str, str], *argv: str) -> asyncio.subprocess.Process:
    """``python -m onward *argv`` in ``env``, its output (both streams) in the file ``log``."""
    with log.open("wb") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "onward", *argv, env=env, stdout=out, stderr=out
        )


async def ready_workers(
    argv: Sequence[str], names: Iterable[str], env: dict[str, str]
) -> list[asyncio.subprocess.Process]:
    """``python *argv --name NAME`` for each name (an `onward worker`), returned once each has
    said it is ready (its first line on stderr, within 60 s); if one does not, those started
    are killed, or the ready ones would serve on after the test."""
    workers = [
        await asyncio.create_subprocess_exec(
            sys.executable, *argv, "--name", name, env=env, stderr=asyncio.subprocess.PIPE
        )
        for name in names
    ]
    try:
        for worker in workers:
            assert worker.stderr is not None
            first = await asyncio.wait_for(worker.stderr.readline(), 60)
            assert b"ready" in first, first
    except BaseException:
        await kill_running(workers)
        raise
    return workers


async def terminated(child: asyncio.subprocess.Process, *, within_s: float) -> tuple[bytes, bytes]:
    """SIGTERM ``child`` if it still runs and collect what it wrote until it ends (piped
    streams; ``b""`` for one not piped); killed if it has not ended within ``within_s``, or it
    would outlive the test."""
    try:
        if child.returncode is None:
            child.send_signal(signal.SIGTERM)
        stdout, stderr = await asyncio.wait_for(child.communicate(), within_s)
    finally:
        await kill_running([child])
    return stdout or b"", stderr or b""


async def stop_children(children: Iterable[asyncio.subprocess.Process], *, within_s: float) -> None:
    """SIGTERM every child still running, wait up to ``within_s`` for each to drain and exit,
    and kill those that do not."""
    children = list(children)
    for child in children:
        if child.returncode is None:
            child.send_signal(signal.SIGTERM)
    for child in children:
        try:
            await asyncio.wait_for(child.wait(), within_s)
        except TimeoutError:
            child.kill()
            await child.wait()


@asynccontextmanager
async def reaped() -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """A list to put children in; each still running when the block ends is killed and waited
    for, so a test that fails or times out part way leaves no process running after it."""
    children: list[asyncio.subprocess.Process] = []
    try:
        yield children
    finally:
        await kill_running(children)


async def kill_running(children: Iterable[asyncio.subprocess.Process]) -> None:
    """SIGKILL every child still running and wait for each: what a test that failed part way
    must do with the children it started, or they outlive it."""
    children = list(children)
    for child in children:
        if child.returncode is None:
            child.kill()
    for child in children:
        await child.wait()


def kill_if_running(process: subprocess.Popen[Any]) -> None:
    """SIGKILL ``process`` if it still runs and wait for it (closing its pipes): kill_running
    for a test that started its child with ``subprocess.Popen``."""
    if process.poll() is None:
        process.kill()
        process.communicate()
