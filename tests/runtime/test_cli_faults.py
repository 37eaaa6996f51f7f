"""Every command against a store that fails: the documented exit code, one line, no traceback.

Each case runs ``python -m onward`` as its own process against the real servers with one of
them made unusable: PostgreSQL on a closed port, with a wrong password or naming a database it
does not have, Kafka on a closed port, Redis on a closed port, with a user and password it does
not know or naming a database number it does not have. The other stores are real and ready (an
existing topic, a migrated schema), so the failure is the one the case names. A wrong setting
(exit 2) names the setting to change, so no supervisor restarts the command for ever.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from support.kafka import delete_topic, new_topic_name
from support.pg import create_schema
from typer.testing import CliRunner

from onward.runtime.cli import _common, app
from onward.testing.storage import drop_schema

pytestmark = pytest.mark.kafka

TESTS = Path(__file__).resolve().parents[1]
RUN = ["run-faults", "--tenant", "acme"]
AGENT = ["--agent", "support.cli_agent:booker", "--provider", "support.cli_agent:booking_model"]
COMMANDS: dict[str, list[str]] = {
    "db-migrate": ["db", "migrate"],
    "db-verify": ["db", "verify"],
    "db-pack-records": ["db", "pack-records"],
    "projector": ["projector"],
    "projections-rebuild": ["projections", "rebuild", "frontiers"],
    "inspect": ["inspect", *RUN],
    "replay": ["replay", *RUN],
    "run-resume": ["run", "--resume", *RUN, *AGENT],
    "approve": ["approve", *RUN[:1], "p", *RUN[1:], "--by", "ann"],
    "deny": ["deny", *RUN[:1], "p", *RUN[1:], "--by", "ann"],
    "resolve": [
        "resolve",
        *RUN[:1],
        "b",
        *RUN[1:],
        *("--outcome", "never_ran", "--by", "ann", "--why", "checked"),
    ],
    "cancel": ["cancel", *RUN, "--by", "ann"],
}
USES: dict[str, set[str]] = {
    "db-migrate": {"postgres"},
    "db-verify": {"postgres"},
    "db-pack-records": {"postgres"},
    "projector": {"kafka", "postgres"},
    "projections-rebuild": {"kafka", "postgres"},
    **{name: {"kafka", "postgres", "redis"} for name in ("inspect", "replay", "run-resume")},
    **{name: {"kafka", "postgres", "redis"} for name in ("approve", "deny", "resolve", "cancel")},
}
FAULTS: dict[str, tuple[str, int]] = {
    # fault: (the store it breaks, the documented exit code)
    "postgres-closed-port": ("postgres", 5),
    "postgres-wrong-password": ("postgres", 2),
    "postgres-missing-database": ("postgres", 2),
    "kafka-closed-port": ("kafka", 5),
    "redis-closed-port": ("redis", 5),
    "redis-wrong-password": ("redis", 2),
    "redis-missing-database": ("redis", 2),
}
SETTINGS = {"postgres": "DATABASE_URL", "redis": "REDIS_URL"}
"""The setting an exit 2 (a wrong setting, not a store away) names, per store."""
CASES = [
    pytest.param(command, fault, id=f"{command}-{fault}")
    for command in COMMANDS
    for fault, (store, _) in FAULTS.items()
    if store in USES[command]
]


@dataclass(frozen=True)
class Deployment:
    """Real servers with an events topic and a migrated schema, as a deployment has them."""

    kafka: str
    database_url: str
    redis_url: str
    topic: str
    schema: str

    def env(self, fault: str, closed_port: int) -> dict[str, str]:
        env = {
            **os.environ,
            "PYTHONPATH": str(TESTS),
            "ONWARD_BACKEND": "kafka",
            "KAFKA_BOOTSTRAP_SERVERS": self.kafka,
            "ONWARD_KAFKA_TOPIC": self.topic,
            "ONWARD_PARTITIONS": "1",
            "DATABASE_URL": self.database_url,
            "ONWARD_DATABASE_SCHEMA": self.schema,
            "REDIS_URL": self.redis_url,
        }
        if fault == "postgres-closed-port":
            env["DATABASE_URL"] = _with_netloc(self.database_url, port=closed_port)
        elif fault == "postgres-wrong-password":
            env["DATABASE_URL"] = _with_netloc(self.database_url, password="not-the-password")
        elif fault == "kafka-closed-port":
            env["KAFKA_BOOTSTRAP_SERVERS"] = f"127.0.0.1:{closed_port}"
        elif fault == "redis-closed-port":
            env["REDIS_URL"] = f"redis://127.0.0.1:{closed_port}/0"
        elif fault == "redis-wrong-password":
            parts = urlsplit(self.redis_url)
            netloc = f"onward-nobody:not-the-password@{parts.hostname}:{parts.port or 6379}"
            env["REDIS_URL"] = urlunsplit(parts._replace(netloc=netloc))
        elif fault == "postgres-missing-database":
            parts = urlsplit(self.database_url)
            env["DATABASE_URL"] = urlunsplit(parts._replace(path="/onward_no_such_database"))
        elif fault == "redis-missing-database":
            # 16 databases, 0 to 15, unless the server is configured otherwise.
            env["REDIS_URL"] = urlunsplit(urlsplit(self.redis_url)._replace(path="/99"))
        return env


def _with_netloc(url: str, *, port: int | None = None, password: str | None = None) -> str:
    parts = urlsplit(url)
    user = parts.username or "postgres"
    secret = password if password is not None else (parts.password or "")
    netloc = f"{user}:{secret}@{parts.hostname}:{port or parts.port or 5432}"
    return urlunsplit(parts._replace(netloc=netloc))


@pytest.fixture(scope="module")
def closed_port() -> int:
    """A local port nothing listens on: bound once to learn a free number, then released."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


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
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()


@pytest.mark.parametrize(("command", "fault"), CASES)
def test_a_failing_store_exits_with_its_code_in_one_line(
    deployment: Deployment, closed_port: int, command: str, fault: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "onward", *COMMANDS[command]],
        env=deployment.env(fault, closed_port),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    store, code = FAULTS[fault]
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    if code == 2:
        assert SETTINGS[store] in result.stderr, result.stderr


async def test_the_wrong_password_is_refused_by_the_real_server(database_url: str) -> None:
    # The wrong-password cases mean something only if the server checks passwords.
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(_with_netloc(database_url, password="not-the-password"))


def test_a_server_that_never_answers_fails_within_the_connect_timeout(
    deployment: Deployment, silent_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_common, "CONNECT_TIMEOUT_S", 1.0)
    env = deployment.env("none", 0)
    env["KAFKA_BOOTSTRAP_SERVERS"] = f"127.0.0.1:{silent_port}"
    env["ONWARD_BACKEND_TIMEOUT"] = "1"  # or opening would wait the configured 30 s
    started = time.monotonic()
    result = CliRunner().invoke(app, COMMANDS["inspect"], env=env)
    assert result.exit_code == 5, result.output
    # The store's own bound fires first (`_common.CONNECT_GRACE_S`): it names the server.
    assert f"connecting to Kafka at 127.0.0.1:{silent_port}: " in result.stderr, result.stderr
    assert "the server did not answer" in result.stderr
    assert time.monotonic() - started < 10


def test_an_events_topic_not_created_yet_says_what_creates_it(
    kafka_bootstrap: str, database_url: str, pg_schema: str, kafka_topic: str
) -> None:
    """The refusal named only `create_topic`, a constructor argument no command or setting has."""
    env = {
        "ONWARD_BACKEND": "kafka",
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "DATABASE_URL": database_url,
        "ONWARD_DATABASE_SCHEMA": pg_schema,
        "ONWARD_KAFKA_TOPIC": kafka_topic,
    }
    result = CliRunner().invoke(app, COMMANDS["inspect"], env=env)
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"topic {kafka_topic!r} does not exist" in result.stderr, result.stderr
    assert "start `onward projector` first, which creates it" in result.stderr, result.stderr


@pytest.mark.parametrize("command", [["projector"], ["projections", "rebuild", "frontiers"]])
@pytest.mark.parametrize("backend", ["sqlite", "memory"])
def test_the_projector_refuses_an_embedded_backend_before_touching_kafka(
    kafka_bootstrap: str,
    database_url: str,
    pg_schema: str,
    kafka_topic: str,
    backend: str,
    command: list[str],
) -> None:
    """With ONWARD_BACKEND=sqlite (the default) the projector made the events topic and
    folded it, on whatever Kafka the unchecked Kafka settings named, and a rebuild folded it
    into PostgreSQL; postgres was refused."""
    env = {
        "ONWARD_BACKEND": backend,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "DATABASE_URL": database_url,
        "ONWARD_DATABASE_SCHEMA": pg_schema,
        "ONWARD_KAFKA_TOPIC": kafka_topic,
    }
    result = CliRunner().invoke(app, command, env=env)
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"ONWARD_BACKEND={backend}" in result.stderr, result.stderr
    assert kafka_topic not in asyncio.run(_topics(kafka_bootstrap))


async def _topics(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()
