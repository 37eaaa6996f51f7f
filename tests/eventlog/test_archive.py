"""`DirectoryArchive`: `ArchiveSinkConformance`, and what only a directory of files has."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zstandard

from onward.errors import ArchiveError, BackendUnavailableError
from onward.eventlog import MemoryEventLog, codec
from onward.eventlog import archive as archive_module
from onward.eventlog.archive import (
    ARCHIVE_FORMAT,
    MANIFEST,
    ArchivedRange,
    ArchiveSink,
    DirectoryArchive,
)
from onward.eventlog.base import Position, StoredEvent, keeping_records, strict
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


async def test_a_record_read_as_the_log_holds_it_is_archived_as_held(
    tmp_path: Path,
) -> None:
    """A field a newer writer added (this code ignores it) and a record's JSON spread over
    lines (a foreign producer's) are archived as the log held them, one record a line; an
    event given as decoded is archived as the codec encodes it, as before."""
    log = MemoryEventLog(partitions=1)
    (first, second) = records(0, range(2))
    newer = msgspec.json.decode(codec.encode(first.event))
    newer["reviewed_by"] = "a newer writer"
    log.write_raw(first.event.run_id, msgspec.json.encode(newer))
    log.write_raw(second.event.run_id, msgspec.json.format(codec.encode(second.event), indent=2))
    with keeping_records():
        read = strict(await log.read_records(0, 0, 2))
    archive = DirectoryArchive(tmp_path / "archive")
    entry = await archive.write(0, 0, 3, [*read, StoredEvent(Position(0, 2), first.event)])
    body = zstandard.ZstdDecompressor().stream_reader((archive.path / entry.file).read_bytes())
    lines = [msgspec.json.decode(line) for line in body.read().splitlines()]
    assert [line["event"].get("reviewed_by") for line in lines] == ["a newer writer", None, None]
    assert [line["event"] for line in lines[1:]] == [
        msgspec.json.decode(codec.encode(e.event)) for e in (second, first)
    ]
    back = strict(await DirectoryArchive(archive.path).read(0, 0, 3))
    assert [s.event for s in back] == [first.event, second.event, first.event]


def _written_by_hand(
    directory: Path, partition: int, start: int, end: int, lines: list[bytes]
) -> None:
    """A range file and its manifest entry as an older Onward could have written them: the
    lines as given, whatever their order."""
    directory.mkdir(exist_ok=True)
    name = archive_module.file_name(partition, start, end)
    body = zstandard.ZstdCompressor().compress(b"".join(line + b"\n" for line in lines))
    (directory / name).write_bytes(body)
    entry = {
        "partition": partition,
        "start": start,
        "end": end,
        "events": len(lines),
        "file": name,
        "size": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
    }
    path = directory / MANIFEST
    manifest: dict[str, Any] = (
        msgspec.json.decode(path.read_bytes()) if path.exists() else {"format": 1, "ranges": []}
    )
    manifest["ranges"].append(entry)
    path.write_bytes(msgspec.json.encode(manifest))


def _line(stored: StoredEvent) -> bytes:
    return msgspec.json.encode(
        {
            "offset": stored.position.offset,
            "run_id": stored.event.run_id,
            "event": msgspec.Raw(codec.encode(stored.event)),
        }
    )


async def test_a_range_an_older_writer_archived_out_of_order_reads_in_offset_order(
    tmp_path: Path,
) -> None:
    """Before writes were checked for order, a range could be archived in any order: a read
    still gives it back in offset order, as it promises (and as a fold must take it)."""
    written = records(0, range(4))
    _written_by_hand(tmp_path / "archive", 0, 0, 4, [_line(s) for s in reversed(written)])
    assert await DirectoryArchive(tmp_path / "archive").read(0, 0, 4) == written
    assert await DirectoryArchive(tmp_path / "archive").read(0, 1, 3) == written[1:3]


@pytest.mark.parametrize("offsets", [[0, 1, 1, 2], [0, 1, 2, 7]], ids=["twice", "outside"])
async def test_a_range_file_holding_an_offset_twice_or_outside_its_range_is_an_archive_error(
    tmp_path: Path, offsets: list[int]
) -> None:
    """Which of two records at one offset is the log's cannot be told; one outside the range
    its entry names was never archived as part of it."""
    _written_by_hand(tmp_path / "archive", 0, 0, 4, [_line(s) for s in records(0, offsets)])
    with pytest.raises(ArchiveError, match="offset"):
        await DirectoryArchive(tmp_path / "archive").read(0, 0, 4)


@pytest.mark.parametrize(("start", "end"), [(12, 3), (5, 5)], ids=["inverted", "empty"])
async def test_an_empty_or_inverted_entry_an_older_writer_left_blocks_no_later_write(
    tmp_path: Path, start: int, end: int
) -> None:
    """Before such ranges were refused, one could be recorded: it holds no record, and by the
    overlap test it would refuse every later range about it, stopping compaction for good."""
    _written_by_hand(tmp_path / "archive", 0, start, end, [])
    archive = DirectoryArchive(tmp_path / "archive")
    written = records(0, range(20))
    await archive.write(0, 0, 20, written)
    reopened = DirectoryArchive(tmp_path / "archive")
    assert spans(await reopened.ranges()) == [(0, 0, 20, 20)]
    assert await reopened.read(0, 0, 20) == written


async def test_an_inverted_entry_claiming_records_is_an_archive_error(tmp_path: Path) -> None:
    _written_by_hand(tmp_path / "archive", 0, 12, 3, [_line(s) for s in records(0, [4])])
    with pytest.raises(ArchiveError, match=r"\[12, 3\)"):
        await DirectoryArchive(tmp_path / "archive").ranges()


async def test_a_range_file_padded_with_blank_lines_is_an_archive_error(tmp_path: Path) -> None:
    """No writer leaves a blank line, and blank lines compress to next to nothing: a file a
    few MB long can hold terabytes of them, read for hours with no line ever over the bound.
    One is refused where it is read, like any other line that is not a record."""
    (first, second) = records(0, range(2))
    padding = b"\n" * (16 * 1024 * 1024)
    _written_by_hand(tmp_path / "archive", 0, 0, 2, [_line(first) + padding, _line(second)])
    assert (tmp_path / "archive" / archive_module.file_name(0, 0, 2)).stat().st_size < 64 * 1024
    with pytest.raises(ArchiveError, match="cannot be read back"):
        await DirectoryArchive(tmp_path / "archive").read(0, 0, 2)


async def test_loading_a_long_manifest_looks_up_no_file_per_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The manifest is loaded for every range listing and every read (a paging reader loads
    it several times a page): a file system lookup per entry at each load made 2,000 entries
    cost over 100 ms a load, and a read through a long archive grow with its size squared.
    Entries are checked by name at a load; a link out of the archive is refused at a read."""
    directory = tmp_path / "archive"
    directory.mkdir()
    entries = [
        {
            "partition": 0,
            "start": start,
            "end": start + 10,
            "events": 10,
            "file": archive_module.file_name(0, start, start + 10),
            "size": 1,
            "sha256": "0" * 64,
        }
        for start in range(0, 20_000, 10)
    ]
    (directory / MANIFEST).write_bytes(msgspec.json.encode({"format": 1, "ranges": entries}))
    resolved = 0
    resolve = Path.resolve

    def counting(self: Path, strict: bool = False) -> Path:
        nonlocal resolved
        resolved += 1
        return resolve(self, strict)

    monkeypatch.setattr(Path, "resolve", counting)
    assert len(await DirectoryArchive(directory).ranges()) == 2_000
    assert resolved == 0


_TOO_DEEP = b"[" * 100_000 + b"]" * 100_000
"""JSON nested past what a decoder recurses into: a few hundred KB, or under 1 KB compressed."""


async def test_a_manifest_nested_too_deep_is_an_archive_error(tmp_path: Path) -> None:
    """A damaged or hostile manifest nested too deep stopped a read (and a compaction) with a
    `RecursionError` traceback, not the error naming the manifest that any other damage gets."""
    directory = tmp_path / "archive"
    directory.mkdir()
    (directory / MANIFEST).write_bytes(b'{"format": 1, "ranges": [], "note": ' + _TOO_DEEP + b"}")
    with pytest.raises(ArchiveError, match=f"{MANIFEST} is corrupt"):
        await DirectoryArchive(directory).ranges()


async def test_a_range_file_nested_too_deep_is_an_archive_error(tmp_path: Path) -> None:
    (first,) = records(0, range(1))
    line = _line(first)[:-1] + b', "note": ' + _TOO_DEEP + b"}"
    _written_by_hand(tmp_path / "archive", 0, 0, 1, [line])
    with pytest.raises(ArchiveError, match="cannot be read back"):
        await DirectoryArchive(tmp_path / "archive").read(0, 0, 1)


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """The inodes of every file and directory synced from here on (``os.fsync`` recorded)."""
    inodes: set[int] = set()
    fsync = os.fsync

    def recording(fd: int) -> None:
        inodes.add(os.fstat(fd).st_ino)
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording)
    return inodes


async def test_the_directories_a_first_write_creates_are_synced_into_their_parents(
    tmp_path: Path, synced: set[int]
) -> None:
    """The first write creates the archive directory (and its missing parents): its files and
    its own entries were synced, never its name in its parent, so a crash after compaction
    cut the log could lose the whole archive, and with it every record cut."""
    directory = tmp_path / "deep" / "archive"
    await DirectoryArchive(directory).write(0, 0, 4, records(0, range(4)))
    assert {os.stat(tmp_path).st_ino, os.stat(directory.parent).st_ino} <= synced


@pytest.mark.parametrize(
    ("partition", "start", "field"),
    [(-1, 0, "partition -1"), (0, -5, "start -5")],
    ids=["partition", "start"],
)
async def test_a_manifest_entry_below_offset_zero_is_an_archive_error(
    tmp_path: Path, partition: int, start: int, field: str
) -> None:
    """No log has a negative partition or offset, and no writer records one (a write refuses
    it): a damaged or hand-edited manifest holding one was read as it stood, an entry that
    reads and overlaps like a real range. It is refused naming the field and the manifest."""
    _written_by_hand(tmp_path / "archive", partition, start, 4, [])
    with pytest.raises(ArchiveError, match=field) as refused:
        await DirectoryArchive(tmp_path / "archive").ranges()
    assert MANIFEST in str(refused.value)


async def test_an_archive_directory_made_before_a_crash_is_synced_into_its_parent(
    tmp_path: Path, synced: set[int]
) -> None:
    """A process that crashed between making the archive directory and syncing it into its
    parent left a directory the next write found there and took as durable: its name was
    never synced, and an OS crash after that write's cut could lose the whole archive."""
    directory = tmp_path / "archive"
    directory.mkdir(mode=archive_module.DIRECTORY_MODE)
    await DirectoryArchive(directory).write(0, 0, 4, records(0, range(4)))
    assert os.stat(tmp_path).st_ino in synced
