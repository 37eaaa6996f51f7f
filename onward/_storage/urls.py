"""Server URLs as they may be shown: the password of their userinfo replaced by ``***``.

``DATABASE_URL`` and ``REDIS_URL`` carry their password inline (``redis://user:pw@host``). An
error naming a URL it could not use, a settings ``repr`` or a log line must still say which URL
it was, so the URL is shown with only the password hidden. The URL may be malformed (that is
often why it is shown): the userinfo is found without parsing it as a URL, and anything that
may be part of the password is hidden rather than kept.
"""

from __future__ import annotations

import re
from typing import Final

HIDDEN: Final = "***"
"""What stands for a password in a URL shown to a person."""

_PASSWORD_PARAMETER: Final = re.compile(r"(?i)([?&](?:ssl)?password=)([^&#]*)")
"""A password given as a query parameter (``postgresql://host/db?password=...``)."""

_SCHEME: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
"""A URL's scheme and the ``//`` after it (RFC 3986)."""


def _password_spans(url: str) -> list[tuple[int, int]]:
    """Where the passwords of ``url`` are: after the user of its userinfo, and in parameters.

    The userinfo ends at the last ``@`` and starts after the scheme's ``://`` (or at the start
    of a URL missing it); its password is everything after its first ``:``. Not after the last
    ``//``: an unencoded password may hold one, and would then be shown.
    """
    spans: list[tuple[int, int]] = []
    at = url.rfind("@")
    if at > 0:
        scheme = _SCHEME.match(url, 0, at)
        start = scheme.end() if scheme else 0
        colon = url.find(":", start, at)
        if colon >= 0 and colon + 1 < at:
            spans.append((colon + 1, at))
    spans.extend(match.span(2) for match in _PASSWORD_PARAMETER.finditer(url) if match.group(2))
    return spans


def masked_url(url: str) -> str:
    """``url`` with each password in it replaced by ``***`` (user, host, port and path kept)."""
    pieces: list[str] = []
    kept_until = 0
    for start, end in sorted(_password_spans(url)):
        if start < kept_until:
            continue
        pieces += (url[kept_until:start], HIDDEN)
        kept_until = end
    pieces.append(url[kept_until:])
    return "".join(pieces)


def without_passwords(text: str, url: str) -> str:
    """``text`` (a driver's message about ``url``) with ``url`` masked and its passwords hidden
    wherever else they appear."""
    text = text.replace(url, masked_url(url))
    for start, end in _password_spans(url):
        text = text.replace(url[start:end], HIDDEN)
    return text


__all__ = ["HIDDEN", "masked_url", "without_passwords"]
