"""`RedisLeaseStore`: leases in Redis (redis-py asyncio), decided by Lua scripts.

Each operation is one script, so it runs atomically on the server, and each script reads the
time with ``redis.call('TIME')`` (``server_now`` in ``_shared.lua``, put before every script):
the Redis server's clock decides expiry, never the caller's.

Two keys per run:

* ``{prefix}lease:{run_id}``, a hash (``holder``, ``tenant``, ``fence``, ``expires_at`` as a
  string of seconds since the epoch by the server's clock, and ``cancel_by`` and ``cancel_why``
  once someone asked the holder to cancel the run). Its ``PEXPIRE`` is set a little past
  the ttl only so abandoned runs do not pile up; expiry is decided by ``expires_at``. A hash
  with a cancel ask has none: an ask its holder let go of unanswered outlives the holding (the
  release keeps the ask's fields) until the run's keys are collected, so whoever takes the run
  next hears it.
* ``{prefix}fence:{run_id}``, the run's fence counter. It has no expiry and only goes up:
  ``INCR``-ed by every acquisition, after a release or an expiry too, and set higher by
  ``raise_fence``.

The counter is only as durable as Redis itself. A restart without persistence, or an eviction,
makes Redis hand out fences the run's log already has; the holder then raises the fence above
the log's (`RedisLeaseStore.raise_fence`), so the run goes on and the loss costs a round trip.
Run Redis with persistence (AOF) and a ``maxmemory-policy`` that never evicts keys without an
expiry (``noeviction`` or a ``volatile-*`` policy) all the same: a worker whose lease Redis
forgot believes it holds the run until its next renewal. The two keys of a run are not
hash-tagged, so a script touching both needs a single-node (or single-slot)
deployment rather than Redis Cluster.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from importlib.resources import files
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from onward._storage import RedisStore, translated

from .base import CancelAsked, RunLease, check_ask, check_ttl, conflict_error, fenced_error

CLEANUP_GRACE_MS = 60_000
"""How long past its expiry a lease hash is kept before Redis deletes it (tidiness only)."""

_SCRIPTS = ("acquire", "renew", "raise_fence", "release", "forget", "current", "ask_to_cancel")


def script_source(name: str) -> str:
    """A script's text, after the functions every script shares (``_shared.lua``)."""
    folder = files("onward") / "schemas" / "redis"
    return (folder / "_shared.lua").read_text() + (folder / f"{name}.lua").read_text()


def lease_key(prefix: str, run_id: str) -> str:
    """The hash holding a run's lease."""
    return f"{prefix}lease:{run_id}"


def fence_key(prefix: str, run_id: str) -> str:
    """The counter holding a run's last fence; it never expires."""
    return f"{prefix}fence:{run_id}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisLeaseStore(RedisStore):
    """A `LeaseStore` in Redis; opened with `RedisStore`'s arguments (url, prefix, pool size,
    timeout)."""

    what = "Redis lease store"
    _scripts: dict[str, AsyncScript]

    def _started(self, client: aioredis.Redis) -> None:
        """Register the scripts, so a bad URL fails at start rather than at first use."""
        self._scripts = {name: client.register_script(script_source(name)) for name in _SCRIPTS}

    def lease_key(self, run_id: str) -> str:
        """The hash holding a run's lease."""
        return lease_key(self.prefix, run_id)

    def fence_key(self, run_id: str) -> str:
        """The counter holding a run's last fence; it never expires."""
        return fence_key(self.prefix, run_id)

    async def _script(self, name: str, keys: list[str], args: list[Any], run_id: str) -> Any:
        """Run one of the store's scripts (coalesced with others'), translating driver failures;
        a store not open says so (it has no scripts then)."""
        self._live_client()
        # No call is retried by the client (the pool built from the URL retries nothing): a
        # lost connection fails the call, and its caller decides; the bound covers the wait
        # for a pooled connection and for the answer.
        with translated(f"running {name}.lua", run_id=run_id):
            async with asyncio.timeout(self._timeout_s):
                return await self.run_script(
                    self._scripts[name], keys, args, what=f"{name}.lua", run_id=run_id
                )

    async def acquire(self, run_id: str, *, tenant: str, holder: str, ttl_s: float) -> RunLease:
        """Take a run's lease, raising its fence.

        Raises:
            ResumeConflictError: Another holder, or this same one, has an unexpired lease.
        """
        check_ttl(ttl_s)
        taken, value, expires_at, *held_for = await self._script(
            "acquire",
            [self.lease_key(run_id), self.fence_key(run_id)],
            [holder, tenant, _ttl_ms(ttl_s), CLEANUP_GRACE_MS],
            run_id,
        )
        if int(taken):
            return RunLease(
                run_id, tenant, holder, int(value), float(expires_at), _asked(*held_for)
            )
        holder_tenant = _text(held_for[0]) if held_for and held_for[0] else None
        raise conflict_error(
            run_id,
            _text(value),
            holder_tenant=holder_tenant,
            tenant=tenant,
            expires_at=float(expires_at),
        )

    async def renew(self, lease: RunLease, *, ttl_s: float) -> RunLease:
        """Extend a lease, keeping its fence.

        Raises:
            FencedError: The lease expired, was released or was superseded.
        """
        check_ttl(ttl_s)
        renewed, value, *asked = await self._script(
            "renew",
            [self.lease_key(lease.run_id)],
            [lease.holder, lease.fence, _ttl_ms(ttl_s), CLEANUP_GRACE_MS],
            lease.run_id,
        )
        if not int(renewed):
            raise fenced_error(lease, f"is lost ({_text(value)})")
        return RunLease(
            lease.run_id, lease.tenant, lease.holder, lease.fence, float(value), _asked(*asked)
        )

    async def raise_fence(self, lease: RunLease, *, above: int) -> RunLease:
        """Lift a held lease's fence above ``above`` in one script, keeping its expiry.

        The script sets the run's fence counter to the new fence as well, so a Redis that lost
        its keys (a restart without persistence, an eviction, a wipe) costs nothing but this.

        Raises:
            FencedError: The lease expired, was released or was superseded.
        """
        if lease.fence > above:
            return lease
        answer = await self._script(
            "raise_fence",
            [self.lease_key(lease.run_id), self.fence_key(lease.run_id)],
            [lease.holder, lease.fence, above],
            lease.run_id,
        )
        if not int(answer[0]):
            raise fenced_error(lease, f"is lost ({_text(answer[1])})")
        _, fence, expires_at, *asked = answer
        return RunLease(
            lease.run_id, lease.tenant, lease.holder, int(fence), float(expires_at), _asked(*asked)
        )

    async def release(self, lease: RunLease) -> None:
        """Hand a lease back; releasing one already released or lapsed (not taken) is a no-op.

        Raises:
            FencedError: A later acquisition superseded the lease.
        """
        heard = "1" if lease.cancel_asked is not None else "0"
        if not await self._handing_back("release", lease, heard):
            raise fenced_error(lease, "was superseded, so releasing it is not this holder's to do")

    async def forget(self, lease: RunLease) -> None:
        """Hand back a lease on a run that does not exist: both its keys are deleted while the
        lease is this one and the counter holds the first fence, else the lease is released.

        Raises:
            FencedError: A later acquisition superseded the lease.
        """
        if not await self._handing_back("forget", lease):
            await self.release(lease)

    async def _handing_back(self, script: str, lease: RunLease, *more: str) -> bool:
        """Run ``script`` (``release`` or ``forget``) on the lease's two keys, with ``more``
        arguments after its holder and fence; whether it answered 1."""
        answer = await self._script(
            script,
            [self.lease_key(lease.run_id), self.fence_key(lease.run_id)],
            [lease.holder, lease.fence, *more],
            lease.run_id,
        )
        return bool(int(answer))

    async def current(self, run_id: str) -> RunLease | None:
        """The unexpired lease on a run, if any, by the Redis server's clock."""
        found = await self._script("current", [self.lease_key(run_id)], [], run_id)
        return _held(run_id, found)

    async def current_many(self, run_ids: Sequence[str]) -> dict[str, RunLease]:
        """The unexpired leases on some runs, by run id, by the Redis server's clock: their
        scripts are asked in one turn of the loop, so they go as one pipeline."""
        found = await asyncio.gather(*(self.current(run_id) for run_id in run_ids))
        return {lease.run_id: lease for lease in found if lease is not None}

    async def ask_to_cancel(
        self, run_id: str, *, tenant: str, by: str, why: str = ""
    ) -> RunLease | None:
        """Ask the unexpired holding of ``tenant``'s run to end it cancelled, in one script (the
        first ask is kept); the holding asked, or ``None`` when there is none."""
        check_ask(run_id, by, why)
        found = await self._script(
            "ask_to_cancel", [self.lease_key(run_id)], [tenant, by, why], run_id
        )
        return _held(run_id, found)

    async def close(self) -> None:
        """Close the connection pool. Idempotent."""
        self._scripts = {}
        await super().close()


def _held(run_id: str, found: list[Any]) -> RunLease | None:
    """The lease a script answered as ``{holder, tenant, fence, expires_at, cancel_by,
    cancel_why}``, or ``None`` for its empty answer."""
    if not found:
        return None
    holder, tenant, fence, expires_at, *asked = found
    return RunLease(
        run_id, _text(tenant), _text(holder), int(fence), float(expires_at), _asked(*asked)
    )


def _asked(by: Any = None, why: Any = None) -> CancelAsked | None:
    """The cancel ask a script answered (``by`` is nil, or absent, when there is none)."""
    return None if not by else CancelAsked(_text(by), "" if why is None else _text(why))


def _ttl_ms(ttl_s: float) -> int:
    """The ttl in whole milliseconds (Redis's resolution), never rounded down to nothing."""
    return max(1, math.ceil(ttl_s * 1000))
