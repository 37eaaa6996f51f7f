"""Waits on people through pydantic-ai's own waiter, backed by Onward approvals.

The waiter is ``HandleDeferredToolCalls`` with a handler that takes a resume token (2.78 and
later), ``RequestInput`` before it: the same wait under the name each release gives it.

Needs a pydantic-ai with external-event waits (2.68 and later): the lowest supported release
waits on people through ``DeferredToolRequests`` only (test_durability.py), and the run of the
lowest release leaves this file out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import HandleDeferredToolCalls
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults
from support.stores import Stores

from integrations.pydantic_ai.world import Crash, Faults, Script, durability_on
from onward.eventlog import ApprovalGranted, ApprovalRequested
from onward.integrations.pydantic_ai import OnwardDurability, current_idempotency_key
from onward.runtime.demo_ledger import Ledger

if "timeout" in HandleDeferredToolCalls.__dataclass_fields__:
    TokenWaiter: Any = HandleDeferredToolCalls  # its handler takes the token when it asks for one
else:  # before 2.78 the waiter whose handler takes a token was ``RequestInput``
    from pydantic_ai.capabilities import RequestInput as TokenWaiter

RUN = "r-wait"


class Asker:
    """The waiter's handler: hands the token on (or answers at once), counting calls."""

    def __init__(self, answer: DeferredToolResults | None = None) -> None:
        self.answer = answer
        self.tokens: list[str] = []

    def __call__(
        self, ctx: RunContext[None], requests: DeferredToolRequests, token: str
    ) -> DeferredToolResults | None:
        self.tokens.append(token)
        return self.answer


def asking_agent(
    durability: OnwardDurability[None], ledger: Ledger, asker: Asker, script: Script
) -> Agent[None, str]:
    agent: Agent[None, str] = Agent(
        FunctionModel(script.answer),
        name="asker",
        capabilities=[durability, TokenWaiter(asker)],
    )

    @agent.tool_plain(requires_approval=True)
    async def book(seat: str) -> str:
        """Book a seat."""
        ledger.record("book", current_idempotency_key() or "", seat=seat)
        return f"seat {seat} booked"

    return agent


async def test_a_wait_is_an_onward_approval_and_its_answer_is_acted_on(
    stores: Stores, tmp_path: Path
) -> None:
    durability = durability_on(stores, worker="here")
    ledger, asker, script = Ledger(tmp_path / "ledger.jsonl"), Asker(), Script()

    waiting = await durability.run(
        asking_agent(durability, ledger, asker, script), "go", run_id=RUN
    )

    assert waiting.status == "waiting"
    assert asker.tokens == [waiting.waiting_on]
    assert ledger.entries() == []
    await durability.decide(RUN, DeferredToolResults(approvals={"b1": True}), by="alice")
    done = await durability.resume(asking_agent(durability, ledger, asker, script), RUN)

    assert done.output == "done: seat 3A booked"
    assert asker.tokens == [waiting.waiting_on]  # not asked again
    assert len(ledger.entries()) == 1
    recorded = [s.event for s in await stores.log.read_run(RUN)]
    granted = [e for e in recorded if isinstance(e, ApprovalGranted)]
    assert [(e.request_id, e.by, e.value["approvals"]) for e in granted] == [
        (waiting.waiting_on, "alice", {"b1": True})
    ]


async def test_an_answer_given_at_once_is_recorded_and_replayed(
    stores: Stores, tmp_path: Path
) -> None:
    durability = durability_on(stores, worker="here")
    ledger = Ledger(tmp_path / "ledger.jsonl")
    asker = Asker(DeferredToolResults(approvals={"b1": True}))
    script = Script(faults=Faults({"second_answer"}))

    with pytest.raises(Crash):
        await durability.run(asking_agent(durability, ledger, asker, script), "go", run_id=RUN)
    done = await durability.resume(asking_agent(durability, ledger, asker, script), RUN)

    assert done.output == "done: seat 3A booked"
    assert len(asker.tokens) == 1
    assert len(ledger.entries()) == 1
    recorded = [s.event for s in await stores.log.read_run(RUN)]
    assert [e.request_id for e in recorded if isinstance(e, ApprovalRequested)] == asker.tokens
