"""Fixtures for every test: real servers, fresh places on them, and replayable randomness.

Servers: a URL in the environment wins. Without one, and with a Docker engine answering,
testcontainers starts the server. With neither the session stops at once and says what to run;
no test is ever skipped for a missing server.

Each test that needs one gets its own Kafka topic (``kafka_topic``), Redis key prefix
(``redis_prefix``) and migrated PostgreSQL schema (``pg_schema``; ``empty_pg_schema`` has no
tables yet, ``new_pg_schema`` makes several), removed afterwards. Randomized tests draw from
``rng``: its seed is printed, and ``ONWARD_TEST_SEED=<seed>`` replays it.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import pytest_asyncio
from support.kafka import fresh_topic
from support.marker_probe import remember
from support.pg import SchemaFactory, schema_factory
from support.private_servers import PrivateKafka, PrivatePostgres, PrivateRedis, running
from support.redis import fresh_prefix
from support.servers import KafkaServers

if TYPE_CHECKING:
    from onward.integrations.mcp import SchemaCache

# The shared assertions in tests/support report their operands as a test's own asserts do.
pytest.register_assert_rewrite("support.histories")

# Garbage is collected after each test, so what a test left unclosed fails that test.
pytest_plugins = ["support.garbage"]

START_COMMAND = 'eval "$(scripts/services.sh up)"   # or: make test'
SEED_VARIABLE = "ONWARD_TEST_SEED"


@pytest.fixture(autouse=True)
def _app_ledger_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`support.appapi`'s tools write their side effects where ``APP_LEDGER`` says (a file in
    the working directory by default, for the README's examples); a test that does not say
    keeps them in its own folder, never in the checkout."""
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "app-ledger.jsonl"))


def _docker_answers() -> bool:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://"):
        # Asked first with a socket of our own, closed either way: the docker client leaves
        # the socket of a refused connection open, which fails the session at its end.
        with socket.socket(socket.AF_UNIX) as probe:
            probe.settimeout(3)
            try:
                probe.connect(host.removeprefix("unix://"))
            except OSError:
                return False
    try:
        import docker  # type: ignore[import-untyped]  # noqa: PLC0415

        client = docker.from_env(timeout=3)
    except Exception:
        return False
    try:
        client.ping()
    except Exception:
        return False
    finally:
        client.close()
    return True


def _no_server(variable: str, session: pytest.Session) -> None:
    """Stop the session after this test, which fails saying how to start the servers.

    Failing the test rather than `pytest.exit` inside the fixture: an exit there leaves the
    test's other fixtures half set up, and pytest's teardown of them ends in a traceback."""
    message = (
        f"{variable} is not set and no Docker engine answers, so there is no server to test "
        f"against. Start the project's servers first:\n    {START_COMMAND}"
    )
    session.shouldstop = message
    pytest.fail(message, pytrace=False)


def _server(
    variable: str,
    container: Callable[[], AbstractContextManager[str]],
    request: pytest.FixtureRequest,
) -> Iterator[str]:
    """The URL in ``variable``; else one of a container started for the session; else stop."""
    url = os.environ.get(variable)
    if url:
        yield url
        return
    if not _docker_answers():
        _no_server(variable, request.session)
    with container() as started:
        yield started


@contextmanager
def _kafka_container() -> Iterator[str]:
    from testcontainers.kafka import KafkaContainer  # noqa: PLC0415

    with KafkaContainer("confluentinc/cp-kafka:7.7.1").with_kraft() as container:
        yield container.get_bootstrap_server()


@contextmanager
def _postgres_container() -> Iterator[str]:
    from testcontainers.postgres import PostgresContainer  # noqa: PLC0415

    with PostgresContainer("postgres:15", driver=None) as container:
        yield container.get_connection_url()


@contextmanager
def _redis_container() -> Iterator[str]:
    from testcontainers.community.redis import RedisContainer  # noqa: PLC0415

    with RedisContainer("redis:7") as container:
        host = container.get_container_host_ip()
        yield f"redis://{host}:{container.get_exposed_port(6379)}/0"


@pytest.fixture(scope="session")
def kafka_bootstrap(request: pytest.FixtureRequest) -> Iterator[str]:
    """``host:port`` of a real Kafka broker."""
    yield from _server("KAFKA_BOOTSTRAP_SERVERS", _kafka_container, request)


@pytest.fixture(scope="session")
def database_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A PostgreSQL URL (``postgresql://user:password@host:port/database``)."""
    yield from _server("DATABASE_URL", _postgres_container, request)


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A Redis URL (``redis://host:port/db``)."""
    yield from _server("REDIS_URL", _redis_container, request)


@pytest_asyncio.fixture
async def kafka_topic(kafka_bootstrap: str) -> AsyncIterator[str]:
    """A topic name of this test alone; the topic is deleted afterwards if it was created."""
    async with fresh_topic(kafka_bootstrap) as topic:
        yield topic


@pytest_asyncio.fixture
async def requests_topic(kafka_bootstrap: str) -> AsyncIterator[str]:
    """A requests topic of this test alone, deleted afterwards if it was created."""
    async with fresh_topic(kafka_bootstrap) as topic:
        yield topic


@pytest_asyncio.fixture
async def redis_prefix(redis_url: str) -> AsyncIterator[str]:
    """A Redis key prefix of this test alone; its keys are deleted afterwards."""
    async with fresh_prefix(redis_url) as prefix:
        yield prefix


@pytest_asyncio.fixture
async def mcp_schema_cache(redis_url: str, redis_prefix: str) -> AsyncIterator[SchemaCache]:
    """An MCP schema cache under the test's own Redis prefix (its keys removed afterwards)."""
    from onward.integrations.mcp import SchemaCache  # noqa: PLC0415  (MCP is an extra)

    async with SchemaCache.from_url(redis_url, prefix=f"{redis_prefix}mcp:schema:") as schemas:
        yield schemas


@pytest_asyncio.fixture
async def new_pg_schema(database_url: str) -> AsyncIterator[SchemaFactory]:
    """Awaited, makes one more schema of this test (migrated unless ``migrated=False``); all
    of them are dropped after the test."""
    async with schema_factory(database_url) as new:
        yield new


@pytest_asyncio.fixture
async def pg_schema(new_pg_schema: SchemaFactory) -> str:
    """A migrated PostgreSQL schema of this test alone, dropped afterwards."""
    return await new_pg_schema()


@pytest_asyncio.fixture
async def empty_pg_schema(new_pg_schema: SchemaFactory) -> str:
    """A PostgreSQL schema of this test alone with no tables yet, dropped afterwards."""
    return await new_pg_schema(migrated=False)


@pytest.fixture
def kafka_servers(request: pytest.FixtureRequest) -> KafkaServers:
    """This test's Kafka topic, PostgreSQL schema and Redis key prefix, with their servers."""
    names = ("kafka_bootstrap", "kafka_topic", "database_url", "pg_schema", "redis_url")
    return KafkaServers._make(
        [
            *(request.getfixturevalue(name) for name in names),
            request.getfixturevalue("redis_prefix"),
        ]
    )


@pytest.fixture(params=["sqlite", pytest.param("kafka", marks=pytest.mark.kafka)])
def clustered(request: pytest.FixtureRequest) -> KafkaServers | None:
    """Each test twice: embedded (``None``: a SQLite file of the test's own), and clustered on
    Kafka + PostgreSQL + Redis (this test's `kafka_servers`)."""
    if request.param == "sqlite":
        return None
    found: KafkaServers = request.getfixturevalue("kafka_servers")
    return found


@pytest_asyncio.fixture
async def private_kafka() -> AsyncIterator[PrivateKafka]:
    """A single-node KRaft broker of this test alone (fault tests)."""
    async with running(PrivateKafka()) as server:
        yield server


@pytest_asyncio.fixture
async def private_redis() -> AsyncIterator[PrivateRedis]:
    """A Redis server of this test alone, without persistence (fault tests)."""
    async with running(PrivateRedis()) as server:
        yield server


@pytest_asyncio.fixture
async def private_postgres() -> AsyncIterator[PrivatePostgres]:
    """A PostgreSQL cluster of this test alone, with role and database ``onward`` (fault
    tests)."""
    async with running(PrivatePostgres()) as server:
        yield server


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers, like a server that hangs."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield server.getsockname()[1]


@pytest.fixture(scope="session")
def test_seed() -> int:
    """The session's seed: ``ONWARD_TEST_SEED`` when set, else a fresh one."""
    chosen = os.environ.get(SEED_VARIABLE)
    return int(chosen) if chosen else random.SystemRandom().randrange(2**32)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep every collected test before ``-m`` deselects any, for the marker checks in
    test_fixtures.py (`support.marker_probe`)."""
    remember(config, items)


def pytest_report_header(config: pytest.Config) -> str:
    chosen = os.environ.get(SEED_VARIABLE)
    return f"{SEED_VARIABLE}={chosen}" if chosen else f"{SEED_VARIABLE} not set: fresh seeds"


@pytest.fixture
def rng(test_seed: int, request: pytest.FixtureRequest) -> random.Random:
    """This test's random source, seeded from the session seed and the test's id.

    The seed is printed (pytest shows it with a failure); running the test again with
    ``ONWARD_TEST_SEED`` set to it draws the very same numbers.
    """
    print(f"random seed: {SEED_VARIABLE}={test_seed} pytest '{request.node.nodeid}'")
    return random.Random(f"{test_seed}/{request.node.nodeid}")
