"""`ArchiveSinkConformance`: the behaviour every `ArchiveSink` must show.

Compaction writes each prefix of a partition it is about to cut to the archive, and cuts only
once the write has returned; ``onward replay --archive`` and ``onward projections rebuild
--archive`` read it back, through other processes, for as long as the history is kept. So an
archive must give back exactly the records it was given, keep its manifest whole (no range
lost to a concurrent write, none overlapping another, a rerun recognised as its own work), and
refuse, with `ArchiveError`, a manifest or a range that is not what was written, including a
manifest entry that would lead a read outside the archive.

Subclass it once per implementation and implement the hooks: :meth:`open_archive` (an empty
archive), :meth:`reopen` (another sink over the same archive, as another process would open
it), :meth:`open_unwritable`, and the ones that damage an archive as a failing disk, an
operator's mistake or an attacker would: :meth:`damage_manifest`, :meth:`mark_manifest_newer`,
:meth:`damage_range`, :meth:`point_entry_at` and :meth:`names_outside`. Needs pytest and
pytest-asyncio (``asyncio_mode = "auto"``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import AsyncExitStack
from typing import cast

import pytest
import pytest_asyncio

from onward.errors import ArchiveError, ConfigurationError, InvalidInputError
from onward.eventlog.archive import ArchivedRange, ArchiveSink
from onward.eventlog.base import Position, StoredEvent
from onward.eventlog.events import AnyEvent

from .eventlog import new_run_id, step_events

CONCURRENT_WRITES = 6
"""How many ranges are written to one archive at once in the lost-update test."""


def records(partition: int, offsets: Iterable[int]) -> list[StoredEvent]:
    """Records at ``offsets`` of a partition: the events of two runs taking turns, in the
    shapes of several kinds, with text beyond ASCII."""
    runs = (new_run_id(), new_run_id())
    chosen = list(offsets)
    events = cast(
        list[AnyEvent],
        [
            *step_events(runs[0], len(chosen), body="ünï ✓"),
            *step_events(runs[1], len(chosen), body="日本"),
        ],
    )
    return [
        StoredEvent(Position(partition, offset), events[(i % 2) * len(chosen) + i // 2])
        for i, offset in enumerate(chosen)
    ]


def spans(entries: Sequence[ArchivedRange]) -> list[tuple[int, int, int, int]]:
    """Each entry's partition, start, end and event count: what a manifest says of a range."""
    return [(e.partition, e.start, e.end, e.events) for e in entries]


class ArchiveSinkConformance:
    """The contract of `ArchiveSink`. Subclass per implementation; every test must pass
    unchanged.

    Attributes:
        exit_stack: Unwound after each test: ``open_archive`` may enter into it what its
            archive needs for the test (a bucket, a directory).
    """

    exit_stack: AsyncExitStack

    async def open_archive(self) -> ArchiveSink:
        """A new, empty archive of this test's own."""
        raise NotImplementedError

    async def reopen(self, archive: ArchiveSink) -> ArchiveSink:
        """Another sink over ``archive``'s storage, sharing nothing with it in memory: what
        replay opens after compaction wrote the archive, or a compactor rerun after a crash."""
        raise NotImplementedError

    async def open_unwritable(self) -> ArchiveSink:
        """An archive at a location this process cannot write (its place taken by something
        that is not a directory, say)."""
        raise NotImplementedError

    async def damage_manifest(self, archive: ArchiveSink) -> None:
        """Overwrite ``archive``'s manifest with bytes that are not a manifest."""
        raise NotImplementedError

    async def mark_manifest_newer(self, archive: ArchiveSink) -> None:
        """Rewrite ``archive``'s manifest as a newer version of its format would."""
        raise NotImplementedError

    async def damage_range(self, archive: ArchiveSink, entry: ArchivedRange) -> None:
        """Change a byte of the stored range ``entry`` names, leaving the manifest alone."""
        raise NotImplementedError

    async def point_entry_at(self, archive: ArchiveSink, entry: ArchivedRange, file: str) -> None:
        """Rewrite ``archive``'s manifest so that ``entry`` (found by its partition, start and
        end) names ``file``; every other field as it was."""
        raise NotImplementedError

    async def names_outside(self, archive: ArchiveSink, entry: ArchivedRange) -> list[str]:
        """Put a copy of ``entry``'s stored range somewhere outside ``archive`` (beside it,
        say), and return each name a manifest entry could give to reach it: relative, absolute,
        whatever the storage resolves. An archive that honoured such a name would read the
        copy back without complaint, so the suite can tell the refusal from a miss."""
        raise NotImplementedError

    @pytest_asyncio.fixture
    async def archive(self) -> AsyncIterator[ArchiveSink]:
        async with AsyncExitStack() as self.exit_stack:
            yield await self.open_archive()

    # -- a range reads back as written -------------------------------------------------------

    async def test_a_range_reads_back_as_written(self, archive: ArchiveSink) -> None:
        written = records(2, range(10))
        entry = await archive.write(2, 0, 10, written)
        assert spans([entry]) == [(2, 0, 10, 10)]
        assert await archive.read(2, 0, 10) == written
        assert await (await self.reopen(archive)).read(2, 0, 10) == written

    async def test_a_read_returns_the_part_of_each_range_it_asks_for(
        self, archive: ArchiveSink
    ) -> None:
        first, second = records(0, range(10)), records(0, range(10, 20))
        await archive.write(0, 0, 10, first)
        await archive.write(0, 10, 20, second)
        reopened = await self.reopen(archive)
        assert await reopened.read(0, 3, 6) == first[3:6]
        assert await reopened.read(0, 5, 15) == [*first[5:], *second[:5]]
        assert await reopened.read(0, 0, 20) == [*first, *second]

    async def test_sparse_offsets_are_kept_and_counted(self, archive: ArchiveSink) -> None:
        """Kafka's offsets have gaps (transaction markers, compacted records)."""
        written = records(1, [0, 3, 4, 9])
        entry = await archive.write(1, 0, 10, written)
        assert entry.events == 4
        assert await (await self.reopen(archive)).read(1, 0, 10) == written
        assert await archive.read(1, 1, 4) == written[1:2]

    async def test_a_range_without_records_is_archived(self, archive: ArchiveSink) -> None:
        entry = await archive.write(0, 0, 5, [])
        assert spans([entry]) == [(0, 0, 5, 0)]
        assert await (await self.reopen(archive)).read(0, 0, 5) == []

    async def test_what_was_never_archived_reads_as_nothing(self, archive: ArchiveSink) -> None:
        assert await archive.ranges() == []
        assert await archive.read(0, 0, 100) == []
        await archive.write(0, 10, 20, records(0, range(10, 20)))
        assert await archive.read(0, 0, 10) == []
        assert await archive.read(0, 20, 30) == []
        assert await archive.read(1, 10, 20) == []

    async def test_partitions_are_archived_apart(self, archive: ArchiveSink) -> None:
        zero, one = records(0, range(5)), records(1, range(5))
        await archive.write(0, 0, 5, zero)
        await archive.write(1, 0, 5, one)
        reopened = await self.reopen(archive)
        assert await reopened.read(0, 0, 5) == zero
        assert await reopened.read(1, 0, 5) == one

    # -- the manifest ------------------------------------------------------------------------

    async def test_ranges_are_listed_by_partition_and_start(self, archive: ArchiveSink) -> None:
        for partition, start, end in [(1, 10, 20), (0, 5, 8), (1, 0, 10), (0, 0, 5)]:
            await archive.write(partition, start, end, records(partition, range(start, end)))
        expected = [(0, 0, 5, 5), (0, 5, 8, 3), (1, 0, 10, 10), (1, 10, 20, 10)]
        assert spans(await archive.ranges()) == expected
        assert spans(await (await self.reopen(archive)).ranges()) == expected
        assert spans(await archive.ranges(1)) == expected[2:]
        assert await archive.ranges(7) == []

    async def test_ranges_written_at_once_are_all_kept(self, archive: ArchiveSink) -> None:
        """Every write rewrites the manifest: none may lose another's entry."""
        await asyncio.gather(
            *(archive.write(p, 0, 3, records(p, range(3))) for p in range(CONCURRENT_WRITES))
        )
        expected = [(p, 0, 3, 3) for p in range(CONCURRENT_WRITES)]
        assert spans(await (await self.reopen(archive)).ranges()) == expected

    async def test_an_overlapping_range_is_refused(self, archive: ArchiveSink) -> None:
        await archive.write(0, 10, 20, records(0, range(10, 20)))
        for start, end in [(5, 15), (15, 25), (12, 18), (0, 30), (10, 19)]:
            with pytest.raises(InvalidInputError):
                await archive.write(0, start, end, records(0, range(start, end)))
        assert spans(await (await self.reopen(archive)).ranges()) == [(0, 10, 20, 10)]

    async def test_an_empty_or_inverted_range_is_refused_and_later_writes_go_on(
        self, archive: ArchiveSink
    ) -> None:
        """An entry for ``[12, 3)`` would overlap, and so refuse, every later range about it."""
        for partition, start, end in [(0, 12, 3), (0, 5, 5), (0, -1, 4), (-1, 0, 4)]:
            with pytest.raises(InvalidInputError):
                await archive.write(partition, start, end, [])
        written = records(0, range(20))
        await archive.write(0, 0, 20, written)
        reopened = await self.reopen(archive)
        assert spans(await reopened.ranges()) == [(0, 0, 20, 20)]
        assert await reopened.read(0, 0, 20) == written

    async def test_records_out_of_offset_order_are_refused_and_nothing_archived(
        self, archive: ArchiveSink
    ) -> None:
        """A read promises offset order, and a fold of what it returns takes the first of two
        events at one offset, or a later seq read first, as the run's history."""
        written = records(0, range(4))
        for unordered in ([*written[2:], *written[:2]], [*written[:2], written[1], written[3]]):
            with pytest.raises(InvalidInputError):
                await archive.write(0, 0, 4, unordered)
        assert await (await self.reopen(archive)).ranges() == []
        await archive.write(0, 0, 4, written)
        assert await (await self.reopen(archive)).read(0, 0, 4) == written

    async def test_a_record_outside_the_range_is_refused_and_nothing_archived(
        self, archive: ArchiveSink
    ) -> None:
        with pytest.raises(InvalidInputError):
            await archive.write(0, 0, 10, records(0, range(11)))
        with pytest.raises(InvalidInputError):
            await archive.write(0, 0, 10, [*records(0, range(5)), *records(1, [5])])
        with pytest.raises(InvalidInputError):
            await archive.write(0, 5, 10, records(0, range(4, 10)))
        assert await (await self.reopen(archive)).ranges() == []

    async def test_archiving_a_range_again_returns_its_entry_and_changes_nothing(
        self, archive: ArchiveSink
    ) -> None:
        """A compactor rerun after a crash between the archive and the cut writes the same
        range again; it must recognise its own work, in this process or the next."""
        written = records(3, range(8))
        entry = await archive.write(3, 0, 8, written)
        assert await archive.write(3, 0, 8, written) == entry
        rerun = await self.reopen(archive)
        assert await rerun.write(3, 0, 8, written) == entry
        assert await rerun.ranges() == [entry]
        assert await rerun.read(3, 0, 8) == written

    async def test_ready_passes_on_an_archive_it_can_write(self, archive: ArchiveSink) -> None:
        await archive.ready()
        await archive.write(0, 0, 2, records(0, range(2)))
        await (await self.reopen(archive)).ready()

    async def test_an_archive_that_cannot_be_written_is_refused_before_anything_is_cut(
        self,
    ) -> None:
        unwritable = await self.open_unwritable()
        with pytest.raises(ConfigurationError):
            await unwritable.ready()
        with pytest.raises(ConfigurationError):
            await unwritable.write(0, 0, 2, records(0, range(2)))

    # -- what is not as written --------------------------------------------------------------

    async def test_a_damaged_range_is_an_archive_error(self, archive: ArchiveSink) -> None:
        entry = await archive.write(0, 0, 4, records(0, range(4)))
        await self.damage_range(archive, entry)
        with pytest.raises(ArchiveError):
            await (await self.reopen(archive)).read(0, 0, 4)

    async def test_archiving_a_damaged_range_again_is_an_archive_error(
        self, archive: ArchiveSink
    ) -> None:
        """A rerun must not take a damaged copy for its own work and let the records be cut."""
        written = records(0, range(4))
        entry = await archive.write(0, 0, 4, written)
        await self.damage_range(archive, entry)
        with pytest.raises(ArchiveError):
            await (await self.reopen(archive)).write(0, 0, 4, written)

    async def test_a_damaged_manifest_refuses_reads_writes_and_ready(
        self, archive: ArchiveSink
    ) -> None:
        await archive.write(0, 0, 4, records(0, range(4)))
        await self.damage_manifest(archive)
        reopened = await self.reopen(archive)
        with pytest.raises(ArchiveError):
            await reopened.ranges()
        with pytest.raises(ArchiveError):
            await reopened.read(0, 0, 4)
        with pytest.raises(ArchiveError):
            await reopened.ready()
        with pytest.raises(ArchiveError):
            await reopened.write(0, 4, 8, records(0, range(4, 8)))

    async def test_a_manifest_of_a_newer_format_is_refused(self, archive: ArchiveSink) -> None:
        await archive.write(0, 0, 4, records(0, range(4)))
        await self.mark_manifest_newer(archive)
        reopened = await self.reopen(archive)
        with pytest.raises(ArchiveError):
            await reopened.ranges()
        with pytest.raises(ArchiveError):
            await reopened.write(0, 4, 8, records(0, range(4, 8)))

    async def test_an_entry_naming_a_file_outside_the_archive_is_refused(
        self, archive: ArchiveSink
    ) -> None:
        entry = await archive.write(0, 0, 4, records(0, range(4)))
        names = await self.names_outside(archive, entry)
        assert names, "names_outside gave no name to try"
        for name in names:
            await self.point_entry_at(archive, entry, name)
            reopened = await self.reopen(archive)
            with pytest.raises(ArchiveError):
                await reopened.read(0, 0, 4)
            with pytest.raises(ArchiveError):
                await reopened.ranges()
            with pytest.raises(ArchiveError):
                await reopened.write(0, 4, 8, records(0, range(4, 8)))

    async def test_an_entry_naming_another_ranges_file_is_refused(
        self, archive: ArchiveSink
    ) -> None:
        first = await archive.write(0, 0, 4, records(0, range(4)))
        second = await archive.write(0, 4, 8, records(0, range(4, 8)))
        await self.point_entry_at(archive, first, second.file)
        with pytest.raises(ArchiveError):
            await (await self.reopen(archive)).read(0, 0, 4)
