"""A writing sqlite3 connection on one dedicated thread, and a reading one on another: what every
SQLite backend shares.

The event loop never blocks on disk, sqlite3 objects never cross threads, and sqlite3 errors are
translated into Onward's in one place. Writes are group-committed (:meth:`SqliteThread.write`):
the writes that queued while the previous commit ran share one transaction and one fsync. Reads
(:meth:`SqliteThread.read`) never wait behind a commit's fsync.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Generic, TypeVar

from onward.errors import ConfigurationError, InvalidInputError

from .locks import LOCK_TIMEOUT_S, LockWait, holder_record
from .translate import translate

if sys.platform != "win32":
    import fcntl

_T = TypeVar("_T")


def connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit) with the durable settings.

    WAL lets readers in other processes work beside a writer; ``synchronous=FULL`` makes a
    committed transaction survive power loss, which write-ahead tool dispatch relies on.
    With ``readonly`` the connection is :func:`connect_readonly`'s.

    A missing file is created 0600 first, whatever the umask: it holds whole histories, and
    SQLite gives its ``-wal`` and ``-shm`` files the database file's mode.
    """
    if readonly:
        return connect_readonly(path)
    refuse_unusable_path(path)
    create_private(path)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=10000")
    except BaseException:
        conn.close()
        raise
    return conn


def connect_reader(path: Path) -> sqlite3.Connection:
    """A second connection of a writing store, for its reads: ``query_only``, so it cannot
    write, and in the WAL mode the writing connection set, so it reads beside the writes."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA query_only=ON")
        conn.execute("PRAGMA busy_timeout=10000")
    except BaseException:
        conn.close()
        raise
    return conn


PRIVATE_FILE_MODE = 0o600


def refuse_unusable_path(path: Path) -> None:
    """Raise `ConfigurationError` if no database file can be at ``path``: it is a directory, or
    its directory is not there. SQLite says only "unable to open database file", which reads
    as a store that did not answer (to be retried) and names neither cause."""
    if path.is_dir():
        raise ConfigurationError(
            f"{path} is a directory, not a database file; point ONWARD_SQLITE_PATH (or "
            f"sqlite_path) at a file, such as {path / 'onward.db'}"
        )
    if not path.parent.is_dir():
        raise ConfigurationError(
            f"{path}: its directory {path.parent} does not exist; create it, or point "
            "ONWARD_SQLITE_PATH (or sqlite_path) at a file in one that does"
        )


def create_private(path: Path) -> None:
    """Create ``path`` empty and 0600 if no file is there; an existing file is left as it is.

    Created exclusively and never through a link, so a link planted at ``path`` is not
    followed to create a file elsewhere (SQLite then opens the link as it always did).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, PRIVATE_FILE_MODE)
    except OSError:
        # There already (left as it is), or not creatable (a missing directory, no rights):
        # sqlite3.connect then opens it or reports why not, as it always did.
        return
    try:
        if sys.platform != "win32":
            os.fchmod(fd, PRIVATE_FILE_MODE)  # exactly 0600, even under an umask taking more
    finally:
        os.close(fd)


def connect_readonly(path: Path) -> sqlite3.Connection:
    """A connection that cannot change the file, nor create one, nor leave files beside it.

    Opened as a ``mode=ro`` URI, with no journal-mode switch and ``query_only`` on. SQLite
    gives a read-only connection to a WAL file its ``-wal`` and ``-shm`` files, creating them
    if missing and unable to remove them again; so when there is no ``-wal`` file (no
    connection has the file open for writing, and none left transactions behind) the file is
    opened ``immutable`` instead, which creates nothing. Such a connection does not see a writer
    that starts meanwhile (SQLite trusts the pages it read), so `SqliteThread` opens it again
    once the file changed (`ReadonlyConnection.outdated`): a long-lived reader
    (`ExecutionManager()`) sees runs written after its first question.

    Raises:
        ConfigurationError: No file at ``path``.
    """
    if not path.is_file():
        refuse_unusable_path(path)
        raise ConfigurationError(f"{path}: no such database file")
    uri = f"{path.absolute().as_uri()}?mode=ro"
    opened_as = None
    if not Path(f"{path}-wal").exists():
        uri += "&immutable=1"
        opened_as = _file_state(path)
    conn = sqlite3.connect(
        uri, uri=True, isolation_level=None, check_same_thread=False, factory=ReadonlyConnection
    )
    conn.opened_as = opened_as
    try:
        conn.execute("PRAGMA query_only=ON")
        conn.execute("PRAGMA busy_timeout=10000")
    except BaseException:
        conn.close()
        raise
    return conn


class ReadonlyConnection(sqlite3.Connection):
    """A `connect_readonly` connection; one opened ``immutable`` remembers the file as it was."""

    opened_as: tuple[int, int, int] | None = None
    """The file's inode, size and mtime when it was opened ``immutable``; else ``None``."""

    def outdated(self, path: Path) -> bool:
        """Whether the file changed since this ``immutable`` connection opened it, which it
        cannot see: SQLite takes no lock on such a file and trusts the pages it read."""
        if self.opened_as is None:
            return False
        return Path(f"{path}-wal").exists() or _file_state(path) != self.opened_as


def _file_state(path: Path) -> tuple[int, int, int] | None:
    """The file's inode, size and mtime (``None`` if it is gone)."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def split_statements(sql: str) -> list[str]:
    """The statements of a script, split where SQLite itself says a statement ends.

    ``sqlite3.complete_statement`` knows string literals, comments and trigger bodies, so a
    ``;`` inside one of them does not end the statement. Pieces holding only comments or
    whitespace are dropped.
    """
    statements: list[str] = []
    pending = ""
    for piece in sql.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if _has_code(pending):
                statements.append(pending.strip())
            pending = ""
    if _has_code(pending.removesuffix(";")):
        raise ValueError(f"SQL script ends inside a statement: {pending.strip()[:80]!r}")
    return statements


def _has_code(sql: str) -> bool:
    """Whether a piece of SQL holds more than comments, whitespace and semicolons."""
    text = "\n".join(line.split("--", 1)[0] for line in sql.splitlines())
    return bool(text.replace(";", "").strip())


@contextmanager
def transaction(conn: sqlite3.Connection, begin: str = "BEGIN IMMEDIATE") -> Iterator[None]:
    """Run a block in one transaction, rolled back if the block raises.

    The rollback is skipped when SQLite has already ended the transaction itself (it does so on
    some errors, such as a full disk), so the original error is the one that surfaces.
    """
    conn.execute(begin)
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


IN_CHUNK = 500
"""Values per ``IN (...)`` list: well under SQLite's bound-variable limit on any build."""


def select_in(conn: sqlite3.Connection, query: str, values: list[Any]) -> list[Any]:
    """Rows of ``query`` (ending in ``... IN``) for every value, one ``IN`` list per
    `IN_CHUNK` values, all read in one transaction (one snapshot of the file)."""
    rows: list[Any] = []
    with transaction(conn, "BEGIN"):
        for first in range(0, len(values), IN_CHUNK):
            chunk = values[first : first + IN_CHUNK]
            marks = ", ".join("?" for _ in chunk)
            rows.extend(conn.execute(f"{query} ({marks})", chunk).fetchall())
    return rows


class FileLock:
    """An exclusive lock every process on the machine sees: ``flock`` on a file beside a database.

    SQLite's own lock covers one statement or transaction; this covers a read-then-write that
    spans several (read positions, fold, store), so two processes never interleave one. It is
    polled without blocking, so a waiter that is cancelled never leaves a thread holding it.
    Its holder writes who it is into the file, so a wait that lasts names it (`LockWait`); a
    wait longer than ``timeout_s`` fails with `BackendUnavailableError` (``None``: no limit).
    Where ``flock`` does not exist (Windows), it locks nothing.
    """

    def __init__(
        self, path: Path, *, what: str | None = None, timeout_s: float | None = LOCK_TIMEOUT_S
    ) -> None:
        self.path = path
        self.what = what or f"the lock file {path}"
        self.timeout_s = timeout_s
        self._fd: int | None = None

    async def __aenter__(self) -> None:
        if sys.platform == "win32":
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            wait = LockWait(self.what, self.timeout_s, self._holder)
            delay = 0.001
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    wait.taken()
                    break
                except BlockingIOError:
                    await wait.not_yet()
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 0.02)
            with suppress(OSError):  # who holds it is for messages only
                os.ftruncate(fd, 0)
                os.pwrite(fd, holder_record().encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    async def __aexit__(self, *exc: object) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor releases its lock

    async def _holder(self) -> str:
        """Who last took the lock, as it wrote itself into the file ("" if unreadable)."""
        try:
            return self.path.read_text(encoding="utf-8", errors="replace").strip()[:200]
        except OSError:
            return ""


class _Write(Generic[_T]):
    """One caller's write waiting for a group commit, and what became of it."""

    __slots__ = ("done", "error", "fn", "result", "waiter")

    def __init__(self, fn: Callable[[], _T], waiter: asyncio.Future[None]) -> None:
        self.fn = fn
        self.waiter = waiter
        self.done = False
        self.result: _T | None = None
        self.error: BaseException | None = None

    def fail(self, error: BaseException) -> None:
        self.result, self.error, self.done = None, error, True


_SAVEPOINT = "onward_write"


def commit_group(conn: sqlite3.Connection, writes: list[_Write[Any]]) -> None:
    """Run ``writes`` in one ``BEGIN IMMEDIATE`` transaction and commit it once.

    Each write runs inside a savepoint, so one that raises is rolled back alone and fails alone
    while the others commit. A write is marked done, with its result or its error, only once
    the commit returned or failed: no caller hears of a write that is not durable. If SQLite
    ends the transaction itself (a full disk, an I/O error), the writes run so far fail with
    that error and the rest are tried again in a fresh transaction.
    """
    pending = deque(writes)
    while pending:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            for write in pending:
                write.fail(exc)
            return
        ran = _run_in_transaction(conn, pending)
        if ran is None:
            continue  # the transaction was lost; what is left gets a fresh one
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            for write in ran:
                write.fail(exc)
            return
        for write in ran:
            write.done = True


def _run_in_transaction(
    conn: sqlite3.Connection, pending: deque[_Write[Any]]
) -> list[_Write[Any]] | None:
    """Run pending writes, each in a savepoint, inside the open transaction; return those that
    ran, or ``None`` if SQLite ended the transaction (they then failed with its error)."""
    ran: list[_Write[Any]] = []
    while pending:
        write = pending.popleft()
        try:
            conn.execute(f"SAVEPOINT {_SAVEPOINT}")
            value = write.fn()
            conn.execute(f"RELEASE {_SAVEPOINT}")
        except Exception as exc:  # noqa: BLE001 - the write's own failure, its caller's to see
            write.fail(exc)
            if conn.in_transaction:
                try:
                    conn.execute(f"ROLLBACK TO {_SAVEPOINT}")
                    conn.execute(f"RELEASE {_SAVEPOINT}")
                    continue
                except sqlite3.Error:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
            for earlier in ran:
                earlier.fail(exc)
            return None
        write.result = value
        ran.append(write)
    return ran


def _wake(writes: list[_Write[Any]]) -> None:
    """From the thread: wake the callers of ``writes``, one call into each event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for write in writes:
        by_loop.setdefault(write.waiter.get_loop(), []).append(write.waiter)
    for loop, waiters in by_loop.items():
        with suppress(RuntimeError):  # that loop is closed: nobody is waiting any more
            loop.call_soon_threadsafe(_resolve, waiters)


def _resolve(waiters: list[asyncio.Future[None]]) -> None:
    for waiter in waiters:
        if not waiter.done():  # a cancelled caller's is done already
            waiter.set_result(None)


def _close_all(connections: list[sqlite3.Connection]) -> None:
    """Close ``connections`` (on the thread that opened them)."""
    for conn in connections:
        conn.close()


class SqliteThread:
    """Owns the writing connection and the single thread it is used from, and the reading
    connection and its thread.

    Args:
        path: The database file.
        what: What the owner is ("event log"), for messages.
    """

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self._what = what
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        self._writes: deque[_Write[Any]] = deque()
        self._commit_scheduled = False
        self.commits = 0
        """Group commits run so far (each one transaction and one fsync)."""
        self._reader_opener: Callable[[], sqlite3.Connection] | None = None
        self._reader_executor: ThreadPoolExecutor | None = None
        self._reader: sqlite3.Connection | None = None
        self._reopener: Callable[[], sqlite3.Connection] | None = None
        self._retired: list[sqlite3.Connection] = []

    @property
    def is_open(self) -> bool:
        return self._conn is not None

    async def open(
        self,
        opener: Callable[[], sqlite3.Connection],
        *,
        reader: Callable[[], sqlite3.Connection] | None = None,
    ) -> None:
        """Open with ``opener`` on the thread. A failed open leaves no thread behind.

        A cancelled one leaves no connection either: the thread goes on opening it after the
        caller stopped waiting, and closes it once it is made.

        With ``reader``, :meth:`read` uses a second connection it opens (on a second thread, at
        the first read), so reads never queue behind a commit's fsync; WAL lets that
        connection read beside the writing one. Without it, reads use the one connection.
        """
        if self._conn is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onward-sqlite")
        self._commit_scheduled = False
        made: list[sqlite3.Connection] = []

        def open_on_thread() -> sqlite3.Connection:
            made.append(opener())
            return made[-1]

        try:
            self._conn = await self.call(open_on_thread, f"opening the {self._what}")
        except BaseException:
            executor, self._executor = self._executor, None
            executor.submit(_close_all, made)  # the thread's next task: after the opener
            executor.shutdown(wait=False)
            raise
        self._reader_opener = reader
        self._reopener = opener

    def connection(self) -> sqlite3.Connection:
        """The open connection, or a clear error saying how to open it."""
        if self._conn is None:
            raise InvalidInputError(
                f"{self.path}: the {self._what} is not open; use `await ....open(...)` or "
                "`async with`"
            )
        return self._conn

    async def call(self, fn: Callable[[], _T], context: str, run_id: str | None = None) -> _T:
        """Run ``fn`` on the thread, translating sqlite3 errors into Onward's."""
        if self._executor is None:
            self.connection()  # raises the not-open error
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._current_then, fn)
        except sqlite3.Error as exc:
            raise translate(exc, context=f"{self.path}: {context}", run_id=run_id) from exc

    def _current_then(self, fn: Callable[[], _T]) -> _T:
        """On the thread: reopen a read-only connection opened ``immutable`` on a file that has
        changed since (a writer came), so it reads the file as it is now; then run ``fn``.

        The connection it replaces stays open till the next reopen (a call queued meanwhile
        may hold it) and is closed then: kept till the store closed, a reader on a file that
        writers open and close again and again held one more open file per change.
        """
        conn = self._conn
        if (
            isinstance(conn, ReadonlyConnection)
            and self._reopener is not None
            and conn.outdated(self.path)
        ):
            self._conn = self._reopener()
            retired, self._retired = self._retired, [conn]
            _close_all(retired)
        return fn()

    async def read(
        self,
        fn: Callable[[sqlite3.Connection], _T],
        context: str,
        run_id: str | None = None,
    ) -> _T:
        """Run ``fn`` with the reading connection, on its thread, translating sqlite3 errors.

        ``fn`` must only read. It sees every write whose :meth:`write` has returned: those
        are committed.
        """
        self.connection()  # raises the not-open error
        if self._reader_opener is None:
            return await self.call(lambda: fn(self.connection()), context, run_id)
        if self._reader_executor is None:
            self._reader_executor = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="onward-sqlite-read"
            )
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._reader_executor, self._read, fn)
        except sqlite3.Error as exc:
            raise translate(exc, context=f"{self.path}: {context}", run_id=run_id) from exc

    def _read(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """On the reading thread: open its connection the first time, then run ``fn``."""
        if self._reader is None:
            if self._reader_opener is None:
                raise InvalidInputError(f"{self.path}: the {self._what} is not open")
            self._reader = self._reader_opener()
        return fn(self._reader)

    async def write(self, fn: Callable[[], _T], context: str, run_id: str | None = None) -> _T:
        """Run ``fn`` on the thread inside a group commit; return once its changes are durable.

        ``fn`` runs inside a transaction (it must not begin or end one) together with the
        writes of other callers that queued while the previous commit was running: a lone
        write commits at once, and many concurrent writes share one transaction and one
        fsync. A write that raises is rolled back alone; the error reaches its caller only.

        Raises:
            BackendError: SQLite refused the write or its commit (translated as by
                :meth:`call`); nothing of it was stored.
        """
        conn = self.connection()
        write = _Write(fn, asyncio.get_running_loop().create_future())
        self._writes.append(write)
        try:
            if not self._commit_scheduled:
                # No commit is waiting to start: schedule one, which takes this write and every
                # one queued before it starts. While a commit runs, the writes queue for the next.
                self._commit_scheduled = True
                try:
                    self._thread().submit(self._commit_queued, conn)
                except BaseException:
                    self._commit_scheduled = False
                    raise
            await write.waiter
        except BaseException:
            with suppress(ValueError):
                self._writes.remove(write)  # not taken by a commit yet: it never runs
            raise
        if write.error is None:
            return write.result  # type: ignore[return-value]  # fn's value, set by the commit
        if isinstance(write.error, sqlite3.Error):
            raise translate(
                write.error, context=f"{self.path}: {context}", run_id=run_id
            ) from write.error
        raise write.error

    def _thread(self) -> ThreadPoolExecutor:
        """The connection's thread, or the not-open error."""
        if self._executor is None:
            raise InvalidInputError(f"{self.path}: the {self._what} is not open")
        return self._executor

    def _commit_queued(self, conn: sqlite3.Connection) -> None:
        """On the thread: commit every write queued so far in one transaction, then wake their
        callers."""
        self._commit_scheduled = False  # a write queued from now on schedules the next commit
        writes: list[_Write[Any]] = []
        while self._writes:
            try:
                writes.append(self._writes.popleft())
            except IndexError:
                break
        if not writes:
            return
        self.commits += 1
        try:
            commit_group(conn, writes)
        except Exception as exc:  # noqa: BLE001 - a rollback failed too: fail what is not done
            for write in writes:
                if not write.done:
                    write.fail(exc)
        finally:
            _wake(writes)

    async def close(self) -> None:
        """Close the connections and stop the threads. Idempotent; the owner may open again."""
        self._reader_opener = None
        reader_executor, self._reader_executor = self._reader_executor, None
        if reader_executor is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(
                    reader_executor, self._close_reader
                )
            finally:
                reader_executor.shutdown(wait=False)
        conn, self._conn = self._conn, None
        retired, self._retired = self._retired, []
        self._reopener = None
        executor, self._executor = self._executor, None
        if executor is None:
            return
        try:
            if conn is not None:
                retired.append(conn)
            await asyncio.get_running_loop().run_in_executor(executor, _close_all, retired)
        finally:
            executor.shutdown(wait=False)

    def _close_reader(self) -> None:
        """On the reading thread: close its connection, if it was opened."""
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()
