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
    └── BackendError                the log or a store failed (driver error attached as __cause__)
        ├── BackendUnavailableError the server could not be reached or timed out; retry later
        └── ProducerFatalError      the Kafka producer's session is unusable; it has been replaced

Driver exceptions (aiokafka, sqlite3, redis-py, asyncpg) are translated in one place,
:func:`translate`, so callers never handle a driver's type. :func:`classify` returns ``None`` for
a driver exception it has no rule for; a test enumerates every driver exception and fails on
any such gap.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import aiokafka.errors as kafka_errors
import asyncpg.exceptions as pg_errors
import redis.exceptions as redis_errors


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
    """An event or batch is larger than the log accepts."""


class LogTruncatedError(OnwardError):
    """A read asked for offsets below the partition's start (compacted away)."""


class RevisionMismatchError(OnwardError):
    """The agent passed to resume is not the revision the run was started with."""


class IndeterminateToolCallError(OnwardError):
    """Resume cannot decide whether calls ran. Never retryable: a person must settle them."""

    retryable = False

    def __init__(self, message: str, *, run_id: str | None = None, calls: tuple[Any, ...] = ()):
        super().__init__(message, run_id=run_id)
        self.calls = calls


class ResumeConflictError(OnwardError):
    """Another worker holds the run's lease."""

    def __init__(self, message: str, *, run_id: str | None = None, holder: str | None = None):
        super().__init__(message, run_id=run_id)
        self.holder = holder


class FencedError(OnwardError):
    """A write was attempted under a fence that a newer claim superseded."""


class HistoryUnavailableError(OnwardError):
    """A transcript handle no longer resolves; the run stops rather than continue with a hole."""


class NothingToResumeError(OnwardError):
    """No run exists under the given id."""


class BackendError(OnwardError):
    """The log or a store failed. The driver's exception is attached as ``__cause__``."""


class BackendUnavailableError(BackendError):
    """The server could not be reached or timed out. The same call may succeed later."""

    retryable = True


class ProducerFatalError(BackendError):
    """The Kafka producer's idempotent session is broken; the log has replaced the producer.

    The batch that met the error was not acknowledged. Appending it again is safe only after
    reading the run back, since the broker may have stored it before the session broke.
    """

    retryable = True


_KAFKA_RULES: tuple[tuple[type[BaseException], type[OnwardError]], ...] = (
    # Checked in order: the first class the exception is an instance of wins.
    (kafka_errors.OutOfOrderSequenceNumber, ProducerFatalError),
    (kafka_errors.DuplicateSequenceNumber, ProducerFatalError),
    (kafka_errors.UnknownProducerId, ProducerFatalError),
    (kafka_errors.InvalidProducerEpoch, ProducerFatalError),
    (kafka_errors.InvalidProducerIdMapping, ProducerFatalError),
    (kafka_errors.ProducerFenced, ProducerFatalError),
    (kafka_errors.MessageSizeTooLargeError, PayloadTooLargeError),
    (kafka_errors.RecordTooLargeError, PayloadTooLargeError),
    (kafka_errors.RecordListTooLargeError, PayloadTooLargeError),
    (kafka_errors.OffsetOutOfRangeError, LogTruncatedError),
    (kafka_errors.NoOffsetForPartitionError, LogTruncatedError),
    (kafka_errors.KafkaTimeoutError, BackendUnavailableError),
    (kafka_errors.KafkaUnavailableError, BackendUnavailableError),
    (kafka_errors.BrokerNotAvailableError, BackendUnavailableError),
    (kafka_errors.ReplicaNotAvailableError, BackendUnavailableError),
    (kafka_errors.ProducerClosed, BackendUnavailableError),
    (kafka_errors.ConsumerStoppedError, BackendUnavailableError),
    (kafka_errors.UnrecognizedBrokerVersion, ConfigurationError),
    (kafka_errors.IncompatibleBrokerVersion, ConfigurationError),
    (kafka_errors.UnsupportedVersionError, ConfigurationError),
    (kafka_errors.UnsupportedForMessageFormatError, ConfigurationError),
    (kafka_errors.UnsupportedCodecError, ConfigurationError),
    (kafka_errors.KafkaConfigurationError, ConfigurationError),
    (kafka_errors.InvalidTopicError, ConfigurationError),
    (kafka_errors.InvalidPartitionsError, ConfigurationError),
    (kafka_errors.InvalidReplicationFactorError, ConfigurationError),
    (kafka_errors.InvalidReplicationAssignmentError, ConfigurationError),
    (kafka_errors.InvalidConfigurationError, ConfigurationError),
    (kafka_errors.InvalidRequiredAcksError, ConfigurationError),
    (kafka_errors.InvalidTransactionTimeout, ConfigurationError),
    (kafka_errors.InvalidSessionTimeoutError, ConfigurationError),
    (kafka_errors.InvalidGroupIdError, ConfigurationError),
    (kafka_errors.InconsistentGroupProtocolError, ConfigurationError),
    (kafka_errors.PolicyViolationError, ConfigurationError),
    (kafka_errors.SecurityDisabled, ConfigurationError),
    (kafka_errors.AuthenticationMethodNotSupported, ConfigurationError),
    (kafka_errors.AuthenticationFailedError, ConfigurationError),
    (kafka_errors.SaslAuthenticationFailed, ConfigurationError),
    (kafka_errors.UnsupportedSaslMechanismError, ConfigurationError),
    (kafka_errors.IllegalSaslStateError, ConfigurationError),
    (kafka_errors.TopicAuthorizationFailedError, ConfigurationError),
    (kafka_errors.GroupAuthorizationFailedError, ConfigurationError),
    (kafka_errors.ClusterAuthorizationFailedError, ConfigurationError),
    (kafka_errors.TransactionalIdAuthorizationFailed, ConfigurationError),
    (kafka_errors.DelegationTokenAuthDisabled, ConfigurationError),
    (kafka_errors.DelegationTokenNotFound, ConfigurationError),
    (kafka_errors.DelegationTokenOwnerMismatch, ConfigurationError),
    (kafka_errors.DelegationTokenRequestNotAllowed, ConfigurationError),
    (kafka_errors.DelegationTokenAuthorizationFailed, ConfigurationError),
    (kafka_errors.DelegationTokenExpired, ConfigurationError),
    (kafka_errors.InvalidPrincipalType, ConfigurationError),
    (kafka_errors.LogDirNotFound, ConfigurationError),
    (kafka_errors.ListenerNotFound, ConfigurationError),
    # Broker answers that mean "not now": leadership moves, coordinators loading, rebalances.
    (kafka_errors.StaleControllerEpochError, BackendUnavailableError),
    (kafka_errors.StaleLeaderEpochCodeError, BackendUnavailableError),
    (kafka_errors.RebalanceInProgressError, BackendUnavailableError),
    (kafka_errors.ConcurrentTransactions, BackendUnavailableError),
    (kafka_errors.ReassignmentInProgress, BackendUnavailableError),
    (kafka_errors.OperationNotAttempted, BackendUnavailableError),
    (kafka_errors.FetchSessionIdNotFound, BackendUnavailableError),
    (kafka_errors.InvalidFetchSessionEpoch, BackendUnavailableError),
    (kafka_errors.MemberIdRequired, BackendUnavailableError),
    # Anything the broker says is retriable, as aiokafka marks it.
    (kafka_errors.NoBrokersAvailable, BackendUnavailableError),
    (kafka_errors.NodeNotReadyError, BackendUnavailableError),
    (kafka_errors.KafkaProtocolError, BackendUnavailableError),
    (kafka_errors.Cancelled, BackendUnavailableError),
    (kafka_errors.TooManyInFlightRequests, BackendUnavailableError),
    (kafka_errors.StaleMetadata, BackendUnavailableError),
    (kafka_errors.MetadataEmptyBrokerList, BackendUnavailableError),
    (kafka_errors.KafkaConnectionError, BackendUnavailableError),
    # Answers that mean our own client logic or the broker state is wrong: not retryable as is.
    (kafka_errors.IllegalStateError, BackendError),
    (kafka_errors.IllegalArgumentError, BackendError),
    (kafka_errors.IllegalOperation, BackendError),
    (kafka_errors.CommitFailedError, BackendError),
    (kafka_errors.QuotaViolationError, BackendError),
    (kafka_errors.NoError, BackendError),
    (kafka_errors.UnknownError, BackendError),
    (kafka_errors.CorruptRecordException, BackendError),
    (kafka_errors.InvalidFetchRequestError, BackendError),
    (kafka_errors.OffsetMetadataTooLargeError, BackendError),
    (kafka_errors.NotEnoughReplicasAfterAppendError, BackendError),
    (kafka_errors.IllegalGenerationError, BackendError),
    (kafka_errors.UnknownMemberIdError, BackendError),
    (kafka_errors.InvalidCommitOffsetSizeError, BackendError),
    (kafka_errors.InvalidTimestampError, BackendError),
    (kafka_errors.TopicAlreadyExistsError, BackendError),
    (kafka_errors.InvalidRequestError, BackendError),
    (kafka_errors.InvalidTxnState, BackendError),
    (kafka_errors.TransactionCoordinatorFenced, BackendError),
    (kafka_errors.NonEmptyGroup, BackendError),
    (kafka_errors.GroupIdNotFound, BackendError),
)

# Retriable broker answers not named above (leader moves, coordinator loading) are matched by
# aiokafka's own `retriable` flag, which it sets per error code.
_SQLITE_RULES: tuple[tuple[type[BaseException], type[OnwardError]], ...] = (
    (sqlite3.OperationalError, BackendUnavailableError),
    (sqlite3.IntegrityError, BackendError),
    (sqlite3.DataError, InvalidInputError),
    (sqlite3.ProgrammingError, BackendError),
    (sqlite3.NotSupportedError, ConfigurationError),
    (sqlite3.InternalError, BackendError),
    (sqlite3.DatabaseError, BackendError),
    (sqlite3.InterfaceError, BackendError),
    (sqlite3.Warning, BackendError),
    (sqlite3.Error, BackendError),
)


_REDIS_RULES: tuple[tuple[type[BaseException], type[OnwardError]], ...] = (
    # A refused login or command is a deployment fact; retrying will not change it.
    (redis_errors.AuthenticationError, ConfigurationError),
    (redis_errors.AuthenticationWrongNumberOfArgsError, ConfigurationError),
    (redis_errors.AuthorizationError, ConfigurationError),
    (redis_errors.NoPermissionError, ConfigurationError),
    (redis_errors.ExternalAuthProviderError, ConfigurationError),
    (redis_errors.ModuleError, ConfigurationError),
    (redis_errors.ClusterCrossSlotError, ConfigurationError),
    (redis_errors.CrossSlotTransactionError, ConfigurationError),
    (redis_errors.IncorrectPolicyType, ConfigurationError),
    (redis_errors.ReadOnlyError, ConfigurationError),
    (redis_errors.MaxConnectionsError, BackendUnavailableError),
    (redis_errors.ConnectionError, BackendUnavailableError),
    (redis_errors.TimeoutError, BackendUnavailableError),
    (redis_errors.BusyLoadingError, BackendUnavailableError),
    (redis_errors.TryAgainError, BackendUnavailableError),
    (redis_errors.ClusterDownError, BackendUnavailableError),
    (redis_errors.MasterDownError, BackendUnavailableError),
    (redis_errors.OutOfMemoryError, BackendUnavailableError),
    (redis_errors.ChildDeadlockedError, BackendError),
    (redis_errors.AskError, BackendError),
    (redis_errors.MovedError, BackendError),
    (redis_errors.SlotNotCoveredError, BackendUnavailableError),
    (redis_errors.ClusterError, BackendError),
    (redis_errors.RedisClusterException, BackendError),
    (redis_errors.NoScriptError, BackendError),
    (redis_errors.ExecAbortError, BackendError),
    (redis_errors.NoSuchFieldsetError, BackendError),
    (redis_errors.InvalidPipelineStack, BackendError),
    (redis_errors.InvalidResponse, BackendError),
    (redis_errors.LockNotOwnedError, BackendError),
    (redis_errors.LockError, BackendError),
    (redis_errors.PubSubError, BackendError),
    (redis_errors.WatchError, BackendError),
    (redis_errors.DataError, BackendError),
    (redis_errors.ResponseError, BackendError),
    (redis_errors.RedisError, BackendError),
)
# asyncpg names one class per SQLSTATE (hundreds); the rules go by SQLSTATE class, the most
# specific first, and every other server error is a plain BackendError.
_ASYNCPG_RULES: tuple[tuple[type[BaseException], type[OnwardError]], ...] = (
    (pg_errors.InvalidPasswordError, ConfigurationError),
    (pg_errors.InvalidAuthorizationSpecificationError, ConfigurationError),
    (pg_errors.InsufficientPrivilegeError, ConfigurationError),
    (pg_errors.InvalidCatalogNameError, ConfigurationError),
    (pg_errors.UndefinedTableError, SchemaMismatchError),
    (pg_errors.UndefinedColumnError, SchemaMismatchError),
    (pg_errors.UndefinedFunctionError, SchemaMismatchError),
    (pg_errors.PostgresConnectionError, BackendUnavailableError),
    (pg_errors.CannotConnectNowError, BackendUnavailableError),
    (pg_errors.TooManyConnectionsError, BackendUnavailableError),
    (pg_errors.AdminShutdownError, BackendUnavailableError),
    (pg_errors.CrashShutdownError, BackendUnavailableError),
    (pg_errors.InsufficientResourcesError, BackendUnavailableError),
    (pg_errors.SerializationError, BackendUnavailableError),
    (pg_errors.DeadlockDetectedError, BackendUnavailableError),
    (pg_errors.LockNotAvailableError, BackendUnavailableError),
    (pg_errors.QueryCanceledError, BackendUnavailableError),
    (pg_errors.ConnectionDoesNotExistError, BackendUnavailableError),
    (pg_errors.InterfaceError, BackendError),
    (pg_errors.PostgresError, BackendError),
    (pg_errors.PostgresWarning, BackendError),  # notices, raised only if warnings are errors
    # Socket-level failures reaching a server (refused, reset, unreachable, timed out).
    (ConnectionError, BackendUnavailableError),
    (TimeoutError, BackendUnavailableError),
    (OSError, BackendUnavailableError),
)


def classify(exc_type: type[BaseException]) -> type[OnwardError] | None:
    """The Onward error a driver exception type becomes, or ``None`` if no rule covers it."""
    for driver_type, onward_type in _KAFKA_RULES:
        if issubclass(exc_type, driver_type):
            return onward_type
    if issubclass(exc_type, kafka_errors.KafkaError) and getattr(exc_type, "retriable", False):
        return BackendUnavailableError
    for rules in (_SQLITE_RULES, _REDIS_RULES, _ASYNCPG_RULES):
        for driver_type, onward_type in rules:
            if issubclass(exc_type, driver_type):
                return onward_type
    return None


def translate(exc: BaseException, *, context: str, run_id: str | None = None) -> OnwardError:
    """Turn a driver exception into the most specific Onward error.

    Args:
        exc: The driver's exception. Raise the result ``from exc`` so the cause stays attached.
        context: What Onward was doing, in a few words ("appending to partition 3").
        run_id: The run concerned, if any.
    """
    if isinstance(exc, OnwardError):
        return exc
    onward_type = classify(type(exc)) or BackendError
    if isinstance(exc, sqlite3.OperationalError) and not _sqlite_busy(exc):
        onward_type = BackendError  # a bad statement or a broken file, not a passing contention
    message = f"{context}: {type(exc).__name__}: {exc}"
    if run_id is not None:
        message = f"run {run_id!r}: {message}"
    if onward_type is BackendUnavailableError:
        message += " (the server did not answer; retry once it is reachable)"
    return onward_type(message, run_id=run_id)


def _sqlite_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


__all__ = [
    "BackendError",
    "BackendUnavailableError",
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
    "PayloadTooLargeError",
    "ProducerFatalError",
    "ResumeConflictError",
    "RevisionMismatchError",
    "SchemaMismatchError",
    "classify",
    "translate",
]
