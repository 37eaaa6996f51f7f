"""An event log whose appends of a run's end fail, in the ways a real server's do."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from onward.errors import BackendUnavailableError
from onward.eventlog import Event, RunFinished
from onward.eventlog.base import EventLog, Position, StoredEvent
from onward.testing.eventlog import WrappedEventLog


class EndFails(WrappedEventLog):
    """Fails the first appends of a `RunFinished`: ``landing`` of them are stored first (a
    broker that took the batch and lost the answer), the rest not at all; and the first
    ``reads_failing`` reads after that fail too (the outage goes on)."""

    def __init__(self, inner: EventLog, *, failures: int, landing: int, reads_failing: int = 0):
        super().__init__(inner)
        self.failures = failures
        self.landing = landing
        self.reads_failing = reads_failing
        self.ends_tried = 0
        self.end_tried = asyncio.Event()

    async def append(self, events: Sequence[Event]) -> list[Position]:
        if not any(isinstance(e, RunFinished) for e in events):
            return await super().append(events)
        self.ends_tried += 1
        self.end_tried.set()
        if self.ends_tried > self.failures:
            return await super().append(events)
        if self.ends_tried <= self.landing:
            await super().append(events)
        raise BackendUnavailableError("the answer to the append was lost")

    async def read_run(
        self, run_id: str, *, start: int | None = None, end: int | None = None
    ) -> list[StoredEvent]:
        if self.ends_tried and self.reads_failing:
            self.reads_failing -= 1
            raise BackendUnavailableError("the log cannot be read either")
        return await super().read_run(run_id, start=start, end=end)
