"""The one message-part convention the runner and the providers share."""

from __future__ import annotations

import msgspec
import pytest

from onward.eventlog.events import Message, ModelAnswered, RunStarted, ToolCall, ToolCompleted
from onward.eventlog.parts import (
    BinaryPart,
    TextPart,
    ToolCallRef,
    ToolCallsPart,
    assistant_message,
    parts_of,
)
from onward.runtime.conversation import Conversation

CALL = ToolCall(call_id="c1", tool="search", args={"q": "onward"})


def test_an_assistant_message_is_its_text_then_one_tool_calls_part() -> None:
    message = assistant_message("looking", [CALL])
    assert message.content == [
        {"type": "text", "text": "looking"},
        {
            "type": "tool_calls",
            "tool_calls": [{"id": "c1", "name": "search", "arguments": {"q": "onward"}}],
        },
    ]
    assert parts_of(message.content) == [
        TextPart("looking"),
        ToolCallsPart([ToolCallRef("c1", "search", {"q": "onward"})]),
    ]


def test_without_calls_the_text_stays_a_string_and_empty_text_is_dropped() -> None:
    assert assistant_message("done", []) == Message(role="assistant", content="done")
    assert parts_of(assistant_message("", [CALL]).content) == [
        ToolCallsPart([ToolCallRef("c1", "search", {"q": "onward"})])
    ]


def test_binary_parts_survive_the_wire_and_unknown_parts_are_kept_as_given() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.invalid/a.png"}}
    encoded = msgspec.json.encode(
        Message(
            role="user", content=msgspec.to_builtins([BinaryPart(b"\x89PNG", "image/png"), image])
        )
    )
    decoded = msgspec.json.decode(encoded, type=Message)
    assert parts_of(decoded.content) == [BinaryPart(b"\x89PNG", "image/png"), image]


def test_a_part_that_is_not_a_part_is_refused_with_its_index() -> None:
    with pytest.raises(msgspec.ValidationError, match="content part 1 is a int"):
        parts_of(["fine", 7])
    with pytest.raises(msgspec.ValidationError):
        parts_of([{"type": "tool_calls", "tool_calls": "not a list"}])


def test_the_conversation_puts_a_model_answer_back_as_the_providers_read_it() -> None:
    conversation = Conversation.of(
        "be brief",
        [
            RunStarted(
                seq=1, agent="a", revision="x", input={"ask": 1}, run_id="r", tenant="t", fence=1
            ),
            ModelAnswered(
                seq=2,
                message=Message(role="assistant", content="hm"),
                tool_calls=[CALL],
                run_id="r",
                tenant="t",
                fence=1,
            ),
            ToolCompleted(seq=3, call_id="c1", result="found", run_id="r", tenant="t", fence=1),
        ],
    )
    assert [m.role for m in conversation.messages] == ["system", "user", "assistant", "tool"]
    assert conversation.messages[1].content == '{"ask":1}'
    assert conversation.messages[2] == assistant_message("hm", [CALL])
    assert conversation.messages[3] == Message(role="tool", content="found", tool_call_id="c1")
    assert conversation.call_ids == {"c1"}
