"""The agent, model, tool and stores of the pydantic-ai tests, their child process included.

The model is pydantic-ai's `FunctionModel` with a script: its first answer books seat 3A, its
second reports what the tool returned. The tool writes each booking to a `Ledger` file, so a
test counts side effects across processes. ``ONWARD_PYDAI_PAUSE`` names a point where the
process writes ``ONWARD_PYDAI_MARKER`` and stops itself (SIGSTOP) for the test to kill it:
``after_effect`` (the booking is in the ledger, its outcome not yet in the log) or
``second_answer`` (the outcome is in the log, the model is asked again).
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests
from support.crash_world import CRASHED_LEASE
from support.stores import Stores, kafka_stores, sqlite_stores

from onward.integrations.pydantic_ai import (
    OnwardDurability,
    current_fence,
    current_idempotency_key,
    current_lease_expires_at,
)
from onward.runtime.demo_ledger import Ledger

TENANT = "acme"
PAUSE = "ONWARD_PYDAI_PAUSE"
MARKER = "ONWARD_PYDAI_MARKER"


class Crash(BaseException):
    """The process dying at a point, for tests that stay in one process."""


@dataclass
class Faults:
    """Where the run stops: in this process (``crash_at``, once each) or the child's (env)."""

    crash_at: set[str] = field(default_factory=set)

    def reach(self, point: str) -> None:
        if os.environ.get(PAUSE) == point:
            Path(os.environ[MARKER]).write_text(point)
            os.kill(os.getpid(), signal.SIGSTOP)
        if point in self.crash_at:
            self.crash_at.discard(point)
            raise Crash(point)


class Script:
    """The model's answers, counting how often it was really asked."""

    def __init__(
        self, *calls: ToolCallPart, faults: Faults | None = None, preamble: str = "booking"
    ) -> None:
        self.calls = calls or (ToolCallPart("book", {"seat": "3A"}, tool_call_id="b1"),)
        self.faults = faults or Faults()
        self.preamble = preamble
        self.asked = 0

    def answer(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.asked += 1
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[TextPart(self.preamble), *self.calls])
        self.faults.reach("second_answer")
        returned = [
            str(part.content) for part in messages[-1].parts if isinstance(part, ToolReturnPart)
        ]
        return ModelResponse(parts=[TextPart("done: " + "; ".join(returned))])


def booking_agent(
    durability: OnwardDurability[None],
    ledger: Ledger,
    script: Script | None = None,
    *,
    book_options: dict[str, Any] | None = None,
    requires_approval: bool = False,
    leases_seen: list[tuple[int | None, float | None]] | None = None,
) -> Agent[None, str | DeferredToolRequests]:
    """The agent under test: one tool with a side effect, the durability capability.

    ``leases_seen`` gets the fence and lease expiry each call of the tool read.
    """
    script = script or Script()
    model = FunctionModel(script.answer)
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        model,
        name="booker",
        capabilities=[durability],
        output_type=[str, DeferredToolRequests],
    )

    @agent.tool_plain(
        metadata={"onward": book_options} if book_options else None,
        requires_approval=requires_approval,
    )
    async def book(seat: str) -> str:
        """Book a seat."""
        if leases_seen is not None:
            leases_seen.append((current_fence(), current_lease_expires_at()))
        ledger.record("book", current_idempotency_key() or "", seat=seat)
        script.faults.reach("after_effect")
        return f"seat {seat} booked"

    return agent


@asynccontextmanager
async def open_stores(config: dict[str, str]) -> AsyncIterator[Stores]:
    """The stores a config names: ``backend`` sqlite (``db``) or kafka (servers, places)."""
    if config["backend"] == "sqlite":
        async with sqlite_stores(Path(config["db"])) as stores:
            yield stores
        return
    async with kafka_stores(
        config["bootstrap"],
        config["topic"],
        config["database_url"],
        config["schema"],
        config["redis_url"],
        config["prefix"],
    ) as stores:
        yield stores


def durability_on(stores: Stores, *, worker: str, **options: Any) -> OnwardDurability[None]:
    """The capability on the given stores."""
    return OnwardDurability(
        log=stores.log,
        tenant=TENANT,
        leases=stores.leases,
        frontiers=stores.frontiers,
        checkpoint_inline=stores.embedded,
        worker=worker,
        **options,
    )


__all__ = [
    "CRASHED_LEASE",
    "TENANT",
    "Crash",
    "Faults",
    "Script",
    "booking_agent",
    "durability_on",
    "open_stores",
]
