"""Leases with fencing: one worker per run.

`RedisLeaseStore` is imported on first use: redis-py costs a process that never opens Redis
~60 ms and ~9 MiB, and the settings every command loads import `base` (so this package).
"""

from typing import TYPE_CHECKING

from .base import LeasePolicy, LeaseStore, RunLease
from .holder import Leaseholder
from .memory import MemoryLeaseStore
from .postgres import PostgresLeaseStore
from .sqlite import SqliteLeaseStore

if TYPE_CHECKING:
    from .redis import RedisLeaseStore

__all__ = [
    "LeasePolicy",
    "LeaseStore",
    "Leaseholder",
    "MemoryLeaseStore",
    "PostgresLeaseStore",
    "RedisLeaseStore",
    "RunLease",
    "SqliteLeaseStore",
]


def __getattr__(name: str) -> object:
    """Import `RedisLeaseStore` (and redis-py) on first access (PEP 562)."""
    if name != "RedisLeaseStore":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .redis import RedisLeaseStore  # noqa: PLC0415

    globals()[name] = RedisLeaseStore
    return RedisLeaseStore


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
