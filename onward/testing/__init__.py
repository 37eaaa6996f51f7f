"""Conformance suites for backend authors: subclass one per backend and run it with pytest.

Needs the ``dev`` extra (pytest, pytest-asyncio).
"""

from .archive import ArchiveSinkConformance
from .blobs import BlobStoreConformance
from .compaction import CompactionStoreConformance
from .eventlog import EventLogConformance, PersistentEventLogConformance
from .frontiers import FrontierStoreConformance
from .gc import RecordSweeperConformance
from .leases import LeaseStoreConformance
from .requests import RequestSenderConformance
from .spend import SpendLedgerConformance

__all__ = [
    "ArchiveSinkConformance",
    "BlobStoreConformance",
    "CompactionStoreConformance",
    "EventLogConformance",
    "FrontierStoreConformance",
    "LeaseStoreConformance",
    "PersistentEventLogConformance",
    "RecordSweeperConformance",
    "RequestSenderConformance",
    "SpendLedgerConformance",
]
