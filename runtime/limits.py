"""The bounds every entry point holds a run's names and values to, in one place.

Whatever reaches the log is read back by every worker, projector and store for as long as the
run is kept, so a name or a value that one of them cannot hold must be refused before it is
written, with an error naming the field:

* Names (run ids, tenants, users, agents, request and call ids, tool names, ``by``) are at most
  `MAX_NAME_LENGTH` characters and hold no control character (C0, DEL): PostgreSQL refuses NUL
  in ``text`` columns, and a name is printed on one line in logs and on terminals. A name that
  addresses what is stored already (a run's id, tenant, user, agent, call or request) is held to
  `check_stored_name` instead: the log refuses only NUL, so a producer writing to it directly
  may have stored a name the stricter check refuses, and that run must stay addressable.
* Labels (tags) are at most `MAX_LABEL_LENGTH` characters, one line, no control character but
  tab; a person's note (``why``) at most `MAX_NOTE_LENGTH`, tabs and newlines allowed. A run
  holds at most `MAX_TAGS_PER_RUN` tags: every tag is kept on the run's frontier.
* Values (run input, approval answers, tool results, a model's tool arguments) are nested at
  most `MAX_DEPTH` levels of lists and objects: deeper JSON cannot be read back by every
  reader (Python's recursion limit is about 1,000 frames, and each level costs several).
* A model answer asks for at most `MAX_TOOL_CALLS_PER_TURN` tool calls (an agent may lower it):
  every call of an answer is one `ModelAnswered` record, and a log record has a size cap.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from onward.errors import InvalidInputError

MAX_NAME_LENGTH = 200
"""Longest run id, tenant, user, agent name, request id, call id, tool name or ``by``."""

MAX_LABEL_LENGTH = 200
"""Longest tag label."""

MAX_NOTE_LENGTH = 10_000
"""Longest note a person leaves (why a call was resolved the way it was)."""

NEEDS_PERSON = "needs-person"
"""The label a worker tags a run with when its resume found a call it must not guess about."""

MAX_TAGS_PER_RUN = 1_000
"""Most tags one run holds; a tag past it is refused (`InvalidInputError`), except the
``needs-person`` tag a worker leaves a run for a person with (`AgentRunner.leave_for_person`)."""

MAX_DEPTH = 100
"""Deepest nesting of lists and objects in a run's input, an approval's value, a tool's result
or a model's tool arguments (a scalar is depth 0, ``[1]`` depth 1)."""

MAX_TOOL_CALLS_PER_TURN = 64
"""Most tool calls one model answer may ask for; an answer over it fails the run."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CONTROL_BUT_TAB = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def check_name(field: str, value: object, *, run_id: str | None = None) -> str:
    """``value`` if it is a name Onward can store and print, else `InvalidInputError`.

    Raises:
        InvalidInputError: Not a string, empty, longer than `MAX_NAME_LENGTH`, or holding a
            control character (the field and the character's position are named).
    """
    return _check_text(field, value, MAX_NAME_LENGTH, _CONTROL, run_id)


def check_stored_name(field: str, value: object, *, run_id: str | None = None) -> str:
    """``value`` if it can be a name already stored (a run's id, tenant, user, agent, call or
    request), else `InvalidInputError`: what addresses an existing run takes its exact name.

    `check_name` holds a name to its bounds when it is created; the log refuses only NUL in
    what a producer writes to it directly, so a run may hold a control character or more than
    `MAX_NAME_LENGTH` characters, and refused as a new name would be, it could never be
    inspected, resolved, cancelled, released or filtered on.

    Raises:
        InvalidInputError: Not a string, empty, or holding what no stored name holds: a NUL
            (no store keeps it in a name) or a lone surrogate (no text any store holds).
    """
    if not isinstance(value, str):
        raise InvalidInputError(f"{field} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidInputError(f"{field} must not be empty", run_id=run_id)
    if "\x00" in value:
        raise InvalidInputError(
            f"{field} holds a NUL character at position {value.index(chr(0))}; no stored name "
            "holds one",
            run_id=run_id,
        )
    _check_utf8(field, value, run_id)
    return value


def check_label(field: str, value: object, *, run_id: str | None = None) -> str:
    """``value`` if it is a label Onward can store and print (one line), else an error.

    Raises:
        InvalidInputError: Not a string, blank, longer than `MAX_LABEL_LENGTH`, or holding a
            control character other than tab.
    """
    text = _check_text(field, value, MAX_LABEL_LENGTH, _CONTROL_BUT_TAB, run_id)
    if not text.strip():
        raise InvalidInputError(f"{field} must not be blank", run_id=run_id)
    return text


def check_note(field: str, value: object, *, run_id: str | None = None) -> str:
    """``value`` if it is free text a person may leave (tabs and newlines allowed, no other
    control character, at most `MAX_NOTE_LENGTH` characters), else `InvalidInputError`.

    Raises:
        InvalidInputError: Not a string, empty, too long, or holding a control character.
    """
    return _check_text(field, value, MAX_NOTE_LENGTH, _CONTROL_BUT_LINES, run_id)


def check_optional_name(field: str, value: object, *, run_id: str | None = None) -> str | None:
    """`check_name`, letting ``None`` through."""
    return None if value is None else check_name(field, value, run_id=run_id)


def _check_text(
    field: str, value: object, limit: int, refused: re.Pattern[str], run_id: str | None
) -> str:
    if not isinstance(value, str):
        raise InvalidInputError(f"{field} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidInputError(f"{field} must not be empty", run_id=run_id)
    if len(value) > limit:
        raise InvalidInputError(
            f"{field} is {len(value)} characters long, over the limit of {limit}", run_id=run_id
        )
    found = refused.search(value)
    if found is not None:
        raise InvalidInputError(
            f"{field} holds the control character {found.group()!r} at position "
            f"{found.start()}; names and labels take printable text only",
            run_id=run_id,
        )
    _check_utf8(field, value, run_id)
    return value


def depth_of(value: Any, *, stop_above: int = MAX_DEPTH) -> int:
    """How deeply lists and objects nest in ``value``, counted without recursion; the count
    stops once it is past ``stop_above`` (so a hostile value costs no more than that)."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        depth += 1
        if depth > deepest:
            deepest = depth
            if deepest > stop_above:
                return deepest
        pending.extend((child, depth) for child in children)
    return deepest


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether lists and objects nest in ``value`` more than ``limit`` levels deep."""
    return depth_of(value, stop_above=limit) > limit


def check_depth(field: str, value: Any, *, run_id: str | None = None) -> Any:
    """``value`` if it nests at most `MAX_DEPTH` levels, else `InvalidInputError`.

    Raises:
        InvalidInputError: ``value`` nests deeper than `MAX_DEPTH` (the field is named).
    """
    if too_deep(value):
        raise InvalidInputError(
            f"{field} nests lists and objects more than {MAX_DEPTH} levels deep; "
            "flatten it or send it as text",
            run_id=run_id,
        )
    return value


def _check_utf8(field: str, value: str, run_id: str | None) -> None:
    """Refuse a lone surrogate (what Python makes of a command-line byte that is not UTF-8):
    no text any store holds."""
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"{field} holds {value[exc.start]!r} at position {exc.start}, a lone surrogate "
            "that is no text any store can hold (UTF-8)",
            run_id=run_id,
        ) from None


__all__ = [
    "MAX_DEPTH",
    "MAX_LABEL_LENGTH",
    "MAX_NAME_LENGTH",
    "MAX_NOTE_LENGTH",
    "MAX_TAGS_PER_RUN",
    "MAX_TOOL_CALLS_PER_TURN",
    "NEEDS_PERSON",
    "check_depth",
    "check_label",
    "check_name",
    "check_note",
    "check_optional_name",
    "check_stored_name",
    "depth_of",
    "too_deep",
]
