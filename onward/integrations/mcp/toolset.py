"""`MCPToolset`: the tools of some MCP servers as Onward tools, for one run."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import anyio
import mcp_types as types
import pydantic
from mcp import ClientSession, MCPError

from onward._storage import Resource
from onward.errors import ConfigurationError, InvalidInputError, OnwardError
from onward.runtime.settings import Settings
from onward.runtime.tools import FENCE_PARAMETER, LEASE_EXPIRY_PARAMETER, Tool

from .cache import MCPSettings, SchemaCache, ServerSchema
from .servers import (
    FENCE_META_KEY,
    IDEMPOTENCY_META_KEY,
    LEASE_EXPIRY_META_KEY,
    NO_ANSWER,
    Connection,
    ServerConfig,
    ToolOptions,
)

_log = logging.getLogger("onward.integrations.mcp")


class MCPToolError(OnwardError):
    """An MCP tool answered with an error (``isError``, or a JSON-RPC error for the call).

    The runner records it as the call's `ToolError` (type ``MCPToolError``), like any tool's
    exception; the model sees the message.

    Attributes:
        server: Onward's name for the server.
        tool: The MCP tool name.
        content: The result's content blocks (MCP JSON), when there was a result.
    """

    def __init__(
        self, message: str, *, server: str, tool: str, content: Sequence[Any] = ()
    ) -> None:
        super().__init__(message)
        self.server = server
        self.tool = tool
        self.content = tuple(content)


class MCPToolset(Resource):
    """The tools of some MCP servers, as `Tool`s that go through the runner like any other.

    ``async with MCPToolset(servers, run_id=..., tenant=..., cache=...) as toolset`` (or
    ``await MCPToolset.open(...)`` and `close`) lists each server's tools, or reads the listings
    cached for that run, and builds ``toolset.tools``. Calls go through the same write-ahead
    dispatch, idempotency keys, approvals and redaction as any tool. Each call carries its
    idempotency key in the request's ``_meta`` under ``onward/idempotency-key`` (and as an
    argument, for a server with ``key_argument``, to the tools that declare it). Beside it,
    ``onward/fence`` carries the fencing token of the lease the call was dispatched under (an
    integer that rises with every claim of the run) and ``onward/lease-expires-at`` when that
    lease lapses (seconds since the epoch, the lease store's clock). A server that remembers
    the highest fence it has seen for a key and refuses a call with a lower one cannot be
    reached by a worker that was paused past its lease and carried on afterwards. A tool whose
    input schema has an argument named ``fence`` or ``lease_expires_at`` keeps it for the
    model: that value is not sent in ``_meta``. One named ``idempotency_key`` is the model's
    too, like any other argument.

    Declared on an agent instead (``Agent(..., toolsets=[MCPToolset(servers)])``, not opened),
    it is bound to each run by whoever drives the run: `onward worker` and `onward.open` open
    a view of it per run (`for_run`) with the run id, its tenant and the schema cache the
    settings ask for (``REDIS_URL``; ``MCP_SCHEMA_CACHE_ENABLED=false`` turns it off), so a
    resume after a crash builds its tools from the cache and sends no ``tools/list``. The
    views share this toolset's connections (one session per server, not one per run);
    `close` ends them, and a call made after it by a view opened before it is refused
    (`BackendUnavailableError`, nothing sent) rather than start a session nothing would close.

    A call whose connection breaks after the request was sent, or that outlasts
    ``call_timeout``, raises `OutcomeUnknownError` (a `BackendUnavailableError`): the server
    may have acted on it, so the runner records it as the call's error only for a
    ``retry_safe`` tool or when the tool's status check says it did not run; otherwise the
    status check's answer settles it, or the call is surfaced for a person. Tools with side
    effects should be idempotent on the key.

    Args:
        servers: The servers, each with a unique ``name``. Tool names must be unique across
            them (after each server's ``prefix``): a clash is a `ConfigurationError`.
        run_id: The run these tools serve: the key of its cached schemas. Without it nothing
            is cached.
        tenant: The tenant the run belongs to: cached schemas are kept per tenant, so a
            toolset opened under another tenant's run id neither reads this run's listings
            nor plants the ones its resume uses. Give it wherever tenants share a cache.
        cache: Where schemas are cached (`SchemaCache.from_settings` reads the environment);
            ``None`` lists every server on every open.
        connect_timeout: Seconds a server may take to start and answer the handshake, and
            to answer its ``tools/list``.
        call_timeout: Seconds a tool call may take; ``None`` waits as long as the tool does.
            A call that takes longer raises `BackendUnavailableError` (the server is sent a
            cancel, and may have acted); the session stays open for the other calls unless
            the server no longer answers a ping either.

    Attributes:
        tools: The tools, in server order, then in the server's name order.
        warm: Names of the servers whose schemas came from the cache (no ``tools/list``).
        replaced: Names of the servers whose cached schemas were replaced because a new
            session reported another version, or the server said its tools changed, and its
            tool list differed.
    """

    def __init__(
        self,
        servers: Sequence[ServerConfig],
        *,
        run_id: str | None = None,
        tenant: str | None = None,
        cache: SchemaCache | None = None,
        connect_timeout: float = 10.0,
        call_timeout: float | None = None,
    ) -> None:
        names = [s.name for s in servers]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigurationError(f"MCP servers named twice: {twice}")
        if not connect_timeout > 0:
            raise InvalidInputError(f"connect_timeout must be positive, got {connect_timeout}")
        if call_timeout is not None and not call_timeout > 0:
            # Zero or less would send each call and give up on its answer at once: every call
            # would take effect and be left undecided.
            raise InvalidInputError(f"call_timeout must be positive, got {call_timeout}")
        self.servers = tuple(servers)
        self.run_id = run_id
        self.tenant = tenant
        self.cache = cache
        self.call_timeout = call_timeout
        self.connections = {
            s.name: Connection(s, connect_timeout=connect_timeout) for s in self.servers
        }
        self.schemas: dict[str, ServerSchema] = {}
        self.tools: tuple[Tool, ...] = ()
        self.warm: tuple[str, ...] = ()
        self.replaced: list[str] = []
        # By server name: the session number and `Connection.list_changes` this toolset's
        # listing is known to match (none yet for a listing from the cache).
        self._checked: dict[str, tuple[int, int]] = {}
        self._open = False
        # By server name: the connection's `Connection.closes` when this toolset opened; its
        # tools are refused a session once the connection closed since.
        self._opened: dict[str, int] = {}
        self._shares_connections = False
        self._settings_cache: tuple[MCPSettings, SchemaCache | None] | None = None
        self._settings_cache_loop: asyncio.AbstractEventLoop | None = None
        # How many open views use each cache made from settings (`run_tools`).
        self._cache_users: dict[SchemaCache, int] = {}
        # Held over the cache made from settings, its loop and its users: two threads' event
        # loops may start runs at once.
        self._settings_guard = threading.Lock()
        self._connect_timeout = connect_timeout

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        """Whether the tools are built and `close` has not been called since."""
        return self._open

    async def _connect(self) -> None:
        """Read the cached schemas, list the servers that have none, build the tools.

        Raises:
            BackendUnavailableError: A server to list did not start or did not answer; the
                message names it.
            ConfigurationError: Tool names clash, or options name a tool a server lacks.
        """
        self._opened = {name: c.closes for name, c in self.connections.items()}
        cached = await self._cached()
        self.warm = tuple(name for name in cached if name in self.connections)
        self.schemas.update(cached)
        cold = [s for s in self.servers if s.name not in cached]
        fresh = await self._list_all(cold)
        self.schemas.update(fresh)
        self.tools = tuple(self._build())
        self._open = True
        if self.cache is not None and self.run_id is not None:
            await self.cache.store(self.run_id, fresh, tenant=self.tenant)

    async def close(self) -> None:
        """Close every session this toolset opened (stopping stdio servers), and the schema
        cache it made from settings; a view (`for_run`) leaves its toolset's open. Idempotent.
        """
        self._open = False
        if self._shares_connections:
            return
        with self._settings_guard:
            settings_cache, self._settings_cache = self._settings_cache, None
            made_in = self._settings_cache_loop
        if settings_cache is not None and settings_cache[1] is not None:
            if made_in is asyncio.get_running_loop():
                await settings_cache[1].close()
            else:
                self._close_elsewhere(settings_cache[1], made_in)
        await asyncio.gather(*(c.close() for c in self.connections.values()))

    # -- per run -----------------------------------------------------------------------------

    def for_run(
        self, run_id: str, *, tenant: str | None = None, cache: SchemaCache | None = None
    ) -> MCPToolset:
        """A view of these servers for one run, to open (``async with``): its own schemas and
        tools, cached under ``run_id`` and ``tenant`` in ``cache`` (default: this toolset's),
        over this toolset's connections, which closing the view leaves open."""
        view = MCPToolset(
            self.servers,
            run_id=run_id,
            tenant=tenant,
            cache=cache if cache is not None else self.cache,
            connect_timeout=self._connect_timeout,
            call_timeout=self.call_timeout,
        )
        view.connections = self.connections
        view._shares_connections = True
        return view

    @contextlib.asynccontextmanager
    async def run_tools(
        self, run_id: str, *, tenant: str | None, settings: Settings
    ) -> AsyncIterator[Sequence[Tool]]:
        """The tools for one run (`onward.runtime.toolsets.RunToolset`): a view's, cached in
        this toolset's cache or else the one ``settings`` ask for (none without
        ``REDIS_URL``, or with ``MCP_SCHEMA_CACHE_ENABLED=false``)."""
        made = self.cache is None
        cache = self.cache if not made else await self._cache_of(settings)
        try:
            async with self.for_run(run_id, tenant=tenant, cache=cache) as view:
                yield view.tools
        finally:
            if made and cache is not None:
                await self._release(cache)

    async def _cache_of(self, settings: Settings) -> SchemaCache | None:
        """The schema cache ``settings`` ask for, made once and kept for the next runs (a
        Redis connection pool shared by the views), counted as used by one more view (to
        `_release`). Looked up, made and counted under a thread lock: another thread's loop
        making one at once left this loop marked as the cache's beside the other loop's cache
        (its Redis connections usable from that loop only), and its own never closed."""
        wanted = MCPSettings.of(settings)
        loop = asyncio.get_running_loop()
        with self._settings_guard:
            if self._settings_cache_loop is not loop:
                # Made in an event loop that has ended (a second ``asyncio.run`` with no
                # `close` between), or another thread's: its Redis connections belong to that
                # loop, usable from no other.
                dropped = self._settings_cache[1] if self._settings_cache is not None else None
                if dropped is not None and dropped not in self._cache_users:
                    self._close_elsewhere(dropped, self._settings_cache_loop)
                self._settings_cache = None
                self._settings_cache_loop = loop
            old: SchemaCache | None = None
            if self._settings_cache is not None and self._settings_cache[0] == wanted:
                cache = self._settings_cache[1]
            else:
                old = self._settings_cache[1] if self._settings_cache is not None else None
                cache = SchemaCache.from_settings(wanted)
                self._settings_cache = (wanted, cache)
            if cache is not None:
                self._cache_users[cache] = self._cache_users.get(cache, 0) + 1
            close_old = old is not None and old not in self._cache_users
        if old is not None:
            # Other settings than the last run's (another deployment in this process): the
            # old cache is closed now, or by the last view using it when that closes.
            _log.info("MCP schema cache settings changed; using a new cache")
            if close_old:
                try:
                    await old.close()
                except BaseException:
                    if cache is not None:  # its view is not opened: it is not counted
                        await self._release(cache)
                    raise
        return cache

    def _close_elsewhere(self, cache: SchemaCache, loop: asyncio.AbstractEventLoop | None) -> None:
        """Close a cache made in ``loop``, another event loop than this one, in that loop if it
        still runs (another thread's, running runs by turns with this one): its Redis
        connections are usable from no other, and dropped they stay open as long as that loop
        lives. One made in a loop that has ended cannot be closed at all."""
        if loop is None or loop.is_closed() or not loop.is_running():
            return
        with contextlib.suppress(RuntimeError):  # that loop closed meanwhile
            asyncio.run_coroutine_threadsafe(cache.close(), loop)

    async def _release(self, cache: SchemaCache) -> None:
        """A view made from settings is done with ``cache``: close it if it was the last view
        using it and other settings (or another loop) have replaced it."""
        with self._settings_guard:
            self._cache_users[cache] -= 1
            if self._cache_users[cache]:
                return
            del self._cache_users[cache]
            current = self._settings_cache[1] if self._settings_cache is not None else None
        if cache is not current:
            await cache.close()

    # -- schemas -----------------------------------------------------------------------------

    async def _cached(self) -> dict[str, ServerSchema]:
        """The cached listings still usable: for the same endpoint, and naming every tool the
        server's options name (one that lacks some predates them, made before an upgrade of
        the server: it is listed again, and only a tool it still lacks is refused)."""
        if self.cache is None or self.run_id is None:
            return {}
        found = await self.cache.load(self.run_id, tenant=self.tenant)
        return {
            s.name: found[s.name]
            for s in self.servers
            if s.name in found
            and found[s.name].endpoint == s.endpoint
            and set(s.tools) <= {str(t["name"]) for t in found[s.name].tools}
        }

    async def _list_all(self, servers: Sequence[ServerConfig]) -> dict[str, ServerSchema]:
        """List the servers concurrently; the first failure is raised once all have ended."""
        listed = await asyncio.gather(
            *(self._first_listing(s) for s in servers), return_exceptions=True
        )
        fresh: dict[str, ServerSchema] = {}
        for server, outcome in zip(servers, listed, strict=True):
            if isinstance(outcome, BaseException):
                raise outcome
            fresh[server.name] = outcome
        return fresh

    async def _first_listing(self, server: ServerConfig) -> ServerSchema:
        connection = self.connections[server.name]
        session, initialized, number = await connection.session(self._opened.get(server.name))
        changes = connection.list_changes
        listed = await self._list(connection, session, initialized)
        self._checked[server.name] = (number, changes)
        return listed

    async def _list(
        self, connection: Connection, session: ClientSession, initialized: types.InitializeResult
    ) -> ServerSchema:
        """The server's tools, every page, within its ``connect_timeout``: the session has no
        read timeout of its own, and a server that never answers must not hold the open (or
        the call that lists it again) for good."""
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        bound = connection.connect_timeout
        limit = asyncio.timeout(bound)
        try:
            async with limit:
                while True:
                    page = await session.list_tools(
                        params=types.PaginatedRequestParams(cursor=cursor) if cursor else None
                    )
                    tools.extend(
                        t.model_dump(mode="json", by_alias=True, exclude_none=True)
                        for t in page.tools
                    )
                    cursor = page.next_cursor
                    if not cursor:
                        break
        except (MCPError, pydantic.ValidationError, OSError, anyio.BrokenResourceError) as exc:
            connection.drop(session)
            if limit.expired():
                raise connection.unavailable(
                    None, f"listing tools (no answer within {bound:g}s)"
                ) from exc
            raise connection.unavailable(exc, "listing tools") from exc
        info = initialized.server_info
        return ServerSchema.of(
            tools,
            endpoint=connection.server.endpoint,
            server_name=info.name,
            server_version=info.version,
        )

    async def _check_version(
        self,
        connection: Connection,
        session: ClientSession,
        initialized: types.InitializeResult,
        number: int,
    ) -> None:
        """List again when a session this toolset has not checked its listing on reports
        another server version, or the server said its tools changed since the listing (for a
        listing from the cache: at all, in this process); replace the cached listing if the
        tools differ.

        Tracked per toolset, not on the connection: the views of every run share it, and each
        run's cached listing needs the check.
        """
        server = connection.server
        known = self.schemas[server.name]
        info = initialized.server_info
        changes = connection.list_changes
        checked = self._checked.get(server.name)
        changed = changes != (checked[1] if checked is not None else 0)
        if not changed and (info.name, info.version) == (known.server_name, known.server_version):
            self._checked[server.name] = (number, changes)
            return
        fresh = await self._list(connection, session, initialized)
        if fresh.digest != known.digest:
            _log.warning(
                "run %r: MCP server %r now reports %s %s with other tools (schema %s, was %s); "
                "its cached schemas are replaced. This run keeps the tools it has; the next "
                "resume gets the new ones.",
                self.run_id,
                server.name,
                info.name,
                info.version,
                fresh.digest,
                known.digest,
            )
            self.replaced.append(server.name)
        self.schemas[server.name] = fresh
        self._checked[server.name] = (number, changes)
        if self.cache is not None and self.run_id is not None:
            await self.cache.store(self.run_id, {server.name: fresh}, tenant=self.tenant)

    # -- tools -------------------------------------------------------------------------------

    def _build(self) -> Iterable[Tool]:
        owners: dict[str, str] = {}
        tools: list[Tool] = []
        for server in self.servers:
            schema = self.schemas[server.name]
            names = {str(t["name"]) for t in schema.tools}
            unknown = sorted(set(server.tools) - names)
            if unknown:
                raise ConfigurationError(
                    f"MCP server {server.name!r} has no tools {unknown}, which its options "
                    f"name; it has {sorted(names)}"
                )
            for raw in schema.tools:
                try:
                    made = self._tool(server, raw)
                except ConfigurationError as exc:
                    # The tool's own check names the tool only; with several servers the
                    # user needs to know which one listed it.
                    raise ConfigurationError(
                        f"MCP server {server.name!r} lists a tool Onward cannot take, "
                        f"{str(raw['name'])!r}: {exc}"
                    ) from None
                if owners.get(made.name) == server.name:
                    raise ConfigurationError(
                        f"MCP server {server.name!r} lists tool {str(raw['name'])!r} twice; "
                        "its listing is broken"
                    )
                if made.name in owners:
                    raise ConfigurationError(
                        f"tool {made.name!r} is offered by MCP servers {owners[made.name]!r} "
                        f"and {server.name!r}; give one of them a prefix"
                    )
                owners[made.name] = server.name
                tools.append(made)
        return tools

    def _tool(self, server: ServerConfig, raw: Mapping[str, Any]) -> Tool:
        mcp_name = str(raw["name"])
        options = server.tools.get(mcp_name, ToolOptions())
        parameters: dict[str, Any] = dict(raw.get("inputSchema") or {"type": "object"})
        # Only a tool that declares the argument is sent it: a server that checks arguments
        # against the schema it listed refuses one the schema does not have.
        key_argument = server.key_argument if _declares(parameters, server.key_argument) else None
        if key_argument is not None:
            parameters = _without(parameters, key_argument)
        retry_safe = options.retry_safe
        if retry_safe is None:
            hints = raw.get("annotations") or {}
            retry_safe = server.trust_annotations and (
                hints.get("readOnlyHint") is True or hints.get("idempotentHint") is True
            )
        connection = self.connections[server.name]
        # An argument of the server's own named `fence` or `lease_expires_at` stays the model's,
        # and the lease's value of that name is then not sent in `_meta`.
        declared = parameters.get("properties")
        declared = declared if isinstance(declared, dict) else {}

        async def call(
            args: dict[str, Any],
            *,
            idempotency_key: str,
            fence: int | None = None,
            lease_expires_at: float | None = None,
        ) -> Any:
            if key_argument is not None:
                args[key_argument] = idempotency_key
            lease = {FENCE_META_KEY: fence, LEASE_EXPIRY_META_KEY: lease_expires_at}
            return await self._call(connection, mcp_name, args, idempotency_key, lease)

        return _MCPTool(
            name=server.prefix + mcp_name,
            description=str(raw.get("description") or ""),
            parameters=parameters,
            fn=call,
            retry_safe=retry_safe,
            reconcile=options.reconcile,
            requires_approval=options.requires_approval,
            takes_fence=FENCE_PARAMETER not in declared,
            takes_lease_expiry=LEASE_EXPIRY_PARAMETER not in declared,
        )

    async def _call(
        self,
        connection: Connection,
        tool: str,
        args: dict[str, Any],
        key: str,
        lease: Mapping[str, int | float | None],
    ) -> Any:
        server = connection.server
        request = types.CallToolRequest(
            params=types.CallToolRequestParams(
                name=tool,
                arguments=args,
                _meta=cast(
                    types.RequestParamsMeta,
                    {IDEMPOTENCY_META_KEY: key}
                    | {meta: value for meta, value in lease.items() if value is not None},
                ),
            )
        )
        for attempt in range(2):
            session, initialized, number = await connection.session(self._opened.get(server.name))
            if self._checked.get(server.name) != (number, connection.list_changes):
                await self._check_version(connection, session, initialized, number)
            try:
                return await self._send(connection, session, tool, key, request)
            except MCPError as exc:
                unsent = connection.unsent(session, key)
                if not unsent and (not connection.refused(session, key) or exc.code in NO_ANSWER):
                    raise  # pragma: no cover - `_send` raises no other
                # The server no longer knew the session (it restarted, or expired it) and
                # refused the call unhandled, or the call never reached it: it is made once
                # more, on a new session.
                connection.drop(session)
                if attempt:
                    why = (
                        "it could not be reached"
                        if unsent
                        else "the server forgot each new session"
                    )
                    raise connection.unavailable(exc, f"calling {tool!r} ({why})") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def _send(
        self,
        connection: Connection,
        session: ClientSession,
        tool: str,
        key: str,
        request: types.CallToolRequest,
    ) -> Any:
        """Send the call on ``session``: its outcome, or the error that says what became of it.

        Raises:
            MCPError: The server refused it for a session it no longer knows
                (`Connection.refused`), or it never reached the server
                (`Connection.unsent`): it was not handled.
        """
        server = connection.server
        try:
            # `send_request` rather than `call_tool`: the latter lists the tools of a session
            # that has not listed them (to check output schemas), which a warm resume skips.
            result = await session.send_request(
                request, types.CallToolResult, request_read_timeout_seconds=self.call_timeout
            )
        except MCPError as exc:
            if connection.refused(session, key) and exc.code not in NO_ANSWER:
                # The answer to this request was the refusal: one in flight when the server
                # went, answered by nothing, may have been handled and is not made again.
                raise
            if connection.unsent(session, key):
                raise  # its request never connected: the server cannot have acted on it
            if exc.code == types.REQUEST_TIMEOUT:
                # This call was slow: the session, shared with other calls, goes only if the
                # server stopped answering altogether.
                await connection.drop_unless_answering(session)
                raise connection.unavailable(exc, f"calling {tool!r}", sent=True) from exc
            if exc.code == types.CONNECTION_CLOSED:
                connection.drop(session)
                raise connection.unavailable(exc, f"calling {tool!r}", sent=True) from exc
            if connection.server_failed(session, key):
                # An HTTP server error, from the server or a gateway that gave up waiting on
                # it, is no answer from the tool: the server may have handled the call.
                raise connection.unavailable(exc, f"calling {tool!r}", sent=True) from exc
            raise MCPToolError(
                f"MCP tool {tool!r} of server {server.name!r} failed: {exc.message}",
                server=server.name,
                tool=tool,
            ) from exc
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            connection.drop(session)
            raise connection.unavailable(exc, f"calling {tool!r}", sent=True) from exc
        except pydantic.ValidationError as exc:
            raise MCPToolError(
                f"MCP tool {tool!r} of server {server.name!r} answered with a malformed result",
                server=server.name,
                tool=tool,
            ) from exc
        return _outcome(server.name, tool, result)


@dataclass(frozen=True)
class _MCPTool(Tool):
    """A tool of an MCP server: its ``fn`` takes the model's arguments as one mapping, beside
    the values Onward passes rather than among them (``fn(args, idempotency_key=...,
    fence=..., lease_expires_at=...)``), so an argument of the server's own named like one of
    Onward's keywords (``idempotency_key``) is the model's, like any other."""

    arguments_as_keywords = False

    async def call(
        self,
        args: Mapping[str, Any],
        *,
        idempotency_key: str,
        approval: Any = None,
        fence: int | None = None,
        lease_expires_at: float | None = None,
    ) -> Any:
        """Call the server's tool with the model's arguments (``approval`` is not sent).

        Raises:
            ToolArgumentsError: The model's arguments were not a JSON object; nothing was
                called.
        """
        return await self.fn(
            self._arguments(args),
            idempotency_key=idempotency_key,
            fence=fence if self.takes_fence else None,
            lease_expires_at=lease_expires_at if self.takes_lease_expiry else None,
        )


def _outcome(server: str, tool: str, result: types.CallToolResult) -> Any:
    """The tool's result: its structured content, else its text, else its content blocks."""
    blocks = [b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in result.content]
    texts = [str(b["text"]) for b in blocks if b.get("type") == "text"]
    if result.is_error:
        detail = "\n".join(texts) or "no detail"
        raise MCPToolError(
            f"MCP tool {tool!r} of server {server!r} reported an error: {detail}",
            server=server,
            tool=tool,
            content=blocks,
        )
    if result.structured_content is not None:
        return result.structured_content
    if len(texts) == len(blocks):
        return "\n".join(texts)
    return blocks


def _declares(schema: Mapping[str, Any], argument: str | None) -> bool:
    """Whether the schema has a property named ``argument``."""
    properties = schema.get("properties")
    return argument is not None and isinstance(properties, dict) and argument in properties


def _without(schema: dict[str, Any], argument: str) -> dict[str, Any]:
    """The schema minus one property (the runner supplies it)."""
    trimmed = dict(schema)
    properties = trimmed.get("properties")
    if isinstance(properties, dict) and argument in properties:
        trimmed["properties"] = {k: v for k, v in properties.items() if k != argument}
    required = trimmed.get("required")
    if isinstance(required, list) and argument in required:
        trimmed["required"] = [r for r in required if r != argument]
    return trimmed
