"""`onward db migrate`, `onward db verify` and `onward db pack-records`: the PostgreSQL schema in
``DATABASE_URL`` (and, for `onward db migrate` on the embedded backend, the SQLite file)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from onward._storage import bound_lock_waits, connected, migrate_sqlite_file, translated
from onward._storage import quoted_identifier as quoted
from onward.errors import BackendUnavailableError, ConfigurationError
from onward.eventlog.postgres import mark_records_packed
from onward.projections.builds import active_build
from onward.projections.migrations import schema_version_postgres
from onward.projections.postgres import PROJECTION, PostgresFrontierStore, migrate
from onward.runtime.settings import Settings, load_settings

from ._common import JsonResultOption, echo_json, opened, out, run_until_terminated

if TYPE_CHECKING:
    import asyncpg


@asynccontextmanager
async def _connection(
    config: Settings, *, statements_bounded: bool = True
) -> AsyncIterator[asyncpg.Connection]:
    """One connection to ``DATABASE_URL`` in the configured schema: connecting (and each
    statement, if ``statements_bounded``) gives up after ``ONWARD_BACKEND_TIMEOUT``."""
    async with connected(
        config.require_database_url(),
        schema=config.database_schema,
        timeout_s=config.backend_timeout,
        statements_bounded=statements_bounded,
    ) as conn:
        yield conn


async def _create_schema(conn: asyncpg.Connection, schema: str | None, timeout_s: float) -> bool:
    """Create ``ONWARD_DATABASE_SCHEMA`` if it does not exist yet; whether it was created.

    Existence is asked first: ``CREATE SCHEMA IF NOT EXISTS`` needs the right to create in the
    database even when the schema is there, and a role migrating into a schema made for it
    need not have that right. Another migration creating it at the same moment makes
    PostgreSQL's ``IF NOT EXISTS`` wait for it and then fail with a unique violation: the
    schema is then there, made by the other, and this one migrates into it. That wait is
    bounded by ``timeout_s``: another session that created the schema and has not committed
    (a transaction left open) would otherwise hold it for as long as it stays open.

    Raises:
        ConfigurationError: The schema is missing and this role may not create it (exit 2);
            the message is the statement a superuser runs.
        BackendUnavailableError: Another session creating it did not end within
            ``timeout_s`` (exit 5).
    """
    import asyncpg  # noqa: PLC0415  (loaded already: ``conn`` is its)

    if not schema:
        return False
    if await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", schema):
        return False
    try:
        async with conn.transaction():
            await bound_lock_waits(conn, timeout_s)
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quoted(schema)}")
    except asyncpg.UniqueViolationError:
        return False
    except asyncpg.LockNotAvailableError as exc:
        raise BackendUnavailableError(
            f"ONWARD_DATABASE_SCHEMA: schema {quoted(schema)} is being created by another "
            f"session, which did not commit or roll back within {timeout_s:g} s; the same "
            "command may succeed once it has"
        ) from exc
    except asyncpg.InsufficientPrivilegeError as exc:
        role = await conn.fetchval("SELECT current_user")
        raise ConfigurationError(
            f"ONWARD_DATABASE_SCHEMA: schema {quoted(schema)} does not exist and role "
            f"{quoted(role)} may not create it; as a superuser run: CREATE SCHEMA "
            f"{quoted(schema)} AUTHORIZATION {quoted(role)};"
        ) from exc
    return True


def migrate_command(as_json: JsonResultOption = False) -> None:
    """Apply pending PostgreSQL migrations (DATABASE_URL) and create the first builds, in
    ONWARD_DATABASE_SCHEMA if set (created if it does not exist).

    With ONWARD_BACKEND=sqlite and no DATABASE_URL, the existing file ONWARD_SQLITE_PATH is
    migrated instead, so the read-only commands can read a file an older Onward wrote.

    Exit 0: the schema is current. 2: bad configuration or credentials. 5: PostgreSQL failed.
    """
    config = load_settings()
    if config.backend == "sqlite" and not config.database_url and config.sqlite_path.is_file():
        with translated(f"migrating {config.sqlite_path}"):
            _print_applied(migrate_sqlite_file(config.sqlite_path), as_json=as_json)
        return

    async def run() -> list[str]:
        # A migration may build an index on a large table: only connecting, and the wait for
        # another migration of the schema, are bounded.
        async with _connection(config, statements_bounded=False) as conn:
            schema = config.database_schema
            created = await _create_schema(conn, schema, config.backend_timeout)
            applied = await migrate(conn, lock_timeout_s=config.backend_timeout)
            if created and schema is not None:
                applied.insert(0, f"schema {quoted(schema)}")
            return applied

    _print_applied(run_until_terminated(run()), as_json=as_json)


def _print_applied(applied: list[str], *, as_json: bool) -> None:
    """Say which migration steps were applied, or that the schema was current already."""
    if as_json:
        echo_json({"applied": applied, "current": True})
        return
    for name in applied:
        out.print(f"applied {name}")
    out.print("schema is current" if not applied else f"{len(applied)} step(s) applied")


def verify_command(as_json: JsonResultOption = False) -> None:
    """Check the PostgreSQL schema is the version this code expects.

    Exit 0: it is. 2: it is not (run `onward db migrate`), or bad configuration or credentials.
    5: PostgreSQL failed.
    """
    config = load_settings()

    async def run() -> tuple[int, int | None]:
        store = PostgresFrontierStore(
            config.require_database_url(),
            schema=config.database_schema,
            timeout_s=config.backend_timeout,
        )
        async with opened("PostgreSQL", store), _connection(config) as conn:
            return await schema_version_postgres(conn), await active_build(conn, PROJECTION)

    version, build = run_until_terminated(run())
    if as_json:
        echo_json({"schema_version": version, "frontiers_build": build, "ok": True})
        return
    out.print(f"schema version {version}, frontiers build {build}: ok")


def pack_records_command(as_json: JsonResultOption = False) -> None:
    """Have the PostgreSQL event log (ONWARD_BACKEND=postgres) store its records packed from
    now on, as a log created by this version does.

    Run it once every process that reads the log runs this version: an earlier one takes a
    packed record for an unreadable one. Processes already running keep writing plain records
    until they restart; every process of this version reads both. Stored rows are left as they
    are.

    Exit 0: the log packs its records (now or already). 2: bad configuration or credentials,
    or no event log on the schema yet (the first one opened packs its records). 5: PostgreSQL
    failed.
    """
    config = load_settings()

    async def run() -> bool | None:
        async with _connection(config) as conn:
            return await mark_records_packed(conn)

    marked = run_until_terminated(run())
    if marked is None:
        raise ConfigurationError(
            "no event log on this schema yet: the first process that opens one with "
            "ONWARD_BACKEND=postgres creates it, and it packs its records"
        )
    if as_json:
        echo_json({"packed": True, "changed": marked})
        return
    out.print(
        "records are packed from now on (processes running now pack once they restart)"
        if marked
        else "records were packed already"
    )
