from __future__ import annotations

import tempfile
from pathlib import Path

from onward.eventlog import Position, SqliteEventLog
from onward.eventlog.base import EventLog
from onward.testing import PersistentEventLogConformance


class TestSqliteEventLog(PersistentEventLogConformance):
    path: Path

    async def open_log(self) -> EventLog:
        self.path = Path(tempfile.mkdtemp(prefix="onward-log-")) / "events.db"
        return await SqliteEventLog.open(self.path, partitions=self.partitions)

    async def reopen(self, log: EventLog) -> EventLog:
        return await SqliteEventLog.open(self.path, partitions=self.partitions)

    async def write_raw(self, log: EventLog, run_id: str, record: bytes) -> Position:
        assert isinstance(log, SqliteEventLog)
        return log.write_raw(run_id, record)
