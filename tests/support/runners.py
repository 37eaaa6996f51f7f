"""Runners for tests in which no projector runs."""

from __future__ import annotations

from typing import Any

from onward.eventlog.base import EventLog
from onward.projections.memory import MemoryFrontierStore
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
