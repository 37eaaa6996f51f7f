"""Bad input to the commands less travelled: each is exit 2, one line naming what was wrong,
never exit 5 blaming "the agent's or the model's code", and nothing stored changes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from support.poison import unknown_kind
from typer.testing import CliRunner, Result

from onward.eventlog import RunStarted, SqliteEventLog
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.checkpoint import Checkpointer
from onward.runtime.cli import app
from onward.testing.eventlog import Envelope

SURROGATE = "\udced"
"""What a shell hands Python for a byte that is not UTF-8 (``$'\\xed'``)."""


def onward(db: Path, *args: str, **env: str) -> Result:
    environ = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db), "COLUMNS": "200"}
    return CliRunner().invoke(app, list(args), env={**environ, **env})


def assert_usage_error(result: Result, *named: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "agent's or the model's code" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    for what in named:
        assert what in result.stderr, result.stderr


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """An Onward database with one run whose second record cannot be read (quarantined)."""
    path = tmp_path / "onward.db"

    async def go() -> None:
        async with SqliteEventLog(path) as log, SqliteFrontierStore(path) as store:
            env = Envelope(run_id="run-q", tenant="acme", seq=1, fence=1, at=1)
            await log.append([RunStarted(**env, agent="booker", revision="r1")])
            log.write_raw("run-q", unknown_kind("run-q", 2))
            await Checkpointer(store, log).catch_up()

    asyncio.run(go())
    return path


@pytest.mark.parametrize("option", ["--tenant", "--user", "--agent", "--after"])
def test_runs_refuses_a_filter_no_store_can_hold(db: Path, option: str) -> None:
    assert_usage_error(onward(db, "runs", option, SURROGATE), option)


def test_replay_refuses_a_run_id_no_store_can_hold(db: Path) -> None:
    assert_usage_error(onward(db, "replay", SURROGATE), "lone surrogate")


@pytest.mark.parametrize(
    ("args", "named"),
    [(["", "--tenant", "acme"], "run_id must not be empty"), (["run-q", "--tenant", ""], "tenant")],
)
def test_replay_refuses_an_empty_run_id_or_tenant_as_every_command_does(
    db: Path, args: list[str], named: str
) -> None:
    """``onward replay ""`` said ``no run ''`` with exit 1, a missing run, where inspect and the
    commands that write refuse the empty name with exit 2."""
    assert_usage_error(onward(db, "replay", *args), named)
    assert_usage_error(onward(db, "replay", *args, "--json"), named)


def test_runs_takes_a_duration_longer_than_the_epoch(db: Path) -> None:
    result = onward(db, "runs", "--older-than", "99999999999999d")
    assert result.exit_code == 0, result.output
    assert "run-q" not in result.output


@pytest.mark.parametrize("ttl", ["inf", "1e308"])
def test_gc_refuses_a_ttl_past_any_time_or_takes_it(db: Path, ttl: str) -> None:
    result = onward(db, "gc", "--dry-run", "--checkpoint-ttl-days", ttl)
    assert result.exit_code in (0, 2), (result.exit_code, result.output)
    assert "agent's or the model's code" not in result.stderr, result.stderr


@pytest.mark.parametrize("minutes", ["inf", "1e308"])
def test_compact_takes_a_retention_past_any_time(db: Path, minutes: str) -> None:
    result = onward(db, "compact", "--dry-run", "--retention-mins", minutes)
    assert result.exit_code == 0, result.output
    assert "would cut 0 records in all" in result.output


def test_compact_refuses_a_run_id_no_store_can_hold(db: Path) -> None:
    assert_usage_error(onward(db, "compact", "--dry-run", "--run", SURROGATE), "--run")


def test_quarantine_release_refuses_a_run_id_no_store_can_hold(db: Path) -> None:
    assert_usage_error(onward(db, "quarantine", "release", SURROGATE, "--by", "ops"), "run_id")


@pytest.mark.parametrize("by", ["ops\x1b[2J", "x" * 10_000, ""])
def test_quarantine_release_refuses_a_bad_by_and_releases_nothing(db: Path, by: str) -> None:
    assert_usage_error(onward(db, "quarantine", "release", "run-q", "--by", by), "by")
    listed = onward(db, "quarantine", "list", "--all", "--json")
    (entry,) = [json.loads(line) for line in listed.output.splitlines()]
    assert (entry["state"], entry["released_by"]) == ("held", None)


def test_quarantine_release_refuses_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    result = onward(text, "quarantine", "release", "run-q", "--by", "ops")
    assert_usage_error(result, "not an Onward database")
    assert text.read_text() == "hello\n"


def _worker_refused(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``onward worker`` of the CLI test agent on the SQLite file ``path`` with ``args``, which
    must end at once with exit 2: one that took them would serve until stopped (bounded here)."""
    env = {**os.environ, "ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(path)}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    command = [sys.executable, "-m", "onward", "worker", "--agent", "support.cli_agent:booker"]
    command += ["--provider", "support.cli_agent:booking_model", *args]
    try:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=30, check=False
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"onward worker {args} on {path} was taken and served on: {exc.stderr!r}")
    assert done.returncode == 2, (done.returncode, done.stderr)
    return done


def test_worker_refuses_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    """Pointed at a file that is no SQLite database, the worker said ``BackendError ... file is
    not a database``, exit 5 (a store failed: retry), so a supervisor restarted it forever; the
    other commands say it is not an Onward database, exit 2."""
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    done = _worker_refused(text)
    assert "not an Onward database" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert text.read_text() == "hello\n"


@pytest.mark.parametrize("value", ["nan", "inf"])
@pytest.mark.parametrize("option", ["--lease-ttl", "--recheck"])
def test_worker_refuses_a_lease_ttl_or_recheck_that_is_no_duration(
    db: Path, tmp_path: Path, option: str, value: str
) -> None:
    """A subprocess, bounded: a worker that takes the option serves until it is stopped."""
    mine = tmp_path / "mine_worker_agents.py"
    mine.write_text(
        "from onward.runtime import Agent, ScriptedProvider, reply\n"
        "agent = Agent(name='a', instructions='hi')\n"
        "def model():\n"
        "    return ScriptedProvider([reply('hello')])\n"
    )
    env = {**os.environ, "ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)}
    command = [sys.executable, "-m", "onward", "worker", "--agent", f"{mine}:agent"]
    command += ["--provider", f"{mine}:model", option, value]
    try:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=30, check=False
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"onward worker {option} {value} was taken and served on: {exc.stderr!r}")
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert option in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("name", ["w\x1b]0;owned\x07", "w\nx"])
def test_worker_refuses_a_name_no_lease_should_hold(db: Path, name: str) -> None:
    """Its name is every lease's holder, printed by inspect, runs and every refusal: one that
    sets a terminal's title or breaks a line is refused before the worker serves."""
    done = _worker_refused(db, "--name", name)
    assert "--name" in done.stderr, done.stderr
    assert "\x1b" not in done.stderr, done.stderr


def test_worker_says_a_name_with_brackets_as_it_is(db: Path) -> None:
    """Printed as rich markup, ``[/pool]`` failed the worker at its first line, exit 5 blaming
    the agent's code."""
    env = {**os.environ, "ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    command = [sys.executable, "-m", "onward", "worker", "--agent", "support.cli_agent:booker"]
    command += ["--provider", "support.cli_agent:booking_model", "--name", "a[/pool]"]
    with subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True) as worker:
        try:
            assert worker.stderr is not None
            first = worker.stderr.readline()
            assert first.startswith("worker a[/pool] ready"), first
            worker.send_signal(signal.SIGTERM)
            rest = worker.stderr.read()
            assert worker.wait(timeout=30) == 0, rest
        finally:
            if worker.poll() is None:
                worker.kill()
    assert "worker a[/pool] stopped" in rest, rest


@pytest.mark.parametrize(
    ("servers", "named"),
    [
        ("127.0.0.1:abc", ()),
        ("127.0.0.1:70000", ()),
        ("[::1", ()),
        ("a:1,,b:2", ()),
        ("127.0.0.1:9092:x", ("neither host:port nor an IPv6 address",)),
        ("broker:1:9092", ("neither host:port nor an IPv6 address",)),
        ("kafka://127.0.0.1:9092", ("scheme", "kafka://127.0.0.1:9092")),
        ("PLAINTEXT://127.0.0.1:9092", ("scheme", "PLAINTEXT://127.0.0.1:9092")),
    ],
)
def test_kafka_bootstrap_servers_with_no_usable_address_is_a_configuration_error(
    db: Path, servers: str, named: tuple[str, ...], database_url: str
) -> None:
    """Exit 2 naming KAFKA_BOOTSTRAP_SERVERS. A URL where host:port belongs (Kafka's own
    listener syntax, or a typed scheme) names the scheme too, not exit 5 "the server did not
    answer; retry", which no retry cures."""
    result = onward(
        db,
        "inspect",
        "run-q",
        ONWARD_BACKEND="kafka",
        KAFKA_BOOTSTRAP_SERVERS=servers,
        DATABASE_URL=database_url,
        ONWARD_BACKEND_TIMEOUT="3",
    )
    assert_usage_error(result, "KAFKA_BOOTSTRAP_SERVERS", *named)


@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SSL"])
def test_kafka_bootstrap_servers_at_another_kind_of_server_is_a_configuration_error(
    db: Path, database_url: str, protocol: str
) -> None:
    """PostgreSQL's port as KAFKA_BOOTSTRAP_SERVERS answered the client's first request with
    bytes that are no Kafka answer, and the command said exit 5 "the server did not answer;
    retry", which no retry cures (over TLS, that Kafka there spoke no TLS): exit 2 naming the
    variable, within a few seconds."""
    postgres = urlsplit(database_url)
    address = f"{postgres.hostname}:{postgres.port}"
    began = time.monotonic()
    result = onward(
        db,
        "inspect",
        "run-q",
        ONWARD_BACKEND="kafka",
        KAFKA_BOOTSTRAP_SERVERS=address,
        KAFKA_SECURITY_PROTOCOL=protocol,
        DATABASE_URL=database_url,
        ONWARD_BACKEND_TIMEOUT="10",
    )
    assert_usage_error(result, f"KAFKA_BOOTSTRAP_SERVERS: {address} does not answer as Kafka")
    assert time.monotonic() - began < 8


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--checkpoint-ttl-days", "0"),
        ("--redis-key-ttl-hours", "-1"),
        ("--task-result-ttl-days", "nan"),
    ],
)
def test_gc_names_the_ttl_option_the_user_typed(db: Path, option: str, value: str) -> None:
    result = onward(db, "gc", "--dry-run", option, value)
    assert_usage_error(result, option)


def test_replay_refuses_an_archive_that_does_not_exist(db: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir"
    result = onward(db, "replay", "--archive", str(missing), "run-q", "--tenant", "acme")
    assert_usage_error(result, str(missing))
