"""Driver log records in one line: a server that is down is news, its stack trace is not.

While a server is unreachable the drivers log what they retry (asyncpg restoring its pool,
aiokafka reconnecting to a broker), some of it with the exception's traceback attached. Those
records are expected and repeated, so :func:`one_line_driver_logs` puts a filter on the
drivers' loggers that folds the exception into the message: one line per record, still naming
what failed. Nothing else about the records changes (level, logger, message).

The HTTP clients log every request with its whole URL (httpx at INFO, which ``onward worker``
logs at), and the MCP client logs the URL it connects to: an MCP server's URL may carry a
password or a token, so :func:`masked_http_logs` hides them in those records.

aiokafka logs every request it sends at DEBUG, the SASL exchange's too: over PLAIN its bytes
are the user and the password themselves, so :func:`masked_sasl_logs` hides them.
"""

from __future__ import annotations

import logging
import re
from typing import Final

from .urls import HIDDEN

DRIVER_LOGGERS = (
    "aiokafka",
    "aiokafka.admin.client",
    "aiokafka.cluster",
    "aiokafka.conn",
    "aiokafka.consumer.consumer",
    "aiokafka.consumer.fetcher",
    "aiokafka.consumer.group_coordinator",
    "aiokafka.producer.producer",
    "aiokafka.producer.sender",
    "asyncpg.pool",
    "redis.asyncio.connection",
)
"""The loggers the drivers log reconnects and retries on (a filter applies to its own logger
only, not to the loggers below it)."""


class OneLine(logging.Filter):
    """Folds a record's exception into its message, so it prints as one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            detail = str(exc).replace("\n", " ")
            record.msg = f"{record.getMessage()} ({type(exc).__name__}: {detail})"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


_FILTER = OneLine()


def one_line_driver_logs() -> None:
    """Put the :class:`OneLine` filter on every driver logger; doing it again changes nothing."""
    for name in DRIVER_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


HTTP_LOGGERS: Final = ("httpx", "httpx2", "mcp.client.streamable_http", "mcp.client.sse")
"""The loggers that log a request's or an endpoint's whole URL."""

_URL: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]+")
"""A URL in a log message, up to the space or quote after it."""

_SCHEME: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def url_for_logs(url: str) -> str:
    """``url`` with its userinfo and the values of its query hidden: an MCP server's token is
    as often a query parameter (``?token=``, ``?api_key=``) as a password, and either is a
    credential. Everything before the last ``@`` is userinfo here, so a password holding a
    ``/`` or ``?`` is hidden too."""
    scheme = _SCHEME.match(url)
    start = scheme.end() if scheme else 0
    at = url.rfind("@")
    rest = f"***{url[at:]}" if at >= start else url[start:]
    address, question, query = rest.partition("?")
    if question:
        query = re.sub(r"=[^&#]*", "=***", query)
    return f"{url[:start]}{address}{question}{query}"


_TRACEBACKS: Final = logging.Formatter()
"""What turns a record's exception into the text `MaskedUrls` masks (as logging's default)."""


def _masked_urls(text: str) -> str:
    """``text`` with every URL in it passed through `url_for_logs`."""
    return _URL.sub(lambda found: url_for_logs(found.group(0)), text)


class MaskedUrls(logging.Filter):
    """Hides the credentials of every URL in a record's message and in its traceback
    (`url_for_logs`): the MCP client logs a failed request with ``exc_info``, and an
    `HTTPStatusError` names the URL whole. The traceback is kept as text, masked, in place of
    the exception, which a formatter would turn into text unmasked."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = _masked_urls(message)
        if masked != message:
            record.msg = masked
            record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = _TRACEBACKS.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = _masked_urls(record.exc_text)
            record.exc_info = None
        return True


_MASKED_URLS = MaskedUrls()


def masked_http_logs() -> None:
    """Put the :class:`MaskedUrls` filter on every HTTP client logger; doing it again changes
    nothing."""
    for name in HTTP_LOGGERS:
        logger = logging.getLogger(name)
        if _MASKED_URLS not in logger.filters:
            logger.addFilter(_MASKED_URLS)


class HiddenSaslBytes(logging.Filter):
    """Hides the bytes of the SASL requests aiokafka logs at DEBUG (``Request to host:port n:
    SaslAuthenticateRequest_v1(sasl_auth_bytes=b'user\\x00user\\x00password')``): over PLAIN
    they hold the password as it is, and SCRAM's hold the proof of it. The request is matched by
    its class's name, so aiokafka is not imported for a filter."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(map(_is_sasl_request, record.args)):
            record.args = tuple(
                f"{type(arg).__name__}(sasl_auth_bytes={HIDDEN})" if _is_sasl_request(arg) else arg
                for arg in record.args
            )
        return True


def _is_sasl_request(arg: object) -> bool:
    return type(arg).__name__.startswith("SaslAuthenticateRequest")


_HIDDEN_SASL_BYTES = HiddenSaslBytes()


def masked_sasl_logs() -> None:
    """Put the :class:`HiddenSaslBytes` filter on aiokafka's connection logger; doing it again
    changes nothing."""
    logger = logging.getLogger("aiokafka.conn")
    if _HIDDEN_SASL_BYTES not in logger.filters:
        logger.addFilter(_HIDDEN_SASL_BYTES)
