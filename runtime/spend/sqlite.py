"""`SqliteSpendLedger`: spend in one SQLite file, the embedded deployment's (the log's own file).

Each record is one ``BEGIN IMMEDIATE`` transaction: the insert, the key's hold dropped, and the
tenant's running total raised only if the insert added a row, so processes sharing the file
never count a call twice. A hold is one too: SQLite's one writer at a time makes the budget
check and the hold one step for every process sharing the file.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from onward._storage import IN_CHUNK, SqliteStore, transaction

from .base import Hold, Spend, SpendEntry, check_entry, hold_decided

_INSERT = (
    "INSERT INTO onward_spend (run_id, seq, tenant, model, input_tokens, output_tokens, micros, "
    "at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, seq) DO NOTHING"
)
_ADD_TO_TENANT = (
    "INSERT INTO onward_spend_tenants (tenant, micros, input_tokens, output_tokens, calls) "
    "VALUES (?, ?, ?, ?, 1) ON CONFLICT (tenant) DO UPDATE SET "
    "micros = micros + excluded.micros, input_tokens = input_tokens + excluded.input_tokens, "
    "output_tokens = output_tokens + excluded.output_tokens, calls = calls + 1"
)
_SUMS = "coalesce(sum(micros), 0), coalesce(sum(input_tokens), 0), coalesce(sum(output_tokens), 0)"
_RUN_MICROS = (
    "SELECT (SELECT coalesce(sum(micros), 0) FROM onward_spend WHERE run_id = ?1) "
    "+ (SELECT coalesce(sum(micros), 0) FROM onward_spend_holds WHERE run_id = ?1)"
)
_TENANT_MICROS = "SELECT micros + held FROM onward_spend_tenants WHERE tenant = ?"
_TAKEN = (
    "SELECT EXISTS (SELECT 1 FROM onward_spend WHERE run_id = ?1 AND seq = ?2) "
    "OR EXISTS (SELECT 1 FROM onward_spend_holds WHERE run_id = ?1 AND seq = ?2)"
)
_HOLD = "INSERT INTO onward_spend_holds (run_id, seq, tenant, micros, at) VALUES (?, ?, ?, ?, ?)"
_ADD_HELD = (
    "INSERT INTO onward_spend_tenants (tenant, micros, input_tokens, output_tokens, calls, held) "
    "VALUES (?1, 0, 0, 0, 0, ?2) ON CONFLICT (tenant) DO UPDATE SET held = held + ?2"
)
_DROP_HOLD = "DELETE FROM onward_spend_holds WHERE run_id = ? AND seq = ? RETURNING tenant, micros"
_DROP_RUN_HOLDS = "DELETE FROM onward_spend_holds WHERE run_id = ? RETURNING tenant, micros"
_SUB_HELD = "UPDATE onward_spend_tenants SET held = held - ? WHERE tenant = ?"


def _spend(micros: Any, input_tokens: Any, output_tokens: Any, calls: Any) -> Spend:
    return Spend(
        micros=int(micros),
        input_tokens=int(input_tokens),
        output_tokens=int(output_tokens),
        calls=int(calls),
    )


class SqliteSpendLedger(SqliteStore):
    """A `SpendLedger` in one SQLite file, possibly the event log's own.

    Args:
        path: The database file; created if missing.
        migrate: Apply the SQLite migrations when opened (`SqliteStore`).
        readonly: Open to read only (``onward inspect``, ``onward runs``).
    """

    what = "spend ledger"

    async def hold(
        self,
        entry: SpendEntry,
        *,
        run_budget: int | None = None,
        tenant_budget: int | None = None,
    ) -> Hold:
        check_entry(entry)
        conn = self._db.connection()
        key = (entry.run_id, entry.seq)

        def hold() -> Hold:
            with transaction(conn, "BEGIN IMMEDIATE"):
                run_micros = int(conn.execute(_RUN_MICROS, key[:1]).fetchone()[0])
                found = conn.execute(_TENANT_MICROS, (entry.tenant,)).fetchone()
                tenant_micros = 0 if found is None else int(found[0])
                if conn.execute(_TAKEN, key).fetchone()[0]:
                    return Hold(held=True, run_micros=run_micros, tenant_micros=tenant_micros)
                answer = hold_decided(
                    entry.micros,
                    run_micros=run_micros,
                    tenant_micros=tenant_micros,
                    run_budget=run_budget,
                    tenant_budget=tenant_budget,
                )
                if answer.held:
                    conn.execute(_HOLD, (*key, entry.tenant, entry.micros, entry.at))
                    conn.execute(_ADD_HELD, (entry.tenant, entry.micros))
                return answer

        return await self._db.call(hold, "holding spend", entry.run_id)

    async def release(self, run_id: str, seq: int) -> None:
        conn = self._db.connection()

        def release() -> None:
            with transaction(conn, "BEGIN IMMEDIATE"):
                _drop_hold(conn, run_id, seq)

        await self._db.call(release, "releasing held spend", run_id)

    async def release_run(self, run_id: str) -> int:
        conn = self._db.connection()

        def release_run() -> int:
            with transaction(conn, "BEGIN IMMEDIATE"):
                by_tenant: dict[str, int] = {}
                for tenant, micros in conn.execute(_DROP_RUN_HOLDS, (run_id,)).fetchall():
                    by_tenant[tenant] = by_tenant.get(tenant, 0) + int(micros)
                conn.executemany(_SUB_HELD, [(m, t) for t, m in by_tenant.items()])
                return sum(by_tenant.values())

        return await self._db.call(release_run, "releasing a finished run's held spend", run_id)

    async def record(self, entry: SpendEntry) -> bool:
        check_entry(entry)
        conn = self._db.connection()
        row = (
            entry.run_id,
            entry.seq,
            entry.tenant,
            entry.model,
            entry.input_tokens,
            entry.output_tokens,
            entry.micros,
            entry.at,
        )

        def record() -> bool:
            with transaction(conn, "BEGIN IMMEDIATE"):
                if not conn.execute(_INSERT, row).rowcount:
                    return False
                _drop_hold(conn, entry.run_id, entry.seq)
                conn.execute(
                    _ADD_TO_TENANT,
                    (entry.tenant, entry.micros, entry.input_tokens, entry.output_tokens),
                )
                return True

        return await self._db.call(record, "recording spend", entry.run_id)

    async def run_total(self, run_id: str) -> Spend:
        def read(conn: sqlite3.Connection) -> Any:
            return conn.execute(
                f"SELECT {_SUMS}, count(*) FROM onward_spend WHERE run_id = ?", (run_id,)
            ).fetchone()

        return _spend(*await self._db.read(read, "reading a run's spend", run_id))

    async def run_totals(self, run_ids: Sequence[str]) -> dict[str, Spend]:
        wanted = list(dict.fromkeys(run_ids))

        def read(conn: sqlite3.Connection) -> list[Any]:
            rows: list[Any] = []
            with transaction(conn, "BEGIN"):
                for first in range(0, len(wanted), IN_CHUNK):
                    chunk = wanted[first : first + IN_CHUNK]
                    marks = ", ".join("?" for _ in chunk)
                    rows.extend(
                        conn.execute(
                            f"SELECT run_id, {_SUMS}, count(*) FROM onward_spend "
                            f"WHERE run_id IN ({marks}) GROUP BY run_id",
                            chunk,
                        ).fetchall()
                    )
            return rows

        rows = await self._db.read(read, "reading runs' spend")
        return {row[0]: _spend(*row[1:]) for row in rows}

    async def tenant_total(self, tenant: str) -> Spend:
        def read(conn: sqlite3.Connection) -> Any:
            return conn.execute(
                "SELECT micros, input_tokens, output_tokens, calls FROM onward_spend_tenants "
                "WHERE tenant = ?",
                (tenant,),
            ).fetchone()

        row = await self._db.read(read, "reading a tenant's spend")
        return Spend() if row is None else _spend(*row)

    async def entries(self, run_id: str) -> list[SpendEntry]:
        def read(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(
                "SELECT run_id, tenant, seq, model, input_tokens, output_tokens, micros, at "
                "FROM onward_spend WHERE run_id = ? ORDER BY seq",
                (run_id,),
            ).fetchall()

        rows = await self._db.read(read, "reading a run's spend", run_id)
        return [_entry(row) for row in rows]


def _drop_hold(conn: Any, run_id: str, seq: int) -> None:
    """Delete the key's hold, if any, and take it off its tenant's held sum (in the caller's
    transaction)."""
    dropped = conn.execute(_DROP_HOLD, (run_id, seq)).fetchone()
    if dropped is not None:
        conn.execute(_SUB_HELD, (int(dropped[1]), dropped[0]))


def _entry(row: Any) -> SpendEntry:
    run_id, tenant, seq, model, input_tokens, output_tokens, micros, at = row
    return SpendEntry(
        run_id=run_id,
        tenant=tenant,
        seq=int(seq),
        model=model,
        input_tokens=int(input_tokens),
        output_tokens=int(output_tokens),
        micros=int(micros),
        at=int(at),
    )
