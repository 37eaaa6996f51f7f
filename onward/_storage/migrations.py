"""Versioned SQL migrations for PostgreSQL and SQLite, applied by `onward db migrate`.

The SQL lives in ``schemas/sql/NNNN_name.sql`` (PostgreSQL) and ``schemas/sqlite/NNNN_name.sql``
(SQLite), shipped inside the package. Applied versions are recorded in
``onward_schema_migrations``. Nothing runs at import time; stores call :func:`verify_postgres` or
:func:`verify_sqlite` before use, which raise `SchemaMismatchError` rather than guess.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from onward.errors import BackendUnavailableError, ConfigurationError, SchemaMismatchError

from .locks import LOCK_TIMEOUT_S, LockWait, bound_lock_waits, lock_taken
from .sqlite import connect, connect_readonly, split_statements, transaction
from .translate import translating

if TYPE_CHECKING:
    import asyncpg

Dialect = Literal["postgres", "sqlite"]
_FOLDER: dict[Dialect, str] = {"postgres": "sql", "sqlite": "sqlite"}
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
# Serializes concurrent `onward db migrate` runs on one schema, until their transaction ends.
_TRY_MIGRATION_LOCK = "SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))"
_MIGRATION_LOCK_POLL_S = 0.2
_HOLDER = """
SELECT a.pid, a.application_name, host(a.client_addr) AS client
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.classid = ((hashtextextended($1, 0) >> 32) & 4294967295)::oid
  AND l.objid = (hashtextextended($1, 0) & 4294967295)::oid
LIMIT 1
"""
"""The session holding the advisory lock keyed ``hashtextextended($1, 0)``: a bigint key is
stored as two oids, its high half in classid, its low half in objid."""

_LEDGER = """
CREATE TABLE IF NOT EXISTS onward_schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at text NOT NULL DEFAULT CURRENT_TIMESTAMP
)
"""


@dataclass(frozen=True, slots=True)
class Migration:
    """One numbered SQL file."""

    version: int
    name: str
    sql: str


def migrations(dialect: Dialect) -> list[Migration]:
    """Every migration of a dialect, in order."""
    folder = files("onward") / "schemas" / _FOLDER[dialect]
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text()))
    found.sort(key=lambda m: m.version)
    return found


def expected_version(dialect: Dialect) -> int:
    """The schema version this code needs: its newest migration."""
    known = migrations(dialect)
    return known[-1].version if known else 0


def _mismatch(where: str, found: int, expected: int) -> SchemaMismatchError:
    if found < expected:
        advice = "run `onward db migrate`"
    else:
        advice = "this code is older than the database; upgrade Onward"
    return SchemaMismatchError(
        f"{where}: schema version {found}, this code expects {expected}; {advice}"
    )


@translating("migrating PostgreSQL")
async def migrate_postgres(
    conn: asyncpg.Connection, *, lock_timeout_s: float | None = LOCK_TIMEOUT_S
) -> list[str]:
    """Apply the PostgreSQL migrations not yet applied; return their names.

    Args:
        lock_timeout_s: The longest another migration of the same schema, or a lock on a
            table a migration changes, is waited for before this one fails with
            `BackendUnavailableError`; ``None`` waits until it is done.
    """
    import asyncpg  # noqa: PLC0415  (loaded already: ``conn`` is its)

    applied: list[str] = []
    async with conn.transaction():
        await _lock_migrations(conn, lock_timeout_s)
        if lock_timeout_s is not None:
            # A session in an open transaction that wrote to a table holds it for as long as
            # it stays open: an ALTER or CREATE INDEX of it waited unbounded and unsaid, every
            # other write to the table queued behind it. The build itself is not bounded.
            await bound_lock_waits(conn, lock_timeout_s)
        await conn.execute(_LEDGER)
        done = {
            r["version"] for r in await conn.fetch("SELECT version FROM onward_schema_migrations")
        }
        _refuse_newer("PostgreSQL", done)
        for migration in migrations("postgres"):
            if migration.version in done:
                continue
            try:
                await conn.execute(migration.sql)
            except asyncpg.LockNotAvailableError as exc:
                within = "" if lock_timeout_s is None else f" within {lock_timeout_s:g} s"
                raise BackendUnavailableError(
                    f"PostgreSQL migration {migration.version:04d}_{migration.name}: a table "
                    "it changes is held by another session, which did not commit or roll back"
                    f"{within}; nothing was applied, and the same command may succeed once it has"
                ) from exc
            await conn.execute(
                "INSERT INTO onward_schema_migrations (version, name) VALUES ($1, $2)",
                migration.version,
                migration.name,
            )
            applied.append(f"{migration.version:04d}_{migration.name}")
    return applied


async def _lock_migrations(conn: asyncpg.Connection, timeout_s: float | None) -> None:
    """Take the migration lock of the schema migrated into, until the transaction ends.

    The lock is the schema's own, so migrations of other schemas on the server go on. It is
    asked for without blocking: a wait on the server would be bounded by nothing (migration
    statements are not), so the wait is made here, said in the log once it lasts, naming
    the session that holds the lock, and ended at ``timeout_s`` (`LockWait`).
    """
    schema = await conn.fetchval("SELECT current_schema()")
    key = f"onward:{schema or ''}:migrations"
    what = f"the migration lock of PostgreSQL schema {schema or '(none)'}"
    if await conn.fetchval(_TRY_MIGRATION_LOCK, key):
        lock_taken(what)
        return
    wait = LockWait(what, timeout_s, lambda: advisory_holder(conn, key))
    while not await conn.fetchval(_TRY_MIGRATION_LOCK, key):
        await wait.not_yet()
        remaining = wait.remaining()
        await asyncio.sleep(
            _MIGRATION_LOCK_POLL_S if remaining is None else min(_MIGRATION_LOCK_POLL_S, remaining)
        )
    wait.taken()


async def advisory_holder(conn: asyncpg.Connection, key: str) -> str:
    """Which session holds the advisory lock ``key``, as PostgreSQL tells it ("" if none)."""
    row = await conn.fetchrow(_HOLDER, key)
    if row is None:
        return ""
    where = f" from {row['client']}" if row["client"] else ""
    return f"backend pid {row['pid']} ({row['application_name'] or 'no application name'}{where})"


@translating("reading the PostgreSQL schema version")
async def schema_version_postgres(conn: asyncpg.Connection) -> int:
    """The newest applied migration, or 0 on an empty database."""
    exists = await conn.fetchval("SELECT to_regclass('onward_schema_migrations') IS NOT NULL")
    if not exists:
        return 0
    return int(
        await conn.fetchval("SELECT coalesce(max(version), 0) FROM onward_schema_migrations")
    )


@translating("verifying the PostgreSQL schema")
async def verify_postgres(conn: asyncpg.Connection) -> None:
    """Raise `SchemaMismatchError` unless the database is at this code's schema version."""
    found = await schema_version_postgres(conn)
    expected = expected_version("postgres")
    if found != expected:
        raise _mismatch("PostgreSQL", found, expected)


def migrate_sqlite(conn: sqlite3.Connection) -> list[str]:
    """Apply the SQLite migrations not yet applied, each in its own transaction."""
    applied: list[str] = []
    conn.execute(_LEDGER)
    done = {row[0] for row in conn.execute("SELECT version FROM onward_schema_migrations")}
    _refuse_newer("SQLite", done)
    for migration in migrations("sqlite"):
        with transaction(conn):
            row = conn.execute(
                "SELECT 1 FROM onward_schema_migrations WHERE version = ?", (migration.version,)
            ).fetchone()
            if row is not None:
                continue
            for statement in split_statements(migration.sql):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO onward_schema_migrations (version, name) VALUES (?, ?)",
                (migration.version, migration.name),
            )
            applied.append(f"{migration.version:04d}_{migration.name}")
    return applied


def _refuse_newer(where: str, done: set[int]) -> None:
    """A database a newer Onward migrated is left alone: older code must not add to it."""
    dialect: Dialect = "postgres" if where == "PostgreSQL" else "sqlite"
    expected = expected_version(dialect)
    if done and max(done) > expected:
        raise _mismatch(where, max(done), expected)


def verify_sqlite(conn: sqlite3.Connection, *, where: str) -> None:
    """Raise `SchemaMismatchError` unless the file is at this code's schema version."""
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'onward_schema_migrations'"
    ).fetchone()
    found = 0
    if exists:
        found = int(
            conn.execute(
                "SELECT coalesce(max(version), 0) FROM onward_schema_migrations"
            ).fetchone()[0]
        )
    expected = expected_version("sqlite")
    if found != expected:
        raise _mismatch(where, found, expected)


def refuse_foreign_sqlite(conn: sqlite3.Connection, *, where: str) -> None:
    """Raise `ConfigurationError` unless the file is an Onward database (it has the ledger).

    A file of another program, or no SQLite file at all, is named as such in one line, so a
    mistyped ``ONWARD_SQLITE_PATH`` is not reported as an Onward schema to migrate.
    """
    try:
        ledger = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'onward_schema_migrations'"
        ).fetchone()
    except sqlite3.DatabaseError as exc:
        raise ConfigurationError(f"{where}: not an Onward database ({exc})") from exc
    if ledger is None:
        raise ConfigurationError(
            f"{where}: not an Onward database (no onward_schema_migrations table); point "
            "ONWARD_SQLITE_PATH at the file the runs were written to"
        )


def check_onward_sqlite(path: Path) -> None:
    """Raise `ConfigurationError` unless ``path`` is an Onward database; change nothing in it.

    For commands about runs that already exist: a file without the migration ledger holds
    none, so it is refused rather than migrated.
    """
    conn = connect(path, readonly=True)
    try:
        refuse_foreign_sqlite(conn, where=str(path))
    finally:
        conn.close()


def _refuse_another_programs(path: Path) -> None:
    """Raise `ConfigurationError` if ``path`` is another program's SQLite database: tables, none
    of them Onward's. Checked read-only before the file is opened to be written, which would
    switch it to WAL and migrate Onward's tables into it. A new or empty file, an Onward file
    (one written before the ledger too) and no SQLite file at all (refused when opened) pass.
    """
    try:
        if not path.is_file() or path.stat().st_size == 0:
            return
        conn = connect_readonly(path)
    except (OSError, sqlite3.Error, ConfigurationError):
        return  # opening it for writing reports why not
    try:
        names = [
            name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        ]
    except sqlite3.DatabaseError:
        return  # not a database: opening it says so
    finally:
        conn.close()
    if names and not any(name.startswith("onward_") for name in names):
        raise ConfigurationError(
            f"{path}: not an Onward database (it holds {len(names)} tables of another "
            "program's, and no onward_schema_migrations table); point ONWARD_SQLITE_PATH at "
            "the file the runs are written to, or at a new one"
        )


def migrate_sqlite_file(path: Path) -> list[str]:
    """Bring an existing embedded store's file to this code's version; the migrations applied.

    For `onward db migrate`: the read-only commands never migrate, so a file an older Onward
    wrote is refused by them until something migrates it, and that should not have to be a
    command that carries a run on. Another program's database, or a file that is no SQLite
    database, is refused (`ConfigurationError`), as the commands about runs refuse them.
    """
    _refuse_another_programs(path)
    try:
        probe = connect_readonly(path)
        try:
            probe.execute("SELECT 1 FROM sqlite_master").fetchone()
        finally:
            probe.close()
    except sqlite3.DatabaseError as exc:
        raise ConfigurationError(f"{path}: not an Onward database ({exc})") from exc
    conn = connect(path)
    try:
        applied = migrate_sqlite(conn)
        verify_sqlite(conn, where=str(path))
    finally:
        conn.close()
    return applied


def open_sqlite(path: Path, *, migrate: bool, readonly: bool = False) -> sqlite3.Connection:
    """A connection to an embedded store's file, migrated if asked, at this code's version.

    What every SQLite store (frontiers, leases, blobs) opens with; run on the store's thread.
    With ``readonly`` nothing is migrated and nothing written (:func:`connect_readonly`), and a
    file that is not an Onward database is refused (`ConfigurationError`) rather than read.
    """
    if not readonly:
        _refuse_another_programs(path)
    conn = connect(path, readonly=readonly)
    try:
        if readonly:
            refuse_foreign_sqlite(conn, where=str(path))
        elif migrate:
            migrate_sqlite(conn)
        verify_sqlite(conn, where=str(path))
    except BaseException:
        conn.close()
        raise
    return conn
