"""Leases with fencing: one worker per run.

The settings every command loads import `base` (so this package): everything else is imported
on first use. `RedisLeaseStore` loads redis-py (~60 ms and ~9 MiB for a process that never
opens Redis), `Leaseholder` the metrics and prometheus_client (~40 ms for a command that holds
no lease, ``onward runs`` say).
"""

from typing import TYPE_CHECKING

from onward._lazy import lazy_exports as _lazy_exports

from .base import CancelAsked, LeasePolicy, LeaseStore, RunLease

if TYPE_CHECKING:
    from .holder import CancelAskHeard, Leaseholder
    from .memory import MemoryLeaseStore
    from .postgres import PostgresLeaseStore
    from .redis import RedisLeaseStore
    from .sqlite import SqliteLeaseStore

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


# Hidden from type checkers, which see each lazy name in the TYPE_CHECKING imports above:
# with a module __getattr__ in view they would take a misspelt import for an `object`.
if not TYPE_CHECKING:
    __getattr__, __dir__ = _lazy_exports(
        __name__,
        {
            "CancelAskHeard": (".holder", "CancelAskHeard"),
            "Leaseholder": (".holder", "Leaseholder"),
            "MemoryLeaseStore": (".memory", "MemoryLeaseStore"),
            "PostgresLeaseStore": (".postgres", "PostgresLeaseStore"),
            "RedisLeaseStore": (".redis", "RedisLeaseStore"),
            "SqliteLeaseStore": (".sqlite", "SqliteLeaseStore"),
        },
    )
