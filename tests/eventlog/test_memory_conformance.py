from __future__ import annotations

from onward.eventlog import MemoryEventLog, Position
from onward.eventlog.base import EventLog
from onward.testing import EventLogConformance


class TestMemoryEventLog(EventLogConformance):
    async def open_log(self) -> EventLog:
        return MemoryEventLog(partitions=self.partitions)

    async def write_raw(self, log: EventLog, run_id: str, record: bytes) -> Position:
        assert isinstance(log, MemoryEventLog)
        return log.write_raw(run_id, record)
