"""Leases with fencing: one worker per run.

`RedisLeaseStore` is imported on first use: redis-py costs a process that never opens Redis
~60 ms and ~9 MiB, and the settings every command loads import `base` (so this package).
"""

from typing import TYPE_CHECKING

from onward._lazy import lazy_exports as _lazy_exports

from .base import CancelAsked, LeasePolicy, LeaseStore, RunLease
from .holder import CancelAskHeard, Leaseholder
from .memory import MemoryLeaseStore
from .postgres import PostgresLeaseStore
from .sqlite import SqliteLeaseStore

if TYPE_CHECKING:
    from .redis import RedisLeaseStore

__all__ = [
    "CancelAskHeard",
    "CancelAsked",
    "LeasePolicy",
    "LeaseStore",
    "Leaseholder",
    "MemoryLeaseStore",
    "PostgresLeaseStore",
    "RedisLeaseStore",
    "RunLease",
    "SqliteLeaseStore",
]


# `RedisLeaseStore` loads redis-py: imported on first access.
__getattr__, __dir__ = _lazy_exports(__name__, {"RedisLeaseStore": (".redis", "RedisLeaseStore")})
