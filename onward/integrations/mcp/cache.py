"""The Redis cache of MCP tool schemas, keyed by run and tenant: what makes a resume warm.

A run's first toolset lists every server's tools and stores the listings under
``{prefix}{run_id}`` (a Redis hash, default prefix ``onward:mcp:schema:``) with a TTL, one
field per tenant and server: ``{tenant digest}:{server name}``. A resume of that run reads
back its own tenant's fields instead of calling ``tools/list`` on each server; the agent's
revision comes out the same because the tools are built from the same JSON either way.

The tenant is part of the entry because a run id alone is not a secret: a toolset opened by
one tenant under another tenant's run id must not plant the listing that run's resume uses.
The key stays the run's, so GC removes a finished run's entry, every tenant's fields with it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import msgspec
import redis.asyncio as redis_asyncio
import redis.exceptions as redis_errors
from pydantic import BaseModel, ConfigDict, Field, field_validator

from onward._storage import Resource, translate, warn_unchecked_server
from onward._storage.redis import checked_connection_options, usable_redis_url
from onward.errors import ConfigurationError, InvalidInputError
from onward.runtime.settings import (
    MAX_SCHEMA_CACHE_TTL_HOURS,
    MIN_SCHEMA_CACHE_TTL,
    SCHEMA_CACHE_PREFIX,
    SecretUrl,
    Settings,
    check_schema_cache_ttl_hours,
    load_settings,
)

_log = logging.getLogger("onward.integrations.mcp")

DEFAULT_PREFIX = SCHEMA_CACHE_PREFIX
FORMAT = 1

CACHE_TIMEOUT_S = 10.0
"""The longest one read, write or removal waits for Redis. A Redis that stops answering (a
partition, a hung server) would otherwise hold every run's open for good, as the client has no
timeout of its own; past it a read is a miss and a write is skipped, like Redis down."""


class MCPSettings(BaseModel):
    """The MCP settings, a part of `onward.runtime.settings.Settings` (the one loader of the
    environment): `load_mcp_settings` builds them from it.

    Attributes:
        redis_url: ``REDIS_URL``; where the schema cache lives (shown without its password, as
            `onward.runtime.settings.Settings` shows it).
        schema_cache_enabled: ``MCP_SCHEMA_CACHE_ENABLED``; unset means on when ``REDIS_URL``
            is set, off otherwise. ``true`` without ``REDIS_URL`` is a `ConfigurationError`.
        schema_cache_ttl_hours: ``MCP_SCHEMA_CACHE_TTL_HOURS`` (default 24); how long a run's
            schemas stay cached after they were last written or read.
        schema_cache_prefix: ``MCP_SCHEMA_CACHE_PREFIX``; the run id is appended to it.
            Unset, ``ONWARD_REDIS_PREFIX`` then ``mcp:schema:`` (``onward:mcp:schema:``) when
            read from the environment (`load_mcp_settings`), ``onward:mcp:schema:`` otherwise.
    """

    model_config = ConfigDict(
        extra="ignore", frozen=True, populate_by_name=True, hide_input_in_errors=True
    )

    redis_url: SecretUrl | None = Field(default=None, validation_alias="REDIS_URL")
    schema_cache_enabled: bool | None = Field(
        default=None, validation_alias="MCP_SCHEMA_CACHE_ENABLED"
    )
    schema_cache_ttl_hours: float = Field(
        default=24.0,
        gt=0,
        le=MAX_SCHEMA_CACHE_TTL_HOURS,
        validation_alias="MCP_SCHEMA_CACHE_TTL_HOURS",
    )
    schema_cache_prefix: str = Field(
        default=DEFAULT_PREFIX, min_length=1, validation_alias="MCP_SCHEMA_CACHE_PREFIX"
    )

    @field_validator("schema_cache_ttl_hours")
    @classmethod
    def _schema_cache_ttl_hours(cls, value: float) -> float:
        return check_schema_cache_ttl_hours(value)

    @classmethod
    def of(cls, settings: Settings) -> MCPSettings:
        """The MCP part of ``settings``."""
        return cls(
            redis_url=settings.redis_url,
            schema_cache_enabled=settings.schema_cache_enabled,
            schema_cache_ttl_hours=settings.schema_cache_ttl_hours,
            schema_cache_prefix=settings.schema_cache_prefix,
        )

    @property
    def cache_enabled(self) -> bool:
        """Whether warm restart is on: explicitly, or because ``REDIS_URL`` is set."""
        if self.schema_cache_enabled is None:
            return bool(self.redis_url)
        return self.schema_cache_enabled


def load_mcp_settings() -> MCPSettings:
    """Read the environment (`load_settings`, the one loader); a bad value is a
    `ConfigurationError` naming the variable."""
    settings = MCPSettings.of(load_settings())
    if settings.schema_cache_enabled and not settings.redis_url:
        raise ConfigurationError(
            "MCP_SCHEMA_CACHE_ENABLED is true but REDIS_URL is not set; set REDIS_URL or "
            "MCP_SCHEMA_CACHE_ENABLED=false"
        )
    return settings


class ServerSchema(msgspec.Struct, frozen=True, kw_only=True):
    """One server's tool listing, as cached.

    Attributes:
        endpoint: A digest of what was connected to (command line, environment and working
            directory; or URL and headers); a listing for another endpoint under the same
            server name is not used.
        server_name: The name the server reported at the handshake.
        server_version: The version it reported; a new session reporting another one is checked.
        digest: Hash of the tool list (sorted by name); the schema version compared on reconnect.
        tools: The tools exactly as the server described them (MCP JSON, camelCase keys).
    """

    endpoint: str
    server_name: str
    server_version: str
    digest: str
    tools: tuple[dict[str, Any], ...]
    format: int = FORMAT

    @classmethod
    def of(
        cls,
        tools: Sequence[Mapping[str, Any]],
        *,
        endpoint: str,
        server_name: str,
        server_version: str,
    ) -> ServerSchema:
        """A listing with its digest computed."""
        ordered = tuple(sorted((dict(t) for t in tools), key=lambda t: str(t.get("name"))))
        return cls(
            endpoint=endpoint,
            server_name=server_name,
            server_version=server_version,
            digest=schema_digest(ordered),
            tools=ordered,
        )


def schema_digest(tools: Sequence[Mapping[str, Any]]) -> str:
    """The schema version of a tool list: a hash of its canonical JSON, in name order."""
    ordered = sorted(tools, key=lambda t: str(t.get("name")))
    return hashlib.sha256(msgspec.json.encode(ordered, order="sorted")).hexdigest()[:32]


_decoder = msgspec.json.Decoder(ServerSchema)


def tenant_scope(tenant: str | None) -> str:
    """The part of a field name that keeps tenants apart: a digest of the tenant (``""``
    without one), so tenant names are not stored and no name can reach into another's."""
    if tenant is None:
        return ""
    return hashlib.sha256(f"tenant\0{tenant}".encode()).hexdigest()[:32]


class SchemaCache(Resource):
    """Tool listings of a run's MCP servers in Redis, under ``{prefix}{run_id}``, one field
    per tenant and server.

    Args:
        client: A ``redis.asyncio.Redis``. The cache closes it only if it created it
            (`from_url`, `from_settings`).
        prefix: Put before the run id.
        ttl: How long an entry lives after it was last written or read.

    Reads that fail (Redis down, a corrupt entry) count as a miss: the servers are listed
    instead, which is slower but correct. `forget` raises, since GC wants to know.
    """

    def __init__(
        self,
        client: redis_asyncio.Redis,
        *,
        prefix: str = DEFAULT_PREFIX,
        ttl: timedelta = timedelta(hours=24),
        owns_client: bool = False,
    ) -> None:
        if ttl < MIN_SCHEMA_CACHE_TTL:
            # Redis keeps a TTL to the millisecond: a shorter one is sent as 0, which deletes
            # each entry as it is written.
            raise InvalidInputError(f"the schema cache TTL must be at least 1ms, got {ttl}")
        self.client = client
        self.prefix = prefix
        self.ttl = ttl
        self._owns_client = owns_client
        self._closed = False

    @classmethod
    def from_url(
        cls, url: str, *, prefix: str = DEFAULT_PREFIX, ttl: timedelta = timedelta(hours=24)
    ) -> SchemaCache:
        """A cache on its own Redis connection pool, closed with the cache.

        Raises:
            ConfigurationError: redis-py cannot use ``url``; named without its password.
        """
        with usable_redis_url(url):
            client = redis_asyncio.Redis.from_url(url)
            checked_connection_options(client.connection_pool)
        warn_unchecked_server(url, "REDIS_URL")
        return cls(client, prefix=prefix, ttl=ttl, owns_client=True)

    @classmethod
    def from_settings(cls, settings: MCPSettings | None = None) -> SchemaCache | None:
        """The cache the environment asks for, or ``None`` when warm restart is off."""
        settings = settings or load_mcp_settings()
        if not settings.cache_enabled or not settings.redis_url:
            return None
        return cls.from_url(
            settings.redis_url.get_secret_value(),
            prefix=settings.schema_cache_prefix,
            ttl=timedelta(hours=settings.schema_cache_ttl_hours),
        )

    def key(self, run_id: str) -> str:
        """The Redis key of a run's entry."""
        return f"{self.prefix}{run_id}"

    async def load(self, run_id: str, *, tenant: str | None = None) -> dict[str, ServerSchema]:
        """The listings cached for a run and tenant, by server name (empty on a miss); renews
        the TTL. Listings stored for another tenant (or for none) are never returned."""
        key = self.key(run_id)
        scope = f"{tenant_scope(tenant)}:"
        try:
            async with (
                asyncio.timeout(CACHE_TIMEOUT_S),
                self.client.pipeline(transaction=True) as pipe,
            ):
                pipe.hgetall(key)
                pipe.pexpire(key, self.ttl)
                raw, _ = await pipe.execute()
        except (redis_errors.RedisError, OSError) as exc:
            _log_miss(run_id, translate(exc, context=f"reading MCP schemas at {key}"))
            return {}
        found: dict[str, ServerSchema] = {}
        for field, value in raw.items():
            name = field.decode() if isinstance(field, bytes) else str(field)
            if not name.startswith(scope):
                continue  # another tenant's, or written before entries had tenants
            name = name.removeprefix(scope)
            try:
                schema = _decoder.decode(value)
            except msgspec.DecodeError as exc:
                _log_miss(run_id, exc)
                continue
            if schema.format == FORMAT:
                found[name] = schema
        return found

    async def store(
        self, run_id: str, schemas: Mapping[str, ServerSchema], *, tenant: str | None = None
    ) -> None:
        """Write (or replace) the listings of some of a run's servers, for one tenant, and
        renew the TTL.

        A failed write is logged, not raised: the run goes on, its next resume is cold.
        """
        if not schemas:
            return
        key = self.key(run_id)
        scope = tenant_scope(tenant)
        mapping = {
            f"{scope}:{name}": msgspec.json.encode(schema) for name, schema in schemas.items()
        }
        try:
            async with (
                asyncio.timeout(CACHE_TIMEOUT_S),
                self.client.pipeline(transaction=True) as pipe,
            ):
                pipe.hset(key, mapping=mapping)  # type: ignore[arg-type]
                pipe.pexpire(key, self.ttl)
                await pipe.execute()
        except (redis_errors.RedisError, OSError) as exc:
            _log.warning(
                "run %r: MCP schemas not cached: %s",
                run_id,
                translate(exc, context=f"writing {key}"),
            )

    async def forget(self, run_id: str) -> bool:
        """Remove a run's entry, every tenant's listings in it (for GC, when the run is
        finished or deleted).

        Returns:
            Whether there was an entry.

        Raises:
            BackendError: Redis failed (`BackendUnavailableError` if it did not answer).
        """
        key = self.key(run_id)
        try:
            async with asyncio.timeout(CACHE_TIMEOUT_S):
                removed = await self.client.delete(key)
        except (redis_errors.RedisError, OSError) as exc:
            raise translate(exc, context=f"removing {key}", run_id=run_id) from exc
        return bool(removed)

    @property
    def is_open(self) -> bool:
        """Whether `close` has not been called (the client connects on first use)."""
        return not self._closed

    async def close(self) -> None:
        """Close the Redis client if this cache created it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            await self.client.aclose()


async def forget_schemas(run_id: str, *, settings: MCPSettings | None = None) -> bool:
    """GC hook: remove a run's cached MCP schemas, using the environment's settings.

    Returns:
        Whether there was an entry (``False`` too when warm restart is off).
    """
    cache = SchemaCache.from_settings(settings)
    if cache is None:
        return False
    async with cache:
        return await cache.forget(run_id)


def _log_miss(run_id: str, reason: object) -> None:
    _log.warning("run %r: MCP schema cache not used, listing the servers: %s", run_id, reason)
