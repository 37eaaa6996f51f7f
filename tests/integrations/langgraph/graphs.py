"""A tiny graph for the saver's tests: each invocation appends who ran it to a list."""

from __future__ import annotations

import operator
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph


class Steps(TypedDict):
    steps: Annotated[list[str], operator.add]


def steps_graph(
    who: str,
    checkpointer: BaseCheckpointSaver[Any],
    *,
    inside: Callable[[], Awaitable[object]] | None = None,
) -> CompiledStateGraph[Any]:
    """A graph whose one node appends ``who`` to ``steps``, after awaiting ``inside`` if given."""

    def step(state: Steps) -> dict[str, list[str]]:
        return {"steps": [who]}

    async def step_inside(state: Steps) -> dict[str, list[str]]:
        if inside is not None:
            await inside()
        return step(state)

    builder = StateGraph(Steps)
    builder.add_node("step", step if inside is None else step_inside)
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    return builder.compile(checkpointer=checkpointer)


def config(thread_id: str) -> RunnableConfig:
    """The invocation config of a thread."""
    return {"configurable": {"thread_id": thread_id}}
