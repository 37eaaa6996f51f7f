"""`RedisStore`: what every store in Redis shares: one bounded pool, checked when opened.

Opening it connects and sends a PING within the timeout, so a bad URL or a silent server fails
at start, translated like every other driver failure.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

import redis.asyncio as aioredis

from onward.errors import ConfigurationError, InvalidInputError

from .stores import BACKEND_TIMEOUT_S, Resource
from .translate import translated


class RedisStore(Resource):
    """A store in Redis, on a blocking pool of at most ``max_connections`` connections.

    A blocking pool: a thousand callers at once wait for one of a bounded set of connections
    instead of failing with "too many connections".

    Args:
        url: ``redis://host:port/db`` (or ``rediss://`` for TLS).
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
        self._url = url
        self.prefix = prefix
        self._max_connections = max_connections
        self._timeout_s = timeout_s
        self._client: aioredis.Redis | None = None

    @property
    def is_open(self) -> bool:
        return self._client is not None

    async def _connect(self) -> None:
        """Open the pool, let the store set itself up, and check Redis answers."""
        try:
            pool = aioredis.BlockingConnectionPool.from_url(
                self._url,
                max_connections=self._max_connections,
                timeout=self._timeout_s,
                socket_timeout=self._timeout_s,
                socket_connect_timeout=self._timeout_s,
                decode_responses=True,
            )
            client = aioredis.Redis(connection_pool=pool)
        except ValueError as exc:
            raise ConfigurationError(f"REDIS_URL {self._url!r} is not a Redis URL: {exc}") from exc
        self._client = client
        self._started(client)
        with translated("connecting to Redis"):
            async with asyncio.timeout(self._timeout_s):
                await client.ping()

    def _started(self, client: aioredis.Redis) -> None:
        """What a store sets up on its new client (its scripts) before the first call."""

    def _live_client(self) -> aioredis.Redis:
        if self._client is None:
            name = type(self).__name__
            raise InvalidInputError(
                f"the {self.what} is not open; use `await {name}.open(url)` or `async with`"
            )
        return self._client

    async def close(self) -> None:
        """Close the connection pool. Idempotent."""
        client, self._client = self._client, None
        if client is not None:
            with translated("closing the Redis connection pool"):
                await client.aclose(close_connection_pool=True)


__all__ = ["RedisStore"]
