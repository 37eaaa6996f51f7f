"""The parts of a message's content: text, the tool calls an assistant asked for, binary data.

A `Message`'s ``content`` is a string or a list of parts. On the wire (and so in the log) a part
is a plain JSON object with a ``type``; here each known type is a tagged msgspec Struct, so the
runner that builds the conversation and the providers that send it read one convention:

* ``{"type": "text", "text": ...}`` (a bare string in the list counts as text too);
* ``{"type": "tool_calls", "tool_calls": [{"id", "name", "arguments"}]}``, which only an
  assistant message carries, after its text;
* ``{"type": "binary", "data": <base64>, "media_type": ...}``.

A part of another type (an image URL, say) is kept as the dict it is, for the provider to pass on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from .events import Message, ToolCall


class TextPart(msgspec.Struct, frozen=True, tag_field="type", tag="text"):
    """Text."""

    text: str


class ToolCallRef(msgspec.Struct, frozen=True):
    """One call inside a tool-calls part: the model's call id, the tool, its arguments."""

    id: str
    name: str
    arguments: dict[str, Any] | str = {}


class ToolCallsPart(msgspec.Struct, frozen=True, tag_field="type", tag="tool_calls"):
    """The calls an assistant message asked for."""

    tool_calls: list[ToolCallRef]


class BinaryPart(msgspec.Struct, frozen=True, tag_field="type", tag="binary"):
    """Bytes with their media type (an image, a file). Never redacted, never trimmed."""

    data: bytes
    media_type: str = "application/octet-stream"


Part = TextPart | ToolCallsPart | BinaryPart
"""A part of a known type."""

_KNOWN: dict[str, type[Part]] = {
    "text": TextPart,
    "tool_calls": ToolCallsPart,
    "binary": BinaryPart,
}


def parts_of(content: str | Sequence[Any]) -> list[Part | dict[str, Any]]:
    """A message's content as parts: known types as Structs, other dicts as they are.

    Raises:
        msgspec.ValidationError: A part of a known type has the wrong shape, or a part is
            neither a string nor a dict with a string ``type``.
    """
    if isinstance(content, str):
        return [TextPart(content)]
    found: list[Part | dict[str, Any]] = []
    for index, part in enumerate(content):
        if isinstance(part, str):
            found.append(TextPart(part))
        elif isinstance(part, TextPart | ToolCallsPart | BinaryPart):
            found.append(part)
        elif isinstance(part, dict) and isinstance(part.get("type"), str):
            known = _KNOWN.get(part["type"])
            found.append(part if known is None else msgspec.convert(part, known))
        else:
            raise msgspec.ValidationError(
                f"content part {index} is a {type(part).__name__}; a part is a string or an "
                "object with a string 'type'"
            )
    return found


def assistant_message(text: str | Sequence[Any], tool_calls: Sequence[ToolCall]) -> Message:
    """The assistant message a reply leaves in the conversation.

    Args:
        text: What the model said: a string, or parts already.
        tool_calls: The calls it asked for; they follow the text as one tool-calls part.

    Returns:
        The text alone when there are no calls, else the text's parts (empty text dropped)
        followed by the tool-calls part.
    """
    if not tool_calls:
        return Message(role="assistant", content=text if isinstance(text, str) else list(text))
    parts: list[Any] = [] if text == "" else parts_of(text)
    parts.append(
        ToolCallsPart(
            [ToolCallRef(call.call_id, call.tool, dict(call.args)) for call in tool_calls]
        )
    )
    return Message(role="assistant", content=msgspec.to_builtins(parts))


__all__ = [
    "BinaryPart",
    "Part",
    "TextPart",
    "ToolCallRef",
    "ToolCallsPart",
    "assistant_message",
    "parts_of",
]
