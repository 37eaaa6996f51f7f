"""One lifecycle for every store: ``start``/``close``, ``open`` and ``async with``.

:class:`AsyncResource` is the part of every store protocol that says so, and
:class:`Resource` is what every event log, frontier store, lease store, blob store and sink
derives from, so opening, closing (idempotently) and the async context manager are written once.
:class:`SqliteStore` and :class:`PostgresStore` add what the embedded and the PostgreSQL stores
share: the connection (a thread or a pool), schema verification and error translation.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self, TypeVar, runtime_checkable

from onward.errors import InvalidInputError

from .locks import LOCK_TIMEOUT_S, LockWait, lock_taken
from .logs import one_line_driver_logs
from .migrations import advisory_holder, open_sqlite, verify_postgres, verify_sqlite
from .postgres import open_pool, pooled
from .sqlite import FileLock, SqliteThread, connect_reader
from .translate import translated

if TYPE_CHECKING:
    import asyncpg

_T = TypeVar("_T")

log = logging.getLogger("onward.storage")

BACKEND_TIMEOUT_S = 30.0
"""How long one call to a server (PostgreSQL, Redis, Kafka) may wait by default before it fails
with a retryable `BackendUnavailableError`: a run stops instead of hanging on a silent server,
and a resume once the server is back carries it on. ``ONWARD_BACKEND_TIMEOUT`` sets it."""


@runtime_checkable
class AsyncResource(Protocol):
    """What every store protocol includes: an idempotent close and ``async with``."""

    async def close(self) -> None:
        """Release connections, files and threads. Idempotent."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class Resource:
    """What holds connections: started once, closed idempotently, used with ``async with``.

    Subclasses implement :attr:`is_open`, :meth:`_connect` and :meth:`close`; all default to
    holding nothing, for the in-memory stores. :meth:`start` connects once, and closes again
    whatever a failed connect left open.
    """

    @classmethod
    async def open(cls, *args: Any, **options: Any) -> Self:
        """Create the object with the constructor's arguments and start it.

        Raises:
            SchemaMismatchError: A store's database is not at this code's schema version.
            BackendUnavailableError: The server could not be reached.
        """
        resource = cls(*args, **options)
        await resource.start()
        return resource

    @property
    def is_open(self) -> bool:
        """Whether :meth:`start` connected and :meth:`close` has not been called since."""
        return False

    async def start(self) -> None:
        """Connect. Starting a started object does nothing; a failed start leaves nothing open."""
        if self.is_open:
            return
        one_line_driver_logs()
        try:
            await self._connect()
        except BaseException:
            await self.close()
            raise

    async def _connect(self) -> None:
        """Open the connections, threads or files :meth:`close` releases."""

    async def close(self) -> None:
        """Release connections and threads. Idempotent."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class SqliteStore(Resource):
    """A store in one SQLite file, written through one connection on one dedicated thread (and
    read through a second on another).

    Args:
        path: The database file; created if missing.
        migrate: Apply the SQLite migrations on :meth:`start`, so embedded mode needs no setup.
            With ``False`` the file must already be migrated (``onward db migrate``), and a file
            that is not is refused rather than changed.
        readonly: Open the file read-only and change nothing in it (no migration, no journal
            mode switch, no file created beside it), for commands that only read; a missing
            file or one that is not an Onward database is a `ConfigurationError`. Every write
            then fails.
        sharing: Another store of the same file whose connection and thread this one uses; that
            store opens and closes them (its migrations include this store's tables). Two
            connections of one process would otherwise take turns at SQLite's write lock
            through its busy handler, which sleeps.
        lock_timeout_s: The longest a lock across processes (`exclusive`; the inline fold's)
            is waited for before the wait fails with `BackendUnavailableError`; ``None``
            waits until it is free. A wait of more than a second is said in the log.
    """

    what: ClassVar[str] = "store"
    """What the store is ("lease store"), for messages."""

    def __init__(
        self,
        path: str | Path,
        *,
        migrate: bool = True,
        readonly: bool = False,
        sharing: SqliteStore | None = None,
        lock_timeout_s: float | None = LOCK_TIMEOUT_S,
    ) -> None:
        if not isinstance(path, str | os.PathLike):
            raise InvalidInputError(
                f"path must be the database file's path (a str or a Path), got "
                f"{type(path).__name__} {path!r}"
            )
        self._path = Path(path)
        self._lock_timeout_s = lock_timeout_s
        self._migrate = migrate and not readonly
        self._readonly = readonly
        self._borrowed = sharing is not None
        self._db: SqliteThread
        if sharing is not None:
            if sharing._path.resolve() != self._path.resolve():
                raise InvalidInputError(
                    f"a store of {self._path} cannot share the connection of {sharing._path}"
                )
            self._readonly = sharing._readonly
            self._db = sharing._db
        else:
            self._db = SqliteThread(self._path, self.what)

    @property
    def is_open(self) -> bool:
        return self._db.is_open

    async def _connect(self) -> None:
        """Open the file, migrate it if configured to, and check its schema version.

        Raises:
            SchemaMismatchError: The file is at another schema version; with ``migrate=False``,
                an unmigrated file is one too.
        """
        if self._borrowed:
            self._db.connection()  # the sharing store must be open: says how if it is not
            return
        await self._db.open(
            self._open, reader=None if self._readonly else lambda: connect_reader(self._path)
        )

    def _open(self) -> sqlite3.Connection:
        """Open the connection; runs on the store's thread."""
        return open_sqlite(self._path, migrate=self._migrate, readonly=self._readonly)

    @property
    def readonly(self) -> bool:
        """Whether the store was opened to read only."""
        return self._readonly

    def exclusive(self, name: str) -> FileLock:
        """A lock named ``name`` that every process using this file sees (``FILE.name.lock``).

        Named from the file's resolved path, beside the file itself: a process that opened it
        through a symbolic link (to it or a directory above it) takes the same lock.
        """
        real = self._path.resolve()
        return FileLock(
            real.with_name(f"{real.name}.{name}.lock"),
            what=f"the {name} lock of {self._path}",
            timeout_s=self._lock_timeout_s,
        )

    async def verify(self) -> None:
        """Check the file is still at this code's schema version.

        Raises:
            SchemaMismatchError: Another process migrated the file to another version.
        """
        conn = self._db.connection()
        await self._db.call(lambda: verify_sqlite(conn, where=str(self._path)), "verifying schema")

    async def close(self) -> None:
        """Close the connection and stop the store's thread (unless borrowed). Idempotent."""
        if not self._borrowed:
            await self._db.close()


class PostgresStore(Resource):
    """A store in PostgreSQL, used through a pool whose every driver error is translated.

    Args:
        dsn: ``postgresql://user:password@host:port/database``.
        schema: The PostgreSQL schema (search path) holding Onward's tables; ``None`` for the
            server's default. The tables come from ``onward db migrate``.
        min_size: Smallest pool size.
        max_size: Largest pool size.
        timeout_s: The longest a connection attempt, a wait for a pooled connection or one
            statement may take before it fails with `BackendUnavailableError`
            (`BACKEND_TIMEOUT_S` by default), and the longest :meth:`close` waits for
            connections still in use; ``None`` waits as long as the server (or a caller) takes.
    """

    what: ClassVar[str] = "PostgreSQL store"
    """What the store is ("PostgreSQL lease store"), for messages."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        min_size: int = 1,
        max_size: int = 10,
        timeout_s: float | None = BACKEND_TIMEOUT_S,
    ) -> None:
        if not isinstance(dsn, str):
            raise InvalidInputError(
                "dsn must be a 'postgresql://user:password@host:port/database' string, got "
                f"{type(dsn).__name__}"
            )
        if not dsn.strip():
            raise InvalidInputError(
                "dsn is empty; give the server's 'postgresql://user:password@host:port/database' "
                "(an empty one would fall back to the PG* environment variables and a local server)"
            )
        self._dsn = dsn
        self._schema = schema
        self._min_size = min_size
        self._max_size = max_size
        self._timeout_s = timeout_s
        self._pool: asyncpg.Pool | None = None
        self._locks: dict[str, AdvisoryLock] = {}

    @property
    def is_open(self) -> bool:
        return self._pool is not None

    async def _connect(self) -> None:
        """Open the pool and verify the schema.

        Raises:
            SchemaMismatchError: The database is not at this code's schema version.
            BackendUnavailableError: PostgreSQL could not be reached.
        """
        self._pool = await open_pool(
            self._dsn,
            schema=self._schema,
            min_size=self._min_size,
            max_size=self._max_size,
            timeout_s=self._timeout_s,
        )
        await self._started()

    async def _started(self) -> None:
        """What a store checks once its pool is open and its schema version verified."""

    def _not_open(self) -> InvalidInputError:
        return InvalidInputError(
            f"the {self.what} is not open; use `await {type(self).__name__}.open(...)` or "
            "`async with`"
        )

    def _live_pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise self._not_open()
        return self._pool

    def _connection(
        self, context: str, run_id: str | None = None, *, transaction: bool = False
    ) -> AbstractAsyncContextManager[asyncpg.Connection]:
        """A pooled connection (in a transaction if asked) whose driver errors are translated."""
        return pooled(
            self._live_pool(),
            context,
            run_id=run_id,
            transaction=transaction,
            timeout_s=self._timeout_s,
        )

    async def _run(
        self,
        work: Callable[[asyncpg.Connection], Awaitable[_T]],
        context: str,
        run_id: str | None = None,
    ) -> _T:
        """Run ``work`` on a pooled connection, translating driver failures in one place."""
        async with self._connection(context, run_id) as conn:
            return await work(conn)

    async def verify(self) -> None:
        """Check the database is at this code's schema version.

        Raises:
            SchemaMismatchError: Run ``onward db migrate`` (or upgrade Onward).
        """
        await self._run(verify_postgres, "verifying schema")

    def exclusive(self, name: str) -> AdvisoryLock:
        """A lock named ``name`` that every process using this schema sees (`AdvisoryLock`);
        the same one for every caller of this store."""
        if name not in self._locks:
            self._locks[name] = AdvisoryLock(self, name)
        return self._locks[name]

    async def close(self) -> None:
        """Close the pool. Idempotent.

        Connections still in use are waited for at most ``timeout_s``: a caller that hangs
        holding one (a user projection's ``apply``) would otherwise keep the close, and the
        shutdown it is part of, waiting for ever. Past the bound the pool is terminated,
        which cuts them (their calls fail as on a lost connection), and the log says so.
        """
        pool, self._pool = self._pool, None
        if pool is None:
            return
        in_use = pool.get_size() - pool.get_idle_size()
        with translated(f"closing the {self.what}"):
            try:
                async with asyncio.timeout(self._timeout_s):
                    await pool.close()  # terminates the pool when the timeout cancels it
            except TimeoutError:
                log.warning(
                    "closing the %s: of %d connection(s) still in use when the close began, "
                    "not all were given back within %g s; the pool was terminated, cutting them",
                    self.what,
                    in_use,
                    self._timeout_s,
                )


_TRY_LOCK = "SELECT pg_try_advisory_lock(hashtextextended($1, 0))"
_LOCK = "SELECT pg_advisory_lock(hashtextextended($1, 0))"
_TRY_LOCK_SHARED = "SELECT pg_try_advisory_lock_shared(hashtextextended($1, 0))"
_LOCK_SHARED = "SELECT pg_advisory_lock_shared(hashtextextended($1, 0))"


class AdvisoryLock:
    """A PostgreSQL advisory lock named for a store's schema, held on one of its pooled
    connections while a block runs; reusable, one holder at a time.

    What `FileLock` is for a SQLite file: a read-then-write that spans several statements
    (read positions, fold, store) is never interleaved with another process's. A process that
    dies holding it releases it with its connection; the connection it was held on releases
    it on its way back to the pool, in the one statement that gives the lock up
    (`PooledConnection`), and a connection whose release failed is closed. Holders in one
    process queue on an asyncio lock first, so at most one of the store's pooled connections
    ever waits on the server's lock and the holder always finds one free to work with.
    """

    def __init__(self, store: PostgresStore, name: str) -> None:
        self._store = store
        self._name = name
        self._keys: list[str] | None = None
        self._earlier_key: str | None = None
        self._schema = store._schema
        self._in_process = asyncio.Lock()
        self._held: tuple[AsyncExitStack, asyncpg.Connection] | None = None

    async def __aenter__(self) -> None:
        await self._in_process.acquire()
        try:
            stack = AsyncExitStack()
            conn = await stack.enter_async_context(
                self._store._connection(f"taking the {self._name} lock")
            )
            conn.release_session_locks()  # before asking: a cancelled ask may be granted
            await self._within(stack, conn, self._wait_for)
        except BaseException:
            self._in_process.release()
            raise
        self._held = (stack, conn)

    async def __aexit__(self, *exc: object) -> None:
        held, self._held = self._held, None
        if held is None:
            return
        stack, _ = held
        try:
            await stack.aclose()  # the pool's reset of the connection unlocks
        finally:
            self._in_process.release()

    async def _within(
        self,
        stack: AsyncExitStack,
        conn: asyncpg.Connection,
        work: Callable[[asyncpg.Connection], Awaitable[None]],
    ) -> None:
        """Run ``work`` on the lock's connection; on failure give the connection back, its
        error translated as every pooled call's is."""
        try:
            await work(conn)
        except BaseException as exc:
            await stack.__aexit__(type(exc), exc, exc.__traceback__)  # raises it translated
            raise

    async def _resolve(self, conn: asyncpg.Connection) -> list[str]:
        """The keys of the lock, in the order they are taken: named for the schema the pool's
        search path resolves to, so a store naming the schema and one reaching it through the
        URL's search path take one lock. A store given no schema also takes the key earlier
        versions took for it (``onward::NAME``), so a process not yet upgraded holding the
        lock keeps this one waiting; in shared mode (`_earlier_key`), as that key is one for
        every schema and upgraded processes on two schemas must not wait for each other.
        Looked up once, on first use."""
        if self._keys is None:
            resolved = await conn.fetchval("SELECT current_schema()") or ""
            self._schema = self._schema or resolved
            keys = [f"onward:{resolved}:{self._name}"]
            legacy = f"onward::{self._name}"
            if not self._store._schema and legacy not in keys:
                keys.append(legacy)
                self._earlier_key = legacy
            self._keys = keys
        return self._keys

    async def _wait_for(self, conn: asyncpg.Connection) -> None:
        """Take the lock: at once if it is free (one round trip per key), else in waits of at
        most a second each, said in the log once they last and ended at the store's timeout.
        The keys are taken in one order, so two holders never each hold one the other waits
        for."""
        keys = await self._resolve(conn)
        what = f"the {self._name} lock of PostgreSQL schema {self._schema or 'public'}"
        wait: LockWait | None = None
        waiting_on = {"key": keys[0]}  # the key the wait is on now, for its holder
        for key in keys:
            shared = key == self._earlier_key
            if await conn.fetchval(_TRY_LOCK_SHARED if shared else _TRY_LOCK, key):
                continue
            waiting_on["key"] = key
            if wait is None:
                wait = LockWait(
                    what,
                    self._store._timeout_s,
                    lambda: advisory_holder(conn, waiting_on["key"]),
                )
            await self._wait_on(conn, key, wait)
        lock_taken(what)

    async def _wait_on(self, conn: asyncpg.Connection, key: str, wait: LockWait) -> None:
        """Wait for the key ``key`` of the lock, within ``wait``."""
        import asyncpg  # noqa: PLC0415  (loaded already: ``conn`` is its)

        while True:
            remaining = wait.remaining()
            lock_timeout_ms = (
                1000 if remaining is None else max(1, min(1000, int(remaining * 1000)))
            )
            try:
                async with conn.transaction():  # a session lock outlives the transaction
                    await conn.execute(f"SET LOCAL lock_timeout = {lock_timeout_ms}")
                    await conn.execute(_LOCK_SHARED if key == self._earlier_key else _LOCK, key)
            except asyncpg.LockNotAvailableError:
                await wait.not_yet()
            else:
                return
