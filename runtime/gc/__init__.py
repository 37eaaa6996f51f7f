"""Garbage collection: the rows and keys of runs that finished long ago go.

`GarbageCollector` decides by ttl which finished runs lose what; a `RecordSweeper`
(`PostgresRecordSweeper`, `SqliteRecordSweeper`, `RedisFrontierSweeper` for frontiers kept in
Redis) and a `KeySweeper` (`RedisKeySweeper`) count
or delete it. See :mod:`onward.runtime.gc.collector`. The Redis sweepers are imported on first
use: redis-py costs ~150 ms to every ``onward --help`` and to a collector that never opens Redis.
"""

from typing import TYPE_CHECKING

from onward._lazy import lazy_exports as _lazy_exports

from .base import KINDS, FinishedRun, GcReport, KeySweeper, Kind, RecordSweeper, SweepPlan
from .collector import GarbageCollector
from .postgres import PostgresRecordSweeper
from .sqlite import SqliteRecordSweeper

if TYPE_CHECKING:
    from .redis import RedisKeySweeper
    from .redis_frontiers import RedisFrontierSweeper

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


# Hidden from type checkers, which see each lazy name in the TYPE_CHECKING imports above:
# with a module __getattr__ in view they would take a misspelt import for an `object`.
if not TYPE_CHECKING:
    __getattr__, __dir__ = _lazy_exports(
        __name__,
        {
            "RedisKeySweeper": (".redis", "RedisKeySweeper"),
            "RedisFrontierSweeper": (".redis_frontiers", "RedisFrontierSweeper"),
        },
    )
