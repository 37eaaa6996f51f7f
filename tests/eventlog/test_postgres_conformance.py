from __future__ import annotations

import pytest

from onward.eventlog import Position, PostgresEventLog
from onward.eventlog.base import EventLog
from onward.testing import PersistentEventLogConformance
from onward.testing.eventlog import new_run_id, step_events
from onward.testing.storage import PostgresConnectionLossConformance


class TestPostgresEventLog(PersistentEventLogConformance):
    database_url: str
    schema: str

    @pytest.fixture(autouse=True)
    def _fresh_schema(self, database_url: str, pg_schema: str) -> None:
        """Each test gets its own migrated schema, dropped afterwards, so partition-level tests
        are exact."""
        self.database_url = database_url
        self.schema = pg_schema

    async def open_log(self) -> EventLog:
        return await PostgresEventLog.open(
            self.database_url, schema=self.schema, partitions=self.partitions
        )

    async def reopen(self, log: EventLog) -> EventLog:
        return await self.open_log()

    async def write_raw(self, log: EventLog, run_id: str, record: bytes) -> Position:
        assert isinstance(log, PostgresEventLog)
        return await log.write_raw(run_id, record)


class TestPostgresEventLogConnectionLoss(PostgresConnectionLossConformance):
    lock_table = "onward_log_partition"

    async def open_connected_store(self, database_url: str, schema: str) -> PostgresEventLog:
        return await PostgresEventLog.open(database_url, schema=schema, partitions=4)

    async def use_store(self, store: PostgresEventLog) -> None:
        await store.append(step_events(new_run_id(), 3))
