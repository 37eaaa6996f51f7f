"""`PostgresLeaseStore`: leases in PostgreSQL (asyncpg), shared by workers on many machines.

One statement decides each acquisition: an upsert whose ``DO UPDATE`` only fires when the row
is free (released) or lapsed, raising the fence in the same write. PostgreSQL locks the row and
re-checks that condition against the newest committed version, so of any number of concurrent
acquirers exactly one gets a row back. Renewal and release are single guarded ``UPDATE``s.

Every time comes from the server's ``now()``; no caller sends one, so a worker whose clock is off
can neither take a lease that has not lapsed nor keep one that has. ``expires_at`` is a
``timestamptz`` in the table and seconds since the epoch in `RunLease`. The row outlives a
release, so the fence only ever goes up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from onward._storage import PostgresStore

from .base import CancelAsked, RunLease, check_ask, check_ttl, conflict_error, fenced_error

if TYPE_CHECKING:
    import asyncpg

_COLUMNS = (
    "tenant, holder, fence, extract(epoch FROM expires_at)::float8 AS expires_at, cancel_by, "
    "cancel_why"
)
_RETURNING = f"RETURNING {_COLUMNS}"
_ACQUIRE = (
    "INSERT INTO onward_leases AS l (run_id, tenant, holder, fence, expires_at) "
    "VALUES ($1, $2, $3, 1, now() + make_interval(secs => $4::float8)) "
    "ON CONFLICT (run_id) DO UPDATE SET tenant = excluded.tenant, holder = excluded.holder, "
    "fence = l.fence + 1, expires_at = excluded.expires_at, updated_at = now() "
    f"WHERE l.holder IS NULL OR l.expires_at <= now() {_RETURNING}"
)
_RENEW = (
    "UPDATE onward_leases SET expires_at = now() + make_interval(secs => $4::float8), "
    "updated_at = now() "
    f"WHERE run_id = $1 AND holder = $2 AND fence = $3 AND expires_at > now() {_RETURNING}"
)
_RAISE_FENCE = (
    "UPDATE onward_leases SET fence = greatest(fence, $4::bigint) + 1, updated_at = now() "
    f"WHERE run_id = $1 AND holder = $2 AND fence = $3 AND expires_at > now() {_RETURNING}"
)
_RELEASE = (
    "UPDATE onward_leases SET holder = NULL, expires_at = NULL, updated_at = now(), "
    "cancel_by = CASE WHEN $4::boolean THEN NULL ELSE cancel_by END, "
    "cancel_why = CASE WHEN $4::boolean THEN NULL ELSE cancel_why END "
    "WHERE run_id = $1 AND holder = $2 AND fence = $3"
)
_FORGET = "DELETE FROM onward_leases WHERE run_id = $1 AND holder = $2 AND fence = $3 AND fence = 1"
_CURRENT = (
    f"SELECT {_COLUMNS} "
    "FROM onward_leases WHERE run_id = $1 AND holder IS NOT NULL AND expires_at > now()"
)
_CURRENT_MANY = (
    f"SELECT run_id, {_COLUMNS} FROM onward_leases "
    "WHERE run_id = ANY($1::text[]) AND holder IS NOT NULL AND expires_at > now()"
)
_ASK_TO_CANCEL = (
    "UPDATE onward_leases SET cancel_by = coalesce(cancel_by, $3), "
    "cancel_why = CASE WHEN cancel_by IS NULL THEN $4 ELSE cancel_why END "
    "WHERE run_id = $1 AND tenant = $2 AND holder IS NOT NULL AND expires_at > now() "
    f"{_RETURNING}"
)
_ROW = (
    "SELECT holder, tenant, fence, holder IS NOT NULL AND expires_at > now() AS held, "
    "extract(epoch FROM expires_at)::float8 AS expires_at "
    "FROM onward_leases WHERE run_id = $1"
)

ACQUIRE_ATTEMPTS = 3
"""How often an acquisition is retried when the lease it lost to was gone by the time it looked.

The upsert refuses while a lease is live; the holder is read in a second statement, and that
holder may release in between. Then the run is free and the acquisition is tried again rather
than refused naming nobody.
"""


def _lease(run_id: str, row: asyncpg.Record) -> RunLease:
    return RunLease(
        run_id=run_id,
        tenant=row["tenant"],
        holder=row["holder"],
        fence=int(row["fence"]),
        expires_at=float(row["expires_at"]),
        cancel_asked=(
            None
            if row["cancel_by"] is None
            else CancelAsked(row["cancel_by"], row["cancel_why"] or "")
        ),
    )


class PostgresLeaseStore(PostgresStore):
    """A `LeaseStore` in PostgreSQL.

    Args:
        dsn: ``postgresql://user:password@host:port/database``.
        schema: The PostgreSQL schema (search path) holding Onward's tables; ``None`` for the
            server's default. The table comes from ``onward db migrate``.
        min_size: Smallest pool size.
        max_size: Largest pool size.
    """

    what = "PostgreSQL lease store"

    async def acquire(self, run_id: str, *, tenant: str, holder: str, ttl_s: float) -> RunLease:
        """Take a run's lease, raising its fence.

        Raises:
            ResumeConflictError: Another holder, or this same one, has an unexpired lease.
        """
        check_ttl(ttl_s)

        async def acquire(
            conn: asyncpg.Connection,
        ) -> tuple[asyncpg.Record | None, asyncpg.Record | None]:
            in_the_way: asyncpg.Record | None = None
            for _ in range(ACQUIRE_ATTEMPTS):
                row = await conn.fetchrow(_ACQUIRE, run_id, tenant, holder, ttl_s)
                if row is not None:
                    return row, None
                current = await conn.fetchrow(_ROW, run_id)
                in_the_way = current
                if current is not None and current["held"]:
                    break
            return None, in_the_way

        row, in_the_way = await self._run(acquire, "acquiring the lease", run_id)
        if row is None:
            raise conflict_error(
                run_id,
                None if in_the_way is None else in_the_way["holder"],
                holder_tenant=None if in_the_way is None else in_the_way["tenant"],
                tenant=tenant,
                expires_at=None if in_the_way is None else in_the_way["expires_at"],
            )
        return _lease(run_id, row)

    async def renew(self, lease: RunLease, *, ttl_s: float) -> RunLease:
        """Extend a lease in one guarded ``UPDATE``, keeping its fence.

        Raises:
            FencedError: The lease expired, was released or was superseded.
        """
        check_ttl(ttl_s)
        return await self._update_held(lease, _RENEW, ttl_s, "renewing the lease")

    async def raise_fence(self, lease: RunLease, *, above: int) -> RunLease:
        """Lift a held lease's fence above ``above`` in one guarded ``UPDATE``, keeping its expiry.

        The row's fence is the run's fence counter, so raising it raises every later
        acquisition's too. A concurrent raise or acquisition waits on the row lock and then
        re-checks the guard against the new fence, so at most one of them wins.

        Raises:
            FencedError: The lease expired, was released or was superseded.
        """
        if lease.fence > above:
            return lease
        return await self._update_held(lease, _RAISE_FENCE, above, "raising the fence")

    async def _update_held(
        self, lease: RunLease, statement: str, value: float, what: str
    ) -> RunLease:
        """Run ``statement`` (guarded by run, holder and fence; ``value`` is its fourth
        parameter) on a lease its holder still holds, and return the lease it leaves."""

        async def update(conn: asyncpg.Connection) -> asyncpg.Record | None:
            row: asyncpg.Record | None = await conn.fetchrow(
                statement, lease.run_id, lease.holder, lease.fence, value
            )
            return row

        row = await self._run(update, what, lease.run_id)
        if row is None:
            raise fenced_error(lease, "expired, was released or was superseded")
        return _lease(lease.run_id, row)

    async def release(self, lease: RunLease) -> None:
        """Hand a lease back; releasing one already released or lapsed (not taken) is a no-op.

        Raises:
            FencedError: A later acquisition superseded the lease.
        """

        async def release(conn: asyncpg.Connection) -> bool:
            status = await conn.execute(
                _RELEASE, lease.run_id, lease.holder, lease.fence, lease.cancel_asked is not None
            )
            if status != "UPDATE 0":
                return True
            row = await conn.fetchrow(_ROW, lease.run_id)
            return row is not None and row["holder"] is None and int(row["fence"]) == lease.fence

        if not await self._run(release, "releasing the lease", lease.run_id):
            raise fenced_error(lease, "was superseded, so releasing it is not this holder's to do")

    async def forget(self, lease: RunLease) -> None:
        """Hand back a lease on a run that does not exist: its row is deleted while it is this
        lease's and holds the first fence, else the lease is released.

        Raises:
            FencedError: A later acquisition superseded the lease.
        """

        async def forget(conn: asyncpg.Connection) -> bool:
            status = await conn.execute(_FORGET, lease.run_id, lease.holder, lease.fence)
            return bool(status != "DELETE 0")

        if not await self._run(forget, "forgetting the lease", lease.run_id):
            await self.release(lease)

    async def current(self, run_id: str) -> RunLease | None:
        """The unexpired lease on a run, if any, by the server's clock."""

        async def read(conn: asyncpg.Connection) -> asyncpg.Record | None:
            row: asyncpg.Record | None = await conn.fetchrow(_CURRENT, run_id)
            return row

        row = await self._run(read, "reading the lease", run_id)
        return None if row is None else _lease(run_id, row)

    async def current_many(self, run_ids: Sequence[str]) -> dict[str, RunLease]:
        """The unexpired leases on some runs, by run id, in one query by the server's clock."""
        if not run_ids:
            return {}

        async def read(conn: asyncpg.Connection) -> list[asyncpg.Record]:
            rows: list[asyncpg.Record] = await conn.fetch(_CURRENT_MANY, list(run_ids))
            return rows

        rows = await self._run(read, "reading the leases", None)
        return {row["run_id"]: _lease(row["run_id"], row) for row in rows}

    async def ask_to_cancel(
        self, run_id: str, *, tenant: str, by: str, why: str = ""
    ) -> RunLease | None:
        """Ask the unexpired holding of ``tenant``'s run to end it cancelled, in one guarded
        ``UPDATE`` (the first ask is kept); the holding asked, or ``None`` when there is none."""
        check_ask(run_id, by, why)

        async def ask(conn: asyncpg.Connection) -> asyncpg.Record | None:
            row: asyncpg.Record | None = await conn.fetchrow(
                _ASK_TO_CANCEL, run_id, tenant, by, why
            )
            return row

        row = await self._run(ask, "asking the holder to cancel", run_id)
        return None if row is None else _lease(run_id, row)
