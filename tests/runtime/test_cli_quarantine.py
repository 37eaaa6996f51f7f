"""`onward quarantine list` and `onward quarantine release`, in-process, on an embedded file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from support.poison import unknown_kind
from support.shell import pasted
from typer.testing import CliRunner, Result

from onward.eventlog import RunStarted, SqliteEventLog
from onward.projections.base import DEFAULT_CONSUMER
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.checkpoint import Checkpointer
from onward.runtime.cli import app
from onward.testing.eventlog import Envelope
from onward.testing.frontiers import poison

TENANT = "acme"


def onward(db: Path, *args: str, backend: str = "sqlite") -> Result:
    env = {"ONWARD_BACKEND": backend, "ONWARD_SQLITE_PATH": str(db), "COLUMNS": "200"}
    return CliRunner().invoke(app, list(args), env=env)


def poisoned(db: Path, run_id: str) -> int:
    """A run whose second record cannot be read, folded by the embedded checkpointer."""

    async def go() -> int:
        async with SqliteEventLog(db) as log, SqliteFrontierStore(db) as store:
            env = Envelope(run_id=run_id, tenant=TENANT, seq=1, fence=1, at=1)
            await log.append([RunStarted(**env, agent="booker", revision="r1")])
            position = log.write_raw(run_id, unknown_kind(run_id, 2))
            await Checkpointer(store, log).catch_up()
            return position.offset

    return asyncio.run(go())


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "onward.db"


def test_list_shows_the_held_run_its_offset_and_reason(db: Path) -> None:
    offset = poisoned(db, "run-q")
    result = onward(db, "quarantine", "list")
    assert result.exit_code == 0, result.output
    assert "run-q" in result.output
    assert "held" in result.output
    assert "run.exploded" in result.output
    assert str(offset) in result.output


def test_list_as_json_lines(db: Path) -> None:
    offset = poisoned(db, "run-q")
    result = onward(db, "quarantine", "list", "--json")
    assert result.exit_code == 0, result.output
    (entry,) = [json.loads(line) for line in result.output.splitlines()]
    assert (entry["run_id"], entry["offset"], entry["kind"]) == ("run-q", offset, "run.exploded")


def test_an_empty_quarantine_says_so(db: Path) -> None:
    async def create() -> None:
        async with SqliteFrontierStore(db):
            pass

    asyncio.run(create())
    result = onward(db, "quarantine", "list")
    assert result.exit_code == 0, result.output
    assert "no quarantined records" in result.output


def test_release_folds_again_and_a_still_unreadable_run_is_held_again(db: Path) -> None:
    poisoned(db, "run-q")
    result = onward(db, "quarantine", "release", "run-q", "--by", "ops")
    assert result.exit_code == 0, result.output
    assert "held again" in result.output
    listed = onward(db, "quarantine", "list", "--all", "--json")
    (entry,) = [json.loads(line) for line in listed.output.splitlines()]
    assert (entry["state"], entry["released_by"]) == ("held", "ops")


def test_release_of_a_run_not_held_exits_1(db: Path) -> None:
    poisoned(db, "run-q")
    result = onward(db, "quarantine", "release", "run-other", "--by", "ops")
    assert result.exit_code == 1
    assert "no quarantined record held" in result.output


def test_the_memory_backend_is_refused_with_exit_2(db: Path) -> None:
    result = onward(db, "quarantine", "list", backend="memory")
    assert result.exit_code == 2
    assert "memory" in result.output


def test_the_title_counts_runs_not_records_that_name_none(db: Path) -> None:
    async def write() -> None:
        async with SqliteFrontierStore(db) as store:
            entries = [poison("run-q", offset=3), poison(None, offset=4), poison(None, offset=5)]
            await store.write(DEFAULT_CONSUMER, {1: 6}, [], [], quarantine=entries)

    asyncio.run(write())
    result = onward(db, "quarantine", "list")
    assert result.exit_code == 0, result.output
    assert "3 quarantined record(s) of 1 run(s)" in result.output


def nameless(db: Path) -> None:
    """A held record of run-q and one at partition 1 offset 4 that names no run (its run could
    not be read at all: a foreign producer's value, not JSON, with no key)."""

    async def write() -> None:
        async with SqliteFrontierStore(db) as store:
            entries = [poison("run-q", offset=3), poison(None, offset=4)]
            await store.write(DEFAULT_CONSUMER, {1: 5}, [], [], quarantine=entries)

    asyncio.run(write())


def listed(db: Path, *options: str) -> list[dict[str, object]]:
    result = onward(db, "quarantine", "list", "--json", *options)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.output.splitlines()]


def test_a_record_that_names_no_run_is_dismissed_and_leaves_the_default_list(db: Path) -> None:
    """No release names it (it has no run): a person who has seen to it says so, and the
    default list no longer shows it; `--all` still does, with who dismissed it."""
    nameless(db)
    args = ["quarantine", "dismiss", "--partition", "1", "--offset", "4", "--by", "ops"]
    result = onward(db, *args, "--json")
    assert result.exit_code == 0, result.output
    said = json.loads(result.output)
    assert (said["partition"], said["offset"], said["by"]) == (1, 4, "ops")
    assert [(e["run_id"], e["offset"]) for e in listed(db)] == [("run-q", 3)]
    everything = {e["offset"]: e for e in listed(db, "--all")}
    assert (everything[4]["state"], everything[4]["released_by"]) == ("cleared", "ops")
    assert isinstance(everything[4]["released_at"], int)
    assert everything[3]["state"] == "held"

    again = onward(db, *args)
    assert again.exit_code == 1
    assert "already dismissed by ops" in again.output


def test_dismiss_refuses_a_record_that_names_a_run_and_one_that_is_not_there(db: Path) -> None:
    nameless(db)
    named = ["quarantine", "dismiss", "--partition", "1", "--offset", "3", "--by", "ops"]
    result = onward(db, *named)
    assert result.exit_code == 2
    assert "onward quarantine release run-q" in result.output
    missing = ["quarantine", "dismiss", "--partition", "1", "--offset", "9", "--by", "ops"]
    result = onward(db, *missing)
    assert result.exit_code == 1
    assert "no quarantined record at partition 1 offset 9" in result.output
    assert [e["state"] for e in listed(db, "--all")] == ["held", "held"]


@pytest.mark.parametrize(
    "options",
    [
        ["--partition", "1", "--offset", "-4", "--by", "ops"],
        ["--partition", "-1", "--offset", "4", "--by", "ops"],
        ["--partition", "1", "--offset", "4", "--by", ""],
        ["--partition", "1", "--offset", "4"],
    ],
)
def test_dismiss_refuses_bad_input_and_changes_nothing(db: Path, options: list[str]) -> None:
    nameless(db)
    result = onward(db, "quarantine", "dismiss", *options)
    assert result.exit_code == 2, result.output
    assert [e["state"] for e in listed(db, "--all")] == ["held", "held"]


def test_dismiss_of_a_named_record_says_a_release_command_that_pastes_as_it_reads(
    db: Path,
) -> None:
    """The run's id and who dismisses may hold spaces, quotes or ``$``: the release command
    the refusal names, pasted into a shell, names that very run and person."""
    run_id, by = "run q'$HOME", "ops team"

    async def write() -> None:
        async with SqliteFrontierStore(db) as store:
            await store.write(
                DEFAULT_CONSUMER, {1: 4}, [], [], quarantine=[poison(run_id, offset=3)]
            )

    asyncio.run(write())
    result = onward(db, "quarantine", "dismiss", "--partition", "1", "--offset", "3", "--by", by)
    assert result.exit_code == 2
    command = result.stderr.split("release the run with ", 1)[1].split(", which", 1)[0]
    assert pasted(command) == ["onward", "quarantine", "release", run_id, "--by", by]
    assert [e["state"] for e in listed(db, "--all")] == ["held"]


def test_the_release_command_dismiss_suggests_releases_a_run_a_producer_named_out_of_bounds(
    db: Path,
) -> None:
    """The log refuses only NUL in a run id: a producer writing to it directly can key a run
    with a control character. The release command a dismiss of its record suggests, pasted,
    names that very run, and run it releases the run and folds it again."""
    run_id = "run-\x1b[2J-q"
    poisoned(db, run_id)
    (entry,) = listed(db)
    dismiss = ["--partition", str(entry["partition"]), "--offset", str(entry["offset"])]
    dismiss += ["--by", "ops"]
    refused = onward(db, "quarantine", "dismiss", *dismiss)
    assert refused.exit_code == 2
    command = refused.stderr.split("release the run with ", 1)[1].split(", which", 1)[0]
    words = pasted(command)
    assert words[:3] == ["onward", "quarantine", "release"]
    assert words[3] == run_id
    released = onward(db, *words[1:], "--json")
    assert released.exit_code == 0, released.output
    assert (json.loads(released.stdout)["run"], json.loads(released.stdout)["released"]) == (
        run_id,
        1,
    )
    assert [(e["run_id"], e["released_by"]) for e in listed(db, "--all")] == [(run_id, "ops")]


def test_dismiss_of_a_named_record_already_released_says_so_not_to_release_it(
    db: Path,
) -> None:
    """Released, the run's record is no longer held: the release command to paste would only
    answer that the run has no record held."""

    async def write_and_release() -> None:
        async with SqliteFrontierStore(db) as store:
            await store.write(
                DEFAULT_CONSUMER, {1: 4}, [], [], quarantine=[poison("run-q", offset=3)]
            )
            assert await store.release(DEFAULT_CONSUMER, "run-q", by="ops", at=1) == 1

    asyncio.run(write_and_release())
    result = onward(db, "quarantine", "dismiss", "--partition", "1", "--offset", "3", "--by", "x")
    assert result.exit_code == 1, result.output
    assert "onward quarantine release" not in result.output
    assert "run-q" in result.output
    assert "released by ops" in result.output
    assert [e["state"] for e in listed(db, "--all")] == ["released"]
