"""A run's transcript: each message of the conversation stored once, keyed by the seq it came from.

The conversation a run's model sees is derived from the run's counted events: the run's input
(``RunStarted``; a run carried on from another has none: its conversation starts from the
transcripts its ``RunStarted.carried`` names), each model answer with the calls it asked for
(``ModelAnswered``), each call's outcome, recorded (``ToolCompleted``) or settled by a person or
a status check (``ToolResolved`` as completed), and a person's answer at a collaborative
checkpoint after a settled turn (``ApprovalGranted`` of a checkpoint request, with a value: the
model reads it as a user message before its next call). Every other event adds nothing to it.
:func:`message_of` is that derivation, the one the runner's `Conversation` uses; the projector
stores it as :func:`stored_message_of` gives it.

The projector (and the embedded fold) appends each message to the transcript of its store in
the same transaction as the run's frontier row, and the frontier counts them
(``Frontier.messages``), so the row is a handle: the transcript holds ``messages`` rows of the
run through ``last_seq``. A reader that finds fewer has a hole in the run's history.

A claim-checked body stays a reference here, as in the log: the message's content is then a
list whose first part is the reference (``{"$blob": digest, "size": n}``), followed, for an
assistant message, by its tool-calls part. The runtime's reader puts the body back.

A model answer whose calls' arguments were moved out of line, or merely look like a reference
(or its wrapping), is stored as a `LoggedMessage` (`stored_message_of`): its tool-calls part
holds each call's arguments as the log does, a reference the claim check made or a look-alike
still wrapped (`escaped`), so the reader fetches the one and unwraps the other; so is a final
answer whose one part looks like one. Rows written before it hold the look-alikes unwrapped,
as like a reference as the real ones: their arguments are read as they are, never fetched.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import msgspec
import zstandard

from onward.eventlog.events import (
    ApprovalGranted,
    Event,
    Message,
    ModelAnswered,
    RunStarted,
    ToolCompleted,
    ToolResolved,
)
from onward.eventlog.parts import ToolCallRef, ToolCallsPart, assistant_message
from onward.eventlog.references import (
    BLOB_REF,
    LITERAL,
    escaped,
    is_escaped,
    is_reference,
    unescaped,
)

CHECKPOINT_REQUEST = "onward.checkpoint:"
"""How the request id of a collaborative checkpoint starts: ``onward.checkpoint:<boundary>:<seq>``,
the boundary a run paused at and the seq of its boundary event."""

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Message)

COMPRESS_OVER = 128
"""Messages stored compressed are those whose JSON is longer than this many bytes: a shorter one
gains little or nothing over a zstd frame's own header, while a model's answer asking for one
tool call (about 150 bytes) is a fifth shorter compressed."""

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
"""How a zstd frame starts; JSON never does (it starts with ``{``), so a stored message says
which it is."""

_codecs = threading.local()
"""A zstd compressor and decompressor per thread (reused: making one costs more than a
message's compression; neither may be used by two threads at once)."""


def _compressor() -> zstandard.ZstdCompressor:
    made: zstandard.ZstdCompressor | None = getattr(_codecs, "compressor", None)
    if made is None:
        made = _codecs.compressor = zstandard.ZstdCompressor(level=1)
    return made


def _decompressor() -> zstandard.ZstdDecompressor:
    made: zstandard.ZstdDecompressor | None = getattr(_codecs, "decompressor", None)
    if made is None:
        made = _codecs.decompressor = zstandard.ZstdDecompressor()
    return made


class LoggedMessage(Message, frozen=True, kw_only=True, gc=False):
    """A model answer as the transcript keeps it when a body of it is not as the model gave it
    (`stored_message_of`); the runtime's reader puts the bodies back.

    Attributes:
        as_logged: Its bodies are as the log holds them: the tool-calls part (its last part,
            when it asked for calls) holds each call's arguments as a claim-check reference
            or, a look-alike, wrapped (`escaped`); a final answer's lone part shaped like a
            reference is wrapped. Only the transcript's writer sets it; a model cannot (it is
            not in ``content``).
    """

    as_logged: bool = False


_LOGGED_KEY = b'"as_logged"'
"""How a stored body that may be a `LoggedMessage` is told apart without decoding it twice."""

_logged_decoder = msgspec.json.Decoder(LoggedMessage)


class TranscriptRow(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One message of a run's transcript, keyed by the seq of the event it came from."""

    tenant: str
    run_id: str
    seq: int
    message: Message

    def encoded(self, *, compressed: bool = False) -> bytes:
        """The message as stored: msgspec JSON or, ``compressed`` and longer than
        `COMPRESS_OVER`, a zstd frame of it when that is shorter. The SQL stores keep it
        compressed (a tool result is most of a step's bytes and was already written to the
        log); Redis keeps text, so it asks for JSON."""
        body = _encoder.encode(self.message)
        if compressed and len(body) > COMPRESS_OVER:
            frame = _compressor().compress(body)
            if len(frame) < len(body):
                return frame
        return body


_COMPRESS_APART_OVER = 16
"""Most bodies compressed on the caller's thread by `encoded_chunks`; more go to a worker."""


class _Said(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One message of a chunk, as stored: ``[seq, message]``."""

    seq: int
    message: Message


_chunk_decoder = msgspec.json.Decoder(list[_Said])


class _LoggedSaid(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One message of a chunk holding a `LoggedMessage`, as stored: ``[seq, message]``."""

    seq: int
    message: LoggedMessage


_logged_chunk_decoder = msgspec.json.Decoder(list[_LoggedSaid])


def _plain(message: LoggedMessage) -> Message:
    """A decoded message as written: a `LoggedMessage` only if its writer marked it one."""
    if message.as_logged:
        return message
    return Message(role=message.role, content=message.content, tool_call_id=message.tool_call_id)


async def encoded_chunks(chunks: Sequence[Sequence[TranscriptRow]]) -> list[bytes]:
    """Each chunk's body as stored, for many chunks at once (a projector's store).

    A chunk is messages of one run, in seq order. One message is stored as
    ``encoded(compressed=True)`` would (what rows of one message always were); several as a
    JSON array of ``[seq, message]`` pairs, compressed together when longer than
    `COMPRESS_OVER` and shorter for it: the row, its key and the frame are paid once per chunk,
    not once per message, and the messages' common JSON compresses across them.

    Compressing costs a few microseconds a message, most of what storing it costs the
    projector. Many bodies are compressed in a worker thread by one call that holds no
    interpreter lock, so the event loop folds the next batch on another core meanwhile (one
    call per body from a thread would queue for the lock after each)."""
    bodies = [
        _encoder.encode(chunk[0].message)
        if len(chunk) == 1
        else _encoder.encode([_Said(row.seq, row.message) for row in chunk])
        for chunk in chunks
    ]
    long = [n for n, body in enumerate(bodies) if len(body) > COMPRESS_OVER]
    if not long:
        return bodies
    inputs: list[bytes | bytearray | memoryview] = [bodies[n] for n in long]
    if len(inputs) > _COMPRESS_APART_OVER:
        frames = await asyncio.to_thread(_compressed_all, inputs)
    else:
        frames = _compressed_all(inputs)
    for n, frame in zip(long, frames, strict=True):
        if len(frame) < len(bodies[n]):
            bodies[n] = frame
    return bodies


def _compressed_all(bodies: list[bytes | bytearray | memoryview]) -> list[bytes]:
    frames = _compressor().multi_compress_to_buffer(bodies)
    return [frames[n].tobytes() for n in range(len(bodies))]


def decode_message(body: bytes) -> Message:
    """A stored message, JSON or a zstd frame of it."""
    if body[:4] == _ZSTD_MAGIC:
        body = _decompressor().decompress(body)
    if _LOGGED_KEY in body:
        return _plain(_logged_decoder.decode(body))
    return _decoder.decode(body)


def decode_chunk(body: bytes) -> list[tuple[int, Message]]:
    """The ``(seq, message)`` pairs of a chunk stored by `encoded_chunks` with more than one
    message, JSON or a zstd frame of it."""
    if body[:4] == _ZSTD_MAGIC:
        body = _decompressor().decompress(body)
    if _LOGGED_KEY in body:
        return [(said.seq, _plain(said.message)) for said in _logged_chunk_decoder.decode(body)]
    return [(said.seq, said.message) for said in _chunk_decoder.decode(body)]


def checkpoint_request(boundary: str, seq: int) -> str:
    """The request id a collaborative run waits on after the boundary event ``seq``."""
    return f"{CHECKPOINT_REQUEST}{boundary}:{seq}"


def checkpoint_of(request_id: str) -> tuple[str, int] | None:
    """The boundary and seq of a checkpoint request id; ``None`` for any other request.

    Only ASCII digits a seq can hold are read as one: `str.isdigit` also takes superscripts
    and other digits `int` refuses, and a request id from the log is anyone's text.
    """
    if not request_id.startswith(CHECKPOINT_REQUEST):
        return None
    boundary, _, seq = request_id[len(CHECKPOINT_REQUEST) :].partition(":")
    readable = seq.isascii() and seq.isdigit() and len(seq) <= _SEQ_DIGITS
    return (boundary, int(seq)) if readable else None


_SEQ_DIGITS = 19
"""Most digits of a seq (a signed 64-bit integer)."""


def _answers_model(event: ApprovalGranted) -> bool:
    """A checkpoint answer after a settled turn, with a value: the model reads it next."""
    found = checkpoint_of(event.request_id) if event.value is not None else None
    return found is not None and found[0] == "after_tool_result"


def speaks(event: Event) -> bool:
    """Whether a counted event adds a message to the conversation. Cheap: no message is built."""
    kind = type(event)
    if kind is ModelAnswered or kind is ToolCompleted:
        return True
    if kind is RunStarted:
        # A run carried on from another starts from that run's transcript, not from an input.
        return event.continuation_of is None  # type: ignore[attr-defined]
    if kind is ApprovalGranted:
        return _answers_model(event)  # type: ignore[arg-type]
    return kind is ToolResolved and event.outcome == "completed"  # type: ignore[attr-defined]


def message_of(event: Event) -> Message | None:
    """The message a counted event adds to the conversation, or ``None``.

    A body the claim check moved out of line stays its reference (see the module docstring).
    """
    if isinstance(event, RunStarted):
        return _said("user", event.input, None) if event.continuation_of is None else None
    if isinstance(event, ModelAnswered):
        content = event.message.content
        # Arguments that looked like a reference were wrapped as written (`escape_bodies`).
        tool_calls = [
            msgspec.structs.replace(c, args=c.args[LITERAL]) if is_escaped(c.args) else c
            for c in event.tool_calls
        ]
        if isinstance(content, list) and len(content) == 1 and is_escaped(content[0]):
            content = [content[0][LITERAL]]
        elif isinstance(content, list) and len(content) == 1 and is_reference(content[0]):
            calls = [ToolCallRef(c.call_id, c.tool, dict(c.args)) for c in tool_calls]
            rest = [msgspec.to_builtins(ToolCallsPart(calls))] if calls else []
            return Message(role="assistant", content=[content[0], *rest])
        return assistant_message(content, tool_calls)
    if isinstance(event, ToolCompleted) or (
        isinstance(event, ToolResolved) and event.outcome == "completed"
    ):
        # A call settled as completed with an error (a result its status check gave that no
        # store can keep, a person's "failed") ended in that error, as a tool's own error does.
        if event.error is not None:
            return _said("tool", {"error": msgspec.to_builtins(event.error)}, event.call_id)
        return _said("tool", event.result, event.call_id)
    answers = isinstance(event, ApprovalGranted) and _answers_model(event)
    # The claim check never moves (nor wraps) a person's answer: one shaped like a reference
    # is theirs as given, never a body to fetch from the blob store every tenant shares.
    value = event.value if answers else None  # type: ignore[attr-defined]
    return Message(role="user", content=as_text(value)) if answers else None


def stored_message_of(event: Event) -> Message | None:
    """The message a counted event adds to the run's transcript, or ``None``: `message_of`'s,
    except for a model answer with a body the log holds wrapped (`escape_bodies`), or whose
    calls' arguments it holds as a reference. That one is a `LoggedMessage` keeping them so:
    the wrapping is what tells a look-alike (which is never fetched) from a reference the
    claim check made.
    """
    message = message_of(event)
    if message is None or not isinstance(event, ModelAnswered):
        return message
    content = event.message.content
    if not event.tool_calls:
        if isinstance(content, list) and len(content) == 1 and is_escaped(content[0]):
            return LoggedMessage(role=message.role, content=list(content), as_logged=True)
        return message
    if not isinstance(message.content, list):
        return message
    if not any(is_reference(c.args) or is_escaped(c.args) for c in event.tool_calls):
        return message
    calls = [ToolCallRef(c.call_id, c.tool, dict(c.args)) for c in event.tool_calls]
    said = [*message.content[:-1], msgspec.to_builtins(ToolCallsPart(calls))]
    return LoggedMessage(role=message.role, content=said, as_logged=True)


def _said(role: str, body: Any, call_id: str | None) -> Message:
    content: str | list[Any] = [body] if is_reference(body) else as_text(unescaped(body))
    return Message(role=role, content=content, tool_call_id=call_id)


def as_text(value: Any) -> str:
    """A value as the model reads it: strings as they are, anything else as JSON."""
    if isinstance(value, str):
        return value
    return msgspec.json.encode(value).decode()


__all__ = [
    "BLOB_REF",
    "CHECKPOINT_REQUEST",
    "LITERAL",
    "LoggedMessage",
    "TranscriptRow",
    "as_text",
    "checkpoint_of",
    "checkpoint_request",
    "decode_chunk",
    "decode_message",
    "escaped",
    "is_escaped",
    "is_reference",
    "message_of",
    "speaks",
    "stored_message_of",
    "unescaped",
]
