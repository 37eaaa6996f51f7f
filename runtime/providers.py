"""Model providers: the `Provider` protocol and the deterministic `ScriptedProvider`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import msgspec

from onward.errors import ConfigurationError, InvalidInputError
from onward.eventlog.events import Message, ToolCall, Usage

from .agent import Agent


class ModelReply(msgspec.Struct, frozen=True, kw_only=True):
    """What a model answered: a message and the tool calls it asks for."""

    message: Message
    tool_calls: list[ToolCall] = []
    usage: Usage = Usage()

    @property
    def final(self) -> bool:
        """The model asked for nothing more: its message is the run's output."""
        return not self.tool_calls


@runtime_checkable
class Provider(Protocol):
    """A chat model."""

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        """Answer the conversation so far (system prompt first)."""
        ...


Script = Callable[[Sequence[Message]], ModelReply]


class ScriptedProvider:
    """A deterministic model for tests, benchmarks and the demo.

    Either a list of replies given in order (the nth model call of a run gets the nth reply,
    counted from the conversation, so a resumed run gets the same reply it would have), or a
    function of the conversation.
    """

    def __init__(self, replies: Sequence[ModelReply] | Script) -> None:
        self._replies = replies
        self.calls = 0

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        self.calls += 1
        if callable(self._replies):
            return self._replies(messages)
        turn = sum(1 for m in messages if m.role == "assistant")
        if turn >= len(self._replies):
            raise InvalidInputError(
                f"scripted provider has {len(self._replies)} replies; the conversation asks for "
                f"reply {turn + 1}"
            )
        return self._replies[turn]


class NoModel:
    """The provider of a runner that must never reach a model: one that only reads runs or
    records what a person did (an answer, a cancel, a tag). A model call from it would be a
    bug, so it fails loudly, saying ``why``, instead of spending tokens."""

    def __init__(self, why: str = "this runner records what people do; it calls no model") -> None:
        self._why = why

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        raise ConfigurationError(self._why)


def reply(
    text: str = "", *calls: ToolCall, input_tokens: int = 10, output_tokens: int = 5
) -> ModelReply:
    """A scripted reply: text, then the tool calls it asks for."""
    return ModelReply(
        message=Message(role="assistant", content=text),
        tool_calls=list(calls),
        usage=Usage(input_tokens=input_tokens, output_tokens=output_tokens),
    )
