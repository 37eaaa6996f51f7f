"""An agent whose tool asks a person questions from its code (`onward.ask`), for the ask tests.

``refund`` asks how much to refund (an int) and, above 100, who signs it off; it records in the
ledger each time its code starts (``started``), each answer it got (``answered``) and the
refund itself (``refund``, its side effect), so a test sees what ran how often.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from onward.eventlog import ToolCall
from onward.runtime.agent import Agent
from onward.runtime.ask import ask
from onward.runtime.demo_ledger import Ledger
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.tools import Tool, tool


class SignOff(BaseModel):
    """Who signs a large refund off."""

    by: str
    ticket: int


def refund_tools(ledger: Ledger) -> list[Tool]:
    @tool
    async def refund(order: str, *, idempotency_key: str) -> dict[str, Any]:
        """Refund an order; a person says how much."""
        ledger.record("started", idempotency_key, order=order)
        amount = ask(f"refund how much for {order}?", schema=int)
        ledger.record("answered", idempotency_key, amount=amount)
        signed: SignOff | None = None
        if amount > 100:
            signed = ask(f"who signs off a refund of {amount}?", schema=SignOff)
            ledger.record("signed", idempotency_key, by=signed.by, ticket=signed.ticket)
        ledger.record("refund", idempotency_key, order=order, amount=amount)
        return {"refunded": amount, "signed_by": signed.by if signed else None}

    return [refund]


def refund_agent(ledger: Ledger) -> Agent:
    return Agent(name="refunder", instructions="refund", tools=refund_tools(ledger))


def refund_provider() -> ScriptedProvider:
    """A model that asks for one refund, then says it is done."""
    asked = ToolCall(call_id="r", tool="refund", args={"order": "A-1"})
    return ScriptedProvider([reply("refunding", asked), reply("done")])
