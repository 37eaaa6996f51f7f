"""Onward: an event-sourced durable runtime for agent runs.

A run that dies mid-way carries on from where it was, on another worker, and no tool call with a
side effect is ever made twice by accident. Every fact of a run is an event on a log; everything
else is derived from it.
"""

from importlib.metadata import PackageNotFoundError, version

from onward.errors import (
    ArchiveError,
    BackendError,
    BackendUnavailableError,
    BudgetExceededError,
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
    RunTimeoutError,
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
from onward.runtime.application.api import (
    get_session_state,
    query,
    query_sync,
    resume,
    resume_sync,
)
from onward.runtime.application.api import open_app as open
from onward.runtime.application.app import App, SessionState
from onward.runtime.application.messages import RunMessage
from onward.runtime.application.stream import RunStream
from onward.runtime.ask import ask
from onward.runtime.options import ExecutionMode, Options
from onward.runtime.settings import Settings

try:
    __version__ = version("onward")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"

__all__ = [
    "EVENT_FORMAT",
    "App",
    "ArchiveError",
    "BackendError",
    "BackendUnavailableError",
    "BudgetExceededError",
    "CheckpointFormatError",
    "ConfigurationError",
    "EventDecodeError",
    "EventLog",
    "ExecutionMode",
    "FencedError",
    "HistoryUnavailableError",
    "IndeterminateToolCallError",
    "InvalidInputError",
    "KafkaEventLog",
    "LogTruncatedError",
    "MemoryEventLog",
    "NothingToResumeError",
    "OnwardError",
    "Options",
    "PayloadTooLargeError",
    "Position",
    "ProducerFatalError",
    "ResumeConflictError",
    "RevisionMismatchError",
    "RunMessage",
    "RunStream",
    "RunTimeoutError",
    "SchemaMismatchError",
    "SequenceGuard",
    "SessionState",
    "Settings",
    "SqliteEventLog",
    "StoredEvent",
    "__version__",
    "ask",
    "get_session_state",
    "open",
    "query",
    "query_sync",
    "resume",
    "resume_sync",
]
