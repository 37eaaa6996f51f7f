"""Files at rest: stored files are private, archive manifests stay in their archive, and
decompression is bounded."""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import zstandard

from onward.errors import ArchiveError
from onward.eventlog import RunStarted, SqliteEventLog, StoredEvent
from onward.eventlog.archive import MANIFEST, MAX_LINE_BYTES, DirectoryArchive
from onward.eventlog.base import Position
from onward.testing.eventlog import new_run_id, step_events


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
