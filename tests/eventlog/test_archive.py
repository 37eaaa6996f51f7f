"""`DirectoryArchive`: ranges written durably, recognised when written again, checked on read."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from onward.errors import ArchiveError, InvalidInputError
from onward.eventlog import RunStarted, StoredEvent
from onward.eventlog.archive import DirectoryArchive
from onward.eventlog.base import Position


def events(partition: int, start: int, end: int) -> list[StoredEvent]:
    return [
        StoredEvent(
            Position(partition, offset),
            RunStarted(run_id=f"r{offset}", tenant="acme", seq=1, fence=1, agent="a", revision="1"),
        )
        for offset in range(start, end)
    ]


async def test_a_range_reads_back_and_writing_it_again_changes_nothing(tmp_path: Path) -> None:
    archive = DirectoryArchive(tmp_path / "archive")
    first = await archive.write(2, 0, 10, events(2, 0, 10))
    manifest = (tmp_path / "archive" / "manifest.json").read_bytes()
    assert await archive.write(2, 0, 10, events(2, 0, 10)) == first
    assert (tmp_path / "archive" / "manifest.json").read_bytes() == manifest
    assert await DirectoryArchive(tmp_path / "archive").read(2, 3, 6) == events(2, 3, 6)
    assert [(r.start, r.end, r.events) for r in await archive.ranges(2)] == [(0, 10, 10)]


async def test_ranges_that_overlap_or_records_outside_are_refused(tmp_path: Path) -> None:
    archive = DirectoryArchive(tmp_path)
    await archive.write(0, 0, 10, events(0, 0, 10))
    with pytest.raises(InvalidInputError, match=r"\[5, 15\) overlaps the archived range \[0, 10\)"):
        await archive.write(0, 5, 15, events(0, 5, 15))
    with pytest.raises(InvalidInputError, match="offset 20 lies outside it"):
        await archive.write(0, 10, 20, events(0, 10, 21))
    assert [(r.start, r.end) for r in await archive.ranges()] == [(0, 10)]


async def test_a_file_that_fails_its_checksum_is_an_archive_error(tmp_path: Path) -> None:
    archive = DirectoryArchive(tmp_path)
    entry = await archive.write(0, 0, 4, events(0, 0, 4))
    path = tmp_path / entry.file
    body = bytearray(await asyncio.to_thread(path.read_bytes))
    body[-1] ^= 0xFF
    await asyncio.to_thread(path.write_bytes, bytes(body))
    with pytest.raises(ArchiveError, match=f"{entry.file} has {entry.size} bytes with SHA-256"):
        await DirectoryArchive(tmp_path).read(0, 0, 4)
    with pytest.raises(ArchiveError):
        await archive.write(0, 0, 4, events(0, 0, 4))
