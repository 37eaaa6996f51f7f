"""`DirectoryArchive`: `ArchiveSinkConformance`, and what only a directory of files has."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path

import msgspec
import pytest

from onward.errors import ArchiveError, BackendUnavailableError
from onward.eventlog import archive as archive_module
from onward.eventlog.archive import (
    ARCHIVE_FORMAT,
    MANIFEST,
    ArchivedRange,
    ArchiveSink,
    DirectoryArchive,
)
from onward.testing import ArchiveSinkConformance
from onward.testing.archive import records, spans

if sys.platform != "win32":
    import fcntl


def _directory(archive: ArchiveSink) -> Path:
    assert isinstance(archive, DirectoryArchive)
    return archive.path


def _rewrite_manifest(
    archive: ArchiveSink, change: dict[str, object], entry: ArchivedRange | None = None
) -> None:
    """Change top-level fields of the manifest, or with ``entry`` the fields of its range."""
    path = _directory(archive) / MANIFEST
    manifest = msgspec.json.decode(path.read_bytes())
    if entry is None:
        manifest.update(change)
    else:
        (found,) = (
            r
            for r in manifest["ranges"]
            if (r["partition"], r["start"], r["end"]) == (entry.partition, entry.start, entry.end)
        )
        found.update(change)
    path.write_bytes(msgspec.json.encode(manifest))


class TestDirectoryArchive(ArchiveSinkConformance):
    folder: Path

    @pytest.fixture(autouse=True)
    def _folder(self, tmp_path: Path) -> None:
        self.folder = tmp_path

    async def open_archive(self) -> ArchiveSink:
        return DirectoryArchive(self.folder / "archive")

    async def reopen(self, archive: ArchiveSink) -> ArchiveSink:
        return DirectoryArchive(_directory(archive))

    async def open_unwritable(self) -> ArchiveSink:
        in_the_way = self.folder / "a-file"
        in_the_way.write_bytes(b"")
        return DirectoryArchive(in_the_way / "archive")

    async def damage_manifest(self, archive: ArchiveSink) -> None:
        (_directory(archive) / MANIFEST).write_bytes(b'{"format": 1, "ranges": [')

    async def mark_manifest_newer(self, archive: ArchiveSink) -> None:
        _rewrite_manifest(archive, {"format": ARCHIVE_FORMAT + 1})

    async def damage_range(self, archive: ArchiveSink, entry: ArchivedRange) -> None:
        path = _directory(archive) / entry.file
        body = bytearray(path.read_bytes())
        body[-1] ^= 0xFF
        path.write_bytes(bytes(body))

    async def point_entry_at(self, archive: ArchiveSink, entry: ArchivedRange, file: str) -> None:
        _rewrite_manifest(archive, {"file": file}, entry)

    async def names_outside(self, archive: ArchiveSink, entry: ArchivedRange) -> list[str]:
        directory = _directory(archive)
        elsewhere = directory.parent / "elsewhere"
        elsewhere.mkdir(exist_ok=True)
        copy = elsewhere / entry.file
        shutil.copyfile(directory / entry.file, copy)
        return [f"../elsewhere/{entry.file}", str(copy), str(copy.resolve())]

    async def test_a_rerun_leaves_the_manifest_byte_for_byte(self, archive: ArchiveSink) -> None:
        written = records(2, range(10))
        await archive.write(2, 0, 10, written)
        manifest = (_directory(archive) / MANIFEST).read_bytes()
        await DirectoryArchive(_directory(archive)).write(2, 0, 10, written)
        assert (_directory(archive) / MANIFEST).read_bytes() == manifest

    async def test_a_range_file_that_is_a_link_out_of_the_archive_is_refused(
        self, archive: ArchiveSink
    ) -> None:
        """The entry names the very file this archive writes for its range, but that file is
        a link to a copy outside: the manifest is right and the read still must not leave."""
        entry = await archive.write(0, 0, 4, records(0, range(4)))
        directory = _directory(archive)
        outside = directory.parent / "outside.jsonl.zst"
        (directory / entry.file).rename(outside)
        (directory / entry.file).symlink_to(outside)
        with pytest.raises(ArchiveError, match="names file"):
            await DirectoryArchive(directory).read(0, 0, 4)

    async def test_a_file_gone_from_the_archive_is_an_archive_error(
        self, archive: ArchiveSink
    ) -> None:
        entry = await archive.write(0, 0, 4, records(0, range(4)))
        await asyncio.to_thread((_directory(archive) / entry.file).unlink)
        with pytest.raises(ArchiveError, match=f"cannot read {entry.file}"):
            await DirectoryArchive(_directory(archive)).read(0, 0, 4)

    @pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")
    async def test_a_write_waiting_on_a_stuck_lock_holder_gives_up_and_says_so(
        self, archive: ArchiveSink, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Another process holding the directory's lock for ever (a compaction hung mid-pass)
        must fail this pass in bounded time, naming what it waited on, not hang it: the thread
        waiting on the lock cannot be cancelled, so shutdown would hang with it."""
        await archive.write(0, 0, 4, records(0, range(4)))
        monkeypatch.setattr(archive_module, "LOCK_TIMEOUT_S", 0.3, raising=False)  # not 60 s
        directory = _directory(archive)
        holder = os.open(directory, os.O_RDONLY)
        fcntl.flock(holder, fcntl.LOCK_EX)  # another open file description: another holder
        try:
            blocked = DirectoryArchive(directory)
            with pytest.raises(BackendUnavailableError, match="lock") as raised:
                await asyncio.wait_for(blocked.write(0, 4, 8, records(0, range(4, 8))), 10)
            assert str(directory) in str(raised.value)
        finally:
            os.close(holder)
        assert spans(await DirectoryArchive(directory).ranges()) == [(0, 0, 4, 4)]
