"""Files at rest and what the CLI prints: stored files are private, archive manifests stay in
their archive, decompression is bounded, and run content cannot drive the operator's terminal."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import zstandard
from support.fleet import agents, script
from typer.testing import CliRunner, Result

from onward.errors import ArchiveError, ResumeConflictError
from onward.eventlog import (
    Event,
    Message,
    ModelAnswered,
    RunClaimed,
    RunStarted,
    SqliteEventLog,
    StoredEvent,
    Tagged,
    ToolCall,
    ToolCompleted,
    ToolDispatched,
    ToolError,
    TurnSettled,
)
from onward.eventlog.archive import MANIFEST, MAX_LINE_BYTES, DirectoryArchive
from onward.eventlog.base import Position
from onward.projections.audit import printable
from onward.runtime.backends import open_backends
from onward.runtime.cli import app
from onward.runtime.cli._common import refuse
from onward.runtime.cli.progress import TurnLines
from onward.runtime.fleet.requests import ResumeRun
from onward.runtime.fleet.worker import Worker
from onward.runtime.providers import ScriptedProvider
from onward.runtime.settings import Settings
from onward.testing.eventlog import Envelope, new_run_id, step_events


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The common umask, under which files default to 0644 and directories to 0755."""
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def events(partition: int, start: int, end: int) -> list[StoredEvent]:
    return [
        StoredEvent(
            Position(partition, offset),
            RunStarted(run_id=f"r{offset}", tenant="acme", seq=1, fence=1, agent="a", revision="1"),
        )
        for offset in range(start, end)
    ]


async def test_the_sqlite_file_and_its_companions_are_private(
    tmp_path: Path, umask_022: None
) -> None:
    """security review #14: the database, its -wal and -shm files and its lock files are 0600."""
    path = tmp_path / "onward.db"
    async with SqliteEventLog(path, partitions=2) as log:
        await log.append(step_events(new_run_id(), 3))
        async with log.exclusive("projector"):
            companions = [
                Path(f"{path}-wal"),
                Path(f"{path}-shm"),
                tmp_path / "onward.db.projector.lock",
            ]
            assert all(p.exists() for p in companions)
            assert {p.name: mode(p) for p in [path, *companions]} == {
                p.name: 0o600 for p in [path, *companions]
            }


async def test_archive_directory_and_files_are_private(tmp_path: Path, umask_022: None) -> None:
    """security review #14: the archive directory is 0700 and its files 0600."""
    archive = DirectoryArchive(tmp_path / "archive")
    entry = await archive.write(0, 0, 3, events(0, 0, 3))
    assert mode(tmp_path / "archive") == 0o700
    assert mode(tmp_path / "archive" / entry.file) == 0o600
    assert mode(tmp_path / "archive" / MANIFEST) == 0o600


async def test_a_manifest_pointing_into_a_sibling_archive_is_refused(tmp_path: Path) -> None:
    """security review #14: an entry naming ``../other/...`` is refused, naming the entry,
    instead of reading another archive's runs."""
    other = DirectoryArchive(tmp_path / "other")
    secret = await other.write(0, 0, 3, events(0, 0, 3))
    mine = DirectoryArchive(tmp_path / "mine")
    await mine.write(1, 0, 1, events(1, 0, 1))
    forged = msgspec.structs.replace(secret, file=f"../other/{secret.file}")
    manifest = {"format": 1, "ranges": [msgspec.to_builtins(forged)]}
    (tmp_path / "mine" / MANIFEST).write_bytes(msgspec.json.encode(manifest))
    with pytest.raises(ArchiveError, match=rf"names file '\.\./other/{secret.file}'"):
        await mine.read(0, 0, 3)


async def test_an_absolute_path_in_a_manifest_is_refused(tmp_path: Path) -> None:
    """security review #14: an absolute ``file`` in a manifest entry is refused."""
    archive = DirectoryArchive(tmp_path / "a")
    entry = await archive.write(0, 0, 2, events(0, 0, 2))
    absolute = str((tmp_path / "a" / entry.file).resolve())
    manifest = {
        "format": 1,
        "ranges": [msgspec.to_builtins(msgspec.structs.replace(entry, file=absolute))],
    }
    (tmp_path / "a" / MANIFEST).write_bytes(msgspec.json.encode(manifest))
    with pytest.raises(ArchiveError, match="names file"):
        await DirectoryArchive(tmp_path / "a").ranges()


def _plant(archive: Path, entry_file: str, body: bytes, events_claimed: int) -> None:
    """Replace an archive's one file with ``body`` and make its manifest agree with it."""
    (archive / entry_file).write_bytes(body)
    manifest = msgspec.json.decode((archive / MANIFEST).read_bytes())
    manifest["ranges"][0].update(
        size=len(body), sha256=hashlib.sha256(body).hexdigest(), events=events_claimed
    )
    (archive / MANIFEST).write_bytes(msgspec.json.encode(manifest))


async def test_a_decompression_bomb_is_refused_unread(tmp_path: Path) -> None:
    """security review #14: a frame decompressing past the line bound is an ArchiveError, not a
    whole decompression into memory."""
    archive = DirectoryArchive(tmp_path)
    entry = await archive.write(0, 0, 1, events(0, 0, 1))
    compressor = zstandard.ZstdCompressor(level=1)
    bomb = compressor.compress(b"x" * (MAX_LINE_BYTES + 2 * 1024 * 1024))
    _plant(tmp_path, entry.file, bomb, 1)
    with pytest.raises(ArchiveError, match=f"decompresses to a line over {MAX_LINE_BYTES} bytes"):
        await DirectoryArchive(tmp_path).read(0, 0, 1)


async def test_a_file_that_is_not_zstd_is_an_archive_error(tmp_path: Path) -> None:
    """security review #14: a zstd error reading a file (its checksum forged to match) is the
    archive's typed error, naming the file."""
    archive = DirectoryArchive(tmp_path)
    entry = await archive.write(0, 0, 1, events(0, 0, 1))
    _plant(tmp_path, entry.file, b"not a zstd frame at all", 1)
    with pytest.raises(ArchiveError, match=f"{entry.file} cannot be read back"):
        await DirectoryArchive(tmp_path).read(0, 0, 1)


async def test_a_line_that_is_not_json_is_an_archive_error(tmp_path: Path) -> None:
    """security review #14: a line that does not decode is the archive's typed error."""
    archive = DirectoryArchive(tmp_path)
    entry = await archive.write(0, 0, 1, events(0, 0, 1))
    _plant(tmp_path, entry.file, zstandard.ZstdCompressor().compress(b"{not json\n"), 1)
    with pytest.raises(ArchiveError, match=f"{entry.file} cannot be read back"):
        await DirectoryArchive(tmp_path).read(0, 0, 1)


async def test_a_planted_temporary_link_is_not_written_through(tmp_path: Path) -> None:
    """security review #14: a symlink planted where the manifest's temporary file goes is
    replaced, and the file it points at is left untouched."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    directory = tmp_path / "archive"
    archive = DirectoryArchive(directory)
    await archive.ready()
    (directory / f"{MANIFEST}.tmp").symlink_to(victim)
    await archive.write(0, 0, 2, events(0, 0, 2))
    assert victim.read_bytes() == b"precious"
    assert await DirectoryArchive(directory).read(0, 0, 2) == events(0, 0, 2)
    assert not (directory / f"{MANIFEST}.tmp").exists()
    assert await asyncio.to_thread(lambda: sorted(p.name for p in directory.iterdir())) == [
        MANIFEST,
        "p00000-000000000000-000000000002.jsonl.zst",
    ]


HOSTILE = "\x1b]0;OWNED\x07\x1b[2J"
"""Retitles the operator's window and clears the screen, printed raw."""


def hostile_run(db: Path) -> str:
    """A run in ``db`` whose model, tool, worker and tag wrote escape sequences."""
    run_id = f"run-{new_run_id()}"
    call = ToolCall(call_id="c1\x1b[8m", tool="look\x1b[1m")

    def env(seq: int) -> Envelope:
        return Envelope(run_id=run_id, tenant="acme", seq=seq, fence=1, at=seq)

    history: list[Event] = [
        RunStarted(**env(1), agent="booker\x1b[8m", revision="r1", input=f"hi{HOSTILE}"),
        RunClaimed(**env(2), worker=f"w{HOSTILE}"),
        ModelAnswered(**env(3), message=Message(role="assistant", content=""), tool_calls=[call]),
        ToolDispatched(**env(4), call_id=call.call_id, tool=call.tool, idempotency_key="k"),
        ToolCompleted(**env(5), call_id=call.call_id, result=HOSTILE),
        Tagged(**env(6), target_seq=5, label="looked\x1b[2J\x9b31m"),
    ]

    async def write() -> None:
        async with SqliteEventLog(db) as log:
            await log.append(history)

    asyncio.run(write())
    return run_id


def onward(db: Path, *args: str) -> Result:
    """The command line against the SQLite file ``db``, as tests/runtime/test_cli.py runs it."""
    env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)}
    return CliRunner().invoke(app, list(args), env=env)


def test_replay_shows_escape_sequences_of_a_run_escaped(tmp_path: Path) -> None:
    """security review #15: a tool result holding OSC and CSI sequences and a label holding ESC
    reach `onward replay`'s table as visible escapes, never as a raw ESC byte."""
    db = tmp_path / "onward.db"
    run_id = hostile_run(db)
    result = onward(db, "replay", run_id, "--tenant", "acme")
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output
    assert "\x07" not in result.output
    assert "\x9b" not in result.output
    assert "\\x1b]0;OWNED\\x07" in result.stdout
    assert "tags: seq 5 looked\\x1b[2J\\x9b31m" in result.stdout


def test_inspect_shows_escape_sequences_of_a_run_escaped(tmp_path: Path) -> None:
    """security review #15: `onward inspect` shows the run's agent, call, tool and tag with
    their escapes visible and no raw ESC byte."""
    db = tmp_path / "onward.db"
    run_id = hostile_run(db)
    result = onward(db, "inspect", run_id, "--tenant", "acme")
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output
    assert "\x9b" not in result.output
    assert "booker\\x1b[8m" in result.stdout
    assert "c1\\x1b[8m" in result.stdout
    assert "looked\\x1b[2J" in result.stdout


def failed_call_run(db: Path) -> tuple[str, list[Event]]:
    """A run in ``db`` whose tool failed with an error type holding escape sequences (a class
    named at run time, or a record written by a producer on the log); its id and events."""
    run_id = f"run-{new_run_id()}"
    call = ToolCall(call_id="c1", tool="look")

    def env(seq: int) -> Envelope:
        return Envelope(run_id=run_id, tenant="acme", seq=seq, fence=1, at=seq)

    history: list[Event] = [
        RunStarted(**env(1), agent="booker", revision="r1", input="hi"),
        RunClaimed(**env(2), worker="w"),
        ModelAnswered(**env(3), message=Message(role="assistant", content=""), tool_calls=[call]),
        ToolDispatched(**env(4), call_id="c1", tool="look", idempotency_key="k"),
        ToolCompleted(**env(5), call_id="c1", error=ToolError(type=f"Err{HOSTILE}", message="x")),
        TurnSettled(**env(6), iteration=1, call_ids=["c1"]),
    ]

    async def write() -> None:
        async with SqliteEventLog(db) as log:
            await log.append(history)

    asyncio.run(write())
    return run_id, history


async def test_a_turns_progress_line_shows_a_failed_calls_error_type_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """security review #15: `onward start` and `run` print a line per settled turn naming how
    each call failed; the error type went out as stored, ESC sequences and all."""
    _, history = await asyncio.to_thread(failed_call_run, tmp_path / "onward.db")
    await TurnLines().appended(history)
    printed = capsys.readouterr().err
    assert "\x1b" not in printed
    assert "\x07" not in printed
    assert "look failed (Err\\x1b]0;OWNED\\x07\\x1b[2J)" in printed


async def test_a_worker_told_to_resume_a_run_of_an_agent_it_lacks_logs_the_id_escaped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """security review #15: a run a producer named with ESC sequences, resumed on a worker
    without its agent, was named as stored in the worker's log line, reaching the terminal
    of whoever follows the log."""
    run_id = f"run{HOSTILE}"
    settings = Settings.model_validate(
        {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "fleet.db")}
    )
    caplog.set_level(logging.WARNING, logger="onward.worker")
    async with open_backends(settings) as backends:
        await backends.log.append(
            [
                RunStarted(
                    **Envelope(run_id=run_id, tenant="acme", seq=1, fence=1, at=1),
                    agent="ghost",
                    revision="r1",
                    input="hi",
                ),
                RunClaimed(
                    **Envelope(run_id=run_id, tenant="acme", seq=2, fence=1, at=2), worker="w"
                ),
            ]
        )
        worker = Worker(backends, ScriptedProvider(script), agents)
        assert await worker.handle(ResumeRun(run_id=run_id, tenant="acme"))

    [line] = [r.getMessage() for r in caplog.records if "no agent 'ghost'" in r.getMessage()]
    assert "\x1b" not in line
    assert "\x07" not in line
    assert line.startswith("run run\\x1b]0;OWNED\\x07\\x1b[2J: no agent 'ghost' here")


def test_printable_escapes_every_control_and_keeps_the_rest() -> None:
    """security review #15: the helper worker log lines can use escapes C0, DEL, C1 and
    bidirectional overrides, and leaves ordinary text (accents, emoji) as it is."""
    assert printable(f"é 🙂 ok{HOSTILE}\x7f\x9b\u202e\n") == (
        "é 🙂 ok\\x1b]0;OWNED\\x07\\x1b[2J\\x7f\\x9b\\u202e\\x0a"
    )


def test_a_refusal_naming_run_content_prints_it_escaped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """security review #15: the CLI's error line shows the holder a conflict names (a worker
    name anyone can choose) with its escapes visible, never as a raw ESC byte."""
    conflict = ResumeConflictError(f"run r is held by w{HOSTILE}", run_id="r", holder=f"w{HOSTILE}")
    refuse(conflict, tenant="acme")
    printed = capsys.readouterr().err
    assert "\x1b" not in printed
    assert "\x07" not in printed
    assert "held by w\\x1b]0;OWNED\\x07\\x1b[2J" in printed
