"""The JSON Schema of every event kind, generated from the event types themselves.

The committed copy, ``schemas/events.schema.json``, is what readers in other languages build
against; a test fails when it and this function disagree, so the two cannot drift apart.
"""

from __future__ import annotations

import msgspec

from .events import AnyEvent


def event_schema() -> bytes:
    """The JSON Schema of every event kind, formatted (two-space indent) for review in diffs."""
    schema = msgspec.json.schema(AnyEvent)
    return msgspec.json.format(msgspec.json.encode(schema), indent=2) + b"\n"


__all__ = ["event_schema"]
