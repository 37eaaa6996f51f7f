"""A frontier row written by a newer Onward is left alone: exit 4, as for a newer event, not
the exit 2 of a database schema to migrate."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import msgspec
from support import cli_agent
from typer.testing import CliRunner

from onward.projections.frontier import FRONTIER_FORMAT
from onward.runtime.backends import open_backends
from onward.runtime.cli import app
from onward.runtime.settings import Settings


def test_inspect_and_resume_of_a_newer_row_exit_4(tmp_path: Path) -> None:
    db = tmp_path / "onward.db"
    settings = Settings(backend="sqlite", sqlite_path=db)

    async def waiting_run() -> None:
        async with open_backends(settings) as backends:
            runner = backends.runner(cli_agent.paying_model())
            await runner.run(cli_agent.payer(), "go", tenant="acme", run_id="run-1")

    asyncio.run(waiting_run())
    with sqlite3.connect(db) as conn:
        (payload,) = conn.execute(
            "SELECT payload FROM onward_frontiers WHERE run_id = 'run-1'"
        ).fetchone()
        newer = {**msgspec.json.decode(payload), "format": FRONTIER_FORMAT + 1}
        conn.execute(
            "UPDATE onward_frontiers SET payload = ? WHERE run_id = 'run-1'",
            (msgspec.json.encode(newer),),
        )
    env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)}
    agent = ["--agent", "support.cli_agent:payer", "--provider", "support.cli_agent:paying_model"]
    for args in (["inspect", "run-1"], ["run", "--resume", "run-1", *agent]):
        result = CliRunner().invoke(app, [*args, "--tenant", "acme"], env=env)
        assert result.exit_code == 4, result.output
        assert result.stderr.startswith("CheckpointFormatError: run 'run-1': frontier payload")
        assert len(result.stderr.strip().splitlines()) == 1
