"""An external system, and the agents that call it, for the paused-worker tests.

`ExternalSystem` is a booking service kept in a JSON file (so a child process and the test share
it) with one of three behaviours a real service may have:

* ``fences``: it remembers the highest fencing token seen for each key and refuses a call with
  a lower one (the fencing-token rule);
* ``dedupe``: a second call with a key it has seen returns the first call's answer, no effect;
* ``plain``: every call takes effect.

Its status check (`status`) answers whether a call with a key took effect; a system that fences
takes the asker's fence as the highest seen for the key before answering. The agent's ``book``
tool marks ``entered`` in the file when it starts; with ``hold`` it then blocks the thread (no
await: nothing in its process can stop it) until a ``.go`` file beside it exists (looked at
without the file's lock, which a stopped process must never hold), so the test can pause the
process there and let it carry on later; with ``max_call_s`` it awaits ``ASYNC_WAIT_S`` first,
which a paused process finds past its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from onward.eventlog import ToolCall
from onward.runtime.agent import Agent
from onward.runtime.leases.base import LeasePolicy
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.tools import Reconciled, Tool, tool

Behaviour = Literal["fences", "dedupe", "plain"]
TENANT = "acme"
TTL_S = 3.0
"""The paused worker's lease: short, so the test waits little for it to lapse."""
POLICY = LeasePolicy(ttl=timedelta(seconds=TTL_S))
MAX_CALL_S = 0.5
ASYNC_WAIT_S = 0.4
"""What the ``max_call_s`` tool awaits before its effect: inside its deadline unless paused."""


class ExternalSystem:
    """The booking service, in ``path`` (see the module docstring)."""

    def __init__(self, path: Path, behaviour: Behaviour) -> None:
        self.path = path
        self.behaviour = behaviour

    @contextlib.contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        with open(self.path.with_suffix(".lock"), "a+") as lock:
            _lock(lock.fileno(), self.path)
            state: dict[str, Any] = (
                json.loads(self.path.read_text())
                if self.path.exists()
                else {"effects": [], "fences": {}, "refused": [], "entered": []}
            )
            yield state
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(state))
            os.replace(tmp, self.path)

    def let_go(self) -> None:
        """Let a holding call go on (`booking_tool` with ``hold``)."""
        self.path.with_suffix(".go").touch()

    def gone(self) -> bool:
        """Whether holding calls may go on; reads no state, so it takes no lock."""
        return self.path.with_suffix(".go").exists()

    def read(self) -> dict[str, Any]:
        with self._state() as state:
            return dict(state)

    def mark(self, field: str, value: Any) -> None:
        with self._state() as state:
            if isinstance(state.get(field), list):
                state[field].append(value)
            else:
                state[field] = value

    def book(self, key: str, fence: int | None, seat: str) -> str:
        """Take effect, or refuse, as this system's behaviour says."""
        with self._state() as state:
            seen = state["fences"].get(key, 0)
            refused = self.behaviour == "fences" and (fence is None or fence < seen)
            answer = self._book(state, key, fence, seat, refused)
        if refused:
            raise RuntimeError(f"fence {fence} is older than {seen} for {key}")
        return answer

    def _book(
        self, state: dict[str, Any], key: str, fence: int | None, seat: str, refused: bool
    ) -> str:
        if refused:
            state["refused"].append({"key": key, "fence": fence, "pid": os.getpid()})
            return ""
        if self.behaviour == "fences":
            state["fences"][key] = fence
        if self.behaviour == "dedupe":
            for effect in state["effects"]:
                if effect["key"] == key:
                    return str(effect["answer"])
        answer = f"seat {seat} booked"
        state["effects"].append({"key": key, "fence": fence, "pid": os.getpid(), "answer": answer})
        return answer

    def status(self, key: str, fence: int | None = None) -> Reconciled:
        """Whether a call with ``key`` took effect. A system that fences takes the asker's
        ``fence`` as the highest seen for the key before it answers, so a call with an older
        one that arrives afterwards is refused."""
        with self._state() as state:
            for effect in state["effects"]:
                if effect["key"] == key:
                    return Reconciled("completed", effect["answer"])
            if self.behaviour == "fences" and fence is not None:
                state["fences"][key] = max(fence, state["fences"].get(key, 0))
            return Reconciled("never_ran")

    def effects(self) -> list[dict[str, Any]]:
        return list(self.read()["effects"])


LOCK_WAIT_S = 30.0
"""The longest a caller waits for the system's lock: a stopped process holding it must fail the
test, not hang it."""


def _lock(fd: int, path: Path) -> None:
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{path}: its lock was held for {LOCK_WAIT_S:g}s (by a stopped process?)"
                ) from None
            time.sleep(0.005)


def booking_tool(
    system: ExternalSystem, *, checked: bool, hold: bool, bounded: bool, second: bool = False
) -> Tool:
    """The ``book`` tool: status-checked or plain, holding at ``go`` or awaiting first;
    ``second``: its call reaches the system only after another process's call did (the
    paused worker's late call arrives first)."""

    async def status(key: str, *, fence: int) -> Reconciled:
        return system.status(key, fence)

    async def book(seat: str, *, idempotency_key: str, fence: int) -> str:
        system.mark("entered", {"pid": os.getpid(), "fence": fence})
        if hold:
            while not system.gone():
                # Blocks the thread on purpose: nothing in this process runs meanwhile.
                time.sleep(0.01)  # noqa: ASYNC251
        if bounded:
            await asyncio.sleep(ASYNC_WAIT_S)
        while second and not _reached_by_another(system.read()):  # noqa: ASYNC110 - another process's file
            await asyncio.sleep(0.01)
        return system.book(idempotency_key, fence, seat)

    return tool(reconcile=status if checked else None, max_call_s=MAX_CALL_S if bounded else None)(
        book
    )


def _reached_by_another(state: dict[str, Any]) -> bool:
    """Whether a call from another process reached the system (took effect or was refused)."""
    return any(e["pid"] != os.getpid() for e in [*state["effects"], *state["refused"]])


def booking_agent(
    system: ExternalSystem, *, checked: bool, hold: bool, bounded: bool, second: bool = False
) -> Agent:
    return Agent(
        name="booker",
        instructions="book the seat",
        tools=[booking_tool(system, checked=checked, hold=hold, bounded=bounded, second=second)],
    )


def booking_model() -> ScriptedProvider:
    return ScriptedProvider(
        [reply("", ToolCall(call_id="b", tool="book", args={"seat": "3A"})), reply("booked")]
    )
