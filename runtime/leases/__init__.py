"""Leases with fencing: one worker per run."""

from .base import LeasePolicy, LeaseStore, RunLease
from .holder import Leaseholder
from .memory import MemoryLeaseStore
from .postgres import PostgresLeaseStore
from .redis import RedisLeaseStore
from .sqlite import SqliteLeaseStore

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
