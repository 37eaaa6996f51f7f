"""Every error Onward raises, under one root.

Each error says what happened, to which run where one is involved, and what to do next::

    OnwardError
    ├── ConfigurationError          a setting or a deployment fact is wrong; fix it and restart
    │   └── SchemaMismatchError     the database schema is not the version this code expects
    ├── InvalidInputError           a caller passed something malformed; nothing was written
    ├── EventDecodeError            a stored record is not a readable event (run, seq, field named)
    │   └── CheckpointFormatError   a record was written by a newer Onward; the run is left alone
    ├── PayloadTooLargeError        one event or batch is larger than the log accepts
    ├── LogTruncatedError           a read asked for offsets that compaction already removed
    ├── RevisionMismatchError       the agent passed in is not the revision the run started with
    ├── IndeterminateToolCallError  resume cannot tell whether a call ran; never retryable
    ├── ResumeConflictError         another worker holds the run's lease
    ├── FencedError                 a write from a superseded fence
    ├── HistoryUnavailableError     a transcript handle no longer resolves
    ├── NothingToResumeError        no run under that id
    ├── RunTimeoutError             a stream saw nothing new for its caller's timeout=
    ├── RunCancelledError           a run a framework drives was cancelled; its invocation stops
    ├── BudgetExceededError         a run stopped before a model call that would pass its budget
    └── BackendError                the log or a store failed (driver error attached as __cause__)
        ├── BackendUnavailableError the server could not be reached or timed out; retry later
        │   └── OutcomeUnknownError a tool's request was sent and never answered: it may have acted
        ├── ProducerFatalError      the Kafka producer's session is unusable; it has been replaced
        └── ArchiveError            an archive of cut log records cannot be read back as written

Driver exceptions (aiokafka, sqlite3, redis-py, asyncpg) are translated into these in one place,
the storage layer (``onward._storage``), so callers never handle a driver's type; a test
enumerates every driver exception and fails on one without a rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # For the annotation only: every layer imports this module, so it imports none at runtime.
    from onward.projections.frontier import CallState


class OnwardError(Exception):
    """Root of every error Onward raises.

    Attributes:
        run_id: The run the error concerns, when there is one.
        retryable: Whether the same call may succeed if simply made again later.
    """

    retryable: bool = False

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id


class ConfigurationError(OnwardError):
    """A setting or a deployment fact (topic layout, URL) is wrong."""


class SchemaMismatchError(ConfigurationError):
    """The database schema is not the version this code expects; run `onward db migrate`."""


class InvalidInputError(OnwardError, ValueError):
    """A caller passed something malformed. Nothing was written."""


class EventDecodeError(OnwardError):
    """A stored record is not a readable event.

    Attributes:
        seq: The record's seq when it could be read, else ``None``.
        field: The path of the offending value (msgspec style, ``$.seq``), else ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        seq: int | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message, run_id=run_id)
        self.seq = seq
        self.field = field


class CheckpointFormatError(EventDecodeError):
    """A record carries an event format newer than this code knows; upgrade before resuming."""


class PayloadTooLargeError(OnwardError):
    """An event or batch is larger than the log accepts.

    Attributes:
        size: How large it is, in bytes, when that was measured, else ``None``.
        limit: The most the log accepts, in bytes, when known, else ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        size: int | None = None,
        limit: int | None = None,
    ) -> None:
        super().__init__(message, run_id=run_id)
        self.size = size
        self.limit = limit


class LogTruncatedError(OnwardError):
    """A read asked for offsets below the partition's start (compacted away).

    Attributes:
        partition: The partition read, when one is involved, else ``None``.
        offset: The offset asked for, else ``None``.
        start: Where the partition's records begin now (for a read through an archive: as far
            back as the archive reaches), else ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
        start: int | None = None,
    ) -> None:
        super().__init__(message, run_id=run_id)
        self.partition = partition
        self.offset = offset
        self.start = start


class RevisionMismatchError(OnwardError):
    """The agent passed to resume is not the revision the run was started with."""


class IndeterminateToolCallError(OnwardError):
    """Resume cannot decide whether calls ran. Never retryable: a person must settle them.

    Attributes:
        calls: The undecided calls, each with its tool, idempotency key and dispatch fence.
    """

    retryable = False

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        calls: tuple[CallState, ...] = (),
    ) -> None:
        super().__init__(message, run_id=run_id)
        self.calls = calls


class ResumeConflictError(OnwardError):
    """Another worker holds the run's lease.

    Attributes:
        holder: Who holds it, told only to the lease's own tenant.
        expires_at: When its lease lapses unless renewed (seconds since the epoch, the lease
            store's clock), told only to the lease's own tenant.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        holder: str | None = None,
        expires_at: float | None = None,
    ):
        super().__init__(message, run_id=run_id)
        self.holder = holder
        self.expires_at = expires_at


class FencedError(OnwardError):
    """A write was attempted under a fence that a newer claim superseded.

    Attributes:
        fence: The superseded fence the refused writer held, when known, else ``None``.
        holder: Who held the lease under that fence, when known, else ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        fence: int | None = None,
        holder: str | None = None,
    ) -> None:
        super().__init__(message, run_id=run_id)
        self.fence = fence
        self.holder = holder


class HistoryUnavailableError(OnwardError):
    """A transcript handle no longer resolves; the run stops rather than continue with a hole."""


class NothingToResumeError(OnwardError):
    """No run exists under the given id."""


class RunTimeoutError(OnwardError, TimeoutError):
    """A stream of a run saw nothing new for as long as its caller allowed (``timeout=``), or,
    in a fleet, nothing came of its start or answer before no worker would act on it any more
    (``ONWARD_REQUEST_MAX_AGE``); the message says who holds the run and until when, if anyone
    does, and where the cause is. The run itself goes on."""


class RunCancelledError(OnwardError):
    """Someone asked the holder of a run to end it cancelled (`onward cancel --wait`,
    `App.cancel`) while a framework drove it in this process: the holder recorded the end and
    stopped writing, so the framework's invocation (a LangGraph graph run) stops here.

    Attributes:
        by: Who asked, as recorded with the run's end.
        why: Why, as they said it (may be empty).
    """

    def __init__(self, message: str, *, run_id: str | None = None, by: str, why: str) -> None:
        super().__init__(message, run_id=run_id)
        self.by = by
        self.why = why


class BudgetExceededError(OnwardError):
    """A run stopped before a model call whose estimated cost would take its spend, or its
    tenant's, past the budget; the model was not called and the run ended ``failed``.

    Attributes:
        scope: ``run`` or ``tenant``: which budget.
        budget_micros: The budget, in micros.
        spent_micros: What the run (or the tenant) had spent, as the spend ledger has it.
        estimate_micros: The next call's estimated cost.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        scope: str | None = None,
        budget_micros: int | None = None,
        spent_micros: int | None = None,
        estimate_micros: int | None = None,
    ) -> None:
        super().__init__(message, run_id=run_id)
        self.scope = scope
        self.budget_micros = budget_micros
        self.spent_micros = spent_micros
        self.estimate_micros = estimate_micros


class BackendError(OnwardError):
    """The log or a store failed. The driver's exception is attached as ``__cause__``."""


class BackendUnavailableError(BackendError):
    """The server could not be reached or timed out. The same call may succeed later."""

    retryable = True


class OutcomeUnknownError(BackendUnavailableError):
    """A tool's request reached (or may have reached) its service and no answer came back: a
    timeout, or a connection lost after sending. The call may or may not have taken effect.

    Raised by a tool, the runner decides the call as one cut off at its deadline: a retry-safe
    tool records it as the call's error, any other asks its status check, and a call nobody can
    decide stops the run for a person (`IndeterminateToolCallError`), so the model is never told
    that a call which may have acted failed, and never asked to make it again.
    """


class ProducerFatalError(BackendError):
    """The Kafka producer's idempotent session is broken; the log has replaced the producer.

    The batch that met the error was not acknowledged. Appending it again is safe only after
    reading the run back, since the broker may have stored it before the session broke.
    """

    retryable = True


class ArchiveError(BackendError):
    """An archive of cut log records cannot be read back as written: its manifest is not valid
    JSON of the expected shape, or a file's size or checksum differs from the manifest's.
    Nothing is cut while it stands; restore the archive from a copy."""


__all__ = [
    "ArchiveError",
    "BackendError",
    "BackendUnavailableError",
    "BudgetExceededError",
    "CheckpointFormatError",
    "ConfigurationError",
    "EventDecodeError",
    "FencedError",
    "HistoryUnavailableError",
    "IndeterminateToolCallError",
    "InvalidInputError",
    "LogTruncatedError",
    "NothingToResumeError",
    "OnwardError",
    "OutcomeUnknownError",
    "PayloadTooLargeError",
    "ProducerFatalError",
    "ResumeConflictError",
    "RevisionMismatchError",
    "RunCancelledError",
    "RunTimeoutError",
    "SchemaMismatchError",
]
