"""Garbage collection: the rows and keys of runs that finished long ago go.

`GarbageCollector` decides by ttl which finished runs lose what; a `RecordSweeper`
(`PostgresRecordSweeper`, `SqliteRecordSweeper`) and a `KeySweeper` (`RedisKeySweeper`) count
or delete it. See :mod:`onward.runtime.gc.collector`.
"""

from .base import KINDS, FinishedRun, GcReport, KeySweeper, Kind, RecordSweeper, SweepPlan
from .collector import GarbageCollector
from .postgres import PostgresRecordSweeper
from .redis import RedisKeySweeper
from .sqlite import SqliteRecordSweeper

__all__ = [
    "KINDS",
    "FinishedRun",
    "GarbageCollector",
    "GcReport",
    "KeySweeper",
    "Kind",
    "PostgresRecordSweeper",
    "RecordSweeper",
    "RedisKeySweeper",
    "SqliteRecordSweeper",
    "SweepPlan",
]
