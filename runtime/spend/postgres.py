"""`PostgresSpendLedger`: spend in PostgreSQL (asyncpg), shared by every worker of a deployment.

A record is one statement: through data-modifying ``WITH``s, the insert, the key's hold dropped
with it, and the tenant's running total raised by exactly the row the insert added (none if the
key was there already) and its held sum lowered by the hold dropped. PostgreSQL decides the
conflict on the primary key, so two workers recording one key at once count it once. A hold
locks the tenant's row first, so the budget checks and holds of one tenant take turns across
every worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from onward._storage import PostgresStore

from .base import Hold, Spend, SpendEntry, check_entry, hold_decided

if TYPE_CHECKING:
    import asyncpg

_RECORD = (
    "WITH added AS ("
    "INSERT INTO onward_spend (run_id, seq, tenant, model, input_tokens, output_tokens, micros, "
    "at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (run_id, seq) DO NOTHING "
    "RETURNING tenant, micros, input_tokens, output_tokens), "
    "dropped AS ("
    "DELETE FROM onward_spend_holds WHERE run_id = $1 AND seq = $2 "
    "AND EXISTS (SELECT 1 FROM added) RETURNING micros) "
    "INSERT INTO onward_spend_tenants AS t "
    "(tenant, micros, input_tokens, output_tokens, calls, held) "
    "SELECT tenant, micros, input_tokens, output_tokens, 1, "
    "-coalesce((SELECT sum(micros) FROM dropped), 0) FROM added "
    "ON CONFLICT (tenant) DO UPDATE SET micros = t.micros + excluded.micros, "
    "input_tokens = t.input_tokens + excluded.input_tokens, "
    "output_tokens = t.output_tokens + excluded.output_tokens, calls = t.calls + 1, "
    "held = t.held + excluded.held "
    "RETURNING 1"
)
"""One statement: the call inserted, the key's hold dropped with it, and the tenant's total
raised by the row the insert added and its held sum lowered by the hold dropped; a key
recorded before changes nothing."""
_LOCK_TENANT = (
    "INSERT INTO onward_spend_tenants AS t (tenant, micros, input_tokens, output_tokens, calls) "
    "VALUES ($1, 0, 0, 0, 0) ON CONFLICT (tenant) DO UPDATE SET micros = t.micros "
    "RETURNING micros + held"
)
"""The tenant's recorded and held micros, its row locked until the transaction ends: the
lock every hold of the tenant takes turns on (the upsert locks a row it finds, and creates it
where there is none)."""
_RUN_MICROS = (
    "SELECT (SELECT coalesce(sum(micros), 0) FROM onward_spend WHERE run_id = $1)::bigint "
    "+ (SELECT coalesce(sum(micros), 0) FROM onward_spend_holds WHERE run_id = $1)::bigint"
)
_TAKEN = (
    "SELECT EXISTS (SELECT 1 FROM onward_spend WHERE run_id = $1 AND seq = $2) "
    "OR EXISTS (SELECT 1 FROM onward_spend_holds WHERE run_id = $1 AND seq = $2)"
)
_HOLD = (
    "WITH held AS (INSERT INTO onward_spend_holds (run_id, seq, tenant, micros, at) "
    "VALUES ($1, $2, $3, $4, $5) RETURNING tenant, micros) "
    "UPDATE onward_spend_tenants t SET held = t.held + held.micros FROM held "
    "WHERE t.tenant = held.tenant"
)
_DROP_HOLD = (
    "WITH dropped AS (DELETE FROM onward_spend_holds WHERE run_id = $1 AND seq = $2 "
    "RETURNING tenant, micros) "
    "UPDATE onward_spend_tenants t SET held = t.held - dropped.micros FROM dropped "
    "WHERE t.tenant = dropped.tenant"
)
_DROP_RUN_HOLDS = (
    "WITH dropped AS (DELETE FROM onward_spend_holds WHERE run_id = $1 "
    "RETURNING tenant, micros), "
    "by_tenant AS (SELECT tenant, sum(micros)::bigint AS micros FROM dropped GROUP BY tenant), "
    "lowered AS (UPDATE onward_spend_tenants t SET held = t.held - by_tenant.micros "
    "FROM by_tenant WHERE t.tenant = by_tenant.tenant) "
    "SELECT coalesce(sum(micros), 0)::bigint FROM by_tenant"
)
"""Every hold of a run dropped and each tenant's held sum lowered by its part, in one
statement; the micros dropped."""
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

    async def hold(
        self,
        entry: SpendEntry,
        *,
        run_budget: int | None = None,
        tenant_budget: int | None = None,
    ) -> Hold:
        check_entry(entry)
        key = (entry.run_id, entry.seq)

        async def hold(conn: asyncpg.Connection) -> Hold:
            async with conn.transaction():
                tenant_micros = int(await conn.fetchval(_LOCK_TENANT, entry.tenant))
                run_micros = int(await conn.fetchval(_RUN_MICROS, entry.run_id))
                if await conn.fetchval(_TAKEN, *key):
                    return Hold(held=True, run_micros=run_micros, tenant_micros=tenant_micros)
                answer = hold_decided(
                    entry.micros,
                    run_micros=run_micros,
                    tenant_micros=tenant_micros,
                    run_budget=run_budget,
                    tenant_budget=tenant_budget,
                )
                if answer.held:
                    await conn.execute(_HOLD, *key, entry.tenant, entry.micros, entry.at)
                return answer

        return await self._run(hold, "holding spend", entry.run_id)

    async def release(self, run_id: str, seq: int) -> None:
        async def release(conn: asyncpg.Connection) -> None:
            await conn.execute(_DROP_HOLD, run_id, seq)

        await self._run(release, "releasing held spend", run_id)

    async def release_run(self, run_id: str) -> int:
        async def release_run(conn: asyncpg.Connection) -> int:
            return int(await conn.fetchval(_DROP_RUN_HOLDS, run_id))

        return await self._run(release_run, "releasing a finished run's held spend", run_id)

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
