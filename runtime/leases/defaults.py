"""The lease store a runner uses when none is named: one that every writer of the log shares.

"Never twice" must not depend on an optional argument, so there is no lease-less runner. The
embedded logs bring their own store: a `SqliteEventLog` keeps its leases in the same file, on the
log's own connection (every process that opens the file shares them, and within a process the
lease writes never queue for SQLite's write lock behind the log's), and a `MemoryEventLog` gets
one `MemoryLeaseStore` per log (every runner of the process that writes to it shares it). Any
other log, Kafka above all, is written by many processes on many hosts, and only a store they
all reach can keep one worker per run: it must be named.
"""

from __future__ import annotations

import weakref

from onward.errors import ConfigurationError
from onward.eventlog.base import EventLog
from onward.eventlog.memory import MemoryEventLog
from onward.eventlog.sqlite import SqliteEventLog

from .base import LeaseStore
from .memory import MemoryLeaseStore
from .sqlite import SqliteLeaseStore

_MEMORY: weakref.WeakKeyDictionary[MemoryEventLog, MemoryLeaseStore] = weakref.WeakKeyDictionary()


def default_leases(log: EventLog) -> LeaseStore:
    """The lease store of an embedded log; open and closed with the log.

    Raises:
        ConfigurationError: ``log`` is not an embedded log, so its writers need a shared store
            named explicitly.
    """
    if isinstance(log, MemoryEventLog):
        store = _MEMORY.get(log)
        if store is None:
            store = _MEMORY[log] = MemoryLeaseStore()
        return store
    if isinstance(log, SqliteEventLog):
        return SqliteLeaseStore(log.path, sharing=log)
    raise ConfigurationError(
        f"{type(log).__name__} has no lease store of its own: every worker of a run must share "
        "one, so pass leases=RedisLeaseStore(REDIS_URL) or leases=PostgresLeaseStore(DATABASE_URL)"
    )
