"""`/metrics`, `/healthz` and `/readyz` over a minimal HTTP/1.1 server on the process's loop.

Served from the same event loop as the work, so `/healthz` answering is itself the proof that
the loop is not stuck. `/readyz` asks the process (its stores, its lag, its group) within a
short bound and answers 200, or 503 with one line saying why not. One request per connection;
no web framework, since three fixed routes need none. Bounded for a port open to a network: at
most `MAX_CONNECTIONS` are answered at once (one past it is answered 503 and closed at once, so
a flood cannot take the file descriptors the stores need), and requests for `/readyz` that
arrive while a check is in flight share its answer instead of probing every store again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Self, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

Readiness = Callable[[], Awaitable[str | None]]
"""Answers ``None`` when the process is ready, else one line saying why it is not."""

Refresh = Callable[[], Awaitable[None]]
"""Brings measured values (a projector's lag) up to date before a scrape."""

READY_WITHIN_S = 5.0
"""Longest a readiness check may take."""

REFRESH_WITHIN_S = 2.0
"""Longest the refresh before a scrape may take; past it, the last values are served."""

PROBE_WITHIN_S = 1.0
"""Longest one store may take to answer a readiness probe (`probe`)."""

MAX_CONNECTIONS = 64
"""Most connections answered at once; past it, one is answered 503 and closed at once."""

_REQUEST_WITHIN_S = 5.0
_MAX_HEADER_BYTES = 16 * 1024

_log = logging.getLogger("onward.metrics")

_T = TypeVar("_T")

_ENDING: set[asyncio.Future[Any]] = set()
"""Checks cut off at their bound and still ending (held so they are not collected)."""


class HealthServer:
    """Serves a registry's metrics, health and readiness on ``host:port`` (0: a free port).

    Args:
        registry: What `/metrics` exposes.
        ready: The readiness check behind `/readyz`.
        refresh: Run (bounded) before `/metrics` is generated.
        host: The address to bind.
        port: The port; 0 picks a free one (read :attr:`port` after start).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        ready: Readiness,
        refresh: Refresh | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self._ready = ready
        self._refresh = refresh
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._closing = False
        self._checking: asyncio.Future[str | None] | None = None

    @property
    def url(self) -> str:
        """Where it serves, for the line the command prints."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        """Bind and start serving; :attr:`port` is the bound port after."""
        self._closing = False
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop serving: close the listening socket and every connection still open, whose
        answer (a readiness check in flight) is cancelled."""
        server, self._server = self._server, None
        if server is not None:
            self._closing = True
            server.close()
            connections = list(self._connections)
            checking, self._checking = self._checking, None
            for task in connections:
                task.cancel()
            if checking is not None:
                checking.cancel()
                await asyncio.gather(checking, return_exceptions=True)
            await asyncio.gather(*connections, return_exceptions=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), _REQUEST_WITHIN_S)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer one connection; `close` cancels it, and the connection closes with it."""
        task = asyncio.current_task()
        if self._closing or task is None:  # accepted as the server closed
            writer.close()
            return
        if len(self._connections) >= MAX_CONNECTIONS:
            with contextlib.suppress(ConnectionError):
                writer.write(_reply(503, "text/plain; charset=utf-8", b"too many connections\n"))
            writer.close()
            return
        self._connections.add(task)
        try:
            await self._exchange(reader, writer)
        except asyncio.CancelledError:
            if not self._closing:
                raise
            # Cancelled by `close`: ends quietly (Python 3.11's stream callback logs a
            # cancelled connection task as an error).
        finally:
            self._connections.discard(task)
            writer.close()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = b""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _REQUEST_WITHIN_S)
            status, content_type, body = await self._answer(head)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            status, content_type, body = 400, "text/plain; charset=utf-8", b"bad request\n"
        except ConnectionError:
            return
        # For HEAD the length says what GET would send; the body is not sent.
        reply = _reply(status, content_type, body, with_body=not head.startswith(b"HEAD "))
        with contextlib.suppress(ConnectionError):
            writer.write(reply)
            try:
                await asyncio.wait_for(writer.drain(), _REQUEST_WITHIN_S)
            except TimeoutError:
                # A client that does not read its answer would hold its connection, one of
                # `MAX_CONNECTIONS`, for as long as it stays open: dropped, unsent answer and all.
                writer.transport.abort()

    async def _answer(self, head: bytes) -> tuple[int, str, bytes]:
        text = "text/plain; charset=utf-8"
        if len(head) > _MAX_HEADER_BYTES:
            return 400, text, b"request too large\n"
        method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
        path = rest.split(" ", 1)[0].split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return 405, text, b"only GET\n"
        if path == "/healthz":
            return 200, text, b"ok\n"
        if path == "/readyz":
            why = await self._readiness()
            return (200, text, b"ready\n") if why is None else (503, text, f"{why}\n".encode())
        if path == "/metrics":
            if self._refresh is not None:
                try:
                    await _within(self._refresh(), REFRESH_WITHIN_S)
                except Exception as exc:  # noqa: BLE001 - the last values are served instead
                    _log.debug("refreshing metrics before a scrape failed: %r", exc)
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)
        return 404, text, b"not found: /metrics, /healthz, /readyz\n"

    async def _readiness(self) -> str | None:
        """The answer of the check in flight, or of a new one: concurrent requests share it.
        Shielded, so a request's connection closing does not cancel the others' answer."""
        if self._checking is None or self._checking.done():
            self._checking = asyncio.ensure_future(self._check())
        return await asyncio.shield(self._checking)

    async def _check(self) -> str | None:
        try:
            return await _within(self._ready(), READY_WITHIN_S)
        except TimeoutError:
            return f"not ready: no answer within {READY_WITHIN_S:g}s"
        except Exception as exc:  # noqa: BLE001 - any failure is a reason not to be ready
            return f"not ready: {type(exc).__name__}: {exc}".splitlines()[0]


def _reply(status: int, content_type: str, body: bytes, *, with_body: bool = True) -> bytes:
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    return head + body if with_body else head


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}


async def probe(
    name: str, check: Awaitable[object], within_s: float = PROBE_WITHIN_S
) -> str | None:
    """``None`` if ``check`` answers within ``within_s``, else one line naming ``name``."""
    try:
        await _within(check, within_s)
    except TimeoutError:
        return f"{name} did not answer within {within_s:g}s"
    except Exception as exc:  # noqa: BLE001 - any failure means the store is not reachable
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"{name} unreachable: {first}"
    return None


async def _within(work: Awaitable[_T], seconds: float) -> _T:
    """What ``work`` gives if it ends within ``seconds``, else `TimeoutError` at ``seconds``.

    Not `asyncio.wait_for`, which waits past its bound for the work it cancelled to end: a
    store call cut off on a silent server ends only at the store's own bound (thirty seconds
    by default), as giving its connection back asks that server. The cancelled work ends in
    the background instead.
    """
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except BaseException:
        _cut_off(task)
        raise
    if not done:
        _cut_off(task)
        raise TimeoutError
    return task.result()


def _cut_off(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and let it end in the background."""
    task.cancel()
    _ENDING.add(task)
    task.add_done_callback(_ended)


def _ended(task: asyncio.Future[Any]) -> None:
    """Let go of a check that ended after its bound; its error, if any, was answered already."""
    _ENDING.discard(task)
    if not task.cancelled():
        task.exception()
