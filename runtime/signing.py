"""Signed requests: the fleet acts only on requests from someone who holds the request key.

The requests topic is a command channel: an `AnswerRequest` on it approves a payment, a
`StartRun` spends model calls. Anyone who can write the topic could otherwise give those
commands, whatever tenant they name. So every request carries an HMAC-SHA256 of the time it was
signed, its record key (the run id) and its value, in the record header ``onward-signature``
(``t=<milliseconds since the epoch>,v2=<hex>``), made with a key the applications and the
workers share (``ONWARD_REQUEST_KEY``). A worker sets aside, with the reason, any request whose
signature is missing or does not check; the tenant a signed request names is then checked
against the run's owner as for every other caller.

A signature alone would let anyone who can read and write the topic send a captured request
again, days later: a start whose run was collected since would run again. So a request is
also set aside once it was signed longer than ``ONWARD_REQUEST_MAX_AGE`` ago (`DEFAULT_MAX_AGE_S`,
a day), or further than `MAX_CLOCK_SKEW_S` in the future. Within that window a request sent
again finds what it asked for done (the run exists, the answer recorded, the run ended): the
window stays far below the time a finished run is kept (`GarbageCollector`'s shortest default
ttl is 48 hours). A signature made before requests carried their time (bare hex, ``v1``) is
set aside too, saying so: it is exactly what a replay of an old captured request looks like.
Upgrade the applications that submit and the workers together; a request an old application
sent is set aside with a line naming why, and is sent again by an upgraded one.

A signature does not cover where the request was sent (the topic, the PostgreSQL schema): a
request captured from one deployment checks in any other with the same key, so each deployment
needs a key of its own.

Keys rotate without downtime: ``ONWARD_REQUEST_KEY`` may hold several keys separated by
commas; the first signs, any of them checks. Deploy the new key second everywhere, then first,
then drop the old one.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Final

from onward.errors import ConfigurationError

SIGNATURE_HEADER: Final = "onward-signature"
"""The record header that holds a request's signature (lowercase hex)."""

MIN_KEY_LENGTH: Final = 32
"""Shortest key accepted, in characters: ``openssl rand -hex 32`` gives 64."""

DEFAULT_MAX_AGE_S: Final = 86_400.0
"""How long after it was signed a request is acted on, by default (``ONWARD_REQUEST_MAX_AGE``):
a day, so a fleet that was down or full overnight still takes what waited for it (an expired
request is set aside, and its sender must send it again), and a request captured and sent
again later is refused before the run it names can be collected (48 hours at the earliest by
default)."""

MAX_CLOCK_SKEW_S: Final = 300.0
"""How far in the future a request's signing time may be: the sender's clock may run ahead."""

_VERSION: Final = b"v1:"
"""Signed before the record key by senders that did not sign the time (checked only to say so)."""

_DATED: Final = b"v2:"
"""Signed before the signing time, so a ``v1`` signature can never pass for a dated one."""

_DATED_HEADER: Final = re.compile(rb"t=(\d{1,15}),v2=([0-9a-f]{64})")


class RequestSigner:
    """Signs requests with the first key, checks them against every key.

    Args:
        keys: One key, or several (comma-separated in a string): the first signs.
        max_age_s: How long after it was signed a request is acted on (`DEFAULT_MAX_AGE_S`).
        clock: Seconds since the epoch, now (`time.time` by default): the signing time, and
            the time a request's age is measured at.

    Raises:
        ConfigurationError: No key, or a key shorter than `MIN_KEY_LENGTH` (its position is
            named, never its value); a ``max_age_s`` that is not positive.
    """

    def __init__(
        self,
        keys: str | Sequence[str],
        *,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not max_age_s > 0:
            raise ConfigurationError(
                f"ONWARD_REQUEST_MAX_AGE must be positive seconds, got {max_age_s}"
            )
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
        self.max_age_s = max_age_s
        self._clock = clock or _now

    def __repr__(self) -> str:
        return f"RequestSigner(<{len(self._keys)} keys>)"

    def sign(self, record_key: bytes, value: bytes) -> bytes:
        """The signature of a request record, for its `SIGNATURE_HEADER`: it covers the time
        it is made, which the header carries."""
        issued_ms = int(self._clock() * 1000)
        mac = _dated_mac(self._keys[0], issued_ms, record_key, value)
        return b"t=%d,v2=%s" % (issued_ms, mac.encode())

    def refusal(
        self,
        record_key: bytes | None,
        value: bytes | None,
        headers: Iterable[tuple[str, bytes | None]],
        *,
        check_age: bool = True,
    ) -> str | None:
        """Why a request record must be set aside, or ``None`` when its signature checks and
        it was signed within `max_age_s` (unless ``check_age`` is false: for what may act on
        a request however old, such as taking back a start to cancel it)."""
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
        return self._signed_refusal(given, record_key or b"", value or b"", check_age=check_age)

    def _signed_refusal(
        self, given: bytes, record_key: bytes, value: bytes, *, check_age: bool
    ) -> str | None:
        """Why a request with signature ``given`` must be set aside, or ``None``."""
        dated = _DATED_HEADER.fullmatch(given)
        if dated is None:
            if self._checks(given, lambda key: _mac(key, record_key, value)):
                return (
                    "its signature carries no signing time (sent by a version of Onward before "
                    "requests expired), as a captured request sent again would: send it again "
                    "from an upgraded application"
                )
            return "its signature does not check with any key of ONWARD_REQUEST_KEY"
        issued_ms = int(dated[1])
        if not self._checks(dated[2], lambda key: _dated_mac(key, issued_ms, record_key, value)):
            return "its signature does not check with any key of ONWARD_REQUEST_KEY"
        age_s = self._clock() - issued_ms / 1000
        if check_age and age_s > self.max_age_s:
            return (
                f"expired: signed {age_s:.0f}s ago, longer than the {self.max_age_s:g}s a "
                "request is acted on within (ONWARD_REQUEST_MAX_AGE): a captured request sent "
                "again, or one that waited too long; send it again if it still stands"
            )
        if check_age and -age_s > MAX_CLOCK_SKEW_S:
            return (
                f"signed {-age_s:.0f}s in the future, more than the {MAX_CLOCK_SKEW_S:g}s clocks "
                "may differ by: is the sending host's clock right?"
            )
        return None

    def _checks(self, given: bytes, mac: Callable[[bytes], str]) -> bool:
        """Whether ``given`` is the signature one of the keys makes (compared in constant time)."""
        return any(hmac.compare_digest(mac(key).encode(), given) for key in self._keys)


def _now() -> float:
    """`time.time`, looked up at each call (so a test may move the clock)."""
    return time.time()


def _mac(key: bytes, record_key: bytes, value: bytes) -> str:
    message = _VERSION + len(record_key).to_bytes(4, "big") + record_key + value
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def _dated_mac(key: bytes, issued_ms: int, record_key: bytes, value: bytes) -> str:
    message = (
        _DATED
        + issued_ms.to_bytes(8, "big")
        + len(record_key).to_bytes(4, "big")
        + record_key
        + value
    )
    return hmac.new(key, message, hashlib.sha256).hexdigest()


__all__ = [
    "DEFAULT_MAX_AGE_S",
    "MAX_CLOCK_SKEW_S",
    "MIN_KEY_LENGTH",
    "SIGNATURE_HEADER",
    "RequestSigner",
]
