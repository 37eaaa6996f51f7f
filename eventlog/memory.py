"""`MemoryEventLog`: the log in a dict, for unit tests. Nothing outlives the process.

It stores encoded records, not event objects, so it decodes on read exactly as the durable
backends do and fails the same way on the same bad record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from onward.errors import LogTruncatedError

from .base import (
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_PARTITIONS,
    EventLogBackend,
    LogRead,
    LogRecord,
    PartitionBounds,
    Position,
    check_offset,
    check_partition,
    check_truncation,
    decode_record,
    partition_for,
)
from .events import Event


class MemoryEventLog(EventLogBackend):
    """An in-process `EventLog`."""

    dense = True

    embedded = True

    def __init__(
        self,
        *,
        partitions: int = DEFAULT_PARTITIONS,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
    ) -> None:
        super().__init__(partitions=partitions, max_batch_bytes=max_batch_bytes)
        # Per partition: the offset of the first kept record, and the kept (run id, record) pairs.
        self._base = [0] * partitions
        self._records: list[list[tuple[str, bytes]]] = [[] for _ in range(partitions)]
        self._lock = asyncio.Lock()

    async def append(self, events: Sequence[Event]) -> list[Position]:
        run_id, partition, encoded = self._prepare(events)
        async with self._lock:
            records = self._records[partition]
            first = self._base[partition] + len(records)
            records.extend((run_id, r) for r in encoded)
        return [Position(partition, first + i) for i in range(len(encoded))]

    async def _read_records(self, request: LogRead) -> list[LogRecord]:
        partition, start, end, run_id, limit = request
        base = self._base[partition]
        records = self._records[partition]
        start = base if start is None else start
        if start < base:
            raise LogTruncatedError(
                f"partition {partition}: offset {start} was truncated; the partition starts at "
                f"{base}",
                run_id=run_id,
                partition=partition,
                offset=start,
                start=base,
            )
        stop = base + len(records) if end is None else min(end, base + len(records))
        out: list[LogRecord] = []
        for offset in range(start, stop):
            key, record = records[offset - base]
            if run_id is not None and key != run_id:
                continue
            out.append(decode_record(Position(partition, offset), record, run_hint=key))
            if limit is not None and len(out) >= limit:
                break
        return out

    async def bounds(self, partition: int) -> PartitionBounds:
        check_partition(partition, self._partitions)
        base = self._base[partition]
        return PartitionBounds(base, base + len(self._records[partition]))

    async def truncate_before(self, partition: int, offset: int) -> None:
        check_partition(partition, self._partitions)
        check_offset(partition, offset)
        async with self._lock:
            base = self._base[partition]
            end = base + len(self._records[partition])
            check_truncation(partition, offset, end)
            if offset <= base:
                return
            del self._records[partition][: offset - base]
            self._base[partition] = offset

    def write_raw(self, run_id: str, record: bytes) -> Position:
        """Store a record as a foreign writer would, unchecked. For tests of bad input."""
        partition = partition_for(run_id, self._partitions)
        records = self._records[partition]
        records.append((run_id, record))
        return Position(partition, self._base[partition] + len(records) - 1)
