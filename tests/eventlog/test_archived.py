"""`ArchivedEventLog`: an archive and the log it was cut from, read as one log."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import pytest

from onward.errors import CheckpointFormatError
from onward.eventlog import codec
from onward.eventlog.archive import ArchivedRange, DirectoryArchive
from onward.eventlog.archived import ArchivedEventLog
from onward.eventlog.base import KeptRecord, LogRecord, UnreadableRecord, partition_for
from onward.eventlog.memory import MemoryEventLog
from onward.testing.eventlog import new_run_id, step_events

if TYPE_CHECKING:
    from onward.eventlog.archive import _Cursor


class _CountingArchive(DirectoryArchive):
    """A `DirectoryArchive` that counts the files it decompresses for a read: to read on
    from (`_open`) or whole (`_read_file`)."""

    opened: int = 0

    def _open(self, entry: ArchivedRange) -> _Cursor | None:
        self.opened += 1
        return super()._open(entry)

    def _read_file(self, entry: ArchivedRange, *span: int | None) -> list[LogRecord]:
        self.opened += 1
        return super()._read_file(entry, *span)


async def test_paging_through_an_archive_opens_each_file_once(tmp_path: Path) -> None:
    """A reader paging with ``limit`` (as over any log) reads the files each page needs, not
    every file from the page's start to the log's: a long archive is read once over, not
    once per page (at 100,000 events a file, thousands of files decompressed a page)."""
    log = MemoryEventLog(partitions=1)
    run = new_run_id()
    await log.append(step_events(run, 40))
    archive = _CountingArchive(tmp_path / "archive")
    kept = await log.read_partition(0, 0)
    for start in (0, 10, 20):
        await archive.write(0, start, start + 10, kept[start : start + 10])
    await log.truncate_before(0, 30)
    whole = ArchivedEventLog(log, archive)

    seen: list[int] = []
    offset = 0
    while page := await whole.read_records(0, offset, limit=5):
        seen.extend(r.position.offset for r in page)
        offset = page[-1].position.offset + 1

    assert seen == list(range(40))
    assert archive.opened == 3


class _ReadCountingArchive(DirectoryArchive):
    """A `DirectoryArchive` that counts the records its reads give back (each one decoded)."""

    given: int = 0

    async def read(self, partition: int, start: int, end: int) -> list[LogRecord]:
        records = await super().read(partition, start, end)
        self.given += len(records)
        return records


async def test_paging_through_one_run_decodes_the_archive_about_once(tmp_path: Path) -> None:
    """A reader paging through one run with ``limit`` read the archive to its range's end at
    every page, decoding every run's records past the page's last: one run of ten paged 100
    at a time through a file of 20,000 records decoded the file over ten times."""
    log = MemoryEventLog(partitions=1)
    runs = [new_run_id() for _ in range(10)]
    events = {run: step_events(run, 500) for run in runs}
    for at in range(0, 500, 10):
        for run in runs:
            await log.append(events[run][at : at + 10])
    kept = await log.read_partition(0, 0)
    archive = _ReadCountingArchive(tmp_path / "archive")
    await archive.write(0, 0, len(kept), kept)
    await log.truncate_before(0, len(kept))
    whole = ArchivedEventLog(log, archive)

    seen: list[int] = []
    offset = 0
    while page := await whole.read_records(0, offset, run_id=runs[0], limit=100):
        seen.extend(r.event.seq for r in page if not isinstance(r, UnreadableRecord))
        offset = page[-1].position.offset + 1

    assert seen == list(range(1, 501))
    assert archive.given <= 2 * len(kept)


async def test_paging_through_partitions_in_turn_opens_each_file_once(tmp_path: Path) -> None:
    """A rebuild reads a page of every partition in turn: each partition's file is read once
    over, not once a page because the page of another partition was read in between (at
    100,000 events a file and 5,000 a page, twenty times over, for every partition)."""
    log = MemoryEventLog(partitions=3)
    archive = _CountingArchive(tmp_path / "archive")
    runs = {partition_for(run, 3): run for run in (new_run_id() for _ in range(60))}
    for partition, run in sorted(runs.items()):
        await log.append(step_events(run, 40))
        await archive.write(partition, 0, 40, await log.read_partition(partition, 0))
        await log.truncate_before(partition, 40)
    whole = ArchivedEventLog(log, archive)

    seen: dict[int, list[int]] = {partition: [] for partition in runs}
    for start in range(0, 40, 5):
        for partition in runs:
            page = await whole.read_records(partition, start, start + 5)
            seen[partition].extend(r.position.offset for r in page)

    assert seen == {partition: list(range(40)) for partition in runs}
    assert archive.opened == len(runs) == 3


async def test_an_archived_record_of_a_newer_format_reads_as_unreadable_as_in_the_log(
    tmp_path: Path,
) -> None:
    """A newer Onward archived a record in a format this code cannot read (a mixed-version
    deployment): a rebuild or audit reading the archive gets it as an `UnreadableRecord` in
    its place, as the live log gives it, so the run is set aside and every other run folded,
    instead of the whole read stopping on it."""
    log = MemoryEventLog(partitions=1)
    run, other = new_run_id(), new_run_id()
    await log.append(step_events(run, 3))
    await log.append(step_events(other, 3))
    kept = await log.read_partition(0, 0)
    newer = msgspec.json.decode(codec.encode(kept[1].event))
    newer["format"] += 1
    archived = [*kept]
    archived[1] = KeptRecord(kept[1].position, kept[1].event, msgspec.json.encode(newer))
    archive = DirectoryArchive(tmp_path / "archive")
    await archive.write(0, 0, 6, archived)
    await log.truncate_before(0, 6)
    whole = ArchivedEventLog(log, DirectoryArchive(archive.path))

    read = await whole.read_records(0)

    unreadable = read[1]
    assert isinstance(unreadable, UnreadableRecord)
    assert (unreadable.position.offset, unreadable.run_id) == (1, run)
    assert unreadable.newer_format
    assert [r for i, r in enumerate(read) if i != 1] == [s for i, s in enumerate(kept) if i != 1]
    assert await whole.read_records(0, run_id=other) == kept[3:]
    assert [r.position.offset for r in await whole.read_records(0, run_id=run)] == [0, 1, 2]
    with pytest.raises(CheckpointFormatError):
        await whole.read_run(run)
