"""Onward: an event-sourced durable runtime for agent runs.

A run that dies mid-way carries on from where it was, on another worker, and no tool call with a
side effect is ever made twice by accident. Every fact of a run is an event on a log; everything
else is derived from it.
"""

from typing import TYPE_CHECKING

from onward._lazy import lazy_exports as _lazy_exports
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
    OutcomeUnknownError,
    PayloadTooLargeError,
    ProducerFatalError,
    ResumeConflictError,
    RevisionMismatchError,
    RunCancelledError,
    RunTimeoutError,
    SchemaMismatchError,
)

if TYPE_CHECKING:
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

    __version__: str

_LAZY: dict[str, tuple[str, str]] = {
    **{
        name: ("onward.eventlog", name)
        for name in (
            "EVENT_FORMAT",
            "EventLog",
            "KafkaEventLog",
            "MemoryEventLog",
            "Position",
            "SequenceGuard",
            "SqliteEventLog",
            "StoredEvent",
        )
    },
    **{
        name: ("onward.runtime.application.api", name)
        for name in ("get_session_state", "query", "query_sync", "resume", "resume_sync")
    },
    "open": ("onward.runtime.application.api", "open_app"),
    "App": ("onward.runtime.application.app", "App"),
    "SessionState": ("onward.runtime.application.app", "SessionState"),
    "RunMessage": ("onward.runtime.application.messages", "RunMessage"),
    "RunStream": ("onward.runtime.application.stream", "RunStream"),
    "ask": ("onward.runtime.ask", "ask"),
    "ExecutionMode": ("onward.runtime.options", "ExecutionMode"),
    "Options": ("onward.runtime.options", "Options"),
    "Settings": ("onward.runtime.settings", "Settings"),
}
"""Exported name -> (module, attribute), imported on first use: a process that needs only the
event log or the projector (``import onward.projections`` imports this package first) does not
pay for the agent runtime, pydantic settings and HTTP clients."""


def _installed_version() -> str:
    """The installed distribution's version; ``importlib.metadata`` is slow to import, so only
    a process that asks for ``__version__`` loads it."""
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version("onward")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0"


_exported, __dir__ = _lazy_exports(__name__, _LAZY)


# Hidden from type checkers, which see each lazy name in the TYPE_CHECKING imports above:
# with a module __getattr__ in view they would take a misspelt import for an `object`.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        """``__version__`` is read on first access too; every other lazy name is
        `_LAZY`'s."""
        if name != "__version__":
            return _exported(name)
        value = globals()[name] = _installed_version()
        return value


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
    "OutcomeUnknownError",
    "PayloadTooLargeError",
    "Position",
    "ProducerFatalError",
    "ResumeConflictError",
    "RevisionMismatchError",
    "RunCancelledError",
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
