"""`ArchivedEventLog`: an archive and the log it was cut from, read as one log.

What ``onward replay --archive`` and ``onward projections rebuild --archive`` read: a partition
starts where its archived ranges reach back to without a gap, offsets below the log's start are
served from the archive, the rest from the log. It only reads; appends and cuts are refused.
"""

from __future__ import annotations

from collections.abc import Sequence

from onward.errors import InvalidInputError, LogTruncatedError

from . import base
from .archive import ArchiveSink
from .base import EventLog, EventLogBackend, LogRead, LogRecord, StoredEvent
from .events import Event

RUN_STEP = 1_000
"""The fewest offsets a read of one run with a limit asks the archive for at a time."""


class ArchivedEventLog(EventLogBackend):
    """Reads ``archive`` below ``log``'s start and ``log`` from there on.

    Args:
        log: The live log (opened and closed by its owner).
        archive: The archive its cut prefixes went to.
    """

    def __init__(self, log: EventLog, archive: ArchiveSink) -> None:
        super().__init__(partitions=log.partitions, max_batch_bytes=base.DEFAULT_MAX_BATCH_BYTES)
        self.log = log
        self.archive = archive

    async def append(self, events: Sequence[Event]) -> list[base.Position]:
        raise InvalidInputError("an archived log is read only; append to the live log")

    async def truncate_before(self, partition: int, offset: int) -> None:
        raise InvalidInputError("an archived log is read only; compaction cuts the live log")

    async def bounds(self, partition: int) -> base.PartitionBounds:
        """The log's end, and the lowest offset from which archive and log have no gap."""
        base.check_partition(partition, self._partitions)
        live = await self.log.bounds(partition)
        return base.PartitionBounds(await self._reach(partition, live.start), live.end)

    async def _reach(self, partition: int, start: int) -> int:
        """How far back from ``start`` the archived ranges reach without a gap."""
        reach = start
        for entry in reversed(await self.archive.ranges(partition)):
            if entry.start < reach <= entry.end:
                reach = entry.start
        return reach

    async def _read_records(self, request: LogRead) -> list[LogRecord]:
        try:
            return await self._read_once(request)
        except LogTruncatedError:
            # The log may have been cut between its bounds and the read: that part is archived
            # now. A read below what the archive reaches fails the same way again.
            return await self._read_once(request)

    async def _read_once(self, request: LogRead) -> list[LogRecord]:
        partition, start, end, run_id, limit = request
        live = await self.log.bounds(partition)
        reach = await self._reach(partition, live.start)
        low = reach if start is None else start
        if low < reach:
            raise LogTruncatedError(
                f"partition {partition}: offset {low} is neither in the log (it starts at "
                f"{live.start}) nor in archive {self.archive.location} (it reaches back to "
                f"{reach})",
                run_id=run_id,
                partition=partition,
                offset=low,
                start=reach,
            )
        out: list[LogRecord] = []
        if low < live.start:
            upto = live.start if end is None else min(end, live.start)
            # One archived range at a time, stopping at the limit: a reader paging through
            # with a limit reads each file once, not every file up to the log's start a page.
            for entry in await self.archive.ranges(partition):
                here, there = max(low, entry.start), min(upto, entry.end)
                while here < there:
                    # As many offsets as records wanted, at most: the archive reads on from
                    # where the last page ended, never decoding the rest of a file a page.
                    # By run, `RUN_STEP` offsets at least: how many of them are the run's is
                    # not known, and read to the range's end, a page decoded every run's
                    # records past its last.
                    step = there
                    if limit is not None:
                        wanted = limit - len(out)
                        step = here + (wanted if run_id is None else max(wanted, RUN_STEP))
                    archived = await self.archive.read(partition, here, min(step, there))
                    out.extend(r for r in archived if run_id is None or _run_of(r) == run_id)
                    if limit is not None and len(out) >= limit:
                        return out[:limit]
                    here = step
        if end is None or end > live.start:
            rest = None if limit is None else limit - len(out)
            out.extend(
                await self.log.read_records(
                    partition, max(low, live.start), end, run_id=run_id, limit=rest
                )
            )
        return out


def _run_of(record: LogRecord) -> str | None:
    """The run a record was filed under: an unreadable one's too, as the log files it."""
    return record.event.run_id if isinstance(record, StoredEvent) else record.run_id
