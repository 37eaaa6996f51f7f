"""Driver exceptions into Onward errors: the one place that knows every driver's types.

:func:`translate` turns an aiokafka, sqlite3, redis-py or asyncpg exception (or a socket failure
under one) into the most specific error of `onward.errors`; :func:`classify` returns ``None`` for
a driver exception it has no rule for, and a test enumerates every driver exception and fails on
any such gap. :func:`translated` wraps a block of driver calls so none of their exceptions leaves
it untranslated.

Each driver is imported only by the stores of its backend: redis-py loads its client, parsers
and OpenTelemetry metrics (~60 ms, ~9 MiB), aiokafka ~170 ms and asyncpg ~40 ms, which a process
on another backend (a command on SQLite, a projector) never uses. No driver's exception can
exist before something imports it, so each driver's rules are looked up only once its
exceptions module is in ``sys.modules``.
"""

from __future__ import annotations

import functools
import sqlite3
import ssl
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from onward.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
    InvalidInputError,
    LogTruncatedError,
    OnwardError,
    PayloadTooLargeError,
    ProducerFatalError,
    SchemaMismatchError,
)

_Rules = tuple[tuple[type[BaseException], type[OnwardError]], ...]
"""Checked in order: the first class the exception is an instance of wins."""

_KAFKA_ERRORS = "aiokafka.errors"
"""aiokafka's exceptions module: once it is in ``sys.modules``, its errors can be raised."""

_POSTGRES_ERRORS = "asyncpg.exceptions"
"""asyncpg's exceptions module: once it is in ``sys.modules``, its errors can be raised."""


@functools.cache
def _loaded_kafka_rules() -> _Rules:
    import aiokafka.errors as kafka_errors  # noqa: PLC0415  (already imported: a look-up)

    return (
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
_SQLITE_RULES: _Rules = (
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


_REDIS_ERRORS = "redis.exceptions"
"""redis-py's exceptions module: once it is in ``sys.modules``, its errors can be raised."""


def _redis_rules() -> _Rules:
    """redis-py's rules once something has imported redis-py, else none (nothing can raise them)."""
    if _REDIS_ERRORS not in sys.modules:
        return ()
    return _loaded_redis_rules()


@functools.cache
def _loaded_redis_rules() -> _Rules:
    import redis.exceptions as redis_errors  # noqa: PLC0415  (already imported: a look-up)

    return (
        # A refused login or command is a deployment fact; retrying will not change it.
        (redis_errors.AuthenticationError, ConfigurationError),
        (redis_errors.AuthenticationWrongNumberOfArgsError, ConfigurationError),
        (redis_errors.AuthorizationError, ConfigurationError),
        (redis_errors.NoPermissionError, ConfigurationError),
        *_since_floor(redis_errors, ("ExternalAuthProviderError", ConfigurationError)),
        (redis_errors.ModuleError, ConfigurationError),
        (redis_errors.ClusterCrossSlotError, ConfigurationError),
        *_since_floor(
            redis_errors,
            ("CrossSlotTransactionError", ConfigurationError),
            ("IncorrectPolicyType", ConfigurationError),
        ),
        # A primary demoted in a failover answers READONLY until the client reaches the new one.
        (redis_errors.ReadOnlyError, BackendUnavailableError),
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
        *_since_floor(
            redis_errors,
            ("NoSuchFieldsetError", BackendError),
            ("InvalidPipelineStack", BackendError),
        ),
        (redis_errors.InvalidResponse, BackendError),
        (redis_errors.LockNotOwnedError, BackendError),
        (redis_errors.LockError, BackendError),
        (redis_errors.PubSubError, BackendError),
        (redis_errors.WatchError, BackendError),
        (redis_errors.DataError, BackendError),
        (redis_errors.ResponseError, BackendError),
        (redis_errors.RedisError, BackendError),
    )


def _since_floor(module: ModuleType, *rules: tuple[str, type[OnwardError]]) -> _Rules:
    """The rules of ``rules`` whose class ``module`` has: redis-py releases after the 6.0 floor
    added these classes, and a redis-py without one cannot raise it."""
    return tuple((getattr(module, name), target) for name, target in rules if hasattr(module, name))


def _is_redis_error(exc: BaseException, *names: str) -> bool:
    """Whether ``exc`` is an instance of one of redis-py's exceptions named ``names``; never
    before redis-py is imported, since nothing could have raised one."""
    redis_errors = sys.modules.get(_REDIS_ERRORS)
    if redis_errors is None:
        return False
    return isinstance(exc, tuple(getattr(redis_errors, name) for name in names))


# asyncpg names one class per SQLSTATE (hundreds); the rules go by SQLSTATE class, the most
# specific first, and every other server error is a plain BackendError.
@functools.cache
def _loaded_postgres_rules() -> _Rules:
    import asyncpg.exceptions as pg_errors  # noqa: PLC0415  (already imported: a look-up)

    return (
        (pg_errors.InvalidPasswordError, ConfigurationError),
        (pg_errors.InvalidAuthorizationSpecificationError, ConfigurationError),
        (pg_errors.InsufficientPrivilegeError, ConfigurationError),
        (pg_errors.InvalidCatalogNameError, ConfigurationError),
        # The client refusing its own connection options (an unknown sslmode in DATABASE_URL).
        (pg_errors.ClientConfigurationError, ConfigurationError),
        (pg_errors.UndefinedTableError, SchemaMismatchError),
        (pg_errors.UndefinedColumnError, SchemaMismatchError),
        (pg_errors.UndefinedFunctionError, SchemaMismatchError),
        (pg_errors.PostgresConnectionError, BackendUnavailableError),
        # A standby reached after a failover, or a primary made read-only for now
        # (default_transaction_read_only, as some managed services do on a full disk).
        (pg_errors.ReadOnlySQLTransactionError, BackendUnavailableError),
        # The server cannot say whether the statement took effect: a retry must find out first.
        (pg_errors.StatementCompletionUnknownError, BackendUnavailableError),
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
        (pg_errors.InternalClientError, BackendError),
        (pg_errors.PostgresError, BackendError),
        (pg_errors.PostgresWarning, BackendError),  # notices, raised only if warnings are errors
        (pg_errors.InterfaceWarning, BackendError),  # the client's own, likewise
    )


_SOCKET_RULES: _Rules = (
    # Socket-level failures reaching a server (refused, reset, unreachable, timed out), under
    # every driver; checked after asyncpg's.
    (ConnectionError, BackendUnavailableError),
    (TimeoutError, BackendUnavailableError),
    (OSError, BackendUnavailableError),
)


def _kafka_rules() -> _Rules:
    """aiokafka's rules once something has imported aiokafka, else none (nothing can raise them)."""
    if _KAFKA_ERRORS not in sys.modules:
        return ()
    return _loaded_kafka_rules()


def _kafka_retriable(exc_type: type[BaseException]) -> bool:
    """Whether ``exc_type`` is a Kafka error aiokafka marks retriable (per error code)."""
    if _KAFKA_ERRORS not in sys.modules:
        return False
    import aiokafka.errors as kafka_errors  # noqa: PLC0415  (already imported: a look-up)

    return issubclass(exc_type, kafka_errors.KafkaError) and getattr(exc_type, "retriable", False)


def _postgres_rules() -> _Rules:
    """asyncpg's rules once something has imported asyncpg, else none (nothing can raise them)."""
    if _POSTGRES_ERRORS not in sys.modules:
        return ()
    return _loaded_postgres_rules()


def _is_postgres_error(exc: BaseException, *names: str) -> bool:
    """Whether ``exc`` is an instance of one of asyncpg's exceptions named ``names``; never
    before asyncpg is imported, since nothing could have raised one."""
    pg_errors = sys.modules.get(_POSTGRES_ERRORS)
    if pg_errors is None:
        return False
    return isinstance(exc, tuple(getattr(pg_errors, name) for name in names))


def classify(exc_type: type[BaseException]) -> type[OnwardError] | None:
    """The Onward error a driver exception type becomes, or ``None`` if no rule covers it."""
    for driver_type, onward_type in _kafka_rules():
        if issubclass(exc_type, driver_type):
            return onward_type
    if _kafka_retriable(exc_type):
        return BackendUnavailableError
    for rules in (_SQLITE_RULES, _redis_rules(), _postgres_rules(), _SOCKET_RULES):
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
    local = _local_file(exc)
    if local:
        onward_type = BackendError  # a path or its permissions, which a retry will not change
    message = f"{context}: {type(exc).__name__}: {exc}"
    setting = refused_setting(exc)
    if setting is not None:
        onward_type = ConfigurationError
        message += f"; {setting}"
    if run_id is not None:
        message = f"run {run_id!r}: {message}"
    if local:
        message += " (a file on this machine, not a server: check the path and its permissions)"
    if onward_type is BackendUnavailableError:
        if _contended(exc):
            message += " (it lost to a concurrent transaction; retry)"
        elif _read_only(exc):
            message += (
                " (the server is read-only, as a replica or a primary is for a while after a "
                "failover; retry, and if it persists point the URL at the primary)"
            )
        elif _is_postgres_error(exc, "StatementCompletionUnknownError"):
            message += " (it may or may not have taken effect; read back before doing it again)"
        elif _cannot_now(exc):
            message += " (the server answered that it cannot do it now; retry later)"
        else:
            message += " (the server did not answer; retry once it is reachable)"
    return onward_type(message, run_id=run_id)


_CONTENTION = ("DeadlockDetectedError", "SerializationError", "LockNotAvailableError")
"""asyncpg's names of PostgreSQL's refusals of a transaction that met another: the server
answered."""


def _contended(exc: BaseException) -> bool:
    """Whether ``exc`` is a store refusing a transaction that met a concurrent one (a
    deadlock, a serialization failure, a lock not granted, a busy SQLite file), which an
    operator must not read as a server that is away."""
    if isinstance(exc, sqlite3.OperationalError):
        return _sqlite_busy(exc)
    return _is_postgres_error(exc, *_CONTENTION)


def _cannot_now(exc: BaseException) -> bool:
    """Whether ``exc`` is a server's own answer that it cannot serve the call for now (a full
    disk, no memory left, its connection limit, a partition without its replicas), which an
    operator must not read as a server that is away: the fix is on the server, not the
    network."""
    if _is_postgres_error(exc, "InsufficientResourcesError"):
        return True
    kafka_errors = sys.modules.get(_KAFKA_ERRORS)
    if kafka_errors is not None and isinstance(exc, kafka_errors.BrokerResponseError):
        return True
    if _REDIS_ERRORS not in sys.modules:
        return False
    import redis.exceptions as redis_errors  # noqa: PLC0415  (already imported: a look-up)

    return isinstance(exc, redis_errors.ResponseError)


def _local_file(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure on a file of this machine (a lock file that cannot be
    opened), which names its file, rather than on a socket to a server."""
    return (
        isinstance(exc, OSError)
        and not isinstance(exc, ConnectionError | TimeoutError)
        and exc.filename is not None
    )


def _read_only(exc: BaseException) -> bool:
    """Whether ``exc`` is a server refusing a write because it is read-only now (a replica, a
    primary demoted in a failover), which passes once the client reaches the new primary."""
    if _is_postgres_error(exc, "ReadOnlySQLTransactionError"):
        return True
    if _REDIS_ERRORS not in sys.modules:
        return False
    import redis.exceptions as redis_errors  # noqa: PLC0415  (already imported: a look-up)

    return isinstance(exc, redis_errors.ReadOnlyError)


_TLS_UNVERIFIED = "CERTIFICATE_VERIFY_FAILED"
"""OpenSSL's reason for a server certificate the client's CA did not sign (or a wrong name)."""


def refused_setting(exc: BaseException) -> str | None:
    """For a connection a server or TLS refused for good, which setting to change; else ``None``.

    A wrong password, a CA that did not sign the server's certificate, a plaintext login a
    server takes over TLS only, a database the server does not have or a user whose ACL
    refuses Onward's commands will fail the same way however often it is retried, so each is
    a `ConfigurationError` naming the setting.
    """
    if _is_postgres_error(exc, "InvalidPasswordError"):
        return "check the user and password in DATABASE_URL"
    if _is_postgres_error(exc, "InvalidCatalogNameError"):
        return "create that database, or name one the server has in DATABASE_URL"
    if _is_postgres_error(exc, "InvalidAuthorizationSpecificationError") and (
        "no encryption" in str(exc)
    ):
        return "the server lets this user in over TLS only: set sslmode=verify-full in DATABASE_URL"
    if isinstance(exc, ssl.SSLCertVerificationError):  # asyncpg raises it as it is
        return (
            "the server's TLS certificate was not accepted: set sslrootcert in DATABASE_URL to "
            "the CA file that signed it"
        )
    if _is_redis_error(exc, "ConnectionError") and _TLS_UNVERIFIED in str(exc):
        return (
            "the server's TLS certificate was not accepted: give the CA file that signed it as "
            "ssl_ca_certs in REDIS_URL (rediss://host:port/db?ssl_ca_certs=/path/to/ca.pem)"
        )
    return _refused_redis_setting(exc)


_REDIS_NO_SUCH_DATABASE = "DB index is out of range"
"""Redis's answer to SELECT of a database number at or above its ``databases`` setting."""

_REDIS_CLUSTER_SELECT = "SELECT is not allowed in cluster mode"
"""A Redis Cluster node's answer to SELECT: a cluster has database 0 alone."""

_REDIS_CLUSTER_ANSWERS = ("ClusterCrossSlotError", "ClusterDownError", "MovedError", "AskError")
"""redis-py's exceptions for answers only a Redis Cluster node gives."""

_REDIS_UNKNOWN_COMMAND = "unknown command"
"""Redis's answer to a command it does not have, or that ``rename-command`` took away."""


def _refused_redis_setting(exc: BaseException) -> str | None:
    """For an answer Redis gives a wrong REDIS_URL whatever the retry, which part to change:
    its database number, its user and password, that user's ACL, or the server it names (a
    Redis Cluster node, a server without Onward's commands)."""
    answer = str(exc) if _is_redis_error(exc, "ResponseError") else ""
    if _is_redis_error(exc, *_REDIS_CLUSTER_ANSWERS) or answer.startswith(_REDIS_CLUSTER_SELECT):
        return (
            "the server is a Redis Cluster node, and Onward's scripts touch several runs' keys "
            "at once: give a single Redis node (not Redis Cluster) in REDIS_URL"
        )
    if answer.startswith(_REDIS_UNKNOWN_COMMAND):
        return (
            "the server does not take this command (taken away with rename-command, or a "
            "server without it): point REDIS_URL at a Redis that takes it"
        )
    if answer.startswith(_REDIS_NO_SUCH_DATABASE):
        return (
            "REDIS_URL names a database the server does not have (it has 16, numbered 0 to 15, "
            "unless its `databases` setting says more): end REDIS_URL with one it has, as "
            "redis://host:port/0"
        )
    if _is_redis_error(exc, "AuthenticationError", "AuthenticationWrongNumberOfArgsError"):
        return (
            "check the user and password in REDIS_URL (redis://user:password@host:port/db, or "
            "redis://:password@host:port/db for a server's requirepass)"
        )
    if _is_redis_error(exc, "NoPermissionError"):
        return (
            "the user in REDIS_URL lacks that permission: grant it to that user (ACL SETUSER) "
            "or give REDIS_URL a user that has it"
        )
    return None


def unusable_tls_file(named: Iterable[tuple[str, str, bool]]) -> str | None:
    """Of the TLS files a client loads before it connects, the first that cannot be loaded,
    in one line naming the setting that names it; ``None`` if every one can be.

    A driver loading such a file fails with a bare OSError, as it does for a server it cannot
    reach, so its failure is asked about here rather than taken for the server's.

    Args:
        named: Per file: the setting that names it ("sslrootcert in DATABASE_URL"), its path,
            and whether it holds CA certificates (loaded as such) rather than a client
            certificate or key (read).
    """
    for setting, path, authorities in named:
        try:
            if authorities:
                ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
            else:
                Path(path).read_bytes()
        except OSError as exc:
            return (
                f"{setting} names {path}, which cannot be used: {exc.strerror or exc}; give the "
                "path of a readable PEM file"
            )
    return None


def unusable_client_certificate(
    certificate: tuple[str, str],
    key: tuple[str, str] | None,
    password: tuple[str, str | None],
) -> str | None:
    """Whether a client certificate and its key, files that can be read, still cannot be
    loaded together, and why, in one line naming the setting at fault; ``None`` if they can.

    A file that is not PEM, a key that is not the certificate's or a wrong key password fails
    the driver's load with `ssl.SSLError`, a bare OSError as an unreachable server's is; call
    this once :func:`unusable_tls_file` found every file readable.

    Args:
        certificate: The setting naming the certificate file, and its path.
        key: The setting naming the key file, and its path; ``None`` when the key is in the
            certificate's file.
        password: The setting that gives the key's password, and the password (``None`` if
            unset: then an encrypted key fails rather than prompt on a terminal).
    """
    setting, path = certificate
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
    except ssl.SSLError:
        return (
            f"{setting} names {path}, which cannot be used: it holds no PEM certificate; give "
            "the path of the client certificate in PEM"
        )
    except OSError:
        return None  # not readable: said by `unusable_tls_file`
    key_setting, key_path = key or certificate
    password_setting, secret = password
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(
            path, key[1] if key else None, password=lambda: secret or ""
        )
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            why = f"it is not the key of the certificate {path}"
        elif secret:
            why = f"it holds no PEM key that {password_setting} decrypts"
        else:
            why = f"it holds no PEM key (an encrypted one needs its password as {password_setting})"
        return f"{key_setting} names {key_path}, which cannot be used: {why}"
    except OSError:
        return None
    return None


def redis_plaintext_refused(exc: BaseException, url: str) -> str | None:
    """For a ``redis://`` client whose first command a TLS-only port cut off, what to change.

    A TLS port reads the command as a broken handshake and drops the connection; a server that
    is down refuses the connection instead, so that stays `BackendUnavailableError`.
    """
    text = str(exc)
    if not url.startswith("redis://") or not _is_redis_error(exc, "ConnectionError"):
        return None
    if "reset by peer" in text or "closed by server" in text:
        return (
            "Redis dropped the connection at the first command, as a TLS-only port does: if the "
            "server takes TLS, use rediss:// in REDIS_URL"
        )
    return None


def _sqlite_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


_SERVER_DRIVERS = (_KAFKA_ERRORS, _POSTGRES_ERRORS, _REDIS_ERRORS)

if TYPE_CHECKING:
    DRIVER_ERRORS: tuple[type[BaseException], ...]
    """Every exception a Kafka, SQLite or PostgreSQL call may raise (not redis-py's): looked up
    on first use (`__getattr__`), which imports aiokafka and asyncpg, so only the modules that
    use those drivers anyway name it."""


def __getattr__(name: str) -> object:
    """`DRIVER_ERRORS`, made on first access (PEP 562)."""
    if name != "DRIVER_ERRORS":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import aiokafka.errors  # noqa: PLC0415, F401  (its users have imported it already)
    import asyncpg.exceptions  # noqa: PLC0415, F401

    return _driver_errors_of((_KAFKA_ERRORS, _POSTGRES_ERRORS))


def server_driver_errors() -> tuple[type[BaseException], ...]:
    """`DRIVER_ERRORS` of the drivers imported so far, importing none: what an ``except``
    clause names to catch any Kafka, SQLite or PostgreSQL exception (none of a driver not
    imported can have been raised)."""
    return _driver_errors_of(
        tuple(name for name in (_KAFKA_ERRORS, _POSTGRES_ERRORS) if name in sys.modules)
    )


def driver_errors() -> tuple[type[BaseException], ...]:
    """Every exception a driver call may raise; :func:`translated` catches these and no others.

    A function, not a constant, so each driver's errors join once something has imported that
    driver; an ``except driver_errors():`` clause is evaluated only when an exception is being
    matched.
    """
    return _driver_errors_of(tuple(name for name in _SERVER_DRIVERS if name in sys.modules))


@functools.cache
def _driver_errors_of(loaded: tuple[str, ...]) -> tuple[type[BaseException], ...]:
    """The exceptions of SQLite, of sockets and of the ``loaded`` drivers' exceptions modules."""
    errors: list[type[BaseException]] = [sqlite3.Error]
    if _KAFKA_ERRORS in loaded:
        import aiokafka.errors as kafka_errors  # noqa: PLC0415  (already imported: a look-up)

        # ConsumerStoppedError is not a KafkaError: a read whose consumer was stopped.
        errors += [kafka_errors.KafkaError, kafka_errors.ConsumerStoppedError]
    if _POSTGRES_ERRORS in loaded:
        import asyncpg.exceptions as pg_errors  # noqa: PLC0415  (already imported: a look-up)

        errors += [pg_errors.PostgresError, pg_errors.InterfaceError, pg_errors.InternalClientError]
    if _REDIS_ERRORS in loaded:
        import redis.exceptions as redis_errors  # noqa: PLC0415  (already imported: a look-up)

        errors.append(redis_errors.RedisError)
    errors.append(OSError)  # sockets under every driver; ConnectionError and TimeoutError too
    return tuple(errors)


@contextmanager
def translated(context: str, *, run_id: str | None = None) -> Iterator[None]:
    """Translate any driver exception raised in the block, ``from`` the original.

    A plain context manager, so it wraps awaits as well; cancellation and Onward's own errors
    pass through untouched.
    """
    try:
        yield
    except driver_errors() as exc:
        raise translate(exc, context=context, run_id=run_id) from exc


_P = ParamSpec("_P")
_T = TypeVar("_T")


def translating(
    context: str,
) -> Callable[[Callable[_P, Awaitable[_T]]], Callable[_P, Awaitable[_T]]]:
    """Decorate a coroutine function so its driver exceptions are translated, as :func:`translated`.

    For functions that take a connection from their caller (builds, migrations) and may be called
    outside any store.
    """

    def decorate(fn: Callable[_P, Awaitable[_T]]) -> Callable[_P, Awaitable[_T]]:
        @functools.wraps(fn)
        async def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T:
            with translated(context):
                return await fn(*args, **kwargs)

        return wrapper

    return decorate
