"""Onward: an event-sourced durable runtime for agent runs.

A run that dies mid-way carries on from where it was, on another worker, and no tool call with a
side effect is ever made twice by accident. Every fact of a run is an event on a log; everything
else is derived from it.
"""

from importlib.metadata import PackageNotFoundError, version

from onward.errors import (
    BackendError,
    BackendUnavailableError,
    CheckpointFormatError,
    ConfigurationError,
    EventDecodeError,
    FencedError,
    HistoryUnavailableError,
    IndeterminateToolCallError,
    InvalidInputError,
    LogTruncatedError,
    NothingToResumeError,
    OnwardError,
    PayloadTooLargeError,
    ProducerFatalError,
    ResumeConflictError,
    RevisionMismatchError,
    SchemaMismatchError,
)
from onward.eventlog import (
    EVENT_FORMAT,
    EventLog,
    KafkaEventLog,
    MemoryEventLog,
    Position,
    SequenceGuard,
    SqliteEventLog,
    StoredEvent,
)

try:
    __version__ = version("onward")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"

__all__ = [
    "EVENT_FORMAT",
    "BackendError",
    "BackendUnavailableError",
    "CheckpointFormatError",
    "ConfigurationError",
    "EventDecodeError",
    "EventLog",
    "FencedError",
    "HistoryUnavailableError",
    "IndeterminateToolCallError",
    "InvalidInputError",
    "KafkaEventLog",
    "LogTruncatedError",
    "MemoryEventLog",
    "NothingToResumeError",
    "OnwardError",
    "PayloadTooLargeError",
    "Position",
    "ProducerFatalError",
    "ResumeConflictError",
    "RevisionMismatchError",
    "SchemaMismatchError",
    "SequenceGuard",
    "SqliteEventLog",
    "StoredEvent",
    "__version__",
]
