"""`onward projector` saying on a file descriptor where its PostgreSQL frontier store's writes are.

Usage: PYTHONPATH=tests python -m support.marked_projector FD ARGS (ARGS as for `onward projector`)

Each write of the store says ``writing N P:O ...`` inside its transaction, right before its first
row is written (N counts the writes, P:O are the positions it stores), and ``wrote N`` once it
returned, committed. A process killed after a ``writing`` line with no ``wrote`` after it died in
the middle of that write: rows being written, the positions not committed. Nothing else about the
projector changes: the store's own `_write` and `_stage_and_upsert` do the work.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any

import asyncpg

from onward.projections import postgres
from onward.projections.base import FrontierWrite
from onward.runtime.cli import main

WRITING = "writing"
WROTE = "wrote"

_unsaid: ContextVar[list[str]] = ContextVar("unsaid")
"""The ``writing`` line of this task's write, until its first row is written."""


def mark_writes(fd: int) -> None:
    """Wrap the store's write, and its row upserts, to say on ``fd`` where each write is."""
    write = postgres.PostgresFrontierStore._write
    stage_and_upsert = postgres._stage_and_upsert
    numbers = itertools.count(1)

    def say(line: str) -> None:
        os.write(fd, f"{line}\n".encode())

    async def marked_write(self: postgres.PostgresFrontierStore, batch: FrontierWrite) -> None:
        number = next(numbers)
        positions = " ".join(f"{p}:{o}" for p, o in sorted(batch.positions.items()))
        _unsaid.set([f"{WRITING} {number} {positions}"])
        await write(self, batch)
        say(f"{WROTE} {number}")

    async def marked_stage_and_upsert(
        conn: asyncpg.Connection,
        table: str,
        columns: tuple[str, ...],
        key: tuple[str, ...],
        rows: Iterable[tuple[Any, ...]],
    ) -> None:
        unsaid = _unsaid.get([])
        while unsaid:
            say(unsaid.pop())
        await stage_and_upsert(conn, table, columns, key, rows)

    postgres.PostgresFrontierStore._write = marked_write  # type: ignore[method-assign]
    postgres._stage_and_upsert = marked_stage_and_upsert


if __name__ == "__main__":
    mark_writes(int(sys.argv[1]))
    sys.argv = ["onward", *sys.argv[2:]]
    main()
