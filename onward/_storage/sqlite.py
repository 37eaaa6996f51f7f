"""One sqlite3 connection, used only from one dedicated thread: what every SQLite backend shares.

The event loop never blocks on disk, sqlite3 objects never cross threads, and sqlite3 errors are
translated into Onward's in one place.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from onward.errors import ConfigurationError, InvalidInputError

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


PRIVATE_FILE_MODE = 0o600


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
    opened ``immutable`` instead, which creates nothing. A writer that starts meanwhile is not
    seen by this connection: a read-only command shows the file as it was when it opened it.

    Raises:
        ConfigurationError: No file at ``path``.
    """
    if not path.is_file():
        raise ConfigurationError(f"{path}: no such database file")
    uri = f"{path.absolute().as_uri()}?mode=ro"
    if not Path(f"{path}-wal").exists():
        uri += "&immutable=1"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA query_only=ON")
        conn.execute("PRAGMA busy_timeout=10000")
    except BaseException:
        conn.close()
        raise
    return conn


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
    Where ``flock`` does not exist (Windows), it locks nothing.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    async def __aenter__(self) -> None:
        if sys.platform == "win32":
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            delay = 0.001
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 0.02)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    async def __aexit__(self, *exc: object) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor releases its lock


class SqliteThread:
    """Owns one connection and the single thread it is used from.

    Args:
        path: The database file.
        what: What the owner is ("event log"), for messages.
    """

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self._what = what
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None

    @property
    def is_open(self) -> bool:
        return self._conn is not None

    async def open(self, opener: Callable[[], sqlite3.Connection]) -> None:
        """Open with ``opener`` on the thread. A failed open leaves no thread behind."""
        if self._conn is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onward-sqlite")
        try:
            self._conn = await self.call(opener, f"opening the {self._what}")
        except BaseException:
            executor, self._executor = self._executor, None
            executor.shutdown(wait=False)
            raise

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
            return await loop.run_in_executor(self._executor, fn)
        except sqlite3.Error as exc:
            raise translate(exc, context=f"{self.path}: {context}", run_id=run_id) from exc

    async def close(self) -> None:
        """Close the connection and stop the thread. Idempotent; the owner may open again."""
        conn, self._conn = self._conn, None
        executor, self._executor = self._executor, None
        if executor is None:
            return
        try:
            if conn is not None:
                await asyncio.get_running_loop().run_in_executor(executor, conn.close)
        finally:
            executor.shutdown(wait=False)
