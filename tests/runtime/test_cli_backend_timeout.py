"""Every command gives up on a server that never answers within ``ONWARD_BACKEND_TIMEOUT``.

The commands are read from the command tree, so a new one is covered as soon as it exists
(with no arguments unless `ARGUMENTS` gives some, using every store unless `USES` says less).
Each runs as ``python -m onward`` against real, ready servers but one: that one is a socket
that accepts connections and never says a word, like a server that hangs. With the timeout at
one second each command must stop within that second plus one (plus starting Python), exit 5,
in one line naming what did not answer. Two commands run at a time (`RUNNING_AT_ONCE`), each
timed on its own.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import typer
from support.kafka import delete_topic, new_topic_name
from support.pg import create_schema
from typer.core import TyperGroup
from typer.testing import CliRunner

from onward._storage import KafkaConnection
from onward.runtime.cli import _common, app
from onward.testing.storage import drop_schema

pytestmark = pytest.mark.kafka

TIMEOUT_S = 1
TESTS = Path(__file__).resolve().parents[1]
RUN = ["timeout-run", "--tenant", "acme"]
AGENT = ["--agent", "support.cli_agent:booker", "--provider", "support.cli_agent:booking_model"]
ARGUMENTS: dict[str, list[str]] = {
    # What a command needs to get as far as its stores; every other command is run bare.
    "inspect": RUN,
    "start": ["book a flight", "--tenant", "acme", *AGENT],
    "run": ["--resume", *RUN, *AGENT],
    "approve": [RUN[0], "p", *RUN[1:], "--by", "ann"],
    "deny": [RUN[0], "p", *RUN[1:], "--by", "ann"],
    "resolve": [RUN[0], "b", *RUN[1:], "--outcome", "never_ran", "--by", "ann", "--why", "x"],
    "cancel": [*RUN, "--by", "ann"],
    "tag": [RUN[0], "phase-1", *RUN[1:]],
    "replay": RUN,
    "compact": ["--dry-run"],
    "gc": ["--dry-run"],
    "worker": AGENT,
    "projections rebuild": ["frontiers"],
    "quarantine release": [RUN[0], "--by", "ann"],
    "quarantine dismiss": ["--partition", "0", "--offset", "7", "--by", "ann"],
}
STORES = ("postgres", "kafka", "redis")
USES: dict[str, set[str]] = {
    # The stores a command opens, where it is not all three.
    "gc": {"postgres", "redis"},
    "projector": {"postgres", "kafka"},
    "projections rebuild": {"postgres", "kafka"},
    "quarantine list": {"postgres"},
    "quarantine release": {"postgres"},
    "quarantine dismiss": {"postgres"},
    "db migrate": {"postgres"},
    "db verify": {"postgres"},
    "db pack-records": {"postgres"},
    "runs": {"postgres"},
}
NO_STORE = {"schema", "demo"}
"""Commands that open no server: the events' JSON Schema, and the demo's own SQLite files."""
NAMES = {"postgres": "PostgreSQL", "kafka": "Kafka", "redis": "Redis"}


def commands(group: TyperGroup, prefix: str = "") -> Iterator[str]:
    """Every command of the tree under ``group``, as typed after ``onward`` (looked up by name:
    the CLI imports a command's module only then)."""
    context = typer.Context(group)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        if command is None or command.hidden:
            continue
        path = f"{prefix}{name}"
        if isinstance(command, TyperGroup):
            yield from commands(command, f"{path} ")
        else:
            yield path


TREE = sorted(commands(typer.main.get_group(app)))
CASES = [
    pytest.param(command, store, id=f"{command.replace(' ', '-')}-{store}")
    for command in TREE
    if command not in NO_STORE
    for store in STORES
    if store in USES.get(command, set(STORES))
]


def test_the_tables_name_commands_that_exist() -> None:
    # A command renamed or removed must not leave the tables testing nothing.
    assert set(ARGUMENTS) | set(USES) | NO_STORE <= set(TREE)
    assert {"db migrate", "projector", "projections rebuild", "quarantine list"} <= set(TREE)


@dataclass(frozen=True)
class Deployment:
    """Real servers with an events topic and a migrated schema, as a deployment has them."""

    kafka: str
    database_url: str
    redis_url: str
    topic: str
    schema: str

    def env(self, silent: str, port: int) -> dict[str, str]:
        env = {
            **os.environ,
            "PYTHONPATH": str(TESTS),
            "ONWARD_BACKEND": "kafka",
            "ONWARD_BACKEND_TIMEOUT": str(TIMEOUT_S),
            "KAFKA_BOOTSTRAP_SERVERS": self.kafka,
            "ONWARD_KAFKA_TOPIC": self.topic,
            "ONWARD_PARTITIONS": "1",
            "DATABASE_URL": self.database_url,
            "ONWARD_DATABASE_SCHEMA": self.schema,
            "REDIS_URL": self.redis_url,
        }
        if silent == "postgres":
            parts = urlsplit(self.database_url)
            netloc = parts.netloc.rpartition("@")[0] + f"@127.0.0.1:{port}"
            env["DATABASE_URL"] = urlunsplit(parts._replace(netloc=netloc))
        elif silent == "kafka":
            env["KAFKA_BOOTSTRAP_SERVERS"] = f"127.0.0.1:{port}"
        else:
            env["REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
        return env


@pytest.fixture(scope="module")
def deployment(kafka_bootstrap: str, database_url: str, redis_url: str) -> Iterator[Deployment]:
    schema = asyncio.run(create_schema(database_url))
    ready = Deployment(kafka_bootstrap, database_url, redis_url, new_topic_name(), schema)
    try:
        asyncio.run(_create_topic(ready.kafka, ready.topic))
        yield ready
    finally:
        asyncio.run(delete_topic(kafka_bootstrap, ready.topic))
        asyncio.run(drop_schema(database_url, schema))


async def _create_topic(bootstrap: str, topic: str) -> None:
    from aiokafka.admin import NewTopic  # noqa: PLC0415 - only the fixture makes topics

    admin = KafkaConnection(bootstrap).admin()
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()


@pytest.fixture(scope="module")
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers, like a server that hangs."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(128)
        yield server.getsockname()[1]


def python_start_s() -> float:
    """How long ``python -m onward`` takes to start and stop, importing what a command on the
    stores imports (the runner, the backends, the settings) but connecting to nothing, right
    now (the machine's load changes it): ``--version`` imports next to none of it."""
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "onward", "inspect", "--help"],
        check=True,
        timeout=60,
        capture_output=True,
    )
    return time.monotonic() - started


@pytest.fixture(scope="module")
def first_start_s() -> float:
    """Python's start read once for the module: a command within the bound it gives needs no
    fresh reading (two more Python starts per case, a third of the file's time)."""
    return python_start_s()


@dataclass(frozen=True)
class Outcome:
    """One command's run against one silent server: how it ended, and how long it took against
    how long Python took to start around then."""

    result: subprocess.CompletedProcess[str]
    took: float
    start_s: float


RUNNING_AT_ONCE = 2
"""Commands run side by side: each spends about half its time waiting out the silent server's
second, when the other can start Python (a case alone took ~3.4 s, most of the file's time)."""


def run_case(
    deployment: Deployment, silent_port: int, first_start_s: float, command: str, silent: str
) -> Outcome:
    """Run ``command`` against the silent ``silent`` server, reading Python's start again (while
    its neighbour still runs, so under the same load) when the module's first reading is too
    short for it."""
    argv = [*command.split(), *ARGUMENTS.get(command, [])]
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "onward", *argv],
        env=deployment.env(silent, silent_port),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    took = time.monotonic() - started
    start_s = first_start_s
    if took > TIMEOUT_S + 1 + 2 * start_s:
        start_s = max(start_s, python_start_s())
    return Outcome(result, took, start_s)


@pytest.fixture(scope="module")
def outcomes(
    request: pytest.FixtureRequest, deployment: Deployment, silent_port: int, first_start_s: float
) -> Iterator[dict[tuple[str, str], Future[Outcome]]]:
    """Every selected case's run, `RUNNING_AT_ONCE` at a time, each handed to its own test."""
    selected = [
        (str(item.callspec.params["command"]), str(item.callspec.params["silent"]))
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.function is test_a_silent_server_is_given_up_on_within_the_backend_timeout
    ]
    pool = ThreadPoolExecutor(RUNNING_AT_ONCE)
    try:
        yield {
            case: pool.submit(run_case, deployment, silent_port, first_start_s, *case)
            for case in selected
        }
    finally:
        pool.shutdown(cancel_futures=True)


@pytest.mark.parametrize(("command", "silent"), CASES)
def test_a_silent_server_is_given_up_on_within_the_backend_timeout(
    outcomes: dict[tuple[str, str], Future[Outcome]], command: str, silent: str
) -> None:
    outcome = outcomes[command, silent].result()
    result, took, start_s = outcome.result, outcome.took, outcome.start_s
    assert result.returncode == 5, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert NAMES[silent] in lines[0], result.stderr
    # Python's start is counted twice over: a command does more than ``inspect --help``,
    # and a loaded machine slows both. It is read again only when the module's first reading
    # is too short for this command (the load may have grown since); the bound stays below 20
    # either way, so a command that waited for the 20-second default instead of the
    # configured second would still fail.
    bound = TIMEOUT_S + 1 + 2 * start_s
    assert took <= bound, f"{took:.1f}s (start {start_s:.1f}s): {result.stderr}"
    assert bound < 20, f"Python alone took {start_s:.1f}s to start: too loaded to tell"


@pytest.mark.parametrize(("configured", "waited"), [("5", 20.0), ("45", 47.0)])
def test_opening_the_stores_waits_the_configured_timeout_when_it_is_the_longer(
    configured: str, waited: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A slow network given ONWARD_BACKEND_TIMEOUT=45 must not be cut off by the 20 s floor
    # (and the stores' own bound fires `_common.CONNECT_GRACE_S` before the command's).
    monkeypatch.setenv("ONWARD_BACKEND_TIMEOUT", configured)
    assert _common.connect_timeout_s() == waited


def test_a_silent_store_at_the_default_bounds_is_named_by_the_store_not_the_connect_bound(
    deployment: Deployment, silent_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the default settings the connect bound and ``ONWARD_BACKEND_TIMEOUT`` are both 30 s,
    so which fired first decided the line: "one of Kafka, PostgreSQL and Redis did not answer"
    or the store's own. The connect bound gives the stores `_common.CONNECT_GRACE_S` more, so
    the store that did not answer always says so itself, with its address (here both at 1 s)."""
    monkeypatch.setattr(_common, "CONNECT_TIMEOUT_S", float(TIMEOUT_S))
    result = CliRunner().invoke(app, ["inspect", *RUN], env=deployment.env("postgres", silent_port))
    assert result.exit_code == 5, result.output
    assert (
        f"PostgreSQL at postgresql://{urlsplit(deployment.database_url).username}:***@127.0.0.1:"
        f"{silent_port}/"
    ) in result.stderr, result.stderr
    assert f"did not answer within {TIMEOUT_S}s (ONWARD_BACKEND_TIMEOUT" in result.stderr


@pytest.mark.parametrize("command", [["runs"], ["quarantine", "list"]])
def test_a_silent_frontier_store_is_named_as_its_server_not_the_backend(
    silent_port: int, database_url: str, command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ONWARD_BACKEND=kafka, a PostgreSQL that took the connection and never answered
    until the command's connect bound passed (a bound shorter than ONWARD_BACKEND_TIMEOUT, as
    here) was reported as "the kafka frontier store did not answer", sending the reader
    to Kafka: the line names PostgreSQL and DATABASE_URL."""
    monkeypatch.setattr(_common, "connect_timeout_s", lambda: 1.0)
    parts = urlsplit(database_url)
    silent = parts._replace(netloc=parts.netloc.rpartition("@")[0] + f"@127.0.0.1:{silent_port}")
    env = {
        "ONWARD_BACKEND": "kafka",
        "ONWARD_BACKEND_TIMEOUT": "30",
        "DATABASE_URL": urlunsplit(silent),
    }
    result = CliRunner().invoke(app, command, env=env)
    assert result.exit_code == 5, result.output
    assert "PostgreSQL (DATABASE_URL) did not answer within 1s" in result.stderr, result.stderr
    assert "kafka" not in result.stderr


def test_stores_that_do_not_answer_are_named_as_their_servers(
    deployment: Deployment, silent_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command on the kafka backend whose PostgreSQL took the connection and never answered
    until the connect bound passed said "the kafka stores did not answer", sending the reader
    to Kafka alone: the line names each server it opens and the variable that says where."""
    monkeypatch.setattr(_common, "connect_timeout_s", lambda: 1.0)
    env = {**deployment.env("postgres", silent_port), "ONWARD_BACKEND_TIMEOUT": "30"}
    result = CliRunner().invoke(app, ["inspect", *RUN], env=env)
    assert result.exit_code == 5, result.output
    assert (
        "one of Kafka (KAFKA_BOOTSTRAP_SERVERS), PostgreSQL (DATABASE_URL) and Redis (REDIS_URL) "
        "did not answer within 1s"
    ) in result.stderr, result.stderr


def test_opening_a_silent_store_says_early_what_it_waits_on_and_until_when(
    silent_port: int, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that took the connection and never answered kept a command silent until the
    connect bound passed (32 s at the default settings): once it has waited
    `_common.SAY_WAIT_AFTER_S`, the command says which server it waits on and until when, and
    still ends at the bound, exit 5."""
    monkeypatch.setattr(_common, "connect_timeout_s", lambda: 2.0)
    monkeypatch.setattr(_common, "SAY_WAIT_AFTER_S", 0.5)
    parts = urlsplit(database_url)
    silent = parts._replace(netloc=parts.netloc.rpartition("@")[0] + f"@127.0.0.1:{silent_port}")
    env = {"ONWARD_BACKEND": "postgres", "ONWARD_BACKEND_TIMEOUT": "30"}
    began = time.time()
    result = CliRunner().invoke(app, ["runs"], env={**env, "DATABASE_URL": urlunsplit(silent)})
    assert result.exit_code == 5, result.output
    waiting, failed = result.stderr.strip().splitlines()
    assert waiting.startswith("waiting for PostgreSQL (DATABASE_URL) to answer; "), waiting
    deadlines = {time.strftime("%H:%M:%S UTC", time.gmtime(began + 2 + d)) for d in (0, 1)}
    assert any(f"until {deadline} " in waiting for deadline in deadlines), waiting
    assert "PostgreSQL (DATABASE_URL) did not answer within 2s" in failed
