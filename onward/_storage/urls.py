"""Server URLs as they may be shown: the password of their userinfo replaced by ``***``.

``DATABASE_URL`` and ``REDIS_URL`` carry their password inline (``redis://user:pw@host``). An
error naming a URL it could not use, a settings ``repr`` or a log line must still say which URL
it was, so the URL is shown with only the password hidden. The URL may be malformed (that is
often why it is shown): the userinfo is found without parsing it as a URL, and anything that
may be part of the password is hidden rather than kept.

A URL can also turn off the check of the server's certificate (``sslmode=require``,
``ssl_cert_reqs=none``) or of its name (``sslmode=verify-ca``, ``ssl_check_hostname=false``);
the connection then works as a checked one does, so `warn_unchecked_server` says so once,
naming the setting.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Final
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger("onward.storage")

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


_QUOTED: Final = re.compile(r"'([^']+)'|\"([^\"]+)\"")
"""A piece of a URL a driver quotes in its message (httpx's ``Invalid port: 'abc'``)."""


def without_passwords(text: str, url: str) -> str:
    """``text`` (a driver's message about ``url``) with ``url`` masked and its passwords hidden
    wherever else they appear, and any piece of ``url`` it quotes that takes in part of one: a
    password holding a ``/`` or ``?`` ends the authority early, and its halves are quoted as
    the port or the query (``Invalid port: 'pa'``, ``bad query field: 'ss@host/db'``)."""
    spans = _password_spans(url)
    text = text.replace(url, masked_url(url))
    for start, end in spans:
        text = text.replace(url[start:end], HIDDEN)

    def hidden_if_password(quoted: re.Match[str]) -> str:
        piece = quoted.group(1) or quoted.group(2)
        at = url.find(piece)
        while at >= 0:
            if any(at < end and start < at + len(piece) for start, end in spans):
                return quoted.group(0).replace(piece, HIDDEN)
            at = url.find(piece, at + 1)
        return quoted.group(0)

    return _QUOTED.sub(hidden_if_password, text)


_UNCHECKED_SSLMODES: Final = frozenset({"allow", "prefer", "require"})
"""``sslmode`` values that connect without checking the server's name (libpq's and asyncpg's
meaning: ``allow`` and ``prefer`` may not even use TLS, ``require`` checks at most the chain)."""

_NAME_UNCHECKED_SSLMODES: Final = frozenset({"verify-ca", "verify_ca"})
"""``sslmode`` values that check the server's certificate chain but not its name, so any
certificate the same CA signed is taken (asyncpg reads ``_`` as ``-``)."""

_NAME_UNCHECKED: Final = (
    "the server's certificate is checked against the CA but not the server's name, so any "
    "server holding a certificate from that CA (another tenant's, at a managed provider) "
    "would be taken for {server}; "
)
"""What a connection that checks the chain alone lets in, for `unchecked_server`."""

_FALSE: Final = frozenset({"0", "F", "FALSE", "N", "NO"})
"""What redis-py reads as false in a URL's query (``redis.utils.to_bool``)."""

_warned: set[str] = set()
"""The URLs (masked) already warned about in this process: every store opens its own pool."""


def unchecked_server(url: str, variable: str) -> str | None:
    """Why a connection made with ``url`` (the value of ``variable``) does not check that the
    server is the one it names, or ``None`` when it does (or uses no TLS at all, which the
    URL says plainly: ``redis://``, ``sslmode=disable``)."""
    try:
        parts = urlsplit(url)
        # Of a repeated parameter, asyncpg takes the last value and redis-py the first.
        taken = 0 if parts.scheme == "rediss" else -1
        query = {name: values[taken] for name, values in parse_qs(parts.query).items()}
    except ValueError:  # a URL the driver refuses too, saying why
        return None
    if parts.scheme in ("postgres", "postgresql"):
        unchecked = _unchecked_postgres(query)
    elif parts.scheme == "rediss":
        unchecked = _unchecked_redis(query)
    else:
        return None
    if unchecked is None:
        return None
    given, after = unchecked
    return f"{variable} {masked_url(url)} has {given}: {after}"


def _unchecked_postgres(query: dict[str, str]) -> tuple[str, str] | None:
    """The ``sslmode`` (or ``PGSSLMODE``, which asyncpg takes when the URL names none) that
    leaves the server or its name unchecked, as given, and what that lets in. Neither given
    is asyncpg's default, ``prefer``: not named, as it is every local server's URL."""
    if "sslmode" in query:
        name, mode = "sslmode", query["sslmode"]
    else:
        name, mode = "PGSSLMODE", os.environ.get("PGSSLMODE", "")
    if mode in _UNCHECKED_SSLMODES:
        return f"{name}={mode}", (
            "the server's certificate and name are not checked, so a server in the middle "
            "would be taken for the database (and allow or prefer may connect without TLS); "
            "use sslmode=verify-full with sslrootcert naming its CA"
        )
    if mode in _NAME_UNCHECKED_SSLMODES:
        return f"{name}={mode}", (
            _NAME_UNCHECKED.format(server="the database")
            + "use sslmode=verify-full, which also checks the name"
        )
    return None


def _unchecked_redis(query: dict[str, str]) -> tuple[str, str] | None:
    """The query parameters of a ``rediss://`` URL that turn a check of the server off, and
    what that lets in. ``ssl_cert_reqs=optional`` is not one: a client checks the server's
    certificate then as with ``required``."""
    cert_reqs = query.get("ssl_cert_reqs")
    check_hostname = query.get("ssl_check_hostname", "")
    name_unchecked = check_hostname.upper() in _FALSE
    if cert_reqs == "none":
        given = "ssl_cert_reqs=none"
        if name_unchecked:
            given += f" and ssl_check_hostname={check_hostname}"
        return given, (
            "the server's certificate is not checked, so a server in the middle would be "
            "taken for Redis; drop it (name the CA that signs the server's certificate with "
            "ssl_ca_certs)"
        )
    if name_unchecked:
        return f"ssl_check_hostname={check_hostname}", (
            _NAME_UNCHECKED.format(server="Redis")
            + "drop it (redis-py checks the name unless told not to)"
        )
    return None


def warn_unchecked_server(url: str, variable: str) -> None:
    """Log once per process, as a warning, that ``url`` leaves its server unchecked (see
    `unchecked_server`): the connection works, so nothing else would tell the operator."""
    why = unchecked_server(url, variable)
    if why is None or masked_url(url) in _warned:
        return
    _warned.add(masked_url(url))
    log.warning("%s", why)


__all__ = [
    "HIDDEN",
    "masked_url",
    "unchecked_server",
    "warn_unchecked_server",
    "without_passwords",
]
