"""The process the tool middleware's crash tests kill: one graph run that books a flight.

``python -m integrations.langgraph.tool_child WORLD_JSON THREAD_ID KIND LEDGER STOP_AT TTL_S``
runs the ``KIND`` graph (``agent`` or ``toolnode``) of `agents` once on the thread. The model
asks for ``book``; the tool appends to ``LEDGER``. With ``STOP_AT`` ``effect`` the process
prints ``effect`` and stops itself (SIGSTOP) right after the side effect, before its outcome is
recorded; with ``outcome``, right after the outcome is recorded, before LangGraph saves the
task's result. The test SIGKILLs it there. The thread's lease has the given ttl. Without
arguments it reads them as one JSON list on stdin, once its imports are done: a test can start
it ahead of the kill that will use it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import cast

from langchain_core.messages import AIMessage, HumanMessage

from .agents import (
    GraphKind,
    StopAfterOutcome,
    asks_to_book,
    booking_tool,
    graph,
    model,
    stop_here,
    thread_config,
)
from .worlds import open_world


async def main(
    world_spec: str, thread_id: str, kind: str, ledger: Path, stop_at: str, ttl_s: float
) -> None:
    after_effect = (lambda: stop_here("effect")) if stop_at == "effect" else None
    tool = booking_tool(ledger, after_effect=after_effect)
    chat = model(asks_to_book(), AIMessage(content="done"))
    outer = StopAfterOutcome() if stop_at == "outcome" else None
    async with (
        open_world(json.loads(world_spec)) as world,
        world.saver(holder="doomed", ttl_s=ttl_s, renew_within_s=ttl_s / 5) as saver,
    ):
        run = graph(cast(GraphKind, kind), saver, chat, tool, outer=outer)
        # durability="sync": the checkpoint before the tools step is saved before it starts,
        # so the kill finds the model's answer saved whatever the scheduling.
        await run.ainvoke(
            {"messages": [HumanMessage(content="book me a seat")]},
            thread_config(thread_id),
            durability="sync",
        )
    print("finished", flush=True)  # the test fails on this: the process should not get here


if __name__ == "__main__":
    args: list[str] = sys.argv[1:] or json.loads(sys.stdin.readline())
    asyncio.run(main(args[0], args[1], args[2], Path(args[3]), args[4], float(args[5])))
