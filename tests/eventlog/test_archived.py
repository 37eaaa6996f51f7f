"""`ArchivedEventLog`: an archive and the log it was cut from, read as one log."""

from __future__ import annotations

from pathlib import Path

from onward.eventlog.archive import ArchivedRange, DirectoryArchive
from onward.eventlog.archived import ArchivedEventLog
from onward.eventlog.base import StoredEvent
from onward.eventlog.memory import MemoryEventLog
from onward.testing.eventlog import new_run_id, step_events


class _CountingArchive(DirectoryArchive):
    """A `DirectoryArchive` that counts the files it decompresses."""

    opened: int = 0

    def _read_file(self, entry: ArchivedRange) -> list[StoredEvent]:
        self.opened += 1
        return super()._read_file(entry)


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
