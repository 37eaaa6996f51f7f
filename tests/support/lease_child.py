"""A process that takes one run's lease and holds it until it is killed.

``python -m support.lease_child KIND WHERE RUN_ID TENANT [HOLDER]``: KIND is ``sqlite`` (WHERE a
file), ``postgres`` (WHERE ``URL#schema``) or ``redis`` (WHERE ``URL#prefix``). The lease is
taken as the runtime takes it (`acquire_run`, under this process's default holder name unless
HOLDER is given), printed as one JSON line, and never renewed nor released.
"""

from __future__ import annotations

import asyncio
import json
import sys

from onward.runtime.leases import LeaseStore, PostgresLeaseStore, RedisLeaseStore, SqliteLeaseStore
from onward.runtime.leases.presence import acquire_run, default_holder

HOLD_TTL_S = 60.0


async def open_store(kind: str, where: str) -> LeaseStore:
    """The store a test and its child both open: same file, same schema, same prefix."""
    if kind == "sqlite":
        return await SqliteLeaseStore.open(where)
    url, _, name = where.partition("#")
    if kind == "postgres":
        return await PostgresLeaseStore.open(url, schema=name)
    if kind == "redis":
        return await RedisLeaseStore.open(url, prefix=name)
    raise SystemExit(f"unknown store kind {kind!r}")


async def main(kind: str, where: str, run_id: str, tenant: str, holder: str) -> None:
    store = await open_store(kind, where)
    lease = await acquire_run(store, run_id, tenant=tenant, holder=holder, ttl_s=HOLD_TTL_S)
    print(json.dumps({"holder": lease.holder, "fence": lease.fence}), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    kind, where, run_id, tenant, *named = sys.argv[1:]
    asyncio.run(main(kind, where, run_id, tenant, named[0] if named else default_holder()))
