"""An event time no calendar date holds does not stop the commands that show a run.

An event's ``at`` is informational (microseconds since the epoch, never used to decide), and
every reader takes any 64-bit value: a foreign producer whose clock gives nanoseconds
(``time.time_ns()``) writes times some 50,000 years ahead, past the last date Python's
`datetime` holds. The fold keeps the latest ``at`` as the run's ``updated_at``; `replay`,
`inspect --json` and `runs` show it as a time. Each must still show the run (and every other
run on the page), not fail with exit 5.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from typer.testing import CliRunner, Result

from onward.eventlog import Event, RunClaimed, RunStarted, SqliteEventLog
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.checkpoint import Checkpointer
from onward.runtime.cli import app
from onward.testing.eventlog import Envelope, new_run_id

TENANT = "acme"
NANOSECONDS = time.time_ns()
"""An ``at`` written by a clock in nanoseconds: past year 9999 read as microseconds."""


def write(db: Path) -> tuple[str, str]:
    """Two runs folded as the embedded backend folds them: one claimed at `NANOSECONDS`, one
    written as the runner writes; returns their ids."""
    odd, plain = f"run-a-{new_run_id()}", f"run-b-{new_run_id()}"
    now = time.time_ns() // 1000

    def env(run_id: str, seq: int, at: int) -> Envelope:
        return Envelope(run_id=run_id, tenant=TENANT, seq=seq, fence=1, at=at)

    steps: list[list[Event]] = [
        [RunStarted(**env(odd, 1, now), agent="booker", revision="r1", input="hi")],
        [RunClaimed(**env(odd, 2, NANOSECONDS), worker="w-ns")],
        [RunStarted(**env(plain, 1, now), agent="booker", revision="r1", input="hi")],
    ]

    async def go() -> None:
        async with SqliteEventLog(db) as log, SqliteFrontierStore(db) as store:
            checkpointer = Checkpointer(store, log)
            for step in steps:
                await checkpointer.after_append(step, await log.append(step))
            await checkpointer.catch_up()
            assert checkpointer.last_error is None

    asyncio.run(go())
    return odd, plain


def onward(db: Path, *args: str) -> Result:
    environment = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db), "COLUMNS": "200"}
    return CliRunner().invoke(app, list(args), env=environment)


def test_replay_shows_an_event_whose_time_no_date_holds(tmp_path: Path) -> None:
    db = tmp_path / "onward.db"
    odd, _ = write(db)
    result = onward(db, "replay", odd, "--tenant", TENANT)
    assert result.exit_code == 0, result.output
    assert "claimed by w-ns" in result.stdout
    assert str(NANOSECONDS) in result.stdout


def test_inspect_json_shows_a_run_updated_at_such_a_time(tmp_path: Path) -> None:
    db = tmp_path / "onward.db"
    odd, _ = write(db)
    result = onward(db, "inspect", odd, "--tenant", TENANT, "--json")
    assert result.exit_code == 0, result.output
    facts = json.loads(result.stdout)
    assert (facts["run"], facts["updated_at"]) == (odd, None)
    assert facts["started_at"] is not None


def test_runs_lists_every_run_when_one_was_updated_at_such_a_time(tmp_path: Path) -> None:
    db = tmp_path / "onward.db"
    odd, plain = write(db)
    table = onward(db, "runs")
    assert table.exit_code == 0, table.output
    assert odd in table.stdout
    assert plain in table.stdout
    listed = onward(db, "runs", "--json")
    assert listed.exit_code == 0, listed.output
    lines = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [(line["run"], line["updated_at"] is None) for line in lines] == [
        (odd, True),
        (plain, False),
    ]
