"""The command line in scripts: ``--version``, a closed pipe, ``--value @file`` and ``-``,
times in the replay table, ``inspect --json``, and a web developer's ``DATABASE_URL``.

Each test leaves a run in an embedded SQLite file as a worker would and drives the command line
in-process, but the closed pipe, which needs a real process writing to a real pipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from support import cli_agent
from support.crashes import Crash, CrashAt
from support.runners import log_runner
from typer.testing import CliRunner, Result

from onward.eventlog import SqliteEventLog
from onward.runtime import Agent, Provider, SqliteLeaseStore
from onward.runtime.cli import app

TENANT = "acme"


def start(db: Path, agent: Agent, provider: Provider, *, crash_at: str | None = None) -> str:
    """A run in ``db`` left as worker w1 leaves it (finished, waiting, or 'dead' at
    ``crash_at``); returns its id."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"

    async def go() -> None:
        async with SqliteEventLog(db) as log, SqliteLeaseStore(db) as leases:
            observer = CrashAt(crash_at) if crash_at else None
            runner = log_runner(provider, log, leases, worker="w1", observer=observer)
            with contextlib.suppress(Crash):
                await runner.run(agent, "go", tenant=TENANT, run_id=run_id)

    asyncio.run(go())
    return run_id


def waiting_run(db: Path) -> str:
    """A run waiting on a person to approve its payment ``p``."""
    return start(db, cli_agent.payer(), cli_agent.paying_model())


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "onward.db"


def env_of(db: Path) -> dict[str, str]:
    return {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)}


def onward(db: Path, *args: str, stdin: str | None = None, **env: str) -> Result:
    """Invoke the command line against ``db``, with ``env`` on top of the backend's."""
    return CliRunner().invoke(app, list(args), env={**env_of(db), **env}, input=stdin)


def events(db: Path, run_id: str) -> list[dict[str, Any]]:
    """The run's timeline as `replay --json` gives it."""
    result = onward(db, "replay", run_id, "--tenant", TENANT, "--json")
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def event_of(db: Path, run_id: str, kind: str) -> dict[str, Any]:
    found = [line["event"] for line in events(db, run_id) if line["kind"] == kind]
    assert len(found) == 1, found
    event: dict[str, Any] = found[0]
    return event


def test_version_prints_the_installed_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"onward {version('onward')}\n"


def test_a_sqlite_database_url_does_not_stop_the_embedded_backend(db: Path) -> None:
    run_id = waiting_run(db)
    result = onward(db, "inspect", run_id, "--tenant", TENANT, DATABASE_URL="sqlite:///app.db")
    assert result.exit_code == 0, result.output
    assert "waiting" in result.stdout


def test_the_kafka_backend_names_a_database_url_that_is_not_postgresql() -> None:
    env = {"ONWARD_BACKEND": "kafka", "DATABASE_URL": "sqlite:///app.db"}
    result = CliRunner().invoke(app, ["inspect", "run-1", "--tenant", TENANT], env=env)
    assert result.exit_code == 2
    assert "DATABASE_URL (database_url): sqlite:///app.db must start with postgresql://" in (
        result.stderr
    )


def test_approve_reads_the_value_from_a_file(db: Path, tmp_path: Path) -> None:
    run_id = waiting_run(db)
    value = {"note": "x" * 200_000}  # far past what a command line may carry
    path = tmp_path / "value.json"
    path.write_text(json.dumps(value))
    result = onward(
        db, "approve", run_id, "p", "--tenant", TENANT, "--by", "ann", "--value", f"@{path}"
    )
    assert result.exit_code == 0, result.output
    assert event_of(db, run_id, "approval.granted")["value"] == value


def test_deny_reads_the_value_from_standard_input(db: Path) -> None:
    run_id = waiting_run(db)
    result = onward(
        db,
        "deny",
        run_id,
        "p",
        "--tenant",
        TENANT,
        "--by",
        "ann",
        "--value",
        "-",
        stdin='{"reason": "over budget"}',
    )
    assert result.exit_code == 0, result.output
    assert event_of(db, run_id, "approval.denied")["value"] == {"reason": "over budget"}


def test_resolve_reads_the_result_from_standard_input(db: Path) -> None:
    run_id = start(db, cli_agent.booker(), cli_agent.booking_model(), crash_at="tool.returned")
    args = ["--outcome", "completed", "--by", "ops", "--why", "the airline has it"]
    result = onward(
        db, "resolve", run_id, "b", "--tenant", TENANT, *args, "--result", "-", stdin='{"seat": 1}'
    )
    assert result.exit_code == 0, result.output
    assert event_of(db, run_id, "tool.resolved")["result"] == {"seat": 1}


def test_a_value_file_that_does_not_exist_exits_2_naming_it(db: Path, tmp_path: Path) -> None:
    run_id = waiting_run(db)
    missing = tmp_path / "nothing.json"
    result = onward(
        db, "approve", run_id, "p", "--tenant", TENANT, "--by", "ann", "--value", f"@{missing}"
    )
    assert result.exit_code == 2
    assert f"--value: cannot read {str(missing)!r}" in result.stderr
    assert not [line for line in events(db, run_id) if line["kind"] == "approval.granted"]


def test_a_value_file_that_is_not_json_exits_2_naming_it(db: Path, tmp_path: Path) -> None:
    run_id = waiting_run(db)
    path = tmp_path / "value.json"
    path.write_text("{no")
    result = onward(
        db, "approve", run_id, "p", "--tenant", TENANT, "--by", "ann", "--value", f"@{path}"
    )
    assert result.exit_code == 2
    assert f"--value: not JSON (file {str(path)!r})" in result.stderr


def test_the_replay_table_shows_each_events_time(db: Path) -> None:
    run_id = waiting_run(db)
    result = onward(db, "replay", run_id, "--tenant", TENANT)
    assert result.exit_code == 0, result.output
    times = [datetime.fromtimestamp(line["at"] / 1_000_000, UTC) for line in events(db, run_id)]
    assert len(times) == 3
    assert times[0].strftime("%Y-%m-%d") in result.stdout
    for at in times:
        assert at.strftime("%H:%M:%S.%f")[:-3] in result.stdout


def test_inspect_as_json_gives_the_runs_facts(db: Path) -> None:
    run_id = waiting_run(db)
    result = onward(db, "inspect", run_id, "--tenant", TENANT, "--json")
    assert result.exit_code == 0, result.output
    facts = json.loads(result.stdout)
    assert facts["run"] == run_id
    assert facts["tenant"] == TENANT
    assert facts["status"] == "waiting"
    assert facts["waiting_on"] == "p"
    assert facts["lease"] is None
    assert facts["resume_would"].startswith("nothing until a person answers p")


@pytest.mark.parametrize(
    "command",
    [["replay", "--json"], ["replay"], ["inspect", "--json"], ["inspect"]],
    ids=" ".join,
)
def test_a_closed_pipe_is_a_normal_exit(db: Path, command: list[str]) -> None:
    """What ``onward replay RUN --json | head -1`` does once head has read its line: the
    reader is gone before the command writes."""
    run_id = waiting_run(db)
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "onward", command[0], run_id, "--tenant", TENANT, *command[1:]],
            stdout=write,
            stderr=subprocess.PIPE,
            env={**os.environ, **env_of(db)},
            timeout=60,
            check=False,
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr.decode()) == (0, "")
