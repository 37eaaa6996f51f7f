"""`RedisStore`: what every store in Redis shares: one bounded pool, checked when opened.

Opening it connects and sends a PING within the timeout, so a bad URL or a silent server fails
at start, translated like every other driver failure.

Script calls are coalesced (`RedisStore.run_script`): the calls made in one turn of the event
loop go to Redis as one pipeline. A worker's runs reach their lease checks together (a broker
acknowledgement settles many runs' appends at once), and one pipeline of a hundred scripts
costs the client less than a tenth of a hundred separate calls, which each take a pooled
connection, a timeout and a retry wrapper of their own. Each call is still its own script,
atomic on the server, and the calls of one pipeline run in the order they were made.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, NoScriptError, ReadOnlyError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from onward.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
    InvalidInputError,
)

from .stores import BACKEND_TIMEOUT_S, Resource
from .translate import (
    redis_plaintext_refused,
    translate,
    translated,
    unusable_client_certificate,
    unusable_tls_file,
)
from .urls import masked_url, warn_unchecked_server, without_passwords


@contextlib.contextmanager
def usable_redis_url(url: str) -> Iterator[None]:
    """Refuse ``url`` as `ConfigurationError` naming REDIS_URL when redis-py cannot make a
    pool of it in the block (a port that is not a number, an option it does not take).

    The URL is shown, for the operator to find the mistake, without its password, and so is
    redis-py's text (a password holding a ``/`` or ``#`` ends the authority early, and its
    first half is quoted as the port); the driver's exception is not chained, as its text may
    hold the URL as it was given.
    """
    try:
        yield
    except (ValueError, TypeError, RedisError) as exc:
        raise ConfigurationError(
            f"REDIS_URL {masked_url(url)} is not a Redis URL: {without_passwords(str(exc), url)}"
            + (" (the ssl_ parameters need rediss://)" if "'ssl_" in str(exc) else "")
        ) from None


def checked_connection_options(pool: aioredis.ConnectionPool) -> None:
    """Make one connection object of ``pool`` (no socket is opened): the URL's query becomes
    the connection's arguments, and one it does not take (a TLS one on redis://, a misspelt
    one, a value redis-py refuses with its own error, such as ssl_cert_reqs=OPTIONAL) fails
    here, inside `usable_redis_url`, not as a TypeError at first use."""
    pool.connection_class(**pool.connection_kwargs)


class RedisStore(Resource):
    """A store in Redis, on a blocking pool of at most ``max_connections`` connections.

    A blocking pool: a thousand callers at once wait for one of a bounded set of connections
    instead of failing with "too many connections".

    Args:
        url: ``redis://host:port/db`` (or ``rediss://`` for TLS; a CA of your own as
            ``rediss://host:port/db?ssl_ca_certs=/path/to/ca.pem``, which redis-py reads from
            the URL).
        prefix: Put before every key, so several deployments (or tests) can share one Redis.
        max_connections: Largest connection pool.
        timeout_s: The longest one call may wait for Redis (connecting, a pooled connection,
            the answer) before it fails with `BackendUnavailableError`; ``None`` waits as long
            as Redis takes.
    """

    what: ClassVar[str] = "Redis store"

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "onward:",
        max_connections: int = 64,
        timeout_s: float | None = BACKEND_TIMEOUT_S,
    ) -> None:
        if not isinstance(url, str):
            raise InvalidInputError(
                f"url must be a 'redis://host:port/db' string, got {type(url).__name__}"
            )
        self._url = url
        self.prefix = prefix
        self._max_connections = max_connections
        self._timeout_s = timeout_s
        self._client: aioredis.Redis | None = None
        self._queued: list[_ScriptCall] = []
        self._sending: set[asyncio.Task[None]] = set()

    @property
    def is_open(self) -> bool:
        return self._client is not None

    async def _connect(self) -> None:
        """Open the pool, let the store set itself up, and check Redis answers."""
        with usable_redis_url(self._url):
            pool = aioredis.BlockingConnectionPool.from_url(
                self._url,
                max_connections=self._max_connections,
                timeout=self._timeout_s,
                socket_timeout=self._timeout_s,
                socket_connect_timeout=self._timeout_s,
                decode_responses=True,
            )
            client = aioredis.Redis(connection_pool=pool)
            checked_connection_options(pool)
        warn_unchecked_server(self._url, "REDIS_URL")
        self._client = client
        self._started(client)
        with translated("connecting to Redis"):
            try:
                async with asyncio.timeout(self._timeout_s):
                    await client.ping()
            except RedisConnectionError as exc:
                refused = redis_plaintext_refused(exc, self._url) or _unusable_tls_file(self._url)
                if refused is None:
                    raise
                raise ConfigurationError(
                    f"connecting to Redis at {masked_url(self._url)}: {refused}"
                ) from exc
            except (TimeoutError, RedisTimeoutError) as exc:
                # The driver's timeout has no message ("connecting to Redis: TimeoutError: "):
                # say which server, for how long and what sets it. Still unavailable (a server
                # that hangs times out too), but "retry once it is reachable" alone misleads
                # when the port takes no TLS: no retry changes that.
                not_answered = (
                    f"Redis at {masked_url(self._url)} did not answer within "
                    f"{self._timeout_s:g}s (ONWARD_BACKEND_TIMEOUT; timeout_s in Python)"
                    if self._timeout_s is not None
                    else str(translate(exc, context="connecting to Redis"))
                )
                if not self._url.startswith("rediss://"):
                    raise BackendUnavailableError(
                        f"{not_answered}; check that it is up and reachable at that address"
                    ) from exc
                raise BackendUnavailableError(
                    f"{not_answered}; a port that takes no TLS never answers the TLS handshake "
                    "of rediss:// either: if the server takes none, use redis:// in REDIS_URL"
                ) from exc

    def _started(self, client: aioredis.Redis) -> None:
        """What a store sets up on its new client (its scripts) before the first call."""

    def _live_client(self) -> aioredis.Redis:
        if self._client is None:
            name = type(self).__name__
            raise InvalidInputError(
                f"the {self.what} is not open; use `await {name}.open(url)` or `async with`"
            )
        return self._client

    @contextlib.asynccontextmanager
    async def _writing(self, client: aioredis.Redis) -> AsyncIterator[None]:
        """Around writes sent outside `run_script` (a pipeline of their own): a server that
        answered READONLY was demoted, and the pool lets go of it as `_send` does, so the
        next call connects afresh instead of meeting the same replica again."""
        try:
            yield
        except ReadOnlyError:
            await _let_go_of_demoted(client)
            raise

    def _raise_first_error(
        self, answers: list[Any], what: str, keys: list[list[str]], run_ids: list[str]
    ) -> None:
        """Raise the first error among the answers of a pipeline of script calls sent with
        ``raise_on_error=False`` (call ``i`` on ``keys[i]`` for ``run_ids[i]``): a WRONGTYPE
        named by its call's keys and run, as `run_script` names it (redis-py names the call
        by its script's digest, the keys cut off), any other as it came."""
        for answer, call_keys, run_id in zip(answers, keys, run_ids, strict=True):
            if not isinstance(answer, ResponseError):
                continue
            if str(answer).startswith("WRONGTYPE"):
                doing = f"running {what}"
                raise _wrong_type(answer, doing, call_keys, self.prefix, run_id) from answer
            raise answer

    async def run_script(
        self,
        script: AsyncScript,
        keys: list[str],
        args: list[Any],
        *,
        what: str = "a script",
        run_id: str | None = None,
    ) -> Any:
        """Run one Lua script, in a pipeline with the other calls of this turn of the loop.

        Raises what the driver raised for this call (the caller translates it), or
        `InvalidInputError` if the store is closed before the call is sent, or if a key or
        argument is of a type Redis cannot take (named with ``what``, the script, and ``run_id``),
        or `BackendError` naming the script's keys when one holds another type than Onward's.
        """
        _check_encodable(self._live_client(), what, [*keys, *args], run_id)
        call = _ScriptCall(script, keys, args, asyncio.get_running_loop().create_future())
        if not self._queued:
            call.answer.get_loop().call_soon(self._send_queued)
        self._queued.append(call)
        try:
            return await call.answer
        except ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                raise
            raise _wrong_type(exc, f"running {what}", keys, self.prefix, run_id) from exc

    @contextlib.contextmanager
    def _naming(self, key: str, doing: str, run_id: str | None = None) -> Iterator[None]:
        """Around one command on ``key`` sent alone: Redis's WRONGTYPE names no key (a
        pipeline's error names each command's, a script's its line), so it is named here
        as `run_script` names a script's keys, with what was being done."""
        try:
            yield
        except ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                raise
            raise _wrong_type(exc, doing, [key], self.prefix, run_id) from exc

    def _send_queued(self) -> None:
        """Send what this turn of the loop queued, as one pipeline in a task of its own."""
        calls, self._queued = self._queued, []
        task = asyncio.get_running_loop().create_task(self._send(calls))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, calls: list[_ScriptCall]) -> None:
        """One pipeline of ``calls``; each call's future gets its answer or error.

        Each pipeline loads its scripts first, so a Redis that restarted and forgot them
        runs the calls in order; one flushed while the pipeline ran answers ``NOSCRIPT``, and
        those calls are sent again once their scripts are loaded. A failure sending them again
        fails those calls alone: the others ran, and their callers get their answers. A call
        whose caller stopped waiting is still sent (it may have been made already, as with a
        call that timed out), and its answer dropped. A server that answered READONLY was
        demoted in a failover: the pool's idle connections to it are closed before anyone
        hears, so a retry connects afresh and reaches the new primary (as redis-py's Sentinel
        client does).
        """
        unknown: list[int] = []
        try:
            client = self._live_client()
            async with asyncio.timeout(self._timeout_s):
                answers = await _pipeline(client, calls)
                unknown = [
                    i for i, answer in enumerate(answers) if isinstance(answer, NoScriptError)
                ]
                if unknown:
                    await _send_again(client, calls, unknown, answers)
        except Exception as exc:  # noqa: BLE001 - every failure is each caller's to translate
            if isinstance(exc, ReadOnlyError):
                await _let_go_of_demoted(client)
            if not unknown:
                for call in calls:
                    call.fail(exc)
                return
            for i in unknown:
                answers[i] = exc
        except BaseException:
            for call in calls:
                call.answer.cancel()
            raise
        if any(isinstance(answer, ReadOnlyError) for answer in answers):
            await _let_go_of_demoted(client)
        for call, answer in zip(calls, answers, strict=True):
            if isinstance(answer, Exception):
                call.fail(answer)
            elif not call.answer.done():
                call.answer.set_result(answer)

    async def close(self) -> None:
        """Close the connection pool. Idempotent; calls not yet answered fail."""
        client, self._client = self._client, None
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)
        if client is not None:
            with translated("closing the Redis connection pool"):
                await client.aclose(close_connection_pool=True)


class _ScriptCall:
    """One queued script call and the future its caller waits on."""

    __slots__ = ("answer", "args", "keys", "script")

    def __init__(
        self, script: AsyncScript, keys: list[str], args: list[Any], answer: asyncio.Future[Any]
    ) -> None:
        self.script = script
        self.keys = keys
        self.args = args
        self.answer = answer

    def fail(self, error: BaseException) -> None:
        if not self.answer.done():
            self.answer.set_exception(error)


_TLS_FILES: tuple[tuple[str, bool], ...] = (
    ("ssl_ca_certs", True),
    ("ssl_certfile", False),
    ("ssl_keyfile", False),
)
"""The TLS files redis-py loads from a ``rediss://`` URL's query, and whether each holds CA
certificates."""


def _unusable_tls_file(url: str) -> str | None:
    """Which TLS file a ``rediss://`` URL names that cannot be loaded, and why; ``None`` if
    every one it names can be. redis-py loads them as it connects, and a failure to is a
    connection error like a server's that does not answer."""
    if not url.startswith("rediss://"):
        return None
    query = parse_qs(urlsplit(url).query)
    named = {
        parameter: (f"{parameter} in REDIS_URL", query[parameter][-1])
        for parameter, _ in _TLS_FILES
        if query.get(parameter, [""])[-1]
    }
    unusable = unusable_tls_file(
        (*named[parameter], authorities)
        for parameter, authorities in _TLS_FILES
        if parameter in named
    )
    if unusable is not None or "ssl_certfile" not in named:
        return unusable
    return unusable_client_certificate(
        named["ssl_certfile"],
        named.get("ssl_keyfile"),
        ("ssl_password in REDIS_URL", query.get("ssl_password", [""])[-1] or None),
    )


def _check_encodable(
    client: aioredis.Redis, what: str, values: list[Any], run_id: str | None
) -> None:
    """Refuse a call holding a value redis-py cannot encode, before it is queued: a pipeline's
    values are encoded all at once as it is sent, so one such value would fail every call
    sent with it (other runs' lease renewals too), not this call alone."""
    encoder = client.get_encoder()  # type: ignore[no-untyped-call]
    for i, value in enumerate(values, 1):
        if isinstance(value, str) and value.isascii():
            continue  # the common case, and a long text is not encoded twice
        try:
            encoder.encode(value)
        except (DataError, UnicodeError) as exc:
            raise InvalidInputError(
                f"running {what}: value {i} of {len(values)} ({_shown(value)}) "
                f"cannot be sent to Redis: {exc}",
                run_id=run_id,
            ) from None


def _wrong_type(
    exc: ResponseError, doing: str, keys: list[str], prefix: str, run_id: str | None
) -> BackendError:
    """Redis's WRONGTYPE, while ``doing`` something, with the keys it may be about: Redis
    names the script's line (or nothing), not the key, and the operator must find the key
    that another program (or another deployment under the same prefix) wrote in another
    type."""
    if len(keys) == 1:
        named = f"its key {keys[0]!r}"
    elif keys:
        named = f"one of its keys {', '.join(map(repr, keys))}"
    else:
        named = f"one of the keys under {prefix!r} it touches"
    shown = "" if run_id is None else f"run {run_id!r}: "
    return BackendError(
        f"{shown}{doing}: {exc}; {named} holds another type than Onward keeps there: "
        "another program's key, or another deployment's under the same prefix (give each its "
        "own ONWARD_REDIS_PREFIX)",
        run_id=run_id,
    )


def _shown(value: Any) -> str:
    """A value's repr, cut short: it may be large."""
    shown = repr(value)
    return shown if len(shown) <= 60 else f"{shown[:57]}..."


async def _let_go_of_demoted(client: aioredis.Redis) -> None:
    """Close the pool's idle connections to a server that said it is a replica now; one in
    use is closed when its own write meets READONLY. Best effort: a failure to close leaves
    the connections to be closed by the server or the next failure."""
    with contextlib.suppress(Exception):
        await client.connection_pool.disconnect(inuse_connections=False)


async def _send_again(
    client: aioredis.Redis, calls: list[_ScriptCall], unknown: list[int], answers: list[Any]
) -> None:
    """Load the scripts of the calls at ``unknown`` (those that met ``NOSCRIPT``), send those
    calls again, and put their answers in ``answers``."""
    for script in {id(calls[i].script): calls[i].script for i in unknown}.values():
        await client.script_load(script.script)
    again = await _pipeline(client, [calls[i] for i in unknown])
    for i, answer in zip(unknown, again, strict=True):
        answers[i] = answer


async def _pipeline(client: aioredis.Redis, calls: list[_ScriptCall]) -> list[Any]:
    """EVALSHA each call in one pipeline; a call's error is its answer (``NOSCRIPT`` too).

    The pipeline loads its scripts before the first call (a no-op for a script Redis knows):
    after a restart, another client may have taught Redis some of them again, and a call that
    met ``NOSCRIPT`` while later ones ran would run after them once sent again, out of the
    order the calls were made in.
    """
    scripts = {id(call.script): call.script for call in calls}
    async with client.pipeline(transaction=False) as pipe:
        for script in scripts.values():
            pipe.script_load(script.script)
        for call in calls:
            pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
        return list(await pipe.execute(raise_on_error=False))[len(scripts) :]


__all__ = ["RedisStore", "checked_connection_options", "usable_redis_url"]
