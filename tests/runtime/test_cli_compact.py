"""`onward compact`, `onward replay` after compaction and `--archive`, on an embedded SQLite file.

Bad input changes nothing: an archive that cannot be written (exit 2) or whose manifest is
corrupt (exit 5) leaves the log as it was, and without an archive nothing is cut unless
--no-archive says so.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from support.compaction_world import AGENT, TENANT, Script, World, log_sizes, sqlite_world
from typer.testing import CliRunner, Result

from onward.eventlog import (
    Event,
    RunClaimed,
    RunFinished,
    RunStarted,
    SqliteEventLog,
    Tagged,
    TurnSettled,
)
from onward.eventlog.archive import DirectoryArchive
from onward.projections.compaction import SqliteCompactionStore
from onward.runtime.cli import app
from onward.runtime.compaction import CheckpointCompactor
from onward.runtime.gc import GarbageCollector, SqliteRecordSweeper
from onward.runtime.providers import NoModel

LIVE = "long"


async def _prepare(folder: Path) -> None:
    async with sqlite_world(folder) as world:
        await world.finished_run("done", turns=2)
        await world.live_run(LIVE, turns=10, done=8)
        history = await world.log.read_run(LIVE)
        first_settled = next(s.event.seq for s in history if isinstance(s.event, TurnSettled))
        await world.runner(NoModel()).tag(LIVE, "first", tenant=TENANT, seq=first_settled)
        await world.fold()


async def _sizes(db: Path) -> list[tuple[int, int]]:
    async with SqliteEventLog(db, partitions=1) as log:
        return await log_sizes(log)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    asyncio.run(_prepare(tmp_path))
    return tmp_path / "onward.db"


def onward(db: Path, *args: str) -> Result:
    env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db), "ONWARD_PARTITIONS": "1"}
    return CliRunner().invoke(app, list(args), env=env)


def test_a_dry_run_says_what_it_would_cut_and_changes_nothing(db: Path, tmp_path: Path) -> None:
    before = asyncio.run(_sizes(db))
    archive = tmp_path / "archive"
    result = onward(db, "compact", "--dry-run", "--archive", str(archive), "--max-checkpoints", "2")
    assert result.exit_code == 0, result.output
    assert "partition 0 [0, " in result.stdout
    assert "would archive [0, " in result.stdout
    assert asyncio.run(_sizes(db)) == before
    assert not archive.exists()


def test_compact_then_replay_marks_the_span_and_the_archive_shows_it_all(
    db: Path, tmp_path: Path
) -> None:
    archive = tmp_path / "archive"
    dry = onward(db, "compact", "--dry-run", "--archive", str(archive), "--json")
    assert dry.exit_code == 0, dry.output
    planned = json.loads(dry.stdout)
    assert planned["dry_run"] is True
    assert planned["events_cut"] == sum(p["events_cut"] for p in planned["partitions"]) > 0
    result = onward(db, "compact", "--archive", str(archive), "--max-checkpoints", "2")
    assert result.exit_code == 0, result.output
    assert "archived" in result.stdout
    start = asyncio.run(_sizes(db))[0][0]
    assert start > 0

    inspect = onward(db, "inspect", LIVE, "--tenant", TENANT)
    assert inspect.exit_code == 0, inspect.output
    assert f"run {LIVE!r}: seqs 1 to " in inspect.stderr
    assert f"archived in {archive}" in inspect.stderr

    replay = onward(db, "replay", LIVE, "--tenant", TENANT, "--json")
    assert replay.exit_code == 0, replay.output
    assert "were compacted" in replay.stderr
    assert str(archive) in replay.stderr
    shown = [json.loads(line) for line in replay.stdout.splitlines()]
    # The tagged event, the Tagged event and the last 2 resume points are kept; the rest was cut.
    retained = [line["seq"] for line in shown if line["retained"]]
    assert len(retained) == 4
    assert [line["seq"] for line in shown if not line["retained"]] == []

    whole = onward(db, "replay", LIVE, "--tenant", TENANT, "--json", "--archive", str(archive))
    assert whole.exit_code == 0, whole.output
    seqs = [json.loads(line)["seq"] for line in whole.stdout.splitlines()]
    assert seqs == list(range(1, len(seqs) + 1))
    assert min(json.loads(line)["offset"] for line in whole.stdout.splitlines()) < start


def test_replay_with_another_archive_names_the_one_compaction_wrote(
    db: Path, tmp_path: Path
) -> None:
    """An --archive that does not hold what compaction archived (a mistyped or another
    directory) is refused naming the archive it wrote, as a rebuild refuses it: read as an
    empty archive, a run cut whole was said not to exist, one cut in part shown from the log."""
    archive = tmp_path / "archive"
    result = onward(db, "compact", "--archive", str(archive), "--max-checkpoints", "2")
    assert result.exit_code == 0, result.output
    other = tmp_path / "other"
    other.mkdir()
    replay = onward(db, "replay", LIVE, "--tenant", TENANT, "--archive", str(other))
    assert replay.exit_code == 2, replay.output
    assert f"archived in {archive}" in replay.stderr
    assert "no run" not in replay.stderr


def test_replay_with_the_archive_of_a_reused_run_id_shows_each_tenant_its_own_run(
    tmp_path: Path,
) -> None:
    """Run x is collected and compaction cuts it into the archive; another tenant's run then
    takes the id. Read with the archive, the old run's tenant was shown the new run (its input
    and answers), and the new run's tenant was told there is no run x."""
    archive = _collected_and_started_again(tmp_path, tenant="other", ask="theirs")
    db = tmp_path / "onward.db"
    for tenant in (TENANT, "other"):
        replay = onward(db, "replay", "x", "--tenant", tenant, "--json", "--archive", str(archive))
        assert replay.exit_code == 0, replay.output
        shown = [json.loads(line) for line in replay.stdout.splitlines()]
        assert {line["event"]["tenant"] for line in shown} == {tenant}
        assert not any(line["refused"] for line in shown)


def test_replay_with_the_archive_of_a_run_id_its_tenant_used_again_counts_each_run(
    tmp_path: Path,
) -> None:
    """Run x is collected and compaction cuts it into the archive; the same tenant then starts
    a new run x. Read with the archive, both histories are the tenant's: the new run's events
    were shown refused, as duplicates of the old run's seqs, and the old run's answer as the
    only one the run gave."""
    archive = _collected_and_started_again(tmp_path, tenant=TENANT, ask="again")
    db = tmp_path / "onward.db"
    replay = onward(db, "replay", "x", "--tenant", TENANT, "--json", "--archive", str(archive))
    assert replay.exit_code == 0, replay.output
    shown = [json.loads(line) for line in replay.stdout.splitlines()]
    assert [line for line in shown if line["refused"]] == []
    starts = [line for line in shown if line["kind"] == "run.started"]
    assert [line["event"]["input"] for line in starts] == [{"ask": "x"}, {"ask": "again"}]
    assert "used again" in replay.stderr


async def _collected_and_cut(world: World, tmp_path: Path, archive: Path) -> None:
    """Forty days on, the garbage collector collects the finished runs (some it must), and the
    compactor cuts them from the log into ``archive``."""
    async with SqliteRecordSweeper(tmp_path / "onward.db") as sweeper:
        later = time.time() + 40 * 86_400.0
        assert (await GarbageCollector(sweeper, clock=lambda: later).run()).expired
    await CheckpointCompactor(
        world.log, world.frontiers, world.store, archive=DirectoryArchive(archive)
    ).compact()


def _collected_and_started_again(tmp_path: Path, *, tenant: str, ask: str) -> Path:
    """Run x finished, collected and cut into an archive; then ``tenant`` starts a new run
    under its id, asking ``ask``. Returns the archive."""
    archive = tmp_path / "archive"

    async def written() -> None:
        async with sqlite_world(tmp_path) as world:
            await world.finished_run("x", turns=1)
            await world.fold()
            await _collected_and_cut(world, tmp_path, archive)
            assert await world.log.read_run("x") == []
            result = await world.runner(Script(0)).run(
                AGENT, {"ask": ask}, tenant=tenant, run_id="x"
            )
            assert result.status == "completed"
            await world.fold()

    asyncio.run(written())
    return archive


def test_inspect_and_replay_count_the_same_retained_events(db: Path, tmp_path: Path) -> None:
    """Both name the compacted span with how many of its events were kept: the tagged event,
    the Tagged event and the last 2 resume points, not the one run that has them."""
    archive = tmp_path / "archive"
    result = onward(db, "compact", "--archive", str(archive), "--max-checkpoints", "2")
    assert result.exit_code == 0, result.output
    replay = onward(db, "replay", LIVE, "--tenant", TENANT, "--json")
    assert replay.exit_code == 0, replay.output
    retained = [json.loads(line)["retained"] for line in replay.stdout.splitlines()].count(True)
    assert retained == 4
    assert f"; {retained} retained (tags, last resume points)" in replay.stderr
    inspect = onward(db, "inspect", LIVE, "--tenant", TENANT)
    assert inspect.exit_code == 0, inspect.output
    assert f"; {retained} retained (tags, last resume points)" in inspect.stderr


def test_an_archive_that_cannot_be_written_cuts_nothing(db: Path, tmp_path: Path) -> None:
    before = asyncio.run(_sizes(db))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = onward(db, "compact", "--archive", str(blocker / "archive"), "--max-checkpoints", "2")
    assert result.exit_code == 2, result.output
    assert "cannot be written" in result.stderr
    assert "nothing was cut" in result.stderr
    assert asyncio.run(_sizes(db)) == before


def test_an_empty_archive_is_refused_not_taken_for_the_working_directory(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--archive "$ARCHIVE"`` with the variable unset: the empty path was the working
    directory, so the log was cut and archived wherever the command ran, said only as a path."""
    before = asyncio.run(_sizes(db))
    here = tmp_path / "cron-cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    for command in (["compact", "--max-checkpoints", "2"], ["replay", LIVE, "-t", TENANT]):
        result = onward(db, *command, "--archive", "")
        assert result.exit_code == 2, result.output
        assert "'--archive': must not be empty" in result.stderr, result.stderr
    assert asyncio.run(_sizes(db)) == before
    assert list(here.iterdir()) == []


def test_a_corrupt_manifest_stops_compaction_before_anything(db: Path, tmp_path: Path) -> None:
    before = asyncio.run(_sizes(db))
    archive = tmp_path / "archive"
    archive.mkdir()
    (archive / "manifest.json").write_text('{"format": 1, "ranges": [{"partition": ')
    result = onward(db, "compact", "--archive", str(archive), "--max-checkpoints", "2")
    assert result.exit_code == 5, result.output
    assert "ArchiveError" in result.stderr
    assert "manifest.json is corrupt" in result.stderr
    assert asyncio.run(_sizes(db)) == before


def test_without_an_archive_nothing_is_cut_and_it_says_why(db: Path) -> None:
    before = asyncio.run(_sizes(db))
    result = onward(db, "compact")
    assert result.exit_code == 0, result.output
    assert "nothing to cut (held by no archive" in result.stdout
    assert "give --archive DIR, or --no-archive to cut without one" in result.stdout
    assert asyncio.run(_sizes(db)) == before
    assert asyncio.run(_truncated(db)) == {}

    both = onward(db, "compact", "--archive", str(db.parent / "archive"), "--no-archive")
    assert both.exit_code == 2, both.output
    assert "not both" in both.stderr
    assert asyncio.run(_sizes(db)) == before

    cut = onward(db, "compact", "--no-archive")
    assert cut.exit_code == 0, cut.output
    assert "not archived" in cut.stdout
    assert asyncio.run(_sizes(db))[0][0] > 0


def test_what_holds_a_partition_without_an_archive_names_the_flags(db: Path) -> None:
    """Each partition held for want of an archive names the command line's flags, in the
    text and the JSON, never the Python keyword a command-line user cannot type."""
    result = onward(db, "compact")
    assert result.exit_code == 0, result.output
    held = [line for line in result.stdout.splitlines() if line.startswith("partition ")]
    assert held, result.stdout
    for line in held:
        assert "(held by no archive (give --archive DIR, or --no-archive to cut without" in line
    assert "no_archive" not in result.stdout

    as_json = onward(db, "compact", "--json")
    assert as_json.exit_code == 0, as_json.output
    partitions = json.loads(as_json.stdout)["partitions"]
    assert partitions
    for partition in partitions:
        assert "--no-archive" in partition["held_by"]
        assert "no_archive" not in partition["held_by"]


def test_a_dry_run_says_how_many_bytes_a_pass_would_free(db: Path, tmp_path: Path) -> None:
    result = onward(db, "compact", "--dry-run", "--archive", str(tmp_path / "archive"))
    assert result.exit_code == 0, result.output
    assert "bytes)" in result.stdout
    assert "held at" in result.stdout
    assert "by the projectors' positions" in result.stdout
    assert "would cut" in result.stdout


def test_one_run_is_compacted_logically_and_nothing_is_cut(db: Path, tmp_path: Path) -> None:
    before = asyncio.run(_sizes(db))
    result = onward(db, "compact", "--run", LIVE, "--archive", str(tmp_path / "archive"))
    assert result.exit_code == 0, result.output
    assert f"run {LIVE!r}: compacted logically (1 truncation point moved" in result.stdout
    assert asyncio.run(_sizes(db)) == before
    assert set(asyncio.run(_truncated(db))) == {LIVE}


async def _truncated(db: Path) -> dict[str, int]:
    async with SqliteCompactionStore(db) as store:
        points = await store.truncations([LIVE, "done"])
    return {run_id: point.before_seq for run_id, point in points.items()}


def test_an_unknown_run_is_refused_naming_it(db: Path, tmp_path: Path) -> None:
    """``--run`` with an id no store knows (a typo) says so with exit 1, as every command
    given a run id that names no run does, rather than report a run compacted."""
    before = asyncio.run(_sizes(db))
    result = onward(db, "compact", "--run", "nope", "--archive", str(tmp_path / "archive"))
    assert result.exit_code == 1, result.output
    assert "'nope'" in result.stderr
    assert "no such run" in result.stderr
    assert "compacted logically" not in result.stdout
    assert asyncio.run(_sizes(db)) == before
    # A run already compacted as far as it goes is still a run: nothing more to do, exit 0.
    assert onward(db, "compact", "--run", LIVE, "--archive", str(tmp_path / "a")).exit_code == 0
    again = onward(db, "compact", "--run", LIVE, "--archive", str(tmp_path / "a"))
    assert again.exit_code == 0, again.output
    assert f"run {LIVE!r}: compacted logically (0 truncation point moved" in again.stdout


def test_an_archive_given_by_a_relative_path_is_named_where_it_is(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cut records where its records went for every later reader, who runs from another
    directory (a shell elsewhere, a scheduled job): named as given, ``archive``, it would send
    them to an archive that is not there, or to another one of that name."""
    (tmp_path / "ops").mkdir()
    monkeypatch.chdir(tmp_path / "ops")
    result = onward(db, "compact", "--archive", "archive", "--max-checkpoints", "2")
    assert result.exit_code == 0, result.output
    where = tmp_path / "ops" / "archive"
    assert f"in {where}" in result.stdout
    monkeypatch.chdir(tmp_path)
    inspect = onward(db, "inspect", LIVE, "--tenant", TENANT)
    assert inspect.exit_code == 0, inspect.output
    assert f"archived in {where}" in inspect.stderr
    replay = onward(db, "replay", LIVE, "--tenant", TENANT)
    assert replay.exit_code == 0, replay.output
    assert f"archived in {where}" in replay.stderr


def test_replay_with_the_archive_of_a_reused_run_id_names_each_runs_tags_apart(
    tmp_path: Path,
) -> None:
    """The old run under id x was tagged, collected and cut into the archive; the tenant's new
    run x is tagged too. Read with the archive, the tags are said per run: one `tags:` line of
    both read as the new run's, its seq 3 tagged though only the old run's was."""
    archive = tmp_path / "archive"

    async def written() -> None:
        async with sqlite_world(tmp_path) as world:
            await world.finished_run("x", turns=1)
            await world.runner(Script(0)).tag("x", "old-note", tenant=TENANT, seq=3)
            await world.fold()
            await _collected_and_cut(world, tmp_path, archive)
            runner = world.runner(Script(0))
            await runner.run(AGENT, {"ask": "again"}, tenant=TENANT, run_id="x")
            await runner.tag("x", "new-note", tenant=TENANT, seq=1)

    asyncio.run(written())
    db = tmp_path / "onward.db"
    args = ("replay", "x", "--tenant", TENANT, "--archive", str(archive))
    shown = [json.loads(line) for line in onward(db, *args, "--json").stdout.splitlines()]
    old, new = [line["offset"] for line in shown if line["kind"] == "run.started"]
    replay = onward(db, *args)
    assert replay.exit_code == 0, replay.output
    tags = [line for line in replay.stdout.splitlines() if "tags" in line]
    assert tags == [
        f"tags of the run from offset {old}: seq 3 old-note",
        f"tags of the run from offset {new}: seq 1 new-note",
    ]


def test_replay_with_the_archive_splits_the_tags_of_a_reused_id_whose_first_start_was_cut(
    tmp_path: Path,
) -> None:
    """The old run under id x lost its start (cut by Kafka retention before compaction archived
    the rest), so only the new run has a counted start: the timeline still holds two runs, named
    as such, and each run's tags are said apart, not on one line as the new run's."""
    db = tmp_path / "onward.db"

    def env(seq: int, at: int) -> dict[str, Any]:
        return {"run_id": "x", "tenant": TENANT, "seq": seq, "fence": 1, "at": at}

    old: list[Event] = [
        RunClaimed(**env(2, 2), worker="w1"),
        Tagged(**env(3, 3), target_seq=2, label="old-note"),
        RunFinished(**env(4, 4), status="completed", output="done"),
    ]
    new: list[Event] = [
        RunStarted(**env(1, 5), agent="booker", revision="r1", input="again"),
        Tagged(**env(2, 6), target_seq=1, label="new-note"),
    ]

    async def written() -> None:
        async with SqliteEventLog(db, partitions=1) as log:
            await log.append(old)
            await log.append(new)

    asyncio.run(written())
    archive = tmp_path / "archive"
    archive.mkdir()
    replay = onward(db, "replay", "x", "--tenant", TENANT, "--archive", str(archive))
    assert replay.exit_code == 0, replay.output
    assert "2 runs are shown in turn" in replay.stderr
    tags = [line for line in replay.stdout.splitlines() if "tags" in line]
    assert tags == [
        "tags of the run from offset 0: seq 2 old-note",
        "tags of the run from offset 3: seq 1 new-note",
    ]
