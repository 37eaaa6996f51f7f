"""Realistic run histories for the benchmarks: the envelope and the model turns they share, and
the model that stops a resume at its first call (what resume timings end on).

A turn is what a runner appends for one model answer: the answer with one to three tool calls,
each call's dispatch and result, and the settled turn; a few hundred bytes per event.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Sequence
from typing import Any

from _common import text

from onward.eventlog import (
    Event,
    Message,
    ModelAnswered,
    ToolCall,
    ToolCompleted,
    ToolDispatched,
    TurnSettled,
    Usage,
)
from onward.runtime.agent import Agent
from onward.runtime.providers import ModelReply, reply
from onward.runtime.tools import tool


class RunHistory:
    """One run's events as they are generated: the seq and a clock advancing by random steps."""

    def __init__(self, rng: random.Random, run_id: str, *, tenant: str, fence: int = 1) -> None:
        self.rng = rng
        self.run_id = run_id
        self.tenant = tenant
        self.fence = fence
        self.seq = 0
        self.at = 1_700_000_000_000_000 + rng.randint(0, 10**9)

    def _env(self) -> dict[str, Any]:
        self.seq += 1
        self.at += self.rng.randint(200, 900_000)
        return {
            "run_id": self.run_id,
            "tenant": self.tenant,
            "seq": self.seq,
            "fence": self.fence,
            "at": self.at,
        }

    def turn(self, iteration: int, budget: int) -> Iterator[list[Event]]:
        """One turn of at most ``budget`` events (at least 4), as the steps a runner appends.

        Lazily: each step draws from ``rng`` only when it is asked for, as the runs of a
        workload take turns on one random source.
        """
        rng = self.rng
        width = min(rng.randint(1, 3), (budget - 2) // 2)
        calls = [
            ToolCall(
                call_id=f"c{iteration}-{n}",
                tool=rng.choice(["search", "book", "pay", "lookup"]),
                args={"q": text(rng, 10, 90), "limit": rng.randint(1, 20)},
                idempotency_key=f"{self.run_id}:c{iteration}-{n}",
            )
            for n in range(width)
        ]
        yield [
            ModelAnswered(
                **self._env(),
                message=Message(role="assistant", content=text(rng, 20, 160)),
                tool_calls=calls,
                usage=Usage(input_tokens=rng.randint(200, 4000), output_tokens=rng.randint(5, 300)),
            )
        ]
        for call in calls:
            yield [
                ToolDispatched(
                    **self._env(),
                    call_id=call.call_id,
                    tool=call.tool,
                    idempotency_key=call.idempotency_key,
                )
            ]
            yield [
                ToolCompleted(
                    **self._env(),
                    call_id=call.call_id,
                    result={"ok": True, "items": text(rng, 40, 200)},
                )
            ]
        yield [TurnSettled(**self._env(), iteration=iteration, call_ids=[c.call_id for c in calls])]


class FirstCall(BaseException):
    """The model was called: the resume is over (what is timed ends here)."""


class Stopwatch:
    """A provider that notes when it is first called and stops the run there.

    Until ``armed``, it answers with a call of the ``search`` tool (building a run's history).
    """

    def __init__(self, turns: int = 0) -> None:
        self.turns = turns
        self.called_at = 0.0

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        if self.turns > 0:
            self.turns -= 1
            n = sum(m.role == "assistant" for m in messages) + 1
            return reply(f"looking {n}", ToolCall(call_id=f"c{n}", tool="search", args={"q": n}))
        self.called_at = time.perf_counter()
        raise FirstCall


@tool
async def search(q: int, *, idempotency_key: str) -> str:
    """A tool whose answer is a few hundred bytes."""
    return f"result {q}: " + "lorem ipsum dolor sit amet " * 12
