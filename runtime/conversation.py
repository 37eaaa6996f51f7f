"""The conversation a run's model sees, rebuilt from the run's transcript and counted events.

The log holds every fact of a run, so the conversation is derived, never written on its own:
the system prompt, the run's input, each model answer (with the tool calls it asked for as a
tool-calls part) and each call's outcome, recorded or settled (`message_of`). The runner keeps
one in step with every append; resume rebuilds one from the run's transcript (the messages the
projector stored, up to the frontier row's handle) and the events of the tail after it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from onward.errors import HistoryUnavailableError
from onward.eventlog.events import Event, Message, ModelAnswered
from onward.eventlog.parts import ToolCallRef, ToolCallsPart, parts_of
from onward.projections.transcript import (
    BLOB_REF,
    LoggedMessage,
    TranscriptRow,
    as_text,
    is_escaped,
    is_reference,
    message_of,
    unescaped,
)

from .blobs import ClaimCheck


class Conversation:
    """The messages of a run, in the order the model saw them, and the call ids used so far.

    Args:
        instructions: The agent's system prompt, always the first message.
    """

    def __init__(self, instructions: str) -> None:
        self.messages: list[Message] = [Message(role="system", content=instructions)]
        self.call_ids: set[str] = set()
        self._sized = 1  # messages counted in _own_bytes, or inherited, or the system prompt
        self._own_bytes = 0

    @classmethod
    def of(cls, instructions: str, events: Iterable[Event]) -> Conversation:
        """The conversation of a run whose counted events, in order, are ``events``."""
        conversation = cls(instructions)
        for event in events:
            conversation.remember(event)
        return conversation

    def remember(self, event: Event) -> None:
        """Keep the conversation in step with one more counted event of the run."""
        message = message_of(event)
        if message is not None:
            self.messages.append(message)
        if isinstance(event, ModelAnswered):
            self.call_ids.update(c.call_id for c in event.tool_calls)

    def recall(self, message: Message) -> None:
        """Add a message of the run's transcript (its bodies restored), in order."""
        self.messages.append(message)
        if message.role == "assistant" and isinstance(message.content, list):
            for part in message.content:
                if isinstance(part, dict) and part.get("type") == "tool_calls":
                    calls = msgspec.convert(part, ToolCallsPart).tool_calls
                    self.call_ids.update(call.id for call in calls)

    def inherit(self, message: Message) -> None:
        """Add a message of a run this one was carried on from (its bodies restored), in order,
        before any of this run's own."""
        self.recall(message)
        self._sized = len(self.messages)

    def own_bytes(self) -> int:
        """The bytes of this run's own messages, as JSON; inherited ones do not count."""
        fresh = self.messages[self._sized :]
        self._own_bytes += sum(len(_encoder.encode(m)) for m in fresh)
        self._sized = len(self.messages)
        return self._own_bytes


_encoder = msgspec.json.Encoder()


async def restored(row: TranscriptRow, claim_check: ClaimCheck | None) -> Message:
    """A transcript message with a claim-checked body put back, as the model saw it.

    Raises:
        HistoryUnavailableError: The body is not in the blob store, or no blob store is
            configured to read it from.
    """
    message = row.message
    if isinstance(message, LoggedMessage) and message.as_logged:
        said = message.content
        if len(said) == 1 and is_escaped(said[0]):
            # A final answer's one part shaped like a reference: the model's, never fetched.
            return Message(role=message.role, content=[unescaped(said[0])])
        message = await _calls_given(row, message, claim_check)
    content = message.content
    if not (isinstance(content, list) and content and is_reference(content[0])):
        return message
    if claim_check is None:
        raise HistoryUnavailableError(
            f"run {row.run_id!r} seq {row.seq}: its body is in a blob store "
            f"({content[0][BLOB_REF]}) and this runner has none; configure blobs=",
            run_id=row.run_id,
        )
    body = msgspec.json.decode(
        await claim_check.body(content[0][BLOB_REF], run_id=row.run_id, seq=row.seq)
    )
    # The body was moved out as written: a look-alike wrapped (`escape_bodies` runs first).
    if message.role != "assistant":
        return msgspec.structs.replace(message, content=as_text(unescaped(body)))
    said = msgspec.convert(body, Message).content
    if isinstance(said, list) and len(said) == 1:
        said = [unescaped(said[0])]
    rest = content[1:]
    if not rest:
        return msgspec.structs.replace(message, content=said)
    parts: list[Any] = [] if said == "" else msgspec.to_builtins(parts_of(said))
    return msgspec.structs.replace(message, content=[*parts, *rest])


async def _calls_given(
    row: TranscriptRow, message: LoggedMessage, claim_check: ClaimCheck | None
) -> Message:
    """A model answer with its calls' arguments as the model gave them: fetched if the claim
    check moved them out of line, unwrapped if they only looked like a reference. Only a row
    that says it holds them as the log does (`LoggedMessage`) is read so; in an earlier row a
    look-alike was stored unwrapped, like a reference, and its arguments are read as stored.
    """
    content = list(message.content)
    part = msgspec.convert(content[-1], ToolCallsPart)
    calls = [
        msgspec.structs.replace(call, arguments=await _arguments(call, row, claim_check))
        for call in part.tool_calls
    ]
    content[-1] = msgspec.to_builtins(ToolCallsPart(calls))
    return Message(role=message.role, content=content, tool_call_id=message.tool_call_id)


async def _arguments(
    call: ToolCallRef, row: TranscriptRow, claim_check: ClaimCheck | None
) -> dict[str, Any] | str:
    """One call's arguments of a `LoggedMessage`, as the model gave them."""
    args = call.arguments
    if not isinstance(args, dict):
        return args
    if claim_check is not None:
        return await claim_check.arguments(args, run_id=row.run_id, seq=row.seq)
    if is_reference(args):
        raise HistoryUnavailableError(
            f"run {row.run_id!r} seq {row.seq}: the arguments of {call.id} are in a blob store "
            f"({args[BLOB_REF]}) and this runner has none; configure blobs=",
            run_id=row.run_id,
        )
    return unescaped(args)  # type: ignore[no-any-return]


__all__ = ["Conversation", "as_text", "restored"]
