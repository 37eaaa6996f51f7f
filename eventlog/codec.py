"""msgspec JSON on the wire, one event per record, with the headers readers filter on.

JSON rather than msgpack so the records stay readable by tools audit and analytics teams already
run (kcat, Kafka Connect, ksqlDB). Decoding is one typed pass on the hot path; only a record that
fails it is probed again to name the run, the seq and the field in the error.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable
from typing import Any

import msgspec

from onward.errors import CheckpointFormatError, EventDecodeError, InvalidInputError

from .events import EVENT_FORMAT, EVENT_TYPES, AnyEvent, Event, format_of, kind_of

_encoder = msgspec.json.Encoder()
_decoder: msgspec.json.Decoder[AnyEvent] = msgspec.json.Decoder(AnyEvent)


class _Probe(msgspec.Struct):
    """The envelope fields, each optional, to describe a record that failed to decode."""

    run_id: object = None
    tenant: object = None
    seq: object = None
    kind: object = None
    format: object = None


_probe_decoder = msgspec.json.Decoder(_Probe)


class Envelope(msgspec.Struct, frozen=True):
    """What can be read of a record's envelope when the record itself cannot be decoded."""

    run_id: str | None = None
    tenant: str | None = None
    kind: str | None = None


_UNDECODABLE = (msgspec.DecodeError, RecursionError, TypeError, ValueError, UnicodeDecodeError)
"""What decoding a record's bytes can raise: msgspec's own errors, and Python's when a foreign
producer wrote a null value (a tombstone) or JSON nested past the interpreter's recursion limit."""


def probe(data: bytes | memoryview | None) -> Envelope:
    """The run, tenant and kind a record names, as far as they can be read; never raises."""
    if data is None:
        return Envelope()
    try:
        found = _probe_decoder.decode(data)
    except _UNDECODABLE:
        return Envelope()

    def text(value: object) -> str | None:
        return value if isinstance(value, str) else None

    return Envelope(text(found.run_id), text(found.tenant), text(found.kind))


_PATH = re.compile(r" - at `(\$[^`]*)`$")

Header = tuple[str, bytes]


def encode(event: Event) -> bytes:
    """Encode one event as JSON bytes.

    Raises:
        InvalidInputError: Not an event of a known kind, a name holding a NUL, a value JSON
            has no form for (run, seq and the path to it named: `unencodable`), or one a
            reader would refuse (an integer out of its range, a word outside its choices).
    """
    if not isinstance(event, Event) or type(event) is Event:
        raise InvalidInputError(f"expected an event of a known kind, got {type(event).__name__}")
    try:
        data = _encoder.encode(event)
    except (TypeError, ValueError, OverflowError) as exc:
        # A value no reader could take back (an object JSON has no form for) is named, with
        # the run and seq, rather than surfacing as the encoder's own error.
        raise InvalidInputError(
            f"run {event.run_id!r} seq {event.seq}: {kind_of(type(event))} cannot be written: "
            f"{unencodable(msgspec.structs.asdict(event)) or type(exc).__name__}",
            run_id=event.run_id,
        ) from exc
    try:
        # Read back as a reader will: a value no reader takes (an integer past what the stores
        # keep, a word outside its field's choices) is refused here, not set aside later.
        _decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise InvalidInputError(
            f"run {event.run_id!r} seq {event.seq}: {kind_of(type(event))} cannot be written: "
            f"{exc}",
            run_id=event.run_id,
        ) from exc
    field = name_with_nul(event) if _ESCAPED_NUL in data else None
    if field is not None:
        # What no reader would take is not written: refused here rather than set aside later.
        raise InvalidInputError(
            f"run {event.run_id!r} seq {event.seq}: {field} holds a NUL character; names "
            "take printable text only",
            run_id=None if "\x00" in event.run_id else event.run_id,
        )
    return data


def unencodable(value: Any) -> str | None:
    """Why ``value`` cannot be written as a field of an event, naming the path to the first
    value at fault (``$.rows[2]``), or ``None`` when it can.

    Refused: what JSON has no form for (an object of a class msgspec does not encode, a dict
    key that is neither text nor a number) and non-finite floats (``nan``, ``inf``), which the
    encoder would otherwise write as ``null``, silently changing the value. Dates, UUIDs,
    decimals, sets, dataclasses and Structs are written as msgspec writes them.
    """
    try:
        data = _encoder.encode(value)
    except (TypeError, ValueError, OverflowError):
        pass
    else:
        if b"null" not in data:  # a non-finite float is encoded as null, so there is none
            return None
    return _fault(value, "$")


def _fault(value: Any, path: str) -> str | None:
    """The first value at fault under ``value`` (at ``path``); ``None`` if there is none."""
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value!r} at `{path}` is not a finite number"
    if isinstance(value, dict):
        return _fault_in_dict(value, path)
    if isinstance(value, list | tuple | set | frozenset):
        return next(
            (f for i, item in enumerate(value) if (f := _fault(item, f"{path}[{i}]"))), None
        )
    if value is None or isinstance(value, str | int | bytes | bytearray):
        return None if _encodes(value) else _scalar_fault(value, path)
    try:
        builtins = msgspec.to_builtins(value)
    except (TypeError, ValueError, OverflowError):
        return f"an object of type {type(value).__name__} at `{path}`, which JSON has no form for"
    return None if builtins is value else _fault(builtins, path)


def _scalar_fault(value: object, path: str) -> str:
    """Why a scalar JSON has a form for cannot be written: an int past Python's limit on the
    digits it writes as text, or text that is not UTF-8 (a lone surrogate)."""
    if isinstance(value, int):
        return f"the int at `{path}` has too many digits to be written"
    return f"the {type(value).__name__} at `{path}` (not UTF-8)"


def _fault_in_dict(value: dict[Any, Any], path: str) -> str | None:
    for key, item in value.items():
        if not isinstance(key, str | int | float) or isinstance(key, bool):
            return f"a key of type {type(key).__name__} at `{path}` (keys are text)"
        if isinstance(key, float) and not math.isfinite(key):
            return f"the key {key!r} at `{path}` is not a finite number"
        found = _fault(item, f"{path}.{key}" if isinstance(key, str) else f"{path}[{key!r}]")
        if found is not None:
            return found
    return None


def _encodes(value: Any) -> bool:
    try:
        _encoder.encode(value)
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def headers(event: Event) -> list[Header]:
    """Record headers: run id, kind, fence and format, so readers skip other runs undecoded."""
    return [
        ("onward.run_id", event.run_id.encode()),
        ("onward.kind", kind_of(type(event)).encode()),
        ("onward.fence", str(event.fence).encode()),
        ("onward.format", str(event.format).encode()),
    ]


_RECORD_FIXED = 1 + 10 + 5 + 1
"""What a Kafka record takes besides its lengths, key, value and headers, at most: attributes, a
timestamp delta and an offset delta (varints up to 10 and 5 bytes), and the header count."""


def framed_size(event: Event, record: bytes) -> int:
    """The bytes ``record`` (``event`` encoded) takes in a Kafka record batch: its value with
    its key, its headers and their framing, never less than Kafka counts.

    What every log measures a batch by, so that the same batch is refused, or accepted, alike
    on every backend: Kafka keeps keys and headers in the record batch its limit guards.
    """
    key = len(event.run_id.encode())
    size = _RECORD_FIXED + _varint_size(key) + key + _varint_size(len(record)) + len(record)
    for name, value in headers(event):
        size += _varint_size(len(name)) + len(name) + _varint_size(len(value)) + len(value)
    return size + _varint_size(size)


def _varint_size(length: int) -> int:
    """The bytes of a length as Kafka writes it (a zigzag varint)."""
    zigzag, size = length << 1, 1
    while zigzag >= 0x80:
        zigzag >>= 7
        size += 1
    return size


def decode(data: bytes | memoryview | None, *, run_hint: str | None = None) -> AnyEvent:
    """Decode one record into its event.

    Args:
        data: The record's value; ``None`` (a Kafka tombstone) is refused like any other
            record that is not an event.
        run_hint: The run the record was filed under (its key), named in errors when the
            record itself is too damaged to say.

    Raises:
        CheckpointFormatError: The record was written in a format newer than :data:`EVENT_FORMAT`.
        EventDecodeError: The record is not a valid event; the message names run, seq and field.
    """
    if data is None:
        raise EventDecodeError(
            f"run {run_hint!r} seq None: unreadable event record: the record has no value "
            "(a tombstone)",
            run_id=run_hint,
        )
    try:
        event = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise _describe_failure(data, exc, run_hint) from exc
    except (RecursionError, TypeError, ValueError, UnicodeDecodeError) as exc:
        raise EventDecodeError(
            f"run {run_hint!r} seq None: unreadable event record: {_python_failure(exc)}",
            run_id=run_hint,
        ) from exc
    newest = format_of(type(event).__struct_config__.tag)
    if event.format > newest:
        raise _newer_format(event.run_id, event.seq, event.format, newest)
    # JSON holds a NUL only escaped, so the names are looked at only when the bytes hold one.
    held = data if isinstance(data, bytes) else bytes(data)
    field = name_with_nul(event) if _ESCAPED_NUL in held else None
    if field is not None:
        raise EventDecodeError(
            f"run {event.run_id!r} seq {event.seq}: unreadable event record: {field} holds a "
            "NUL character, which no Onward writes and PostgreSQL cannot store",
            run_id=None if "\x00" in event.run_id else event.run_id,
            seq=event.seq,
            field=field,
        )
    return event


_ESCAPED_NUL = b"\\u0000"
"""A NUL inside a JSON string: JSON holds control characters escaped only."""

_NEWEST: dict[type[Event], int] = {
    kind: format_of(kind.__struct_config__.tag) for kind in EVENT_TYPES
}
"""The newest format this code reads, per event kind (looked up per record by type)."""


def decode_many(values: Iterable[bytes | memoryview | None]) -> list[AnyEvent]:
    """Decode many records' values, in order: what :func:`decode` gives for each, for a
    fraction of its cost per record (a projector's hot path: one typed pass per value, and
    the format and NUL checks inline).

    Raises:
        CheckpointFormatError: As :func:`decode`, for the first record that fails.
        EventDecodeError: As :func:`decode`, for the first record that fails.
    """
    typed = _decoder.decode
    newest = _NEWEST
    nul = _ESCAPED_NUL
    out: list[AnyEvent] = []
    append = out.append
    for data in values:
        if type(data) is not bytes:
            append(decode(data))  # a tombstone, or a view: the checks as `decode` makes them
            continue
        try:
            event = typed(data)
        except _UNDECODABLE:
            event = decode(data)  # raises, naming the run, seq and field
        if (event.format > EVENT_FORMAT and event.format > newest[type(event)]) or nul in data:
            event = decode(data)  # a newer format, or a NUL in a name, raises there
        append(event)
    return out


_NAME_FIELDS = (
    "run_id",
    "tenant",
    "agent",
    "revision",
    "continuation_of",
    "worker",
    "call_id",
    "tool",
    "idempotency_key",
    "request_id",
)
"""The fields whose values stores keep as names (``text`` columns: run, tenant, agent, holder,
call, tool, what a run waits on); a NUL in one of them cannot be stored by PostgreSQL."""


@functools.cache
def _names_of(kind: type[Event]) -> tuple[str, ...]:
    """The name fields an event kind has (looked up once per kind, not per event)."""
    fields = {field.name for field in msgspec.structs.fields(kind)}
    return tuple(name for name in _NAME_FIELDS if name in fields)


def name_with_nul(event: Event) -> str | None:
    """The path of the first name of ``event`` holding a NUL character, else ``None``.

    Free-form values (inputs, results, messages, errors) may hold NUL: they are stored as
    bytes. Names may not: every store keeps them as text, and PostgreSQL refuses NUL in text.
    """
    for name in _names_of(type(event)):
        value = getattr(event, name)
        if isinstance(value, str) and "\x00" in value:
            return f"$.{name}"
    user = (
        options.get("user")
        if isinstance(options := getattr(event, "options", None), dict)
        else None
    )
    if isinstance(user, str) and "\x00" in user:
        return "$.options.user"
    for index, call in enumerate(getattr(event, "tool_calls", ())):
        for name in ("call_id", "tool", "idempotency_key"):
            if "\x00" in getattr(call, name):
                return f"$.tool_calls[{index}].{name}"
    return None


def _python_failure(exc: BaseException) -> str:
    """One line naming why Python, rather than msgspec, refused the bytes (never the bytes)."""
    if isinstance(exc, RecursionError):
        return "JSON nested deeper than can be read"
    return f"{type(exc).__name__} while decoding"


def _newer_format(
    run_id: object, seq: object, fmt: object, newest: int = EVENT_FORMAT
) -> CheckpointFormatError:
    run = run_id if isinstance(run_id, str) else None
    return CheckpointFormatError(
        f"run {run!r} seq {seq}: event format {fmt} is newer than this code reads "
        f"({newest}); upgrade Onward before reading or resuming this run",
        run_id=run,
        seq=seq if isinstance(seq, int) else None,
        field="$.format",
    )


def _describe_failure(
    data: bytes | memoryview, exc: msgspec.DecodeError, run_hint: str | None
) -> EventDecodeError:
    try:
        probe = _probe_decoder.decode(data)
    except _UNDECODABLE:
        probe = _Probe()
    run = probe.run_id if isinstance(probe.run_id, str) else run_hint
    seq = probe.seq if isinstance(probe.seq, int) and not isinstance(probe.seq, bool) else None
    newest = format_of(probe.kind)
    if isinstance(probe.format, int) and probe.format > newest:
        return _newer_format(run, seq, probe.format, newest)
    # msgspec quotes a tag it does not know as it is: a NUL in it would make the reason text
    # PostgreSQL refuses (the quarantine entry, the run's mark), failing the batch that files it.
    reason = str(exc).replace("\x00", "\\x00")
    match = _PATH.search(reason)
    field = match.group(1) if match else None
    return EventDecodeError(
        f"run {run!r} seq {seq}: unreadable event record"
        f"{f' (kind {probe.kind!r})' if isinstance(probe.kind, str) else ''}: {reason}",
        run_id=run,
        seq=seq,
        field=field,
    )
