"""The parts of a message's content; defined with the event model in `onward.eventlog.parts`.

They live beside `Message` because the projector, which derives a run's transcript from its
events, builds assistant messages with them too, and it sits below the runtime.
"""

from onward.eventlog.parts import (
    BinaryPart,
    Part,
    TextPart,
    ToolCallRef,
    ToolCallsPart,
    assistant_message,
    parts_of,
)

__all__ = [
    "BinaryPart",
    "Part",
    "TextPart",
    "ToolCallRef",
    "ToolCallsPart",
    "assistant_message",
    "parts_of",
]
