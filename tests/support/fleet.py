"""Agents and a model for fleet tests and the fleet benchmark, named by `onward worker --agent`.

Every run makes ``FLEET_STEPS`` tool calls, one per turn, then answers. Each call's side effect
goes to the ledger ``FLEET_LEDGER`` names before the tool sleeps ``FLEET_TOOL_S`` seconds, so a
worker killed mid-call leaves an effect without its `ToolCompleted`. The ledger is written (and
fsynced) in a thread, as a tool's network call would leave the event loop to other runs. The
model answers after ``FLEET_MODEL_S`` seconds (0: at once), plus up to ``FLEET_MODEL_JITTER_S``.

``booker``'s tool has a status check (the ledger), so resume settles such a call itself;
``charger``'s has none, so such a call is indeterminate and its run is left for a person.
``broken``'s model always fails, so workers give up on its runs after their attempts.
``payer``'s tool needs a person's approval for every call.

With ``FLEET_SPANS`` set, ``book`` and ``charge`` also append each call's span (the worker's
pid, when the call began and ended) to that file: the tests count from it how many runs a
worker had in flight, rather than taking the worker's word for it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from onward.eventlog import Message, ToolCall
from onward.runtime.agent import Agent
from onward.runtime.demo_ledger import Ledger
from onward.runtime.providers import ModelReply, ScriptedProvider, reply
from onward.runtime.tools import Reconciled, Tool, tool

DEFAULT_STEPS = 3
"""Tool calls per run when ``FLEET_STEPS`` is not set."""


def steps() -> int:
    """``FLEET_STEPS`` as it is now: tests that run the CLI in-process set it per test, after
    another test may have imported this module."""
    return int(os.environ.get("FLEET_STEPS", str(DEFAULT_STEPS)))


def tool_s() -> float:
    return float(os.environ.get("FLEET_TOOL_S", "0.05"))


def model_s() -> float:
    """``FLEET_MODEL_S``, plus up to ``FLEET_MODEL_JITTER_S`` more, drawn for each call (a
    real model's time varies)."""
    jitter = float(os.environ.get("FLEET_MODEL_JITTER_S", "0"))
    return float(os.environ.get("FLEET_MODEL_S", "0")) + (
        random.uniform(0, jitter) if jitter else 0
    )


def _ledger() -> Ledger:
    return Ledger(os.environ.get("FLEET_LEDGER", "fleet-ledger.jsonl"))


async def _status(key: str) -> Reconciled | None:
    found = _ledger().find("book", key)
    return Reconciled("completed", {"booked": key}) if found else Reconciled("never_ran")


@asynccontextmanager
async def _span() -> AsyncIterator[None]:
    """Append the call's span to ``FLEET_SPANS`` (if set) once it ends, however it ends: one
    short line in append mode, so the lines of concurrent calls and processes never mix."""
    began = time.monotonic()
    try:
        yield
    finally:
        spans = os.environ.get("FLEET_SPANS")
        if spans:
            _append(spans, {"pid": os.getpid(), "began": began, "ended": time.monotonic()})


def _append(path: str, span: dict[str, float]) -> None:
    """Written at once, not in a thread: a call being cancelled still records its span."""
    with open(path, "a") as file:
        file.write(json.dumps(span) + "\n")


def _tools() -> tuple[Tool, Tool, Tool]:
    @tool(reconcile=_status)
    async def book(n: int, *, idempotency_key: str) -> dict[str, object]:
        async with _span():
            record = _ledger().record
            await asyncio.to_thread(record, "book", idempotency_key, n=n, pid=os.getpid())
            await asyncio.sleep(tool_s())
        return {"booked": idempotency_key}

    @tool
    async def charge(n: int, *, idempotency_key: str) -> dict[str, object]:
        async with _span():
            record = _ledger().record
            await asyncio.to_thread(record, "charge", idempotency_key, n=n, pid=os.getpid())
            await asyncio.sleep(tool_s())
        return {"charged": idempotency_key}

    @tool(requires_approval=True)
    async def pay(n: int, *, idempotency_key: str) -> dict[str, object]:
        await asyncio.to_thread(_ledger().record, "pay", idempotency_key, n=n, pid=os.getpid())
        return {"paid": idempotency_key}

    return book, charge, pay


_book, _charge, _pay = _tools()

agents: dict[str, Agent] = {
    "booker": Agent(name="booker", instructions="book, step by step", tools=[_book]),
    "charger": Agent(name="charger", instructions="charge, step by step", tools=[_charge]),
    "broken": Agent(name="broken", instructions="broken: book, step by step", tools=[_book]),
    "payer": Agent(name="payer", instructions="pay, step by step", tools=[_pay]),
}


def make_booker() -> Agent:
    """A function returning an agent, as ``--agent`` accepts."""
    return agents["booker"]


class ModelDownError(RuntimeError):
    """The model failed (for ``broken`` runs, always)."""


def script(messages: Sequence[Message]) -> ModelReply:
    """One tool call per turn for ``FLEET_STEPS`` turns, then a final answer."""
    turn = sum(1 for m in messages if m.role == "assistant")
    instructions = str(messages[0].content)
    if instructions.startswith("broken"):
        raise ModelDownError("the model is down")
    tool_name = "book" if "book" in instructions else "charge"
    if instructions.startswith("pay"):
        tool_name = "pay"
    if turn >= steps():
        return reply(f"done after {turn} steps")
    return reply(
        f"step {turn + 1}", ToolCall(call_id=f"c{turn + 1}", tool=tool_name, args={"n": turn + 1})
    )


class _Model(ScriptedProvider):
    """The scripted model, answering after ``FLEET_MODEL_S`` seconds."""

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        seconds = model_s()
        if seconds > 0:
            await asyncio.sleep(seconds)
        return await super().complete(agent, messages)


def provider() -> ScriptedProvider:
    """The model: one tool call per turn for ``FLEET_STEPS`` turns, then a final answer."""
    return _Model(script)
