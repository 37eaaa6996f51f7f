"""Agents for the fleet test with random pauses and kills, named by `onward worker --agent`.

Both agents' tools call an `ExternalSystem` (a JSON file under ``FLEET_SYSTEMS`` with a lock,
shared by every worker process) that records each effect with its idempotency key and fence,
so an effect taken twice shows as two entries under one key:

* ``booker``: ``book`` has a status check, asked with the asking worker's fence, and its
  system (``bookings``) refuses a fence older than one it has seen for the key, from a call or
  a status check;
* ``charger``: ``charge`` is plain, and so is its system (``charges``): every call takes effect.

Each call waits ``FLEET_TOOL_S`` on its way to the system and again on its way back, so a worker
stopped mid-call may be stopped before or after the effect. The system is called in a thread:
a worker stopped while holding the file's lock stalls the others' calls, not their event loops
(their leases are renewed meanwhile). The model is `support.fleet`'s: ``FLEET_STEPS`` calls,
one a turn, then an answer.

Each call also says, in the file ``calls`` beside the systems, when it set out and when it came
back, with the worker's pid: `on_their_way` tells which calls of a process were out when it was
killed.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from onward.runtime.agent import Agent
from onward.runtime.tools import Reconciled, Tool, tool
from support.fleet import provider, tool_s
from support.paused_world import Behaviour, ExternalSystem

__all__ = ["BOOKINGS", "CHARGES", "agents", "on_their_way", "provider", "system"]

BOOKINGS = "bookings"
CHARGES = "charges"
_BEHAVIOURS: dict[str, Behaviour] = {BOOKINGS: "fences", CHARGES: "plain"}


def system(name: str, directory: Path | None = None) -> ExternalSystem:
    """The external system ``name`` (`BOOKINGS` or `CHARGES`) in ``directory`` (by default
    ``FLEET_SYSTEMS``)."""
    where = directory if directory is not None else Path(os.environ["FLEET_SYSTEMS"])
    return ExternalSystem(where / f"{name}.json", _BEHAVIOURS[name])


SET_OUT = "out"
CAME_BACK = "back"


def _say(directory: Path, line: str) -> None:
    """Append one line to the ``calls`` file: one write, so processes' lines never interleave."""
    fd = os.open(directory / "calls", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


@asynccontextmanager
async def _out(key: str, fence: int) -> AsyncIterator[None]:
    """Say that this process's call ``key`` set out, and once it came back (or raised)."""
    directory = Path(os.environ["FLEET_SYSTEMS"])
    call = f"{os.getpid()} {key} {fence}"
    _say(directory, f"{SET_OUT} {call}")
    try:
        yield
    finally:
        _say(directory, f"{CAME_BACK} {call}")


def on_their_way(directory: Path, pid: int) -> list[str]:
    """The calls (key and fence) process ``pid`` set out on and never came back from."""
    path = directory / "calls"
    out: Counter[str] = Counter()
    for line in path.read_text().splitlines() if path.exists() else []:
        said, by, call = line.split(" ", 2)
        if int(by) == pid:
            out[call] += 1 if said == SET_OUT else -1
    return [call for call, n in out.items() if n > 0]


async def _booked(key: str, *, fence: int) -> Reconciled:
    return await asyncio.to_thread(system(BOOKINGS).status, key, fence)


def _tools() -> tuple[Tool, Tool]:
    @tool(reconcile=_booked)
    async def book(n: int, *, idempotency_key: str, fence: int) -> str:
        async with _out(idempotency_key, fence):
            await asyncio.sleep(tool_s())
            answer = await asyncio.to_thread(system(BOOKINGS).book, idempotency_key, fence, str(n))
            await asyncio.sleep(tool_s())
        return answer

    @tool
    async def charge(n: int, *, idempotency_key: str, fence: int) -> str:
        async with _out(idempotency_key, fence):
            await asyncio.sleep(tool_s())
            answer = await asyncio.to_thread(system(CHARGES).book, idempotency_key, fence, str(n))
            await asyncio.sleep(tool_s())
        return answer

    return book, charge


_book, _charge = _tools()

agents: dict[str, Agent] = {
    "booker": Agent(name="booker", instructions="book, step by step", tools=[_book]),
    "charger": Agent(name="charger", instructions="charge, step by step", tools=[_charge]),
}
