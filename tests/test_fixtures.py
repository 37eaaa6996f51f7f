"""The places the shared fixtures hand out are fresh, and gone after the test."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis
from aiokafka.admin import AIOKafkaAdminClient
from support.kafka import fresh_topic
from support.marker_probe import OUT_VARIABLE as MARKER_OUT_VARIABLE
from support.marker_probe import unmarked, whole_suite
from support.pg import fresh_schema, schema_factory
from support.redis import fresh_prefix
from support.replay_probe import OUT_VARIABLE

from onward.eventlog import KafkaEventLog

REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / "tests" / "support" / "replay_probe.py"


async def _tables(conn: asyncpg.Connection, schema: str) -> int:
    count = await conn.fetchval(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1", schema
    )
    return int(count)


async def _schema_exists(conn: asyncpg.Connection, schema: str) -> bool:
    found = await conn.fetchval(
        "SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1", schema
    )
    return bool(found)


@pytest.mark.kafka
async def test_a_fresh_topic_is_deleted_afterwards(kafka_bootstrap: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        async with fresh_topic(kafka_bootstrap) as topic:
            assert topic not in await admin.list_topics()
            async with KafkaEventLog(kafka_bootstrap, topic=topic, partitions=1):
                pass
            assert topic in await admin.list_topics()
        assert topic not in await admin.list_topics()
        async with fresh_topic(kafka_bootstrap) as never_created:
            pass  # a topic the test never created is no error
        assert never_created != topic
    finally:
        await admin.close()


async def test_a_fresh_prefix_leaves_no_keys(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        async with fresh_prefix(redis_url) as prefix:
            assert [k async for k in client.scan_iter(match=f"{prefix}*")] == []
            await client.set(f"{prefix}a", "1")
            await client.set(f"{prefix}b", "2")
        assert [k async for k in client.scan_iter(match=f"{prefix}*")] == []
    finally:
        await client.aclose()


async def test_fresh_schemas_are_migrated_or_empty_and_dropped(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        async with fresh_schema(database_url) as migrated:
            assert await _tables(conn, migrated) > 0
        async with schema_factory(database_url) as new:
            empty = await new(migrated=False)
            another = await new()
            assert await _tables(conn, empty) == 0
            assert await _tables(conn, another) > 0
        for schema in (migrated, empty, another):
            assert not await _schema_exists(conn, schema), schema
    finally:
        await conn.close()


def test_the_random_source_prints_its_seed(
    capsys: pytest.CaptureFixture[str], rng: random.Random, test_seed: int
) -> None:
    assert f"ONWARD_TEST_SEED={test_seed} " in capsys.readouterr().out


def _history(seed: int, out: Path) -> subprocess.Popen[bytes]:
    """The replay probe in a fresh pytest process (a hash seed of its own), seeded with ``seed``."""
    env = {**os.environ, "ONWARD_TEST_SEED": str(seed), OUT_VARIABLE: str(out)}
    env.pop("PYTHONHASHSEED", None)
    argv = ["-m", "pytest", "-q", "-p", "no:cacheprovider", str(PROBE)]
    return subprocess.Popen(
        [sys.executable, *argv], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


@pytest.mark.slow
def test_the_printed_seed_replays_a_workload_byte_for_byte(
    rng: random.Random, tmp_path: Path
) -> None:
    """README: the printed seed replays a test exactly. Two processes given the same seed append
    the same history (run ids, so partitions, batches, interleaving), byte for byte; another
    seed appends another."""
    seed = rng.randrange(2**32)
    outs = [tmp_path / "first", tmp_path / "again", tmp_path / "other"]
    children = [_history(s, o) for s, o in zip((seed, seed, seed + 1), outs, strict=True)]
    try:
        for child in children:
            output, _ = child.communicate(timeout=120)
            assert child.returncode == 0, output.decode(errors="replace")[-3000:]
    finally:
        for child in children:
            if child.returncode is None:
                child.kill()
                child.communicate()
    first, again, other = (o.read_bytes() for o in outs)
    assert first.count(b"\n") > 100
    assert first == again
    assert first != other


@pytest.mark.slow
@pytest.mark.timeout(300)  # alone, it collects the suite anew: two minutes on a busy machine
def test_every_test_on_the_shared_broker_carries_the_kafka_marker(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """`make test-kafka` selects ``-m kafka`` to run the Kafka tests against the other broker
    version; a test that takes the shared broker without the marker is silently left out. A
    session that collected the whole suite is checked as it is; another collects it anew."""
    suite = whole_suite(request.config, REPO / "tests")
    if suite is not None:
        assert request.node in suite
        assert unmarked(suite) == []
        return
    out = tmp_path / "unmarked"
    env = {**os.environ, MARKER_OUT_VARIABLE: str(out), "PYTHONPATH": str(REPO / "tests")}
    argv = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only"]
    argv += ["-p", "support.marker_probe", str(REPO / "tests")]
    done = subprocess.run(
        [sys.executable, *argv], cwd=REPO, env=env, capture_output=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout.decode(errors="replace")[-3000:]
    assert out.read_text().splitlines() == []


def test_the_paths_the_second_kafka_run_takes_exist_and_hold_kafka_tests(
    request: pytest.FixtureRequest,
) -> None:
    """`make test-kafka` runs the Kafka tests again by path: a file renamed or moved, or a path
    mistyped, would quietly leave its tests out of the run on the other broker. A session that
    collected the whole suite is checked as it is; another collects the paths anew."""
    makefile = (REPO / "Makefile").read_text()
    listed = makefile.split("KAFKA_AGAIN :=", 1)[1].split("\ntest-kafka:", 1)[0]
    paths = listed.replace("\\\n", " ").split()
    assert len(paths) >= 5, paths
    suite = whole_suite(request.config, REPO / "tests")
    if suite is not None:
        assert request.node in suite
        kafka = [item.nodeid for item in suite if item.get_closest_marker("kafka")]
        for path in paths:
            assert any(n.startswith((f"{path}/", f"{path}::")) for n in kafka), (
                f"{path} holds no Kafka test"
            )
        return
    argv = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", "-m", "kafka"]
    done = subprocess.run(
        [sys.executable, *argv, *paths], cwd=REPO, capture_output=True, timeout=300, check=False
    )
    collected = done.stdout.decode(errors="replace")
    assert done.returncode == 0, collected[-3000:]
    for path in paths:
        assert f"{path}/" in collected or f"{path}::" in collected, f"{path} holds no Kafka test"


def test_without_servers_the_session_stops_saying_how_to_start_them(tmp_path: Path) -> None:
    """A test that needs a server, with none set and no Docker engine: it fails with the
    command that starts them and the session stops there, without a traceback."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("KAFKA_BOOTSTRAP_SERVERS", "DATABASE_URL", "REDIS_URL")
    }
    env["DOCKER_HOST"] = f"unix://{tmp_path / 'no-docker.sock'}"
    # Its servers are asked for after its temporary directory is made (as most tests do).
    first = "tests/runtime/test_cli.py::test_resume_against_kafka_postgres_and_redis"
    after = "tests/test_fixtures.py::test_a_fresh_prefix_leaves_no_keys"
    argv = ["-m", "pytest", "-q", "-p", "no:cacheprovider", first, after]
    done = subprocess.run(
        [sys.executable, *argv], cwd=REPO, env=env, capture_output=True, timeout=300, check=False
    )
    said = done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
    assert done.returncode == 2, said[-3000:]
    assert "KAFKA_BOOTSTRAP_SERVERS is not set and no Docker engine answers" in said
    assert 'eval "$(scripts/services.sh up)"' in said
    assert "1 error" in said
    assert "passed" not in said  # stopped before the next test
    assert "Traceback" not in said, said[-3000:]
    assert "Warning" not in said, said[-3000:]


LEAKS = '''
import socket

import pytest


class Cycle:
    """A socket left open in a reference cycle: only the cycle collector finalizes it."""

    def __init__(self) -> None:
        self.me = self
        self.sock = socket.socket()


class FileCycle:
    """A file left open in a reference cycle, named so its warning says whose it was."""

    def __init__(self) -> None:
        self.me = self
        self.file = open(__file__ + ".held-by-the-session")  # noqa: SIM115


@pytest.fixture(scope="module")
def held_by_the_module() -> object:
    return Cycle()


@pytest.fixture(scope="session")
def held_by_the_session() -> object:
    return FileCycle()


def test_leaves_a_socket_open() -> None:
    Cycle()


def test_leaves_nothing() -> None:
    pass


def test_uses_the_module_s_cycle(held_by_the_module: object) -> None:
    pass


def test_uses_the_session_s_cycle(held_by_the_session: object) -> None:
    pass
'''


def test_a_socket_a_test_left_open_fails_that_test_and_one_a_module_left_is_found(
    tmp_path: Path,
) -> None:
    """`support.garbage` collects after each test and sets the survivors aside: the leak of a
    test is reported at its own teardown (not by whichever test the collector next ran in), the
    cycle a module-scoped fixture left, set aside while it was held, is found once the module is
    done, and the one a session-scoped fixture left, set aside too, is found at the session's end
    (pytest's own last collection walks it)."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["support.garbage"]\n')
    (tmp_path / "test_leaks.py").write_text(LEAKS)
    (tmp_path / "test_leaks.py.held-by-the-session").write_text("")
    (tmp_path / "test_after.py").write_text("def test_in_the_next_module() -> None:\n    pass\n")
    argv = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-W", "error"]
    argv += ["-o", "asyncio_default_fixture_loop_scope=function", "test_leaks.py", "test_after.py"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests")}
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    out = done.stdout.decode(errors="replace")
    errors = [line for line in out.splitlines() if line.startswith("_") and "ERROR at" in line]
    assert len(errors) == 2, out[-3000:]
    assert "ERROR at teardown of test_leaves_a_socket_open " in errors[0], out[-3000:]
    assert "unclosed <socket.socket" in out, out[-3000:]
    said_at_the_end = done.stderr.decode(errors="replace")
    assert "test_leaks.py.held-by-the-session" in said_at_the_end, said_at_the_end[-3000:]
