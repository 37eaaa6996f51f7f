"""`onward projections rebuild --archive DIR` on a log compaction cut (ONWARD_BACKEND=postgres).

A log that was cut is refused without an archive, since a rebuild from what is left would miss
the start of every run it cut into. An archive that does not hold what was cut (a mistyped
directory, an empty one) is the same rebuild, and is refused the same way: the views keep the
build they had, so no run drops out of `onward runs`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import msgspec
import pytest
import zstandard
from typer.testing import CliRunner, Result

from onward.eventlog import PostgresEventLog
from onward.eventlog.archive import MANIFEST
from onward.runtime.cli import app

RUNS = ("arch-1", "arch-2")


@pytest.fixture
def env(database_url: str, empty_pg_schema: str, tmp_path: Path) -> dict[str, str]:
    (tmp_path / "rebuild_archive_agents.py").write_text(
        "from onward.runtime import Agent, ScriptedProvider, reply\n"
        "agent = Agent(name='a', instructions='hi')\n"
        "def model():\n"
        "    return ScriptedProvider([reply('hello')])\n"
    )
    return {
        "ONWARD_BACKEND": "postgres",
        "DATABASE_URL": database_url,
        "ONWARD_DATABASE_SCHEMA": empty_pg_schema,
        "ONWARD_PARTITIONS": "1",
    }


def onward(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(app, list(args), env={**env, "COLUMNS": "300"})


def listed(env: dict[str, str]) -> list[str]:
    result = onward(env, "runs", "--json")
    assert result.exit_code == 0, result.output
    return sorted(json.loads(line)["run"] for line in result.stdout.splitlines())


@pytest.fixture
def cut(env: dict[str, str], tmp_path: Path) -> Path:
    """Two finished runs, compacted: their records are cut from the log into an archive."""
    assert onward(env, "db", "migrate").exit_code == 0
    agent = str(tmp_path / "rebuild_archive_agents.py")
    for run_id in RUNS:
        started = onward(
            env, "start", "hi", "--run-id", run_id, "--agent", f"{agent}:agent",
            "--provider", f"{agent}:model",
        )  # fmt: skip
        assert started.exit_code == 0, started.output
    archive = tmp_path / "archive"
    compacted = onward(env, "compact", "--archive", str(archive), "--json")
    assert compacted.exit_code == 0, compacted.output
    assert json.loads(compacted.stdout)["events_cut"] > 0
    assert listed(env) == list(RUNS)
    return archive


@pytest.mark.parametrize("wrong", ["mistyped", "empty"])
def test_an_archive_without_what_was_cut_is_refused_and_the_views_stay(
    env: dict[str, str], cut: Path, tmp_path: Path, wrong: str
) -> None:
    other = tmp_path / wrong
    if wrong == "empty":
        other.mkdir()
    result = onward(env, "projections", "rebuild", "frontiers", "--archive", str(other))
    assert result.exit_code == 2, result.output
    assert "--archive" in result.stderr
    assert str(cut) in result.stderr  # where what was cut went
    assert listed(env) == list(RUNS)


def test_the_archive_compaction_wrote_rebuilds_every_run(env: dict[str, str], cut: Path) -> None:
    result = onward(env, "projections", "rebuild", "frontiers", "--archive", str(cut), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["build"] == 2
    assert listed(env) == list(RUNS)


def test_a_log_cut_without_an_archive_is_not_rebuilt(env: dict[str, str], tmp_path: Path) -> None:
    """A cut made with --no-archive is gone for good: no --archive can give a rebuild what it
    cut, so a rebuild would drop every run it cut into; it is refused, and the views stay."""
    assert onward(env, "db", "migrate").exit_code == 0
    agent = str(tmp_path / "rebuild_archive_agents.py")
    for run_id in RUNS:
        started = onward(
            env, "start", "hi", "--run-id", run_id, "--agent", f"{agent}:agent",
            "--provider", f"{agent}:model",
        )  # fmt: skip
        assert started.exit_code == 0, started.output
    compacted = onward(env, "compact", "--no-archive", "--json")
    assert compacted.exit_code == 0, compacted.output
    assert json.loads(compacted.stdout)["events_cut"] > 0
    empty = tmp_path / "empty"
    empty.mkdir()
    result = onward(env, "projections", "rebuild", "frontiers", "--archive", str(empty))
    assert result.exit_code == 2, result.output
    assert "--no-archive" in result.stderr
    assert listed(env) == list(RUNS)


def test_an_archive_that_is_not_there_is_named_even_with_nothing_cut(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Nothing was cut, so no cut names the archive: a mistyped --archive must still be said,
    as `onward replay --archive` says it, not read as an empty archive."""
    assert onward(env, "db", "migrate").exit_code == 0
    missing = tmp_path / "mistyped"
    result = onward(env, "projections", "rebuild", "frontiers", "--archive", str(missing))
    assert result.exit_code == 2, result.output
    assert f"--archive {missing}: no such directory" in result.stderr
    assert not missing.exists()


def test_a_log_that_lost_its_start_otherwise_than_by_compaction_is_not_rebuilt(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Records deleted below the log's start by something other than compaction (Kafka's
    retention on a topic made by hand, a delete-records by an operator) are in no cut and no
    archive: a rebuild from what is left folds every run begun below from the middle of its
    history, and switched the views to that. It is refused, and the views stay."""
    assert onward(env, "db", "migrate").exit_code == 0
    agent = str(tmp_path / "rebuild_archive_agents.py")
    for run_id in RUNS:
        started = onward(
            env, "start", "hi", "--run-id", run_id, "--agent", f"{agent}:agent",
            "--provider", f"{agent}:model",
        )  # fmt: skip
        assert started.exit_code == 0, started.output

    async def lose_the_start() -> None:
        async with PostgresEventLog(
            env["DATABASE_URL"], schema=env["ONWARD_DATABASE_SCHEMA"], partitions=1
        ) as log:
            await log.truncate_before(0, 1)

    asyncio.run(lose_the_start())
    result = onward(env, "projections", "rebuild", "frontiers")
    assert result.exit_code == 2, result.output
    assert "partition 0" in result.stderr
    assert listed(env) == list(RUNS)
    assert onward(env, "inspect", RUNS[0], "--json").exit_code == 0


def test_a_record_archived_in_a_newer_format_sets_its_run_aside_not_the_rebuild(
    env: dict[str, str], cut: Path
) -> None:
    """A newer Onward archived a record this code cannot read (a mixed-version deployment):
    as a record in the log, it sets its own run aside, and every other run is rebuilt."""
    (entry,) = msgspec.json.decode((cut / MANIFEST).read_bytes())["ranges"]
    path = cut / entry["file"]
    lines, newer = [], 0
    for raw in zstandard.ZstdDecompressor().stream_reader(path.read_bytes()).read().splitlines():
        line = msgspec.json.decode(raw)
        if line["run_id"] == RUNS[1] and line["event"]["seq"] == 2:
            line["event"]["format"] += 1
            newer += 1
        lines.append(msgspec.json.encode(line) + b"\n")
    assert newer == 1
    body = zstandard.ZstdCompressor().compress(b"".join(lines))
    path.write_bytes(body)
    entry.update(size=len(body), sha256=hashlib.sha256(body).hexdigest())
    (cut / MANIFEST).write_bytes(msgspec.json.encode({"format": 1, "ranges": [entry]}))

    result = onward(env, "projections", "rebuild", "frontiers", "--archive", str(cut), "--json")

    assert result.exit_code == 0, result.output
    assert RUNS[0] in listed(env)
