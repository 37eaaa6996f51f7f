"""The conversation a run's model sees, rebuilt from the run's counted events.

The log holds every fact of a run, so the conversation is derived, never stored on its own: the
system prompt, the run's input, each model answer (with the tool calls it asked for as a
tool-calls part) and each call's outcome, recorded or settled. The runner keeps one in step with
every append; resume rebuilds one from the events `Resumer` read.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from onward.eventlog.events import (
    Event,
    Message,
    ModelAnswered,
    RunStarted,
    ToolCompleted,
    ToolResolved,
)

from .parts import assistant_message


class Conversation:
    """The messages of a run, in the order the model saw them, and the call ids used so far.

    Args:
        instructions: The agent's system prompt, always the first message.
    """

    def __init__(self, instructions: str) -> None:
        self.messages: list[Message] = [Message(role="system", content=instructions)]
        self.call_ids: set[str] = set()

    @classmethod
    def of(cls, instructions: str, events: Iterable[Event]) -> Conversation:
        """The conversation of a run whose counted events, in order, are ``events``."""
        conversation = cls(instructions)
        for event in events:
            conversation.remember(event)
        return conversation

    def remember(self, event: Event) -> None:
        """Keep the conversation in step with one more counted event of the run."""
        if isinstance(event, RunStarted):
            self.messages.append(Message(role="user", content=as_text(event.input)))
        elif isinstance(event, ModelAnswered):
            self.messages.append(assistant_message(event.message.content, event.tool_calls))
            self.call_ids.update(c.call_id for c in event.tool_calls)
        elif isinstance(event, ToolCompleted):
            body = (
                event.result if event.error is None else {"error": msgspec.to_builtins(event.error)}
            )
            self._answer(event.call_id, body)
        elif isinstance(event, ToolResolved) and event.outcome == "completed":
            self._answer(event.call_id, event.result)

    def _answer(self, call_id: str, body: Any) -> None:
        self.messages.append(Message(role="tool", content=as_text(body), tool_call_id=call_id))


def as_text(value: Any) -> str:
    """A value as the model reads it: strings as they are, anything else as JSON."""
    if isinstance(value, str):
        return value
    return msgspec.json.encode(value).decode()
