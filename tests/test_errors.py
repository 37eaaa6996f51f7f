"""The error tree: one root, and every driver exception mapped to a specific Onward error."""

from __future__ import annotations

import inspect
import socket
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import aiokafka.errors as kafka_errors
import asyncpg.exceptions as pg_errors
import pytest
import pytest_asyncio
import redis.exceptions as redis_errors

import onward.errors as errors
from onward._storage import classify, translate
from onward.errors import OnwardError
from onward.eventlog import (
    AnyEvent,
    EventLog,
    KafkaEventLog,
    MemoryEventLog,
    Message,
    ModelAnswered,
    Position,
    RunStarted,
    SqliteEventLog,
    StoredEvent,
    ToolCall,
    ToolCompleted,
    ToolDispatched,
)
from onward.projections.frontier import CallState, Frontier, fold_all
from onward.runtime.agent import Agent
from onward.runtime.leases import LeaseStore, MemoryLeaseStore, SqliteLeaseStore
from onward.runtime.planning import plan_resume, refuse_if_undecidable
from onward.runtime.tools import tool
from onward.testing.eventlog import TENANT, runs_in_partition, step_events

# Abstract bases the driver never raises itself; mapping them would hide new subclasses.
_ABSTRACT = {kafka_errors.KafkaError, kafka_errors.BrokerResponseError}


def _driver_exception_types() -> list[type[BaseException]]:
    found: list[type[BaseException]] = []
    for module in (kafka_errors, sqlite3, redis_errors, pg_errors):
        for _, value in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(value, BaseException)
                and value.__module__.startswith(module.__name__)
                and value not in _ABSTRACT
            ):
                found.append(value)
    return found


def _redis_since_floor(*names: str) -> tuple[type[BaseException], ...]:
    """The classes of ``names`` this redis-py has: releases after the 6.0 floor added them, and
    a redis-py without them cannot raise them."""
    return tuple(getattr(redis_errors, name) for name in names if hasattr(redis_errors, name))


# What each driver exception must become. The classes whose target someone chose are listed;
# every other class is grouped with its nearest listed ancestor (its first base in the table),
# and a Kafka error under no listed class goes by aiokafka's `retriable` flag. A class that
# falls in no group has no expected target and fails the test until it is placed.
_EXPECTED: dict[type[OnwardError], tuple[type[BaseException], ...]] = {
    errors.ProducerFatalError: (
        kafka_errors.OutOfOrderSequenceNumber,
        kafka_errors.DuplicateSequenceNumber,
        kafka_errors.UnknownProducerId,
        kafka_errors.InvalidProducerEpoch,
        kafka_errors.InvalidProducerIdMapping,
        kafka_errors.ProducerFenced,
    ),
    errors.PayloadTooLargeError: (
        kafka_errors.MessageSizeTooLargeError,
        kafka_errors.RecordTooLargeError,
        kafka_errors.RecordListTooLargeError,
    ),
    errors.LogTruncatedError: (
        kafka_errors.OffsetOutOfRangeError,
        kafka_errors.NoOffsetForPartitionError,
    ),
    errors.SchemaMismatchError: (
        pg_errors.UndefinedTableError,
        pg_errors.UndefinedColumnError,
        pg_errors.UndefinedFunctionError,
    ),
    errors.InvalidInputError: (sqlite3.DataError,),
    errors.ConfigurationError: (
        # Kafka: versions, settings, topics, security; retrying changes none of them.
        kafka_errors.UnrecognizedBrokerVersion,
        kafka_errors.IncompatibleBrokerVersion,
        kafka_errors.UnsupportedVersionError,
        kafka_errors.UnsupportedForMessageFormatError,
        kafka_errors.UnsupportedCodecError,
        kafka_errors.KafkaConfigurationError,
        kafka_errors.InvalidTopicError,
        kafka_errors.InvalidPartitionsError,
        kafka_errors.InvalidReplicationFactorError,
        kafka_errors.InvalidReplicationAssignmentError,
        kafka_errors.InvalidConfigurationError,
        kafka_errors.InvalidRequiredAcksError,
        kafka_errors.InvalidTransactionTimeout,
        kafka_errors.InvalidSessionTimeoutError,
        kafka_errors.InvalidGroupIdError,
        kafka_errors.InconsistentGroupProtocolError,
        kafka_errors.PolicyViolationError,
        kafka_errors.SecurityDisabled,
        kafka_errors.AuthenticationMethodNotSupported,
        kafka_errors.AuthenticationFailedError,
        kafka_errors.SaslAuthenticationFailed,
        kafka_errors.UnsupportedSaslMechanismError,
        kafka_errors.IllegalSaslStateError,
        kafka_errors.TopicAuthorizationFailedError,
        kafka_errors.GroupAuthorizationFailedError,
        kafka_errors.ClusterAuthorizationFailedError,
        kafka_errors.TransactionalIdAuthorizationFailed,
        kafka_errors.DelegationTokenAuthDisabled,
        kafka_errors.DelegationTokenNotFound,
        kafka_errors.DelegationTokenOwnerMismatch,
        kafka_errors.DelegationTokenRequestNotAllowed,
        kafka_errors.DelegationTokenAuthorizationFailed,
        kafka_errors.DelegationTokenExpired,
        kafka_errors.InvalidPrincipalType,
        kafka_errors.LogDirNotFound,
        kafka_errors.ListenerNotFound,
        # SQLite: a feature this build of SQLite lacks.
        sqlite3.NotSupportedError,
        # Redis: a refused login or command, a cluster-only command.
        redis_errors.AuthenticationError,
        redis_errors.AuthenticationWrongNumberOfArgsError,
        redis_errors.AuthorizationError,
        redis_errors.NoPermissionError,
        *_redis_since_floor("ExternalAuthProviderError"),
        redis_errors.ModuleError,
        redis_errors.ClusterCrossSlotError,
        *_redis_since_floor("CrossSlotTransactionError", "IncorrectPolicyType"),
        # PostgreSQL: credentials, privileges, a database that does not exist.
        pg_errors.InvalidPasswordError,
        pg_errors.InvalidAuthorizationSpecificationError,
        pg_errors.InsufficientPrivilegeError,
        pg_errors.InvalidCatalogNameError,
        # asyncpg refusing the connection options themselves (an unknown sslmode).
        pg_errors.ClientConfigurationError,
    ),
    errors.BackendUnavailableError: (
        # Kafka: no broker, a leader moving, a rebalance, a request that timed out.
        kafka_errors.KafkaTimeoutError,
        kafka_errors.KafkaUnavailableError,
        kafka_errors.BrokerNotAvailableError,
        kafka_errors.ReplicaNotAvailableError,
        kafka_errors.ProducerClosed,
        kafka_errors.ConsumerStoppedError,
        kafka_errors.StaleControllerEpochError,
        kafka_errors.StaleLeaderEpochCodeError,
        kafka_errors.RebalanceInProgressError,
        kafka_errors.ConcurrentTransactions,
        kafka_errors.ReassignmentInProgress,
        kafka_errors.OperationNotAttempted,
        kafka_errors.FetchSessionIdNotFound,
        kafka_errors.InvalidFetchSessionEpoch,
        kafka_errors.MemberIdRequired,
        kafka_errors.NoBrokersAvailable,
        kafka_errors.NodeNotReadyError,
        kafka_errors.KafkaProtocolError,
        kafka_errors.Cancelled,
        kafka_errors.TooManyInFlightRequests,
        kafka_errors.StaleMetadata,
        kafka_errors.MetadataEmptyBrokerList,
        kafka_errors.KafkaConnectionError,
        kafka_errors.NotLeaderForPartitionError,
        # SQLite: locked or busy (translate() narrows a non-busy one to BackendError).
        sqlite3.OperationalError,
        # Redis: down, slow, loading, out of memory, a cluster slot with no node, a primary
        # demoted in a failover (READONLY until the client reaches the new one).
        redis_errors.MaxConnectionsError,
        redis_errors.ConnectionError,
        redis_errors.TimeoutError,
        redis_errors.BusyLoadingError,
        redis_errors.TryAgainError,
        redis_errors.ClusterDownError,
        redis_errors.MasterDownError,
        redis_errors.OutOfMemoryError,
        redis_errors.SlotNotCoveredError,
        redis_errors.ReadOnlyError,
        # PostgreSQL: connections, restarts, contention that a retry can win.
        pg_errors.PostgresConnectionError,
        pg_errors.CannotConnectNowError,
        pg_errors.TooManyConnectionsError,
        pg_errors.AdminShutdownError,
        pg_errors.CrashShutdownError,
        pg_errors.InsufficientResourcesError,
        pg_errors.SerializationError,
        pg_errors.DeadlockDetectedError,
        pg_errors.LockNotAvailableError,
        pg_errors.QueryCanceledError,
        pg_errors.ConnectionDoesNotExistError,
        # PostgreSQL: read-only for now (a standby after a failover), an outcome unknown.
        pg_errors.ReadOnlySQLTransactionError,
        pg_errors.StatementCompletionUnknownError,
        # A socket under any driver: refused, reset, unreachable, timed out.
        ConnectionError,
        TimeoutError,
        OSError,
    ),
    errors.BackendError: (
        # Kafka answers that mean our own logic or the broker's state is wrong.
        kafka_errors.IllegalStateError,
        kafka_errors.IllegalArgumentError,
        kafka_errors.IllegalOperation,
        kafka_errors.CommitFailedError,
        kafka_errors.QuotaViolationError,
        kafka_errors.NoError,
        kafka_errors.UnknownError,
        kafka_errors.CorruptRecordException,
        kafka_errors.InvalidFetchRequestError,
        kafka_errors.OffsetMetadataTooLargeError,
        kafka_errors.NotEnoughReplicasAfterAppendError,
        kafka_errors.IllegalGenerationError,
        kafka_errors.UnknownMemberIdError,
        kafka_errors.InvalidCommitOffsetSizeError,
        kafka_errors.InvalidTimestampError,
        kafka_errors.TopicAlreadyExistsError,
        kafka_errors.InvalidRequestError,
        kafka_errors.InvalidTxnState,
        kafka_errors.TransactionCoordinatorFenced,
        kafka_errors.NonEmptyGroup,
        kafka_errors.GroupIdNotFound,
        # Every other error of SQLite, Redis and PostgreSQL: a constraint, a bad statement.
        sqlite3.Error,
        sqlite3.IntegrityError,
        sqlite3.Warning,
        redis_errors.RedisError,
        redis_errors.RedisClusterException,
        *_redis_since_floor("InvalidPipelineStack"),
        redis_errors.ResponseError,
        redis_errors.WatchError,
        redis_errors.LockError,
        redis_errors.ChildDeadlockedError,
        redis_errors.AskError,
        redis_errors.MovedError,
        pg_errors.PostgresError,
        pg_errors.PostgresWarning,
        pg_errors.InterfaceWarning,
        pg_errors.InterfaceError,
        pg_errors.InternalClientError,
        pg_errors.UniqueViolationError,
    ),
}
_TARGET = {driver: target for target, drivers in _EXPECTED.items() for driver in drivers}


def _expected_target(driver_type: type[BaseException]) -> type[OnwardError] | None:
    """The class itself if listed, else its nearest listed ancestor, else a Kafka error's
    `retriable` flag; ``None`` for a class in no group."""
    for ancestor in driver_type.__mro__:
        if ancestor in _TARGET:
            return _TARGET[ancestor]
    retriable = getattr(driver_type, "retriable", False)
    if issubclass(driver_type, kafka_errors.KafkaError) and retriable:
        return errors.BackendUnavailableError
    return None


@pytest.mark.parametrize(
    "module", [kafka_errors, sqlite3, redis_errors, pg_errors], ids=lambda m: m.__name__
)
def test_every_driver_exception_maps_to_its_expected_error(module: ModuleType) -> None:
    """Fails naming each class whose Onward error changed, or that no rule or group covers."""
    found = [t for t in _driver_exception_types() if t.__module__.startswith(module.__name__)]
    assert found
    wrong = {
        t.__name__: (_name(classify(t)), _name(_expected_target(t)))
        for t in found
        if classify(t) is not _expected_target(t) or _expected_target(t) is None
    }
    assert wrong == {}, "class: (maps to, expected)"


def _name(target: type[BaseException] | None) -> str | None:
    return None if target is None else target.__name__


def test_every_listed_class_is_a_driver_exception_or_a_socket_error() -> None:
    """The table and the enumeration describe the same classes (the socket errors aside)."""
    assert set(_TARGET) - set(_driver_exception_types()) == {ConnectionError, TimeoutError, OSError}


def test_socket_errors_under_a_driver_map_to_unavailable() -> None:
    """A driver may let the socket's own error through: an outage, retryable."""
    sockets = [ConnectionRefusedError, ConnectionResetError, TimeoutError, socket.gaierror, OSError]
    assert {t.__name__: _name(classify(t)) for t in sockets} == dict.fromkeys(
        (t.__name__ for t in sockets), "BackendUnavailableError"
    )


def test_the_driver_enumeration_sees_both_drivers() -> None:
    names = {t.__name__ for t in _driver_exception_types()}
    assert {
        "KafkaConnectionError",
        "OutOfOrderSequenceNumber",
        "OperationalError",
        "ConnectionError",
        "UniqueViolationError",
    } <= names


@pytest.mark.parametrize(
    ("driver_error", "expected"),
    [
        (kafka_errors.KafkaConnectionError("down"), errors.BackendUnavailableError),
        (kafka_errors.NotLeaderForPartitionError(), errors.BackendUnavailableError),
        (kafka_errors.OutOfOrderSequenceNumber(), errors.ProducerFatalError),
        (kafka_errors.UnknownProducerId(), errors.ProducerFatalError),
        (kafka_errors.MessageSizeTooLargeError(), errors.PayloadTooLargeError),
        (kafka_errors.OffsetOutOfRangeError(), errors.LogTruncatedError),
        (kafka_errors.TopicAuthorizationFailedError(), errors.ConfigurationError),
        (sqlite3.OperationalError("database is locked"), errors.BackendUnavailableError),
        (sqlite3.DatabaseError("file is not a database"), errors.BackendError),
        (redis_errors.ConnectionError("refused"), errors.BackendUnavailableError),
        (redis_errors.AuthenticationError("bad password"), errors.ConfigurationError),
        (redis_errors.ResponseError("WRONGTYPE"), errors.BackendError),
        (pg_errors.InvalidPasswordError("no"), errors.ConfigurationError),
        (pg_errors.UndefinedTableError("no table"), errors.SchemaMismatchError),
        (pg_errors.TooManyConnectionsError("busy"), errors.BackendUnavailableError),
        (pg_errors.UniqueViolationError("dup"), errors.BackendError),
        (ConnectionRefusedError("refused"), errors.BackendUnavailableError),
    ],
)
def test_translate_picks_the_most_specific_error(
    driver_error: BaseException, expected: type[OnwardError]
) -> None:
    translated = translate(driver_error, context="appending to partition 3", run_id="run-9")
    assert type(translated) is expected
    assert translated.run_id == "run-9"
    assert "appending to partition 3" in str(translated)


@pytest.mark.parametrize(
    "redirected",
    [redis_errors.MovedError("3999 127.0.0.1:6381"), redis_errors.AskError("3999 127.0.0.1:6381")],
    ids=lambda exc: type(exc).__name__,
)
def test_a_redis_cluster_redirection_names_redis_url(redirected: BaseException) -> None:
    """Only a Redis Cluster node redirects a key to another node; Onward needs a single node,
    which no retry gives: it was a `BackendError` (exit 5) naming no setting."""
    translated = translate(redirected, context="renewing the lease")
    assert type(translated) is errors.ConfigurationError
    assert "a single Redis node (not Redis Cluster) in REDIS_URL" in str(translated)


@pytest.mark.parametrize(
    "contended",
    [
        pg_errors.DeadlockDetectedError("deadlock detected"),
        pg_errors.SerializationError("could not serialize access"),
        pg_errors.LockNotAvailableError("could not obtain lock"),
        sqlite3.OperationalError("database is locked"),
    ],
)
def test_a_write_that_lost_to_a_concurrent_one_says_so_not_that_the_server_is_away(
    contended: BaseException,
) -> None:
    translated = translate(contended, context="writing frontiers")
    assert type(translated) is errors.BackendUnavailableError
    assert "did not answer" not in str(translated)
    assert "lost to a concurrent transaction; retry" in str(translated)


@pytest.mark.parametrize(
    "refused",
    [
        pg_errors.DiskFullError("could not extend file: No space left on device"),
        pg_errors.TooManyConnectionsError("sorry, too many clients already"),
        pg_errors.OutOfMemoryError("out of memory"),
        redis_errors.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
        redis_errors.TryAgainError("Multiple keys request during rehashing of slot"),
        kafka_errors.NotEnoughReplicasError(),
    ],
    ids=lambda exc: type(exc).__module__.split(".")[0] + "-" + type(exc).__name__,
)
def test_a_server_that_answered_it_cannot_now_is_not_said_to_be_away(
    refused: BaseException,
) -> None:
    """An operator reading "did not answer; retry once it is reachable" looks at the network,
    not at the server's full disk, its memory or its connection limit."""
    translated = translate(refused, context="writing frontiers")
    assert type(translated) is errors.BackendUnavailableError
    assert "did not answer" not in str(translated)
    assert "answered that it cannot do it now; retry later" in str(translated)


@pytest.mark.parametrize(
    "away",
    [
        ConnectionRefusedError("refused"),
        redis_errors.ConnectionError("Error 111 connecting to cache:6379."),
        kafka_errors.KafkaConnectionError("down"),
        pg_errors.CannotConnectNowError("the database system is starting up"),
    ],
)
def test_a_server_that_did_not_answer_is_said_to_be_away(away: BaseException) -> None:
    assert "the server did not answer" in str(translate(away, context="connecting"))


@pytest.mark.parametrize(
    "refused",
    [
        redis_errors.ReadOnlyError("You can't write against a read only replica."),
        pg_errors.ReadOnlySQLTransactionError("cannot execute INSERT in a read-only transaction"),
    ],
    ids=lambda exc: type(exc).__module__.split(".")[0] + "-" + type(exc).__name__,
)
def test_a_server_read_only_after_a_failover_refuses_for_now(refused: BaseException) -> None:
    """A primary demoted in a failover, or a standby a connection was left on, refuses writes
    until the client reaches the new primary: a retry, not a deployment fault."""
    translated = translate(refused, context="renewing the lease")
    assert type(translated) is errors.BackendUnavailableError
    assert translated.retryable
    assert "the server is read-only" in str(translated)
    assert "did not answer" not in str(translated)


def test_a_statement_whose_outcome_is_unknown_says_to_read_back_before_doing_it_again() -> None:
    unknown = pg_errors.StatementCompletionUnknownError("statement completion unknown")
    translated = translate(unknown, context="appending to partition 3")
    assert type(translated) is errors.BackendUnavailableError
    assert "may or may not have taken effect" in str(translated)
    assert "did not answer" not in str(translated)


@pytest.mark.parametrize(
    "local",
    [
        PermissionError(13, "Permission denied", "/data/onward.db.fold.lock"),
        IsADirectoryError(21, "Is a directory", "/data/onward.db.fold.lock"),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_a_local_file_that_cannot_be_opened_is_not_said_to_be_a_server_away(
    local: OSError,
) -> None:
    """A lock file this process may not open fails every retry the same way; "the server did
    not answer" sent the operator to the network."""
    translated = translate(local, context="approve")
    assert type(translated) is errors.BackendError
    assert not translated.retryable
    assert "/data/onward.db.fold.lock" in str(translated)
    assert "did not answer" not in str(translated)
    assert "a file on this machine" in str(translated)


def test_an_onward_error_passes_through_untouched() -> None:
    original = errors.FencedError("run r: fence 3 superseded by 4", run_id="r")
    assert translate(original, context="x") is original


def test_every_error_hangs_from_the_root_and_ends_in_error() -> None:
    public = [getattr(errors, n) for n in errors.__all__ if isinstance(getattr(errors, n), type)]
    assert len(public) >= 15
    for error_type in public:
        assert issubclass(error_type, OnwardError)
        assert error_type.__name__.endswith("Error")


def test_the_docstring_draws_every_error() -> None:
    doc = errors.__doc__ or ""
    for name in errors.__all__:
        if isinstance(getattr(errors, name), type):
            assert name in doc, f"{name} is missing from the tree in onward/errors.py"


# -- the facts an error carries, set where it is raised ------------------------------------------


@pytest_asyncio.fixture(params=["memory", "sqlite"])
async def log(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[EventLog]:
    if request.param == "memory":
        yield MemoryEventLog(partitions=4, max_batch_bytes=4_000)
        return
    async with SqliteEventLog(tmp_path / "log.db", partitions=4, max_batch_bytes=4_000) as opened:
        yield opened


@pytest_asyncio.fixture(params=["memory", "sqlite"])
async def leases(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LeaseStore]:
    if request.param == "memory":
        yield MemoryLeaseStore()
        return
    async with SqliteLeaseStore(tmp_path / "leases.db") as opened:
        yield opened


async def test_a_read_below_a_truncated_start_names_partition_offset_and_start(
    log: EventLog,
) -> None:
    (run_id,) = runs_in_partition(2, 1, log.partitions)
    await log.append(step_events(run_id, 6))
    await log.truncate_before(2, 4)
    with pytest.raises(errors.LogTruncatedError) as caught:
        await log.read_partition(2, 1)
    assert (caught.value.partition, caught.value.offset, caught.value.start) == (2, 1, 4)
    assert caught.value.run_id is None
    with pytest.raises(errors.LogTruncatedError) as caught:
        await log.read_run(run_id, start=3)
    assert (caught.value.partition, caught.value.offset, caught.value.start) == (2, 3, 4)
    assert caught.value.run_id == run_id


async def test_a_batch_over_the_logs_cap_names_its_size_and_the_limit(log: EventLog) -> None:
    (run_id,) = runs_in_partition(0, 1, log.partitions)
    too_big = step_events(run_id, 1, body="x" * 5_000)
    with pytest.raises(errors.PayloadTooLargeError) as caught:
        await log.append(too_big)
    assert caught.value.limit == 4_000
    assert caught.value.size is not None
    assert caught.value.size > 5_000
    assert str(caught.value.size) in str(caught.value)
    assert caught.value.run_id == run_id


async def test_a_superseded_lease_is_refused_naming_its_fence_and_holder(
    leases: LeaseStore,
) -> None:
    old = await leases.acquire("run-fenced", tenant=TENANT, holder="w1", ttl_s=60)
    await leases.release(old)
    new = await leases.acquire("run-fenced", tenant=TENANT, holder="w2", ttl_s=60)
    assert new.fence > old.fence
    with pytest.raises(errors.FencedError) as caught:
        await leases.renew(old, ttl_s=60)
    assert (caught.value.fence, caught.value.holder) == (old.fence, "w1")
    assert caught.value.run_id == "run-fenced"
    with pytest.raises(errors.FencedError) as caught:
        await leases.release(old)
    assert (caught.value.fence, caught.value.holder) == (old.fence, "w1")


def test_undecided_calls_come_with_their_recorded_state() -> None:
    @tool(retry_safe=True)
    async def search(query: str, *, idempotency_key: str) -> str:
        return query

    @tool
    async def book(seat: str, *, idempotency_key: str) -> str:
        return seat

    def env(seq: int) -> dict[str, Any]:
        return {"run_id": "run-undecided", "tenant": TENANT, "seq": seq, "fence": 1, "at": seq}

    search_call = ToolCall(call_id="s", tool="search", args={"query": "LIS"}, idempotency_key="k-s")
    book_call = ToolCall(call_id="b", tool="book", args={"seat": "3A"}, idempotency_key="k-b")
    events: list[AnyEvent] = [
        RunStarted(**env(1), agent="booker", revision="r", input="book LIS"),
        ModelAnswered(
            **env(2),
            message=Message(role="assistant", content=""),
            tool_calls=[search_call, book_call],
        ),
        ToolDispatched(**env(3), call_id="s", tool="search", idempotency_key="k-s"),
        ToolDispatched(**env(4), call_id="b", tool="book", idempotency_key="k-b"),
        ToolCompleted(**env(5), call_id="s", result="flights"),
    ]
    stored = [StoredEvent(Position(0, i), e) for i, e in enumerate(events)]
    frontier = fold_all(Frontier.empty("run-undecided", TENANT), stored)
    agent = Agent(name="booker", instructions="", tools=[search, book])
    with pytest.raises(errors.IndeterminateToolCallError) as caught:
        refuse_if_undecidable(plan_resume(frontier, agent))
    assert caught.value.retryable is False
    [call] = caught.value.calls
    assert isinstance(call, CallState)
    assert (call.call_id, call.tool, call.idempotency_key) == ("b", "book", "k-b")
    assert call.dispatched_fence == 1
    assert call.args == {"seat": "3A"}


def test_errors_made_without_their_facts_still_work() -> None:
    """Raisers that know no more than a message (a driver's error, translated) keep working."""
    assert errors.FencedError("superseded").fence is None
    assert errors.FencedError("superseded").holder is None
    truncated = errors.LogTruncatedError("compacted")
    assert (truncated.partition, truncated.offset, truncated.start) == (None, None, None)
    too_large = errors.PayloadTooLargeError("too large")
    assert (too_large.size, too_large.limit) == (None, None)
    assert errors.IndeterminateToolCallError("undecided").calls == ()
    translated = translate(kafka_errors.OffsetOutOfRangeError(), context="reading partition 1")
    assert isinstance(translated, errors.LogTruncatedError)
    assert translated.offset is None


@pytest.mark.kafka
async def test_kafka_names_the_size_of_a_step_over_a_record_batch_and_a_truncated_read(
    kafka_bootstrap: str, kafka_topic: str
) -> None:
    async with KafkaEventLog(
        kafka_bootstrap, topic=kafka_topic, partitions=2, max_batch_bytes=3_000_000
    ) as log:
        (run_id,) = runs_in_partition(1, 1, log.partitions)
        with pytest.raises(errors.PayloadTooLargeError) as too_large:
            await log.append(step_events(run_id, 2, body="x" * 600_000))
        assert too_large.value.size is not None
        assert too_large.value.limit is not None
        assert too_large.value.size > 1_200_000 > too_large.value.limit
        await log.append(step_events(run_id, 4))
        await log.truncate_before(1, 2)
        with pytest.raises(errors.LogTruncatedError) as truncated:
            await log.read_partition(1, 0)
    assert (truncated.value.partition, truncated.value.offset, truncated.value.start) == (1, 0, 2)


def test_every_error_a_caller_can_meet_is_importable_from_onward() -> None:
    """``except onward.XError`` works for every error the package defines: a caller should not
    need to know which submodule raised it."""
    import onward  # noqa: PLC0415

    defined = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, OnwardError) and not name.startswith("_")
    }
    assert len(defined) >= 20
    assert (
        sorted(name for name in defined if getattr(onward, name, None) is not vars(errors)[name])
        == []
    )
