"""Garbage collection: the rows and keys of runs that finished long ago go.

`GarbageCollector` decides by ttl which finished runs lose what; a `RecordSweeper`
(`PostgresRecordSweeper`, `SqliteRecordSweeper`, `RedisFrontierSweeper` for frontiers kept in
Redis) and a `KeySweeper` (`RedisKeySweeper`) count
or delete it. See :mod:`onward.runtime.gc.collector`.
"""

from .base import KINDS, FinishedRun, GcReport, KeySweeper, Kind, RecordSweeper, SweepPlan
from .collector import GarbageCollector
from .postgres import PostgresRecordSweeper
from .redis import RedisKeySweeper
from .redis_frontiers import RedisFrontierSweeper
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
    "RedisFrontierSweeper",
    "RedisKeySweeper",
    "SqliteRecordSweeper",
    "SweepPlan",
]
