"""Agents and models the command-line tests name with ``--agent`` and ``--provider``.

``onward run --resume`` imports them by ``module:attr`` like a user's own, so they live in an
importable module rather than in the test file. ``EFFECTS`` is the tools' own ledger: what
really ran, whatever the log says.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path

from onward.eventlog import ToolCall
from onward.eventlog.events import Message
from onward.runtime import Agent, ModelReply, ScriptedProvider, idempotency_key, reply, tool

EFFECTS: list[tuple[str, str]] = []
"""(tool, idempotency key) of every call that took effect in this process."""


@tool
async def book(seat: str, *, idempotency_key: str) -> dict[str, str]:
    """Book a seat: a side effect that must not happen twice."""
    EFFECTS.append(("book", idempotency_key))
    return {"seat": seat}


@tool(requires_approval=True)
async def pay(amount: int, *, idempotency_key: str) -> str:
    """Pay: a person approves every call first."""
    EFFECTS.append(("pay", idempotency_key))
    return f"paid {amount}"


@tool(name="book")
async def slow_book(seat: str, *, idempotency_key: str) -> dict[str, str]:
    """Book a seat, slowly: marks ``CLI_AGENT_ENTERED`` (a file) once it is in the call."""
    Path(os.environ["CLI_AGENT_ENTERED"]).write_text(idempotency_key)  # noqa: ASYNC240
    await asyncio.sleep(60)
    return {"seat": seat}


def slow_booker() -> Agent:
    """Books one seat with a call that takes a minute."""
    return Agent(name="slow-booker", instructions="book the seat asked for", tools=[slow_book])


def booker() -> Agent:
    """Books one seat."""
    return Agent(name="booker", instructions="book the seat asked for", tools=[book])


def changed_booker() -> Agent:
    """The booker with other instructions: another revision, which resume must refuse."""
    return Agent(name="booker", instructions="book two seats", tools=[book])


def payer() -> Agent:
    """Pays once a person approves."""
    return Agent(name="payer", instructions="pay when approved", tools=[pay])


def booking_model() -> ScriptedProvider:
    """Asks for one booking, then says it is done."""
    return ScriptedProvider(
        [reply("", ToolCall(call_id="b", tool="book", args={"seat": "3A"})), reply("booked")]
    )


def paying_model() -> ScriptedProvider:
    """Asks for one payment, then says it is done."""
    return ScriptedProvider(
        [reply("", ToolCall(call_id="p", tool="pay", args={"amount": 10})), reply("paid")]
    )


class StallingModel:
    """A model that never answers: marks ``CLI_AGENT_ENTERED`` (a file) once it is asked, then
    waits a minute, so a test can kill the process holding the run while it waits."""

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        Path(os.environ["CLI_AGENT_ENTERED"]).write_text(agent.name)  # noqa: ASYNC240
        await asyncio.sleep(60)
        raise AssertionError("the stalling model was meant to be killed while it waited")


def stalling_model() -> StallingModel:
    """A model the process holding the run is killed in."""
    return StallingModel()


not_an_agent = 42
"""Something importable that is not an agent, for the bad ``--agent`` tests."""


def effects(tool_name: str, run_id: str, call_id: str) -> int:
    """How often a call of a run took effect in this process."""
    key = idempotency_key(run_id, call_id)
    return sum(1 for name, k in EFFECTS if (name, k) == (tool_name, key))
