"""`PostgresSpendLedger`: spend in PostgreSQL (asyncpg), shared by every worker of a deployment.

A record is one statement: the insert, and (through a data-modifying ``WITH``) the tenant's
running total raised by exactly the row the insert added, none if the key was there already.
PostgreSQL decides the conflict on the primary key, so two workers recording one key at once
count it once.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from onward._storage import PostgresStore

from .base import Spend, SpendEntry, check_entry

_RECORD = (
    "WITH added AS ("
    "INSERT INTO onward_spend (run_id, seq, tenant, model, input_tokens, output_tokens, micros, "
    "at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (run_id, seq) DO NOTHING "
    "RETURNING tenant, micros, input_tokens, output_tokens) "
    "INSERT INTO onward_spend_tenants AS t (tenant, micros, input_tokens, output_tokens, calls) "
    "SELECT tenant, micros, input_tokens, output_tokens, 1 FROM added "
    "ON CONFLICT (tenant) DO UPDATE SET micros = t.micros + excluded.micros, "
    "input_tokens = t.input_tokens + excluded.input_tokens, "
    "output_tokens = t.output_tokens + excluded.output_tokens, calls = t.calls + 1 "
    "RETURNING 1"
)
_SUMS = (
    "coalesce(sum(micros), 0)::bigint AS micros, "
    "coalesce(sum(input_tokens), 0)::bigint AS input_tokens, "
    "coalesce(sum(output_tokens), 0)::bigint AS output_tokens, count(*) AS calls"
)


def _spend(row: asyncpg.Record) -> Spend:
    return Spend(
        micros=int(row["micros"]),
        input_tokens=int(row["input_tokens"]),
        output_tokens=int(row["output_tokens"]),
        calls=int(row["calls"]),
    )


class PostgresSpendLedger(PostgresStore):
    """A `SpendLedger` in PostgreSQL (``onward_spend``, ``onward_spend_tenants``).

    Args:
        dsn: ``postgresql://user:password@host:port/database``.
        schema: The PostgreSQL schema (search path) holding Onward's tables; the tables come
            from ``onward db migrate``.
        min_size: Smallest pool size.
        max_size: Largest pool size.
        timeout_s: The longest one call may wait for PostgreSQL (`PostgresStore`).
    """

    what = "PostgreSQL spend ledger"

    async def record(self, entry: SpendEntry) -> bool:
        check_entry(entry)

        async def record(conn: asyncpg.Connection) -> bool:
            added = await conn.fetchval(
                _RECORD,
                entry.run_id,
                entry.seq,
                entry.tenant,
                entry.model,
                entry.input_tokens,
                entry.output_tokens,
                entry.micros,
                entry.at,
            )
            return added is not None

        return await self._run(record, "recording spend", entry.run_id)

    async def run_total(self, run_id: str) -> Spend:
        async def read(conn: asyncpg.Connection) -> asyncpg.Record:
            row: asyncpg.Record = await conn.fetchrow(
                f"SELECT {_SUMS} FROM onward_spend WHERE run_id = $1", run_id
            )
            return row

        return _spend(await self._run(read, "reading a run's spend", run_id))

    async def run_totals(self, run_ids: Sequence[str]) -> dict[str, Spend]:
        async def read(conn: asyncpg.Connection) -> list[asyncpg.Record]:
            rows: list[asyncpg.Record] = await conn.fetch(
                f"SELECT run_id, {_SUMS} FROM onward_spend WHERE run_id = ANY($1::text[]) "
                "GROUP BY run_id",
                list(dict.fromkeys(run_ids)),
            )
            return rows

        return {row["run_id"]: _spend(row) for row in await self._run(read, "reading runs' spend")}

    async def tenant_total(self, tenant: str) -> Spend:
        async def read(conn: asyncpg.Connection) -> asyncpg.Record | None:
            row: asyncpg.Record | None = await conn.fetchrow(
                "SELECT micros, input_tokens, output_tokens, calls FROM onward_spend_tenants "
                "WHERE tenant = $1",
                tenant,
            )
            return row

        row = await self._run(read, "reading a tenant's spend")
        return Spend() if row is None else _spend(row)

    async def entries(self, run_id: str) -> list[SpendEntry]:
        async def read(conn: asyncpg.Connection) -> list[asyncpg.Record]:
            rows: list[asyncpg.Record] = await conn.fetch(
                "SELECT run_id, tenant, seq, model, input_tokens, output_tokens, micros, at "
                "FROM onward_spend WHERE run_id = $1 ORDER BY seq",
                run_id,
            )
            return rows

        rows = await self._run(read, "reading a run's spend", run_id)
        return [
            SpendEntry(
                run_id=row["run_id"],
                tenant=row["tenant"],
                seq=int(row["seq"]),
                model=row["model"],
                input_tokens=int(row["input_tokens"]),
                output_tokens=int(row["output_tokens"]),
                micros=int(row["micros"]),
                at=int(row["at"]),
            )
            for row in rows
        ]
