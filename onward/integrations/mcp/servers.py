"""MCP server declarations and the connection that holds one session to a server.

A session lives in a task of its own: the SDK's transports are anyio task groups, which must be
entered and left by the same task, while tool calls arrive from whichever task the runner uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import shlex
import sys
import threading
import weakref
from asyncio import FIRST_COMPLETED
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO
from urllib.parse import urlsplit

import httpx2
import mcp_types as types
from anyio.abc import Process
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.os.posix.utilities import terminate_posix_process_tree

from onward._storage.logs import masked_http_logs
from onward.errors import BackendUnavailableError, ConfigurationError, OutcomeUnknownError
from onward.runtime.tools import Reconcile

_log = logging.getLogger("onward.integrations.mcp")

_CLOSE_TIMEOUT = 10.0
"""Seconds a session gets to shut down (the SDK's stdio shutdown bounds itself at a few)."""

_TERMINATE_TIMEOUT = 2.0
"""Seconds a server process ended from outside its session's loop gets between SIGTERM and
SIGKILL (the SDK's own grace)."""

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
"""A URL's scheme and the ``//`` after it (RFC 3986)."""

_BEYOND_AUTHORITY = re.compile(r"[/?#]")
"""What ends a URL's authority: a userinfo holding one was not parsed as a userinfo."""

_QUERY_OR_FRAGMENT = re.compile(r"[?#]")
"""Where a URL's query or fragment (a token, often) starts."""

NO_ANSWER = (types.CONNECTION_CLOSED, types.REQUEST_TIMEOUT)
"""JSON-RPC error codes the SDK gives a request the server never answered."""

TransportStreams = tuple[Any, Any]
"""The read and write streams a transport yields (the SDK's own alias is private)."""

IDEMPOTENCY_META_KEY = "onward/idempotency-key"
"""The ``_meta`` key of every ``tools/call`` that carries the call's idempotency key."""

FENCE_META_KEY = "onward/fence"
"""The ``_meta`` key that carries the fencing token (an integer) the call was dispatched under."""

SESSION_HEADER = "mcp-session-id"
"""The HTTP header of a streamable HTTP request that names its session."""

LEASE_EXPIRY_META_KEY = "onward/lease-expires-at"
"""The ``_meta`` key that carries when the call's lease lapses (seconds since the epoch)."""


@dataclass(frozen=True, slots=True)
class ToolOptions:
    """What the MCP server cannot say about one of its tools; given by the user.

    Attributes:
        retry_safe: Calling it twice is harmless. ``None`` takes it from the tool's MCP
            annotations when the server's ``trust_annotations`` is on (``readOnlyHint`` or
            ``idempotentHint`` true), else ``False``.
        requires_approval: A person approves each call before it is dispatched.
        reconcile: The tool's status check for calls resume cannot decide.
    """

    retry_safe: bool | None = None
    requires_approval: bool = False
    reconcile: Reconcile | None = None


@dataclass(frozen=True, kw_only=True)
class _Server:
    name: str
    tools: Mapping[str, ToolOptions] = field(default_factory=dict)
    prefix: str = ""
    key_argument: str | None = None
    trust_annotations: bool = True

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigurationError("an MCP server needs a name")

    @property
    def where(self) -> str:  # pragma: no cover - both kinds override it
        """Where the server is, for messages: no arguments, query strings or credentials."""
        raise NotImplementedError

    @property
    def endpoint(self) -> str:  # pragma: no cover - both kinds override it
        """A digest of what is connected to; a cached listing for another endpoint is unused."""
        raise NotImplementedError

    def transport(
        self,
        *,
        on_response: Callable[[httpx2.Response], None] | None = None,
        on_unsent: Callable[[httpx2.Request], None] | None = None,
        on_process: Callable[[Process], None] | None = None,
    ) -> contextlib.AbstractAsyncContextManager[TransportStreams]:
        """The transport's streams; ``on_response`` sees each HTTP response, ``on_unsent``
        each request that never reached the server (no connection was made) (HTTP only);
        ``on_process`` the server process once started (stdio only)."""
        raise NotImplementedError  # pragma: no cover


@dataclass(frozen=True, kw_only=True)
class StdioServer(_Server):
    """An MCP server Onward starts as a subprocess and talks to over stdin/stdout.

    Attributes:
        name: Onward's name for the server: in errors, logs and the schema cache.
        command: The executable.
        args: Its arguments.
        env: Extra environment variables (the SDK passes only a safe few of ours through).
        cwd: Its working directory.
        errlog: Where its stderr goes (default: this process's stderr).
        tools: Options by MCP tool name (`ToolOptions`); a name the server does not have is a
            `ConfigurationError`.
        prefix: Put before each of its tool names, to keep names apart across servers.
        key_argument: Also pass the idempotency key as this argument (and hide it from the
            model's schema), for servers whose tools take the key as a parameter: to each tool
            whose input schema declares it, and only to those.
        trust_annotations: Let ``readOnlyHint``/``idempotentHint`` make a tool `retry_safe`.
    """

    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = field(default=None, repr=False)
    cwd: str | None = None
    errlog: TextIO | None = field(default=None, compare=False, repr=False)

    @property
    def where(self) -> str:
        """The executable (its arguments may hold secrets)."""
        return f"command {self.command}"

    @property
    def endpoint(self) -> str:
        """A digest of the command line, the extra environment and the working directory:
        another token in ``env`` is another endpoint (and no value is stored in clear)."""
        return _digest_of(
            "stdio", shlex.join([self.command, *self.args]), self.cwd or "", self.env or {}
        )

    @contextlib.asynccontextmanager
    async def transport(
        self,
        *,
        on_response: Callable[[httpx2.Response], None] | None = None,
        on_unsent: Callable[[httpx2.Request], None] | None = None,
        on_process: Callable[[Process], None] | None = None,
    ) -> AsyncIterator[TransportStreams]:
        parameters = StdioServerParameters(
            command=self.command,
            args=list(self.args),
            env=dict(self.env) if self.env is not None else None,
            cwd=self.cwd,
        )
        client = stdio_client(parameters, errlog=self.errlog or sys.stderr)
        async with client as streams:
            if on_process is not None and (process := _process_of(client)) is not None:
                on_process(process)
            yield streams


@dataclass(frozen=True, kw_only=True)
class HttpServer(_Server):
    """An MCP server reached over streamable HTTP.

    Attributes:
        name: Onward's name for the server: in errors, logs and the schema cache.
        url: Its endpoint (``https://host/mcp``).
        headers: Sent with every request (authorization, for instance).
        timeout_seconds: Connect and write timeout. Reads have no bound of their own: the
            toolset bounds each request (``connect_timeout``, ``call_timeout``), and a call
            with no ``call_timeout`` waits as long as the tool does.
        tools: Options by MCP tool name, as for `StdioServer`.
        prefix: Put before each of its tool names.
        key_argument: Also pass the idempotency key as this argument, to each tool whose
            input schema declares it.
        trust_annotations: Let ``readOnlyHint``/``idempotentHint`` make a tool `retry_safe`.
    """

    url: str = field(repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    timeout_seconds: float = 30.0

    def __post_init__(self) -> None:
        """Refuse a URL no request can be sent to, or a timeout no request can be sent
        within, naming the server, at declaration rather than at the first connection (where
        a bad port was a bare `ValueError`, and a zero timeout a ``ConnectTimeout``)."""
        super().__post_init__()
        timeout = self.timeout_seconds
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ConfigurationError(
                f"MCP server {self.name!r}: its timeout_seconds must be a positive number of "
                f"seconds, got {timeout!r}"
            )
        try:
            parts = urlsplit(self.url)
            port_ok = parts.port is None or parts.port > 0
        except ValueError:
            # Not the parser's text: a password holding a "/" is the port it names.
            raise ConfigurationError(
                f"MCP server {self.name!r}: its url is invalid (a port that is not a number "
                f"from 1 to 65535, or a [host] not closed), got {self.where!r}"
            ) from None
        if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
            raise ConfigurationError(
                f"MCP server {self.name!r}: its url must be http:// or https:// with a host, "
                f"got {self.where!r}"
            )

    def __repr__(self) -> str:
        # The url may hold a password or a token (in its userinfo, in its query): shown as
        # `where` shows it, as the headers are left out.
        return (
            f"HttpServer(name={self.name!r}, where={self.where!r}, tools={self.tools!r}, "
            f"prefix={self.prefix!r}, key_argument={self.key_argument!r}, "
            f"trust_annotations={self.trust_annotations!r}, "
            f"timeout_seconds={self.timeout_seconds!r})"
        )

    @property
    def where(self) -> str:
        """The URL without credentials, query or fragment, read as text rather than parsed: a
        userinfo that is not parsed as such (no ``scheme://``, or a password holding a ``/``,
        ``?`` or ``#``: ``http://user:pa/ss@host`` is host ``user``, port ``pa``) has what is
        before the last ``@`` hidden."""
        scheme = _SCHEME.match(self.url)
        start = scheme.end() if scheme else 0
        at = self.url.rfind("@")
        if at < start:
            head, rest = self.url[:start], self.url[start:]
        elif scheme and not _BEYOND_AUTHORITY.search(self.url, start, at):
            head, rest = self.url[:start], self.url[at + 1 :]
        else:
            head, rest = f"{self.url[:start]}***", self.url[at:]
        return head + _QUERY_OR_FRAGMENT.split(rest, maxsplit=1)[0]

    @property
    def endpoint(self) -> str:
        """A digest of the URL and the headers (names case-folded): another tenant's
        authorization on the same URL is another endpoint (and no value is stored in clear)."""
        headers = {name.lower(): value for name, value in self.headers.items()}
        return _digest_of("http", self.url, "", headers)

    @contextlib.asynccontextmanager
    async def transport(
        self,
        *,
        on_response: Callable[[httpx2.Response], None] | None = None,
        on_unsent: Callable[[httpx2.Request], None] | None = None,
        on_process: Callable[[Process], None] | None = None,
    ) -> AsyncIterator[TransportStreams]:
        # No read bound: a fixed one would cut off a tool that answers later than it (a
        # server that answers with one JSON body sends nothing until then), failing the call
        # and, with it, every call in flight on the session, although the server goes on.
        timeout = httpx2.Timeout(self.timeout_seconds, read=None)
        # The clients log the URL whole, at INFO for each request; it may hold a credential.
        masked_http_logs()

        async def answered(response: httpx2.Response) -> None:
            if on_response is not None:
                on_response(response)

        async with (
            _Client(
                on_unsent=on_unsent,
                headers=dict(self.headers),
                timeout=timeout,
                event_hooks={"response": [answered]},
            ) as client,
            streamable_http_client(self.url, http_client=client) as streams,
        ):
            yield streams


ServerConfig = StdioServer | HttpServer
"""A declared MCP server."""


class _Client(httpx2.AsyncClient):
    """An HTTP client that tells ``on_unsent`` of each request that failed to connect: no
    connection to the server was made, so no byte of it reached the server (a failure once
    connected is another error: the request may have been read)."""

    def __init__(
        self, *, on_unsent: Callable[[httpx2.Request], None] | None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self._on_unsent = on_unsent

    async def send(self, request: httpx2.Request, **kwargs: Any) -> httpx2.Response:
        try:
            return await super().send(request, **kwargs)
        except (httpx2.ConnectError, httpx2.ConnectTimeout):
            if self._on_unsent is not None:
                self._on_unsent(request)
            raise


@dataclass(eq=False)
class _InLoop:
    """What a connection holds in one event loop: its lock, session task, handshake, session,
    the session's number and stop event. Each loop has its own: a session's streams and task
    are usable from the loop that made them only. ``closed`` once another loop's `close` let
    go of it: a session opened in it then would be one no close reaches. ``process``: the
    stdio server process of the session, ended by `close` itself when that loop no longer
    runs (its session task never would)."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    task: asyncio.Task[None] | None = None
    ready: asyncio.Future[Any] | None = None
    current: tuple[ClientSession, types.InitializeResult] | None = None
    number: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False
    process: Process | None = None


class Connection:
    """One server's session, opened on demand and held by a task of its own.

    Attributes:
        sessions: How many sessions were opened (each one is a handshake); the number of the
            open one.
        list_changes: How many times the server said its tool list changed
            (``notifications/tools/list_changed``). A count rather than a flag: every run
            sharing the connection checks its own listing against it.
        closes: How many times it was closed: a toolset opened before a close refuses the
            calls made after it (`session`'s ``since``) rather than start a session nothing
            would close.
    """

    def __init__(self, server: ServerConfig, *, connect_timeout: float) -> None:
        self.server = server
        self.connect_timeout = connect_timeout
        self.sessions = 0
        self.list_changes = 0
        self.closes = 0
        # By event loop (two threads' may use the connection at once): its own session.
        self._loops: dict[asyncio.AbstractEventLoop, _InLoop] = {}
        self._loops_guard = threading.Lock()
        # By session, for as long as anything holds the session: what its HTTP responses
        # said is asked after the session ended too (a call whose request never connected
        # ends the transport before its caller hears of it).
        self._answers: weakref.WeakKeyDictionary[ClientSession, _HttpAnswers]
        self._answers = weakref.WeakKeyDictionary()
        self._reads: weakref.WeakKeyDictionary[ClientSession, Any] = weakref.WeakKeyDictionary()

    def unavailable(
        self, exc: BaseException | None, doing: str, *, sent: bool = False
    ) -> BackendUnavailableError:
        """The error naming this server, for a failure of ``doing``; `OutcomeUnknownError`
        once a call was ``sent``: the server may have acted on it."""
        detail = f": {_describe(exc)}" if exc is not None else ""
        message = f"MCP server {self.server.name!r} ({self.server.where}): {doing} failed{detail}"
        if sent:
            return OutcomeUnknownError(f"{message}; it was sent, so it may have taken effect")
        return BackendUnavailableError(message)

    @property
    def is_open(self) -> bool:
        """Whether a session (and the server process or HTTP session under it) is running, in
        this event loop (in any, outside one)."""
        try:
            here = [self._here()]
        except RuntimeError:  # no loop running: any loop's
            with self._loops_guard:
                here = list(self._loops.values())
        return any(state.task is not None and not state.task.done() for state in here)

    async def session(
        self, since: int | None = None
    ) -> tuple[ClientSession, types.InitializeResult, int]:
        """The open session, opening one if there is none, and its number (`sessions` when
        it was opened): a run whose listing was not checked on that session checks it.

        Args:
            since: The `closes` the caller's toolset opened at: refused once it was closed
                since, for nothing would close a session opened after that close.

        Raises:
            BackendUnavailableError: The server did not start or did not answer the
                handshake, or the connection was closed ``since``.
        """
        async with self._locked() as here:
            if since is not None and since != self.closes:
                raise BackendUnavailableError(
                    f"MCP server {self.server.name!r} ({self.server.where}): its toolset was "
                    "closed; nothing was sent"
                )
            if (
                not here.closed
                and here.current is not None
                and here.task is not None
                and not here.task.done()
                and not _read_side_ended(self._reads.get(here.current[0]))
            ):
                return (*here.current, here.number)
            await self._stop_task(here)
            loop = asyncio.get_running_loop()
            ready: asyncio.Future[tuple[ClientSession, types.InitializeResult]]
            ready = here.ready = loop.create_future()
            here.stop = asyncio.Event()
            with self._loops_guard:  # ordered with another loop's `close` letting go of it
                if here.closed:
                    raise BackendUnavailableError(
                        f"MCP server {self.server.name!r} ({self.server.where}): it was closed "
                        "while connecting; nothing was sent"
                    )
                task = here.task = asyncio.create_task(
                    self._hold(ready, here.stop, here), name=f"mcp:{self.server.name}"
                )
            waiting: set[asyncio.Future[Any]] = {ready, task}
            try:
                await asyncio.wait(
                    waiting, timeout=self.connect_timeout, return_when=FIRST_COMPLETED
                )
            except asyncio.CancelledError:
                await self._stop_task(here)
                raise
            if ready.done() and ready.exception() is None:
                current = here.current = ready.result()
            else:
                failure = ready.exception() if ready.done() else _ended(task)
                timed_out = not ready.done() and not task.done()
                await self._stop_task(here)
                if timed_out:
                    raise self.unavailable(
                        None, f"connecting (no answer within {self.connect_timeout:g}s)"
                    )
                raise self.unavailable(failure, "connecting") from failure
            with self._loops_guard:  # another loop's thread may count one at once
                self.sessions += 1
                here.number = self.sessions
            return (*current, here.number)

    async def _hold(
        self,
        ready: asyncio.Future[tuple[ClientSession, types.InitializeResult]],
        stop: asyncio.Event,
        here: _InLoop,
    ) -> None:
        answers = _HttpAnswers()
        started: Process | None = None

        def spawned(process: Process) -> None:
            nonlocal started
            started = here.process = process

        try:
            async with (
                self.server.transport(
                    on_response=answers.seen, on_unsent=answers.unsent, on_process=spawned
                ) as (read, write),
                ClientSession(read, write, message_handler=self._notified) as session,
            ):
                self._answers[session] = answers
                self._reads[session] = read
                initialized = await session.initialize()
                ready.set_result((session, initialized))
                await stop.wait()
        except Exception as exc:  # noqa: BLE001 - handed to the caller waiting on `ready`
            if not ready.done():
                ready.set_exception(exc)
            else:
                _log.debug("MCP server %r: session ended: %s", self.server.name, _describe(exc))
        finally:
            with self._loops_guard:  # its transport ended it; nothing is left for a close
                if started is not None and here.process is started:
                    here.process = None

    async def _notified(self, message: types.ServerNotification | Exception) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.list_changes += 1

    def forgot(self, session: ClientSession) -> bool:
        """Whether the server said it no longer knows ``session`` (an HTTP 404 to a request
        in it): a request it refused so was never handled, and the session is of no more use."""
        answers = self._answers.get(session)
        return answers is not None and answers.lost

    def refused(self, session: ClientSession, key: str) -> bool:
        """Whether the ``tools/call`` with idempotency ``key`` on ``session`` was itself
        answered 404 for a session the server no longer knows: refused, never handled. Asked
        of the call, not the session: another call's 404 says nothing of one whose answer
        came before the server went."""
        answers = self._answers.get(session)
        return answers is not None and key in answers.refused_calls

    def unsent(self, session: ClientSession, key: str) -> bool:
        """Whether the ``tools/call`` with idempotency ``key`` on ``session`` never reached the
        server: its HTTP request failed to connect (the server is down, or restarting)."""
        answers = self._answers.get(session)
        return answers is not None and key in answers.unsent_calls

    def server_failed(self, session: ClientSession, key: str) -> bool:
        """Whether the ``tools/call`` with idempotency ``key`` on ``session`` was answered with
        an HTTP server error (5xx, from the server or a gateway before it), not an MCP answer:
        the server may have handled it. Asked once per call."""
        answers = self._answers.get(session)
        if answers is None or key not in answers.failed_calls:
            return False
        answers.failed_calls.discard(key)
        return True

    def drop(self, session: ClientSession) -> None:
        """Forget ``session``, which broke; the next call opens a new one. A session that is no
        longer the open one is left alone: a failure on it reported late (a request that was
        in flight when it broke) must not end the session other runs opened since."""
        here = self._here()
        if here.current is not None and here.current[0] is session:
            here.current = None
            here.stop.set()

    async def drop_unless_answering(self, session: ClientSession) -> None:
        """After a request on ``session`` timed out: keep the session if the server still
        answers a ping within ``connect_timeout`` (that tool was slow, and the calls of every
        run sharing the connection are in flight on it), drop it if not (the server hung)."""
        try:
            await session.send_request(
                types.PingRequest(),
                types.EmptyResult,
                request_read_timeout_seconds=self.connect_timeout,
            )
        except MCPError as exc:
            answered = exc.code not in NO_ANSWER  # an error answer (no ping) is an answer
        except Exception:  # noqa: BLE001 - no answer, however the SDK says so
            answered = False
        else:
            answered = True
        if not answered or self.forgot(session):
            self.drop(session)

    async def _stop_task(self, here: _InLoop) -> None:
        task, here.task, here.current = here.task, None, None
        if task is None:
            return
        here.stop.set()
        ready = here.ready
        if ready is None or not ready.done():
            task.cancel()  # still in the handshake, which the stop event cannot interrupt
        _, pending = await asyncio.wait({task}, timeout=_CLOSE_TIMEOUT)
        if pending:
            task.cancel()
            await asyncio.wait({task})
        if ready is not None and ready.done() and not ready.cancelled():
            # A handshake that failed as its caller gave up (cancelled, timed out): nobody is
            # left to report it to, and asyncio would log it as an error nobody read.
            ready.exception()
        if (failure := _ended(task)) is not None:
            _log.debug("MCP server %r: closing: %s", self.server.name, _describe(failure))

    @contextlib.asynccontextmanager
    async def _locked(self) -> AsyncIterator[_InLoop]:
        """Hold this event loop's current lock: a caller that waited on one `close` replaced
        goes on to wait on the new one, so it cannot open a session beside one opened under
        it."""
        here = self._here()
        while True:
            lock = here.lock
            await lock.acquire()
            if lock is here.lock:
                break
            lock.release()
        try:
            yield here
        finally:
            lock.release()

    def _here(self) -> _InLoop:
        """What this connection holds in the running event loop. Each loop has its own (two
        threads running runs at once each use their own session): a session's task and
        streams, and a lock a wait bound, are usable from their loop only. What a loop that
        has ended held is let go of (its tasks were cancelled as it ended, and cannot even be
        waited on from another); a loop still running keeps its session for its next turn, and
        `close` ends it there: let go of, it was left running (its server process too) for as
        long as that loop lived, and every turn started one more. A closed loop whose session
        still holds a server process (closed without its tasks cancelled) is kept for `close`
        to end that process.

        Raises:
            RuntimeError: No event loop is running.
        """
        loop = asyncio.get_running_loop()
        with self._loops_guard:
            here = self._loops.get(loop)
            if here is None:
                for ended in [
                    other
                    for other, state in self._loops.items()
                    if other.is_closed() and state.process is None
                ]:
                    del self._loops[ended]
                here = self._loops[loop] = _InLoop()
            return here

    def _end_elsewhere(self) -> list[Process]:
        """Count the close, tell the loops still running other than this one that hold a
        session of this connection to end it, and let go of what they held: their next use
        opens anew. Counted first, with the letting go: a view opened before the close asking
        for a session while the close still waits for its own to end is refused, not given one
        the close has passed over.

        Returns:
            The server processes of sessions in loops that are not running (stopped, or
            closed, without their tasks ended): nothing there would end them, so the caller
            does.
        """
        loop = asyncio.get_running_loop()
        with self._loops_guard:
            self.closes += 1
            elsewhere = [
                (other, here, here.task, here.ready)
                for other, here in self._loops.items()
                if other is not loop
            ]
            stranded = [
                here.process
                for other, here, task, _ in elsewhere
                if here.process is not None
                and task is not None
                and not task.done()
                and not other.is_running()
            ]
            for other, here, _, _ in elsewhere:
                # A session that loop is about to open (its old one still ending) would be
                # one nothing ends: it is refused instead.
                here.closed = True
                del self._loops[other]
        for other, here, task, ready in elsewhere:
            if task is None or task.done() or other.is_closed():
                continue
            handshaking = ready is None or not ready.done()
            with contextlib.suppress(RuntimeError):  # that loop closed meanwhile
                other.call_soon_threadsafe(task.cancel if handshaking else here.stop.set)
        return stranded

    async def _end_stranded(self, processes: list[Process]) -> None:
        """End the server processes (and their process groups) whose event loop no longer
        runs: SIGTERM, then SIGKILL after a bounded grace, as the SDK's own shutdown does.
        Only while its session task has not ended: the SDK has not ended the process, so its
        process group is still the server's."""
        if not processes or sys.platform == "win32":  # Windows: the SDK's job object ends it
            return
        for process in processes:
            _log.warning(
                "MCP server %r: the event loop holding its session no longer runs; ending its "
                "process %d from the closing loop",
                self.server.name,
                process.pid,
            )
        await asyncio.gather(
            *(terminate_posix_process_tree(process, _TERMINATE_TIMEOUT) for process in processes)
        )

    async def close(self) -> None:
        """End the session and whatever it started (the server process, the HTTP session),
        and those other event loops still running hold (ended in their loops).

        The connection may be used again afterwards, from another event loop too (a toolset
        declared on an agent at import serves every ``asyncio.run`` of its process), so the
        lock, which a wait binds to the loop it happened in, is a new one.
        """
        async with self._locked() as here:
            stranded = self._end_elsewhere()
            await self._stop_task(here)
            await self._end_stranded(stranded)
            here.lock = asyncio.Lock()


@dataclass
class _HttpAnswers:
    """What the HTTP responses of one session said beside their MCP answers."""

    lost: bool = False
    """A request in the session was answered 404: the server no longer knows the session (it
    restarted, or expired it) and handled nothing; the client must open a new one."""
    refused_calls: set[str] = field(default_factory=set)
    """Idempotency keys of the calls answered 404 so: refused, never handled."""
    failed_calls: set[str] = field(default_factory=set)
    """Idempotency keys of the calls answered with an HTTP server error (5xx)."""
    unsent_calls: set[str] = field(default_factory=set)
    """Idempotency keys of the calls whose request failed to connect: never sent."""

    def unsent(self, request: httpx2.Request) -> None:
        if (key := _call_key(request)) is not None:
            self.unsent_calls.add(key)

    def seen(self, response: httpx2.Response) -> None:
        if response.status_code == 404 and SESSION_HEADER in response.request.headers:
            self.lost = True
            if (key := _call_key(response.request)) is not None:
                self.refused_calls.add(key)
        elif response.status_code >= 500 and (key := _call_key(response.request)) is not None:
            self.failed_calls.add(key)


def _call_key(request: httpx2.Request) -> str | None:
    """The idempotency key of a ``tools/call`` request, or ``None`` for any other."""
    try:
        message = json.loads(request.content)
    except (httpx2.RequestNotRead, ValueError):
        return None
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return None
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    key = meta.get(IDEMPOTENCY_META_KEY) if isinstance(meta, dict) else None
    return key if isinstance(key, str) else None


def _process_of(client: contextlib.AbstractAsyncContextManager[Any]) -> Process | None:
    """The server process an entered SDK ``stdio_client`` started, or ``None`` if it cannot
    be found. The SDK keeps it in the transport's own frame only, and ends it from the task of
    the session's event loop; a close from another loop, when that one no longer runs, ends it
    through this."""
    frame = getattr(getattr(client, "gen", None), "ag_frame", None)
    process = frame.f_locals.get("process") if frame is not None else None
    return process if isinstance(process, Process) else None


def _read_side_ended(read: Any) -> bool:
    """Whether a session's transport has stopped delivering answers: the writer of its read
    stream closed (a stdio server's stdout reached its end: the process is gone, or a write to
    it failed). Nothing sent on that session would be answered, so nothing is: a call goes to a
    new session rather than be sent, unanswered, and left as one that may have taken effect.
    Only a memory stream (stdio's) says so; another transport's session is taken as alive."""
    statistics = getattr(read, "statistics", None)
    if statistics is None:
        return False
    state = statistics()
    return bool(state.open_send_streams == 0 or state.open_receive_streams == 0)


def _ended(task: asyncio.Task[None]) -> BaseException | None:
    """How a finished session task ended: its exception, or ``None`` (cancelled or clean)."""
    if not task.done() or task.cancelled():
        return None
    return task.exception()


def _digest_of(kind: str, target: str, cwd: str, values: Mapping[str, str]) -> str:
    """One digest of what a server declaration connects to, its values included only as
    digests of their own (so the canonical text hashed holds no secret either)."""
    hidden = sorted((name, _digest(value)) for name, value in values.items())
    return _digest(json.dumps([kind, target, cwd, hidden]))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _describe(exc: BaseException | None) -> str:
    """The innermost useful message, unwrapping the exception groups of anyio task groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if exc is None:
        return "no detail"
    text = str(exc) or repr(exc)
    return f"{type(exc).__name__}: {text}"
