"""A process that takes a store's fold lock, as a worker folding its checkpoints does, and is
then paused (the test sends SIGSTOP) holding it: a stopped process, a frozen machine.

Usage: PYTHONPATH=tests python -m support.lock_child sqlite PATH
       PYTHONPATH=tests python -m support.lock_child postgres URL SCHEMA
It prints ``held`` once it holds the lock, and holds it until it is killed.
"""

from __future__ import annotations

import asyncio
import sys
from contextlib import AbstractAsyncContextManager

from onward._storage import PostgresStore, SqliteStore


async def main(kind: str, where: str, schema: str | None) -> None:
    store: AbstractAsyncContextManager[SqliteStore | PostgresStore] = (
        SqliteStore(where) if kind == "sqlite" else PostgresStore(where, schema=schema)
    )
    async with store as opened, opened.exclusive("fold"):
        print("held", flush=True)
        await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
