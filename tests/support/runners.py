"""Runners for tests in which no projector runs."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from onward.eventlog import MemoryEventLog, SqliteEventLog
from onward.eventlog.base import EventLog
from onward.projections.memory import MemoryFrontierStore
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.leases import LeaseStore
from onward.runtime.providers import Provider
from onward.runtime.runner import AgentRunner


def log_runner(
    provider: Provider, log: EventLog, leases: LeaseStore, **options: Any
) -> AgentRunner:
    """An `AgentRunner` with a frontier store of its own, in memory: with no projector to keep
    the stored frontiers, it reads each run it carries on from the log."""
    return AgentRunner(
        provider=provider, log=log, leases=leases, frontiers=MemoryFrontierStore(), **options
    )


@contextlib.asynccontextmanager
async def embedded_log(kind: str, tmp_path: Path) -> AsyncIterator[tuple[EventLog, dict[str, Any]]]:
    """A log of ``kind`` (``memory`` or ``sqlite``) and the runner options that go with it: in
    memory no frontier store (runs are folded from the log); a SQLite file with its frontier
    store, folded inline."""
    if kind == "memory":
        yield MemoryEventLog(), {}
        return
    path = tmp_path / "onward.db"
    async with SqliteEventLog(path) as log, SqliteFrontierStore(path) as frontiers:
        yield log, {"frontiers": frontiers, "checkpoint_inline": True}
