"""Claim-check references in event bodies, and the wrapping that keeps look-alikes literal.

A body the claim check moved out of line is written as ``{"$blob": digest, "size": n}``. A body
that merely has that shape (or the wrapper's) is written as ``{"$literal": body}``, so readers
never mistake a value a run was given for a reference to fetch.
"""

from __future__ import annotations

from typing import Any

BLOB_REF = "$blob"
"""The key of a claim-check reference (``{"$blob": digest, "size": n}``)."""

LITERAL = "$literal"
"""The key a body shaped like a claim-check reference is wrapped in when written
(``{"$literal": body}``), so that only the claim check itself ever makes a reference: a run's
input or a tool's result that merely looks like one is never fetched from the blob store."""


def is_reference(value: Any) -> bool:
    """Whether a body is a claim-check reference."""
    return isinstance(value, dict) and set(value) == {BLOB_REF, "size"}


def is_escaped(value: Any) -> bool:
    """Whether a body is a value wrapped because it looked like a reference (`LITERAL`)."""
    return isinstance(value, dict) and len(value) == 1 and LITERAL in value


def escaped(value: Any) -> Any:
    """A body as written: wrapped in `LITERAL` if it looks like a reference or a wrapped value
    (so the wrapping is undone exactly once), otherwise the very same object."""
    return {LITERAL: value} if is_reference(value) or is_escaped(value) else value


def unescaped(value: Any) -> Any:
    """A body as it was given, the `LITERAL` wrapping of `escaped` taken off."""
    return value[LITERAL] if is_escaped(value) else value


__all__ = ["BLOB_REF", "LITERAL", "escaped", "is_escaped", "is_reference", "unescaped"]
