"""A small user projection: how many events of each kind the log holds."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import asyncpg

from onward.eventlog import StoredEvent, kind_of


class KindCounts:
    """Counts events per kind, in table ``<name>_<build>`` (view ``kinds``)."""

    name = "kinds"
    version = 1

    def ddl(self, table: str) -> str:
        return f"CREATE TABLE {table} (kind text PRIMARY KEY, events bigint NOT NULL)"

    async def apply(
        self, conn: asyncpg.Connection, table: str, events: Sequence[StoredEvent]
    ) -> None:
        counts = Counter(kind_of(type(s.event)) for s in events)
        await conn.executemany(
            f"INSERT INTO {table} (kind, events) VALUES ($1, $2) "
            f"ON CONFLICT (kind) DO UPDATE SET events = {table}.events + excluded.events",
            list(counts.items()),
        )
