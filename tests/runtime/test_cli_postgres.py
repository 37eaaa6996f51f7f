"""`ONWARD_BACKEND=postgres`: a deployment on PostgreSQL alone, driven through the command line.

The README's first-run flow on a fresh schema: `onward db migrate`, `onward start` in a process
of its own SIGKILLed in the middle of a tool call, `onward run --resume` carrying the run on,
then the commands that read and tidy (`runs`, `inspect`, `replay`, `compact`, `gc`,
`quarantine`). Side
effects go to a file ledger every process writes, so a call made twice would show.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.poison import unknown_kind
from support.processes import TESTS, kill_if_running
from typer.testing import CliRunner, Result

from onward.eventlog import PostgresEventLog, RunStarted, partition_for
from onward.runtime.backends import open_backends
from onward.runtime.checkpoint import Checkpointer
from onward.runtime.cli import app
from onward.runtime.demo_ledger import Ledger
from onward.runtime.leases.presence import HOLDERS_DIR_ENV
from onward.runtime.settings import Settings
from onward.testing.eventlog import Envelope

STEPS = 6
AGENT = ["--agent", "support.fleet:make_booker", "--provider", "support.fleet:provider"]
RUN_ID = "pg-run-1"


@pytest.fixture
def env(
    database_url: str, empty_pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """The deployment's variables: PostgreSQL alone, a schema nothing was migrated into yet,
    this test's ledger and presence locks (inherited by the child processes)."""
    monkeypatch.setenv(HOLDERS_DIR_ENV, str(tmp_path / "holders"))
    return {
        "ONWARD_BACKEND": "postgres",
        "DATABASE_URL": database_url,
        "ONWARD_DATABASE_SCHEMA": empty_pg_schema,
        "ONWARD_PARTITIONS": "4",
        "FLEET_LEDGER": str(tmp_path / "ledger.jsonl"),
        "FLEET_STEPS": str(STEPS),
        "FLEET_TOOL_S": "0.3",
    }


def onward(env: dict[str, str], *args: str) -> Result:
    """The command line in this process, against the deployment."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)  # the tools read FLEET_* when called
        return CliRunner().invoke(app, list(args), env=env)


def started_then_killed(env: dict[str, str], ledger: Ledger, after_effects: int) -> None:
    """`onward start` in a process of its own, SIGKILLed once its tools made ``after_effects``
    side effects: in the middle of the next call or of the model's turn before it."""
    child_env = {**os.environ, **env, "PYTHONPATH": str(TESTS)}
    command = [sys.executable, "-m", "onward", "start", "book", "--run-id", RUN_ID, *AGENT]
    starting = subprocess.Popen(
        command, env=child_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    try:
        while len(ledger.entries()) < after_effects:
            assert starting.poll() is None, starting.communicate()
            assert time.monotonic() < deadline, "the run made no side effect"
            time.sleep(0.02)
        starting.send_signal(signal.SIGKILL)
        starting.communicate(timeout=30)
    finally:
        kill_if_running(starting)  # it would go on with the run after the test
    assert starting.returncode == -signal.SIGKILL


def test_a_run_killed_mid_call_is_carried_on_by_the_next_command_once(
    env: dict[str, str],
) -> None:
    migrated = onward(env, "db", "migrate")
    assert migrated.exit_code == 0, migrated.output
    ledger = Ledger(env["FLEET_LEDGER"])

    started_then_killed(env, ledger, after_effects=3)
    before = len(ledger.entries())
    assert before < STEPS

    resumed = onward(env, "run", "--resume", RUN_ID, "--tenant", "default", *AGENT)
    assert resumed.exit_code == 0, resumed.output
    assert "status completed" in resumed.stdout
    keys = [(e["tool"], e["key"]) for e in ledger.entries()]
    assert len(keys) == len(set(keys)) == STEPS, "a booking was made twice or never"

    listed = onward(env, "runs", "--json")
    assert listed.exit_code == 0, listed.output
    assert RUN_ID in listed.stdout
    shown = onward(env, "inspect", RUN_ID)
    assert shown.exit_code == 0, shown.output
    assert "completed" in shown.stdout
    replayed = onward(env, "replay", RUN_ID, "--json")
    assert replayed.exit_code == 0, replayed.output
    kinds = [json.loads(line)["kind"] for line in replayed.stdout.splitlines()]
    assert kinds[0] == "run.started"
    assert kinds[-1] == "run.finished"
    assert (
        kinds.count("run.claimed") == 1
    )  # the resume's: a start holds the run from its first event

    compacted = onward(env, "compact", "--no-archive", "--json")
    assert compacted.exit_code == 0, compacted.output
    assert onward(env, "gc", "--dry-run", "--json").exit_code == 0
    again = onward(env, "inspect", RUN_ID)
    assert again.exit_code == 0, again.output
    assert "completed" in again.stdout

    async def log_start() -> int:
        async with PostgresEventLog(
            env["DATABASE_URL"], schema=env["ONWARD_DATABASE_SCHEMA"], partitions=4
        ) as log:
            return (await log.bounds(partition_for(RUN_ID, 4))).start

    assert asyncio.run(log_start()) > 0, "compact cut nothing from the run's partition"


def test_the_stores_are_all_in_postgresql(env: dict[str, str]) -> None:
    assert onward(env, "db", "migrate").exit_code == 0
    settings = Settings.model_validate(env)

    async def classes() -> list[str]:
        async with open_backends(settings) as backends:
            assert backends.embedded
            stores = [backends.log, backends.frontiers, backends.leases, backends.blobs]
            return [type(s).__name__ for s in [*stores, backends.compaction]]

    assert asyncio.run(classes()) == [
        "PostgresEventLog",
        "PostgresFrontierStore",
        "PostgresLeaseStore",
        "PostgresBlobStore",
        "PostgresCompactionStore",
    ]


def test_the_postgres_backend_without_a_database_url_exits_2() -> None:
    env = {"ONWARD_BACKEND": "postgres", "DATABASE_URL": None}
    result = CliRunner().invoke(app, ["inspect", "run-1"], env=env)
    assert result.exit_code == 2
    assert "DATABASE_URL" in result.stderr


def test_a_database_url_that_is_not_postgresql_is_refused_naming_the_backend() -> None:
    env = {"ONWARD_BACKEND": "postgres", "DATABASE_URL": "sqlite:///app.db"}
    result = CliRunner().invoke(app, ["inspect", "run-1"], env=env)
    assert result.exit_code == 2
    assert "postgres backend keeps its stores in PostgreSQL" in result.stderr


def test_a_poisoned_run_is_held_listed_and_folded_again_on_release(env: dict[str, str]) -> None:
    """No projector process runs on PostgreSQL alone: the inline fold sets an unreadable run
    aside, and `onward quarantine release` folds it again at once, as on SQLite."""
    assert onward(env, "db", "migrate").exit_code == 0
    settings = Settings.model_validate(env)
    run_id = "run-q"

    async def poison() -> int:
        async with open_backends(settings) as backends:
            log = backends.log
            assert isinstance(log, PostgresEventLog)
            first = Envelope(run_id=run_id, tenant="default", seq=1, fence=1, at=1)
            await log.append([RunStarted(**first, agent="booker", revision="r1")])
            position = await log.write_raw(run_id, unknown_kind(run_id, 2))
            await Checkpointer(backends.frontiers, log).catch_up()
            return position.offset

    offset = asyncio.run(poison())
    listed = onward(env, "quarantine", "list", "--json")
    assert listed.exit_code == 0, listed.output
    (entry,) = [json.loads(line) for line in listed.output.splitlines()]
    assert (entry["run_id"], entry["offset"], entry["kind"]) == (run_id, offset, "run.exploded")

    released = onward(env, "quarantine", "release", run_id, "--by", "ops", "--json")
    assert released.exit_code == 0, released.output
    said = json.loads(released.output)
    assert (said["folded"], said["held"] is not None) == (True, True)  # still unreadable
    again = onward(env, "quarantine", "list", "--all", "--json")
    (entry,) = [json.loads(line) for line in again.output.splitlines()]
    assert (entry["state"], entry["released_by"]) == ("held", "ops")


def test_frontiers_rebuild_from_the_postgresql_log_and_no_projector_is_needed(
    env: dict[str, str],
) -> None:
    assert onward(env, "db", "migrate").exit_code == 0
    started = onward(env, "start", "book", "--run-id", RUN_ID, *AGENT)
    assert started.exit_code == 0, started.output

    rebuilt = onward(env, "projections", "rebuild", "frontiers", "--json")
    assert rebuilt.exit_code == 0, rebuilt.output
    report = json.loads(rebuilt.stdout)
    assert (report["build"], report["previous"]) == (2, 1)
    assert report["events"] > 0
    shown = onward(env, "inspect", RUN_ID)
    assert shown.exit_code == 0, shown.output
    assert "completed" in shown.stdout

    projector = onward(env, "projector")
    assert projector.exit_code == 2
    assert "folds the runs it appends inline" in projector.stderr
