"""Realistic run histories for the benchmarks: the envelope and the model turns they share.

A turn is what a runner appends for one model answer: the answer with one to three tool calls,
each call's dispatch and result, and the settled turn; a few hundred bytes per event.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
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
