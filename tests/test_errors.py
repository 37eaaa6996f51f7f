"""The error tree: one root, and every driver exception mapped to a specific Onward error."""

from __future__ import annotations

import inspect
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
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
                and value.__module__ == module.__name__
                and value not in _ABSTRACT
            ):
                found.append(value)
    return found


@pytest.mark.parametrize("driver_type", _driver_exception_types(), ids=lambda t: t.__name__)
def test_every_driver_exception_has_a_rule(driver_type: type[BaseException]) -> None:
    assert classify(driver_type) is not None, f"{driver_type.__name__} has no mapping"


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
