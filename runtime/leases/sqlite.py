"""`SqliteLeaseStore`: leases in one SQLite file, for the embedded single-machine deployment.

Workers in several processes on one machine share the file. Each decision runs inside a
``BEGIN IMMEDIATE`` transaction, which takes the file's write lock before reading, so two
processes acquiring the same run at once are serialized and exactly one wins. Decisions are
group-committed with the other writes of the connection (the log's appends, when the store
shares the log's connection): each is answered once its transaction is durable.

The clock is SQLite's own ``julianday('now')``, which SQLite reads from the operating system
itself; Python's ``time.time`` is never consulted and no caller sends a time. ``expires_at`` is
stored and returned in seconds since the epoch. The row of a run outlives its release (holder
and expiry become NULL), so the fence it carries only ever goes up.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from onward._storage import SqliteStore

from .base import CancelAsked, RunLease, check_ask, check_ttl, conflict_error, fenced_error

SQLITE_NOW = "((julianday('now') - 2440587.5) * 86400.0)"
"""Seconds since the epoch by SQLite's clock; 'now' is fixed for the length of one statement."""

_COLUMNS = "tenant, holder, fence, expires_at, cancel_by, cancel_why"
_RETURNING = f"RETURNING {_COLUMNS}"

_ACQUIRE = (
    "INSERT INTO onward_leases (run_id, tenant, holder, fence, expires_at) "
    f"VALUES (?, ?, ?, 1, {SQLITE_NOW} + ?) "
    "ON CONFLICT(run_id) DO UPDATE SET tenant = excluded.tenant, holder = excluded.holder, "
    "fence = onward_leases.fence + 1, expires_at = excluded.expires_at "
    f"WHERE onward_leases.holder IS NULL OR onward_leases.expires_at <= {SQLITE_NOW} "
    f"{_RETURNING}"
)
_RENEW = (
    f"UPDATE onward_leases SET expires_at = {SQLITE_NOW} + ? "
    f"WHERE run_id = ? AND holder = ? AND fence = ? AND expires_at > {SQLITE_NOW} {_RETURNING}"
)
_RAISE_FENCE = (
    "UPDATE onward_leases SET fence = max(fence, ?) + 1 "
    f"WHERE run_id = ? AND holder = ? AND fence = ? AND expires_at > {SQLITE_NOW} {_RETURNING}"
)
_RELEASE = (
    "UPDATE onward_leases SET holder = NULL, expires_at = NULL, "
    "cancel_by = CASE WHEN ? THEN NULL ELSE cancel_by END, "
    "cancel_why = CASE WHEN ? THEN NULL ELSE cancel_why END "
    "WHERE run_id = ? AND holder = ? AND fence = ?"
)
_FORGET = "DELETE FROM onward_leases WHERE run_id = ? AND holder = ? AND fence = ? AND fence = 1"
_CURRENT = (
    f"SELECT {_COLUMNS} FROM onward_leases "
    f"WHERE run_id = ? AND holder IS NOT NULL AND expires_at > {SQLITE_NOW}"
)
_ASKED_AT_ONCE = 500
"""How many run ids one query of `SqliteLeaseStore.current_many` names: under the 999
parameters an SQLite built before 3.32 takes."""
_ASK_TO_CANCEL = (
    "UPDATE onward_leases SET cancel_by = coalesce(cancel_by, ?), "
    "cancel_why = CASE WHEN cancel_by IS NULL THEN ? ELSE cancel_why END "
    f"WHERE run_id = ? AND tenant = ? AND holder IS NOT NULL AND expires_at > {SQLITE_NOW} "
    f"{_RETURNING}"
)


def _lease(run_id: str, row: Any) -> RunLease:
    tenant, holder, fence, expires_at, cancel_by, cancel_why = row
    asked = None if cancel_by is None else CancelAsked(cancel_by, cancel_why or "")
    return RunLease(run_id, tenant, holder, int(fence), float(expires_at), asked)


class SqliteLeaseStore(SqliteStore):
    """A `LeaseStore` in one SQLite file, possibly the event log's own.

    Args:
        path: The database file; created if missing.
        migrate: Apply the SQLite migrations when opened, so embedded mode needs no setup. With
            ``False`` the file must already be migrated, and one that is not is refused.
    """

    what = "lease store"

    async def acquire(self, run_id: str, *, tenant: str, holder: str, ttl_s: float) -> RunLease:
        """Take a run's lease, raising its fence.

        Raises:
            ResumeConflictError: Another holder, or this same one, has an unexpired lease.
        """
        check_ttl(ttl_s)
        conn = self._db.connection()

        def acquire() -> tuple[Any, Any]:
            # fetchall: a RETURNING statement must run to its end before the COMMIT.
            rows = conn.execute(_ACQUIRE, (run_id, tenant, holder, ttl_s)).fetchall()
            if rows:
                return rows[0], None
            current = conn.execute(
                "SELECT holder, tenant, expires_at FROM onward_leases WHERE run_id = ?",
                (run_id,),
            ).fetchone()
            return None, current

        row, current = await self._db.write(acquire, "acquiring the lease", run_id)
        if row is None:
            raise conflict_error(
                run_id,
                current[0],
                holder_tenant=current[1],
                tenant=tenant,
                expires_at=None if current[2] is None else float(current[2]),
            )
        return _lease(run_id, row)

    async def renew(self, lease: RunLease, *, ttl_s: float) -> RunLease:
        """Extend a lease in one transaction, keeping its fence.

        Raises:
            FencedError: The lease expired, was released or was superseded.
        """
        check_ttl(ttl_s)
        return await self._update_held(lease, _RENEW, ttl_s, "renewing the lease")

    async def raise_fence(self, lease: RunLease, *, above: int) -> RunLease:
        """Lift a held lease's fence above ``above`` in one transaction, keeping its expiry.

        The row's fence is the run's fence counter, so raising it raises every later
        acquisition's too.

        Raises:
            FencedError: The lease expired, was released or was superseded.
        """
        if lease.fence > above:
            return lease
        return await self._update_held(lease, _RAISE_FENCE, above, "raising the fence")

    async def _update_held(
        self, lease: RunLease, statement: str, value: float, what: str
    ) -> RunLease:
        """Run ``statement`` (``value`` first, then run, holder and fence as its guard) on a
        lease its holder still holds, and return the lease it leaves."""
        conn = self._db.connection()
        params = (value, lease.run_id, lease.holder, lease.fence)

        def update() -> Any:
            rows = conn.execute(statement, params).fetchall()
            return rows[0] if rows else None

        row = await self._db.write(update, what, lease.run_id)
        if row is None:
            raise fenced_error(lease, "expired, was released or was superseded")
        return _lease(lease.run_id, row)

    async def release(self, lease: RunLease) -> None:
        """Hand a lease back; releasing one already released or lapsed (not taken) is a no-op.

        Raises:
            FencedError: A later acquisition superseded the lease.
        """
        conn = self._db.connection()

        def release() -> bool:
            heard = lease.cancel_asked is not None
            cursor = conn.execute(_RELEASE, (heard, heard, lease.run_id, lease.holder, lease.fence))
            if cursor.rowcount:
                return True
            row = conn.execute(
                "SELECT holder, fence FROM onward_leases WHERE run_id = ?", (lease.run_id,)
            ).fetchone()
            return row is not None and row[0] is None and int(row[1]) == lease.fence

        if not await self._db.write(release, "releasing the lease", lease.run_id):
            raise fenced_error(lease, "was superseded, so releasing it is not this holder's to do")

    async def forget(self, lease: RunLease) -> None:
        """Hand back a lease on a run that does not exist: its row is deleted while it is this
        lease's and holds the first fence, else the lease is released.

        Raises:
            FencedError: A later acquisition superseded the lease.
        """
        conn = self._db.connection()

        def forget() -> int:
            return conn.execute(_FORGET, (lease.run_id, lease.holder, lease.fence)).rowcount

        if not await self._db.write(forget, "forgetting the lease", lease.run_id):
            await self.release(lease)

    async def current(self, run_id: str) -> RunLease | None:
        """The unexpired lease on a run, if any, by SQLite's clock."""

        def read(conn: sqlite3.Connection) -> Any:
            return conn.execute(_CURRENT, (run_id,)).fetchone()

        row = await self._db.read(read, "reading the lease", run_id)
        return None if row is None else _lease(run_id, row)

    async def current_many(self, run_ids: Sequence[str]) -> dict[str, RunLease]:
        """The unexpired leases on some runs, by run id, by SQLite's clock: one read, of a
        query per `_ASKED_AT_ONCE` ids."""
        if not run_ids:
            return {}
        ids = list(run_ids)

        def read(conn: sqlite3.Connection) -> list[Any]:
            rows: list[Any] = []
            for start in range(0, len(ids), _ASKED_AT_ONCE):
                chunk = ids[start : start + _ASKED_AT_ONCE]
                marks = ", ".join("?" * len(chunk))
                rows += conn.execute(
                    f"SELECT run_id, {_COLUMNS} FROM onward_leases WHERE run_id IN ({marks}) "
                    f"AND holder IS NOT NULL AND expires_at > {SQLITE_NOW}",
                    chunk,
                ).fetchall()
            return rows

        rows = await self._db.read(read, "reading the leases")
        return {row[0]: _lease(row[0], row[1:]) for row in rows}

    async def ask_to_cancel(
        self, run_id: str, *, tenant: str, by: str, why: str = ""
    ) -> RunLease | None:
        """Ask the unexpired holding of ``tenant``'s run to end it cancelled, in one guarded
        ``UPDATE`` (the first ask is kept); the holding asked, or ``None`` when there is none."""
        check_ask(run_id, by, why)
        conn = self._db.connection()

        def ask() -> Any:
            rows = conn.execute(_ASK_TO_CANCEL, (by, why, run_id, tenant)).fetchall()
            return rows[0] if rows else None

        row = await self._db.write(ask, "asking the holder to cancel", run_id)
        return None if row is None else _lease(run_id, row)
