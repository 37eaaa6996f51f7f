"""The graphs of the tool middleware's tests: a ``create_agent`` agent and a hand-built
model/``ToolNode`` loop, both with one tool, ``book``, whose side effect is a line in a ledger.

The model is LangChain's own scripted fake chat model: it answers with the messages it is
given, in order, whatever it is asked.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from onward.integrations.langgraph import OnwardSaver, OnwardToolMiddleware

GraphKind = Literal["agent", "toolnode"]
GRAPH_KINDS: tuple[GraphKind, ...] = ("agent", "toolnode")
CALL_ID = "call-1"
FLIGHT = "LH123"
Handler = Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]]


class ScriptedChat(GenericFakeChatModel):
    """The fake chat model, told about tools it will never choose itself."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChat:
        return self


def asks_to_book() -> AIMessage:
    """The model's first answer: one call of ``book``."""
    return AIMessage(
        content="", tool_calls=[{"name": "book", "args": {"flight": FLIGHT}, "id": CALL_ID}]
    )


def model(*answers: AIMessage) -> ScriptedChat:
    """A model that gives these answers, one per call."""
    script: Iterator[AIMessage | str] = iter(answers)
    return ScriptedChat(messages=script)


def ledger_lines(ledger: Path) -> list[str]:
    """One line per booking the tool made."""
    return ledger.read_text().splitlines() if ledger.exists() else []


def booking_tool(ledger: Path, *, after_effect: Callable[[], None] | None = None) -> BaseTool:
    """``book(flight)``: appends a line to ``ledger`` (the side effect), then ``after_effect``."""

    def book(flight: str) -> str:
        """Book a seat on a flight."""
        with ledger.open("a") as out:
            out.write(f"{flight}\n")
        if after_effect is not None:
            after_effect()
        return f"booked {flight}"

    async def book_async(flight: str) -> str:
        return book(flight)

    return as_book(book, book_async)


def as_book(
    book: Callable[[str], str], book_async: Callable[[str], Awaitable[str]] | None = None
) -> BaseTool:
    """A ``book(flight)`` tool from these functions."""
    return StructuredTool.from_function(
        func=book, coroutine=book_async, name="book", description="Book a seat on a flight."
    )


def stop_here(said: str) -> None:
    """Say where, then stop this process (SIGSTOP) for the test to SIGKILL it."""
    print(said, flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)


class StopAfterOutcome(AgentMiddleware[Any, Any, Any]):
    """Outside Onward's middleware: stops the process once the tool's outcome is recorded,
    before LangGraph saves the task's writes."""

    async def awrap_tool_call(self, request: ToolCallRequest, handler: Handler) -> Any:
        output = await handler(request)
        stop_here("outcome")
        return output


def graph(
    kind: GraphKind,
    saver: OnwardSaver,
    chat: ScriptedChat,
    tool: BaseTool,
    *,
    outer: AgentMiddleware[Any, Any, Any] | None = None,
    retry_safe: Sequence[str] = (),
) -> CompiledStateGraph[Any]:
    """The agent (``create_agent``) or the hand-built loop, its tools under Onward's middleware
    (with ``outer`` around it, if given) and its checkpoints in ``saver``."""
    onward = OnwardToolMiddleware(saver, retry_safe=retry_safe)
    if kind == "agent":
        middleware = [outer, onward] if outer is not None else [onward]
        agent: CompiledStateGraph[Any] = create_agent(
            chat, [tool], middleware=middleware, checkpointer=saver
        )
        return agent
    return _tool_loop(saver, chat, tool, onward, outer)


def _tool_loop(
    saver: OnwardSaver,
    chat: ScriptedChat,
    tool: BaseTool,
    onward: OnwardToolMiddleware,
    outer: AgentMiddleware[Any, Any, Any] | None,
) -> CompiledStateGraph[Any]:
    async def wrapped(request: ToolCallRequest, execute: Handler) -> ToolMessage | Command[Any]:
        if outer is None:
            return await onward.awrap_tool_call(request, execute)

        async def inner(req: ToolCallRequest) -> ToolMessage | Command[Any]:
            return await onward.awrap_tool_call(req, execute)

        output: ToolMessage | Command[Any] = await outer.awrap_tool_call(request, inner)
        return output

    def answer(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [chat.invoke(state["messages"])]}

    async def answer_async(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await chat.ainvoke(state["messages"])]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    builder = StateGraph(MessagesState)
    builder.add_node("model", RunnableLambda(answer, afunc=answer_async))
    builder.add_node(
        "tools", ToolNode([tool], wrap_tool_call=onward.wrap_tool_call, awrap_tool_call=wrapped)
    )
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", route, ["tools", END])
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=saver)


def thread_config(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id}}
