"""`onward quarantine release` on PostgreSQL alone folds the run again here and now; a frontier
it finds over the snapshot cap is kept uncapped beside the row, in the deployment's compaction
store, as the runner's fold keeps it: the run's resume and next fold go on from it rather than
read the run from its first event."""

from __future__ import annotations

import asyncio
import functools
import json
from pathlib import Path

import pytest
from support.poison import newer_format
from typer.testing import CliRunner, Result

from onward.eventlog import (
    EVENT_FORMAT,
    Event,
    PostgresEventLog,
    RunClaimed,
    RunStarted,
    codec,
    events,
)
from onward.runtime.backends import open_backends
from onward.runtime.checkpoint import Checkpointer
from onward.runtime.cli import app, quarantine
from onward.runtime.leases.presence import HOLDERS_DIR_ENV
from onward.runtime.settings import Settings
from onward.testing.eventlog import Envelope

CAP = 200


@pytest.fixture
def env(
    database_url: str, empty_pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    monkeypatch.setenv(HOLDERS_DIR_ENV, str(tmp_path / "holders"))
    return {
        "ONWARD_BACKEND": "postgres",
        "DATABASE_URL": database_url,
        "ONWARD_DATABASE_SCHEMA": empty_pg_schema,
        "ONWARD_PARTITIONS": "1",
        "COLUMNS": "200",
    }


def onward(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(app, list(args), env=env)


def test_a_released_run_over_the_cap_is_kept_beside_its_row(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert onward(env, "db", "migrate").exit_code == 0
    settings = Settings.model_validate(env)
    run_id = "run-q"

    async def poison() -> None:
        async with open_backends(settings) as backends:
            log = backends.log
            assert isinstance(log, PostgresEventLog)
            first = Envelope(run_id=run_id, tenant="default", seq=1, fence=1, at=1)
            await log.append([RunStarted(**first, agent="booker", revision="r1")])
            await log.write_raw(run_id, newer_format(run_id, 2))
            await Checkpointer(backends.frontiers, log).catch_up()

    asyncio.run(poison())
    # A newer Onward, which reads the record, releases the run; its frontier is over the cap.
    monkeypatch.setitem(events.LATER_FORMATS, "run.claimed", EVENT_FORMAT + 1)
    claimed: type[Event] = RunClaimed
    monkeypatch.setitem(codec._NEWEST, claimed, EVENT_FORMAT + 1)
    monkeypatch.setattr(quarantine, "Checkpointer", functools.partial(Checkpointer, max_bytes=CAP))
    released = onward(env, "quarantine", "release", run_id, "--by", "ops", "--json")
    assert released.exit_code == 0, released.output
    said = json.loads(released.output)
    assert (said["folded"], said["held"]) == (True, None)

    async def kept() -> None:
        async with open_backends(settings) as backends:
            row = await backends.frontiers.get(run_id)
            assert row is not None
            assert row.frontier is None  # over the cap: the row keeps the reason
            assert backends.compaction is not None
            frontier = (await backends.compaction.snapshots([run_id])).get(run_id)
            assert frontier is not None, "the frontier over the cap is kept beside the row"
            assert frontier.last_seq == 2

    asyncio.run(kept())
