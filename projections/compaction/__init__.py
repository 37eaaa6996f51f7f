"""Compaction's stores: run truncation points, retained (tagged) events and recorded cuts."""

from .base import CompactionStore, LogCut, RetainedEvent, RunTruncation, refuse_compacted
from .memory import MemoryCompactionStore
from .postgres import PostgresCompactionStore
from .sqlite import SqliteCompactionStore, embedded_compaction

__all__ = [
    "CompactionStore",
    "LogCut",
    "MemoryCompactionStore",
    "PostgresCompactionStore",
    "RetainedEvent",
    "RunTruncation",
    "SqliteCompactionStore",
    "embedded_compaction",
    "refuse_compacted",
]
