"""Signed requests: the fleet acts only on requests from someone who holds the request key.

The requests topic is a command channel: an `AnswerRequest` on it approves a payment, a
`StartRun` spends model calls. Anyone who can write the topic could otherwise give those
commands, whatever tenant they name. So every request carries an HMAC-SHA256 of its record key
(the run id) and its value, in the record header ``onward-signature``, made with a key the
applications and the workers share (``ONWARD_REQUEST_KEY``). A worker sets aside, with the
reason, any request whose signature is missing or does not check; the tenant a signed request
names is then checked against the run's owner as for every other caller.

Keys rotate without downtime: ``ONWARD_REQUEST_KEY`` may hold several keys separated by
commas; the first signs, any of them checks. Deploy the new key second everywhere, then first,
then drop the old one.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence
from typing import Final

from onward.errors import ConfigurationError

SIGNATURE_HEADER: Final = "onward-signature"
"""The record header that holds a request's signature (lowercase hex)."""

MIN_KEY_LENGTH: Final = 32
"""Shortest key accepted, in characters: ``openssl rand -hex 32`` gives 64."""

_VERSION: Final = b"v1:"
"""Signed before the record key, so a later scheme can never be confused with this one."""


class RequestSigner:
    """Signs requests with the first key, checks them against every key.

    Args:
        keys: One key, or several (comma-separated in a string): the first signs.

    Raises:
        ConfigurationError: No key, or a key shorter than `MIN_KEY_LENGTH` (its position is
            named, never its value).
    """

    def __init__(self, keys: str | Sequence[str]) -> None:
        given = keys.split(",") if isinstance(keys, str) else list(keys)
        found = [key.strip() for key in given if key.strip()]
        if not found:
            raise ConfigurationError("ONWARD_REQUEST_KEY holds no key")
        for position, key in enumerate(found, start=1):
            if len(key) < MIN_KEY_LENGTH:
                raise ConfigurationError(
                    f"ONWARD_REQUEST_KEY: key {position} has {len(key)} characters, fewer than "
                    f"{MIN_KEY_LENGTH}; make one with `openssl rand -hex 32`"
                )
        self._keys = [key.encode() for key in found]

    def __repr__(self) -> str:
        return f"RequestSigner(<{len(self._keys)} keys>)"

    def sign(self, record_key: bytes, value: bytes) -> bytes:
        """The signature of a request record, for its `SIGNATURE_HEADER`."""
        return _mac(self._keys[0], record_key, value).encode()

    def refusal(
        self,
        record_key: bytes | None,
        value: bytes | None,
        headers: Iterable[tuple[str, bytes | None]],
    ) -> str | None:
        """Why a request record must be set aside, or ``None`` when its signature checks."""
        signatures = [v for k, v in headers if k == SIGNATURE_HEADER]
        if not signatures:
            return (
                f"unsigned (no {SIGNATURE_HEADER} header: is ONWARD_REQUEST_KEY set where it "
                "was sent?)"
            )
        if len(signatures) > 1:
            return f"{len(signatures)} {SIGNATURE_HEADER} headers"
        given = signatures[0]
        if not isinstance(given, bytes):  # a header with no value (Kafka headers may have none)
            return f"its {SIGNATURE_HEADER} header has no value"
        for key in self._keys:
            if hmac.compare_digest(_mac(key, record_key or b"", value or b"").encode(), given):
                return None
        return "its signature does not check with any key of ONWARD_REQUEST_KEY"


def _mac(key: bytes, record_key: bytes, value: bytes) -> str:
    message = _VERSION + len(record_key).to_bytes(4, "big") + record_key + value
    return hmac.new(key, message, hashlib.sha256).hexdigest()


__all__ = ["MIN_KEY_LENGTH", "SIGNATURE_HEADER", "RequestSigner"]
