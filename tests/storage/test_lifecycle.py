"""The storage layer's lifecycle and translation: one start, idempotent close, no raw errors."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest

from onward._storage import PostgresStore, Resource, SqliteStore, translated, translating
from onward._storage.postgres import pooled
from onward._storage.redis import RedisStore
from onward.errors import BackendError, BackendUnavailableError, FencedError, InvalidInputError


class _Counted(Resource):
    """Counts connects and closes; fails its first connect when told to."""

    def __init__(self, *, fail_first: bool = False) -> None:
        self.connects = 0
        self.closes = 0
        self._open = False
        self._fail_first = fail_first

    @property
    def is_open(self) -> bool:
        return self._open

    async def _connect(self) -> None:
        self.connects += 1
        if self._fail_first and self.connects == 1:
            raise BackendUnavailableError("not yet")
        self._open = True

    async def close(self) -> None:
        self.closes += 1
        self._open = False


async def test_start_connects_once_and_async_with_closes() -> None:
    async with _Counted() as resource:
        await resource.start()
    assert (resource.connects, resource.closes) == (1, 1)


async def test_a_failed_start_closes_what_it_opened_and_may_be_retried() -> None:
    resource = _Counted(fail_first=True)
    with pytest.raises(BackendUnavailableError):
        await resource.start()
    assert (resource.is_open, resource.closes) == (False, 1)
    await resource.start()
    assert resource.is_open


async def test_open_builds_and_starts() -> None:
    resource = await _Counted.open(fail_first=False)
    assert resource.is_open


async def test_translated_turns_driver_errors_and_nothing_else() -> None:
    with (
        pytest.raises(BackendUnavailableError, match="reading x") as caught,
        translated("reading x", run_id="r-1"),
    ):
        raise ConnectionResetError("reset")
    assert isinstance(caught.value.__cause__, ConnectionResetError)
    assert caught.value.run_id == "r-1"
    fenced = FencedError("superseded")
    with pytest.raises(FencedError) as passed, translated("writing"):
        raise fenced
    assert passed.value is fenced
    with pytest.raises(asyncio.CancelledError), translated("waiting"):
        raise asyncio.CancelledError


async def test_translating_wraps_a_coroutine_function() -> None:
    @translating("counting rows")
    async def count() -> int:
        raise asyncpg.exceptions.UniqueViolationError("dup")

    with pytest.raises(BackendError, match="counting rows"):
        await count()


@pytest.mark.parametrize(
    ("build", "argument"),
    [
        (lambda: SqliteStore(5), "path"),  # type: ignore[arg-type]
        (lambda: SqliteStore(None), "path"),  # type: ignore[arg-type]
        (lambda: PostgresStore(5432), "dsn"),  # type: ignore[arg-type]
        (lambda: PostgresStore(None), "dsn"),  # type: ignore[arg-type]
        (lambda: RedisStore(6379), "url"),  # type: ignore[arg-type]
        (lambda: RedisStore(None), "url"),  # type: ignore[arg-type]
    ],
)
def test_a_store_given_no_string_for_its_address_is_refused_naming_the_argument(
    build: Callable[[], Resource], argument: str
) -> None:
    """A port number or ``None`` where a store's path or URL goes is refused when the store is
    built, naming the argument, not with an AttributeError or TypeError from the driver."""
    with pytest.raises(InvalidInputError, match=rf"^{argument} must be"):
        build()


@pytest.mark.parametrize("dsn", ["", "  "])
def test_a_postgres_store_given_an_empty_address_is_refused_naming_the_argument(dsn: str) -> None:
    """An empty ``dsn`` (an unset variable read as ``""``) is refused when the store is built,
    naming the argument, instead of libpq falling back to the ``PG*`` variables and a local
    server, to fail there for a user nobody chose (or to reach a database nobody named)."""
    with pytest.raises(InvalidInputError, match=r"^dsn is empty; give .*postgresql://"):
        PostgresStore(dsn)


async def test_a_sqlite_store_reports_a_broken_file_as_an_onward_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.db"
    path.write_bytes(b"not a database" * 100)
    store = SqliteStore(path)
    with pytest.raises(BackendError, match=r"broken\.db"):
        await store.start()
    assert not store.is_open
    await store.close()
    await store.close()


@pytest.mark.parametrize(
    ("make", "url", "shown"),
    [
        pytest.param(
            PostgresStore,
            "postgresql://onward:pg-secret-7d1c@127.0.0.1:{port}/onward",
            "PostgreSQL at postgresql://onward:***@127.0.0.1:{port}/onward",
            id="postgres",
        ),
        pytest.param(
            RedisStore,
            "redis://:redis-secret-4b2e@127.0.0.1:{port}/0",
            "Redis at redis://:***@127.0.0.1:{port}/0",
            id="redis",
        ),
    ],
)
async def test_a_store_whose_server_never_answers_names_it_and_the_bound(
    silent_port: int, make: Callable[..., Resource], url: str, shown: str
) -> None:
    """A PostgreSQL or Redis that takes the connection and never answers failed with
    "connecting to PostgreSQL: TimeoutError: " (the drivers' timeouts have no message): the
    error names the server's address, without its password, the bound it waited and the
    setting that sets it."""
    address = url.format(port=silent_port)
    store = make(address, timeout_s=0.5)
    with pytest.raises(BackendUnavailableError) as caught:
        await store.start()
    message = str(caught.value)
    assert (
        f"{shown.format(port=silent_port)} did not answer within 0.5s "
        "(ONWARD_BACKEND_TIMEOUT; timeout_s in Python)"
    ) in message, message
    password = urlsplit(address).password
    assert password, address
    assert password not in message
    assert caught.value.retryable
    assert not store.is_open


async def test_a_postgres_store_that_cannot_connect_is_retryable_and_leaves_nothing_open() -> None:
    store = PostgresStore("postgresql://nobody@127.0.0.1:1/none")
    with pytest.raises(BackendUnavailableError) as caught:
        await store.start()
    assert caught.value.retryable
    assert not store.is_open
    with pytest.raises(InvalidInputError, match="not open"):
        await store.verify()
    await store.close()


async def test_a_pool_with_no_connection_to_give_says_what_it_waited_for(database_url: str) -> None:
    """A call that waits out its bound for a pooled connection (every one in use, or a server
    that stopped answering new ones) failed with "<context>: TimeoutError: ", nothing after it:
    it says how long it waited for a connection and how many of the pool's were in use."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
    try:
        async with pool.acquire():
            with pytest.raises(BackendUnavailableError) as caught:
                async with pooled(pool, "loading frontiers", timeout_s=0.3):
                    pass
        message = str(caught.value)
        assert message.startswith("loading frontiers: no PostgreSQL connection within 0.3s"), (
            message
        )
        assert "1 of 1 in use" in message, message
        assert caught.value.retryable
    finally:
        await pool.close()
