"""`RedisKeySweeper`: the Redis keys finished runs left, counted or deleted.

Per run, one Lua script (``schemas/redis/gc.lua``) decides atomically, by the Redis server's
clock: the lease hash and fence counter go unless somebody holds the lease now; the MCP schema
cache entry goes. The keys are the ones `RedisLeaseStore` and the MCP `SchemaCache` write,
under their prefixes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from onward._storage import BACKEND_TIMEOUT_S, RedisStore, translated
from onward.errors import ConfigurationError
from onward.runtime.leases.redis import fence_key, lease_key, script_source
from onward.runtime.settings import SCHEMA_CACHE_PREFIX, schema_prefix_clash

from .base import KEY_KINDS, Kind


class RedisKeySweeper(RedisStore):
    """A `KeySweeper` in Redis.

    Args:
        url: ``redis://host:port/db``.
        prefix: The lease store's prefix (``ONWARD_REDIS_PREFIX``).
        schema_prefix: The MCP schema cache's prefix (``MCP_SCHEMA_CACHE_PREFIX``).
        timeout_s: The longest one call may wait for Redis.

    Raises:
        ConfigurationError: A schema cache key could be a lease's or a frontier's (it would
            be deleted as a cache entry).
    """

    what = "Redis key sweeper"
    _gc: AsyncScript

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "onward:",
        schema_prefix: str = SCHEMA_CACHE_PREFIX,
        timeout_s: float | None = BACKEND_TIMEOUT_S,
    ) -> None:
        clash = schema_prefix_clash(prefix, schema_prefix)
        if clash is not None:
            raise ConfigurationError(clash)
        super().__init__(url, prefix=prefix, max_connections=4, timeout_s=timeout_s)
        self.schema_prefix = schema_prefix

    def _started(self, client: aioredis.Redis) -> None:
        self._gc = client.register_script(script_source("gc"))

    async def sweep(self, run_ids: Collection[str], *, delete: bool) -> dict[Kind, int]:
        client = self._live_client()
        counts = dict.fromkeys(KEY_KINDS, 0)
        if not run_ids:
            return counts
        with translated("deleting the keys of finished runs" if delete else "counting them"):
            async with (
                self._writing(client),
                asyncio.timeout(self._timeout_s),
                client.pipeline() as pipe,
            ):
                ids = list(run_ids)
                sent = [
                    [
                        lease_key(self.prefix, run_id),
                        fence_key(self.prefix, run_id),
                        f"{self.schema_prefix}{run_id}",
                    ]
                    for run_id in ids
                ]
                for keys in sent:
                    await self._gc(keys=keys, args=["1" if delete else "0"], client=pipe)
                answers = await pipe.execute(raise_on_error=False)
                # The lease hash is the one key the script reads by type (the others it only
                # tests and deletes): the schema cache key, under MCP_SCHEMA_CACHE_PREFIX, is
                # no suspect for a hint to move ONWARD_REDIS_PREFIX.
                read_by_type = [[keys[0]] for keys in sent]
                self._raise_first_error(answers, "gc.lua", read_by_type, ids)
        for found in answers:
            for kind, there in zip(KEY_KINDS, found, strict=True):
                counts[kind] += int(there)
        return counts


__all__ = ["RedisKeySweeper"]
