"""PostgreSQL connection pools: opened, verified and used through one translating path.

Every PostgreSQL store opens its pool with :func:`open_pool` (search path set, schema version
verified) and runs its work through :func:`pooled`, so no asyncpg or socket exception reaches
a caller untranslated. asyncpg is imported when the first pool or connection is opened: a
process on SQLite or Kafka alone never loads it (~40 ms).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from onward.errors import BackendError, BackendUnavailableError, ConfigurationError

from .migrations import verify_postgres
from .translate import (
    server_driver_errors,
    translated,
    unusable_client_certificate,
    unusable_tls_file,
)
from .urls import masked_url, warn_unchecked_server, without_passwords

if TYPE_CHECKING:
    import asyncpg


def _failures() -> tuple[type[BaseException], ...]:
    """What a call on a lost connection fails with: a driver error, or one a function such as
    a build lookup already translated. Evaluated when an exception is matched, so aiokafka's
    errors count once it is imported without this module importing it."""
    return (*server_driver_errors(), BackendError)


APPLICATION_NAME = "onward"
"""What Onward's connections call themselves on the server (``pg_stat_activity``)."""


def application_name(schema: str | None) -> str:
    """The ``application_name`` of a store's connections: ``onward``, or ``onward:<schema>``.

    The schema in it lets an operator (or a test) tell apart the connections of deployments
    sharing one server.
    """
    return f"{APPLICATION_NAME}:{schema}" if schema else APPLICATION_NAME


async def open_pool(
    dsn: str,
    *,
    schema: str | None = None,
    min_size: int = 1,
    max_size: int = 10,
    timeout_s: float | None = None,
) -> asyncpg.Pool:
    """A connection pool to a PostgreSQL store, its schema verified before anything uses it.

    What every PostgreSQL store opens with: the search path set to ``schema``, driver failures
    translated, and the pool closed again if the schema is not this code's version.

    Args:
        timeout_s: The longest a connection attempt and each statement may take before it fails
            (`BackendUnavailableError`); ``None``: asyncpg's 60 s to connect, statements
            unbounded.
    """
    import asyncpg  # noqa: PLC0415  (for PostgreSQL only)

    from .pooled_connection import PooledConnection  # noqa: PLC0415  (derives from asyncpg's)

    warn_unchecked_server(dsn, "DATABASE_URL")
    with translated("connecting to PostgreSQL"), _usable_url(dsn), _answered(dsn, timeout_s):
        pool = await asyncpg.create_pool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            connection_class=PooledConnection,
            **_connect_options(schema, timeout_s),
        )
    try:
        async with pooled(pool, "verifying schema", timeout_s=timeout_s) as conn:
            await verify_postgres(conn)
    except BaseException:
        await pool.close()
        raise
    return pool


@asynccontextmanager
async def connected(
    dsn: str,
    *,
    schema: str | None = None,
    timeout_s: float | None = None,
    statements_bounded: bool = True,
) -> AsyncIterator[asyncpg.Connection]:
    """One connection, outside any pool, for a command that runs a few statements of its own
    (``onward db migrate``): the server settings, the time bounds and the error translation of
    `open_pool`, but the schema version is not verified (migrations run on an old one).

    Args:
        timeout_s: The longest connecting and each statement may take before it fails
            (`BackendUnavailableError`); ``None``: asyncpg's 60 s to connect, statements
            unbounded.
        statements_bounded: Whether ``timeout_s`` bounds statements too; ``False`` for work
            that may rightly take long (a migration building an index on a large table).
    """
    import asyncpg  # noqa: PLC0415  (for PostgreSQL only)

    options = _connect_options(schema, timeout_s, statements_bounded=statements_bounded)
    warn_unchecked_server(dsn, "DATABASE_URL")
    with translated("connecting to PostgreSQL"), _usable_url(dsn), _answered(dsn, timeout_s):
        conn = await asyncpg.connect(dsn, **options)
    try:
        with translated("PostgreSQL"):
            yield conn
    finally:
        with translated("closing a PostgreSQL connection"):
            await conn.close(timeout=timeout_s)


def quoted_identifier(name: str) -> str:
    """``name`` as a quoted SQL identifier: taken as it is written, whatever its case."""
    return '"' + name.replace('"', '""') + '"'


def _connect_options(
    schema: str | None, timeout_s: float | None, *, statements_bounded: bool = True
) -> dict[str, Any]:
    """What every connection is opened with: its name and search path, and its time bounds.

    The schema is quoted in the search path, as `onward db migrate` creates it: unquoted,
    PostgreSQL would fold a name with capitals to lower case and look in another schema.

    A statement is bounded on the server too (``statement_timeout``), not only by the client
    giving up (``command_timeout``): the client's cancel goes over the network, and when it
    cannot get through (a partition, a silent proxy) the statement would run on, a write then
    committing after its caller was told it failed and after a read said it was not there.
    """
    settings = {"application_name": application_name(schema)}
    if schema:
        settings["search_path"] = quoted_identifier(schema)
    options: dict[str, Any] = {"server_settings": settings}
    if timeout_s is not None:
        options.update(timeout=timeout_s)
        if statements_bounded:
            options.update(command_timeout=timeout_s)
            settings["statement_timeout"] = str(max(1, int(timeout_s * 1000)))
    return options


@contextmanager
def _usable_url(dsn: str) -> Iterator[None]:
    """asyncpg's DSN parser raises a bare ValueError (a port that is not a number): say which
    setting is wrong. The URL is shown without its password, and the driver's exception is not
    chained, as its text may hold the URL as it was given.

    It loads the TLS files the URL names before it connects, and a file it cannot read or load
    (not PEM, a key not the certificate's) fails with a bare OSError, as an unreachable server
    does: such a failure is said to be the file's (`_unusable_tls_file`), a
    `ConfigurationError`, rather than the server's.
    """
    try:
        yield
    except ssl.SSLCertVerificationError:
        raise  # a ValueError too, but no fault of the URL's form: `translated` names sslrootcert
    except ValueError as exc:
        raise ConfigurationError(
            f"DATABASE_URL {masked_url(dsn)} is not a usable PostgreSQL URL: "
            f"{without_passwords(str(exc), dsn)}"
        ) from None
    except OSError as exc:
        unusable = _unusable_tls_file(dsn)
        if unusable is None:
            raise
        raise ConfigurationError(unusable) from exc


ASYNCPG_CONNECT_TIMEOUT_S = 60.0
"""How long asyncpg waits for a connection when no bound is given (its ``timeout``)."""


@contextmanager
def _answered(dsn: str, timeout_s: float | None) -> Iterator[None]:
    """asyncpg gives up on a server that took the connection and never answered with a
    `TimeoutError` that has no message ("connecting to PostgreSQL: TimeoutError: "): say which
    server it was, without its password, how long it was waited for and what sets that."""
    try:
        yield
    except TimeoutError as exc:
        if timeout_s is None:
            bound = f"asyncpg's default {ASYNCPG_CONNECT_TIMEOUT_S:g}s (timeout_s=None in Python)"
        else:
            bound = f"{timeout_s:g}s (ONWARD_BACKEND_TIMEOUT; timeout_s in Python)"
        raise BackendUnavailableError(
            f"PostgreSQL at {masked_url(dsn)} did not answer within {bound}; check that it is "
            "up and reachable at that address"
        ) from exc


_TLS_FILES: tuple[tuple[str, str, bool], ...] = (
    ("sslrootcert", "PGSSLROOTCERT", True),
    ("sslcrl", "PGSSLCRL", True),
    ("sslcert", "PGSSLCERT", False),
    ("sslkey", "PGSSLKEY", False),
)
"""The TLS files asyncpg loads (each named in the URL's query, or else by its variable), and
whether each holds CA certificates."""


def _unusable_tls_file(dsn: str) -> str | None:
    """Which TLS file ``dsn`` (or a ``PGSSL*`` variable) names that cannot be loaded, and why;
    ``None`` if every one it names can be."""
    try:
        query = parse_qs(urlsplit(dsn).query)
    except ValueError:  # a URL the driver could not parse either: not a file's fault
        return None
    named: dict[str, tuple[str, str]] = {}
    for parameter, variable, _ in _TLS_FILES:
        if query.get(parameter, [""])[-1]:
            named[parameter] = (f"{parameter} in DATABASE_URL", query[parameter][-1])
        elif os.environ.get(variable):
            named[parameter] = (variable, os.environ[variable])
    unusable = unusable_tls_file(
        (*named[parameter], authorities)
        for parameter, _, authorities in _TLS_FILES
        if parameter in named
    )
    if unusable is not None or "sslcert" not in named:
        return unusable
    return unusable_client_certificate(
        named["sslcert"],
        named.get("sslkey") or _default_key(),
        ("sslpassword in DATABASE_URL", query.get("sslpassword", [""])[-1] or None),
    )


def _default_key() -> tuple[str, str] | None:
    """The client key asyncpg (as libpq) loads when none is named, if there is one:
    ``~/.postgresql/postgresql.key``."""
    try:
        key = Path.home() / ".postgresql" / "postgresql.key"
    except (RuntimeError, KeyError):  # no home directory
        return None
    return ("the default client key", str(key)) if key.exists() else None


@asynccontextmanager
async def pooled(
    pool: asyncpg.Pool,
    context: str,
    *,
    run_id: str | None = None,
    transaction: bool = False,
    timeout_s: float | None = None,
) -> AsyncIterator[asyncpg.Connection]:
    """A connection from the pool, in a transaction if asked; every driver error translated.

    A connection the server dropped (restart, failover, ``pg_terminate_backend``) fails the
    call in progress with a retryable `BackendUnavailableError`; the pool discards it, so the
    next call gets a fresh connection. So does a connection whose server refused a write as
    read-only (a standby a failover left it on): the retry may reach the new primary.

    Args:
        pool: The store's pool.
        context: What the store is doing, in a few words, for the error message.
        run_id: The run concerned, if any.
        transaction: Run the block in one transaction, rolled back if it raises.
        timeout_s: The longest to wait for a connection (a pool exhausted, or a server that
            does not answer a new connection); ``None`` waits as long as it takes.
    """
    with translated(context, run_id=run_id):
        async with _acquired(pool, context, timeout_s) as conn:
            try:
                if not transaction:
                    yield conn
                    return
                async with conn.transaction():
                    yield conn
            except _failures() as exc:
                if connection_gone(conn):
                    raise connection_lost(exc, context=context, run_id=run_id) from exc
                import asyncpg  # noqa: PLC0415  (loaded already: the pool is its)

                if isinstance(exc.__cause__ or exc, asyncpg.ReadOnlySQLTransactionError):
                    conn.terminate()  # a standby's session: the retry connects afresh
                raise


@asynccontextmanager
async def _acquired(
    pool: asyncpg.Pool, context: str, timeout_s: float | None
) -> AsyncIterator[asyncpg.Connection]:
    """A connection from ``pool``; a wait for one that outlasts ``timeout_s`` says what it
    waited for (asyncpg's `TimeoutError` has no message) and how many connections were in use.
    Only the acquiring is timed: a timeout in the caller's block is the caller's to report."""
    try:
        conn = await pool.acquire(timeout=timeout_s)
    except TimeoutError as exc:
        in_use = pool.get_size() - pool.get_idle_size()
        bound = f"{timeout_s:g}s" if timeout_s is not None else "asyncpg's connect timeout"
        raise BackendUnavailableError(
            f"{context}: no PostgreSQL connection within {bound} ({in_use} of "
            f"{pool.get_max_size()} in use); the server stopped answering new connections, or "
            "every one is taken: a larger pool or a longer ONWARD_BACKEND_TIMEOUT may help"
        ) from exc
    try:
        yield conn
    finally:
        await pool.release(conn)


def connection_gone(conn: asyncpg.Connection) -> bool:
    """Whether the connection is gone; a pooled one the pool already let go of counts as gone."""
    import asyncpg  # noqa: PLC0415  (loaded already: ``conn`` is its)

    try:
        return bool(conn.is_closed())
    except asyncpg.InterfaceError:  # detached from its pool because it closed
        return True


def connection_lost(
    exc: BaseException, *, context: str, run_id: str | None = None
) -> BackendUnavailableError:
    """The error of a call whose connection the server dropped, whatever asyncpg raised for it.

    A connection cut while idle in the pool is noticed only by the next call on it, and asyncpg
    may then raise an internal client error rather than a connection error; the call is still
    one that can simply be made again.
    """
    message = (
        f"{context}: the connection to PostgreSQL was lost ({type(exc).__name__}: {exc}); "
        "retry, the next call opens a fresh connection"
    )
    if run_id is not None:
        message = f"run {run_id!r}: {message}"
    return BackendUnavailableError(message, run_id=run_id)
