"""Numbers the long-running commands cannot use: `projector`, `projections rebuild` and `worker`
given a batch of no records, a time that is no duration or one no client can send, exit 2
naming the option, at once; never exit 5 blaming the agent's code, a traceback, a hang, or a
worker that retries a store in a loop with no pause.

Each runs as ``python -m onward``, bounded: a command that took the number would serve (or
fold) until stopped.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from onward.runtime.cli import app

pytestmark = pytest.mark.kafka

BOUND_S = 30


def onward(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m onward *args``, this process's environment with ``env`` over it."""
    command = [sys.executable, "-m", "onward", *args]
    try:
        return subprocess.run(
            command,
            env={**os.environ, **env, "COLUMNS": "300"},
            capture_output=True,
            text=True,
            timeout=BOUND_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"onward {' '.join(args)} was taken and ran on: {exc.stderr!r}")


def assert_refused(done: subprocess.CompletedProcess[str], option: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert option in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "agent's or the model's code" not in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--batch", "0"),
        ("--batch", "-1"),
        ("--caught-up-store-s", "inf"),
        ("--caught-up-store-s", "nan"),
        ("--flush-interval", "nan"),
        ("--flush-events", "-1"),
        ("--session-timeout-ms", "-5"),
        ("--session-timeout-ms", "99999999999"),
    ],
)
def test_the_projector_refuses_a_number_it_cannot_use(
    kafka_bootstrap: str,
    database_url: str,
    pg_schema: str,
    kafka_topic: str,
    option: str,
    value: str,
) -> None:
    env = {
        "ONWARD_BACKEND": "kafka",
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "DATABASE_URL": database_url,
        "ONWARD_DATABASE_SCHEMA": pg_schema,
        "ONWARD_KAFKA_TOPIC": kafka_topic,
        "ONWARD_PARTITIONS": "1",
    }
    group = f"numeric-options-{uuid.uuid4().hex[:8]}"
    assert_refused(onward(env, "projector", "--group", group, option, value), option)


@pytest.mark.parametrize("batch", ["0", "-3"])
def test_a_rebuild_refuses_a_batch_of_no_records(
    database_url: str, empty_pg_schema: str, tmp_path: Path, batch: str
) -> None:
    """A batch of 0 read no record of a log that has some, again and again, forever."""
    env = {
        "ONWARD_BACKEND": "postgres",
        "DATABASE_URL": database_url,
        "ONWARD_DATABASE_SCHEMA": empty_pg_schema,
        "ONWARD_PARTITIONS": "1",
    }
    agents = tmp_path / "numeric_options_agents.py"
    agents.write_text(
        "from onward.runtime import Agent, ScriptedProvider, reply\n"
        "agent = Agent(name='a', instructions='hi')\n"
        "def model():\n"
        "    return ScriptedProvider([reply('hello')])\n"
    )
    runner = CliRunner()
    assert runner.invoke(app, ["db", "migrate"], env=env).exit_code == 0
    agent = ["--agent", f"{agents}:agent", "--provider", f"{agents}:model"]
    started = runner.invoke(app, ["start", "hi", *agent], env=env)
    assert started.exit_code == 0, started.output
    assert_refused(onward(env, "projections", "rebuild", "frontiers", "--batch", batch), "--batch")


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--backoff", "-1"),
        ("--backoff", "0"),
        ("--backoff", "nan"),
        ("--backoff", "inf"),
        ("--lease-ttl", "1e300"),
        ("--lease-ttl", "86401"),
        ("--lease-ttl", "1e-9"),
    ],
)
def test_the_worker_refuses_a_backoff_or_lease_ttl_that_is_no_duration(
    tmp_path: Path, option: str, value: str
) -> None:
    """--lease-ttl is held to what ONWARD_LEASE_TTL may be: a day at most."""
    agents = tmp_path / "numeric_options_worker.py"
    agents.write_text(
        "from onward.runtime import Agent, ScriptedProvider, reply\n"
        "agent = Agent(name='a', instructions='hi')\n"
        "def model():\n"
        "    return ScriptedProvider([reply('hello')])\n"
    )
    env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "onward.db")}
    worker = ["worker", "--agent", f"{agents}:agent", "--provider", f"{agents}:model"]
    assert_refused(onward(env, *worker, option, value), option)


@pytest.mark.parametrize("option", ["--max-runs", "--max-attempts"])
@pytest.mark.parametrize("value", ["0", "-2"])
def test_the_worker_refuses_no_runs_or_no_attempts_before_it_reaches_a_store(
    tmp_path: Path, option: str, value: str
) -> None:
    """Refused naming the option, whatever state the stores are in: here a PostgreSQL that
    does not answer (the refusal had come only once the stores were open, exit 5 without)."""
    agents = tmp_path / "numeric_options_worker.py"
    agents.write_text(
        "from onward.runtime import Agent, ScriptedProvider, reply\n"
        "agent = Agent(name='a', instructions='hi')\n"
        "def model():\n"
        "    return ScriptedProvider([reply('hello')])\n"
    )
    env = {
        "ONWARD_BACKEND": "postgres",
        "DATABASE_URL": "postgresql://onward:onward@127.0.0.1:1/onward",
    }
    worker = ["worker", "--agent", f"{agents}:agent", "--provider", f"{agents}:model"]
    assert_refused(onward(env, *worker, option, value), option)
