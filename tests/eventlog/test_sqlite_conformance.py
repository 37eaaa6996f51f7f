from __future__ import annotations

from pathlib import Path

import pytest

from onward.eventlog import Position, SqliteEventLog
from onward.eventlog.base import EventLog
from onward.testing import PersistentEventLogConformance


class TestSqliteEventLog(PersistentEventLogConformance):
    path: Path

    @pytest.fixture(autouse=True)
    def _file(self, tmp_path: Path) -> None:
        """pytest's own directory, so a run leaves no file behind in /tmp."""
        self.path = tmp_path / "events.db"

    async def open_log(self) -> EventLog:
        return await SqliteEventLog.open(self.path, partitions=self.partitions)

    async def reopen(self, log: EventLog) -> EventLog:
        return await SqliteEventLog.open(self.path, partitions=self.partitions)

    async def write_raw(self, log: EventLog, run_id: str, record: bytes) -> Position:
        assert isinstance(log, SqliteEventLog)
        return log.write_raw(run_id, record)
