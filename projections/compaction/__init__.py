"""Compaction's stores: run truncation points, retained (tagged) events and recorded cuts."""

from .base import (
    CompactionStore,
    KeptAs,
    LogCut,
    RetainedEvent,
    RunTruncation,
    TagPin,
    refuse_compacted,
)
from .memory import MemoryCompactionStore
from .postgres import PostgresCompactionStore
from .sqlite import SqliteCompactionStore, embedded_compaction

__all__ = [
    "CompactionStore",
    "KeptAs",
    "LogCut",
    "MemoryCompactionStore",
    "PostgresCompactionStore",
    "RetainedEvent",
    "RunTruncation",
    "SqliteCompactionStore",
    "TagPin",
    "embedded_compaction",
    "refuse_compacted",
]
