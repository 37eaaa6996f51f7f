"""The error tree: one root, and every driver exception mapped to a specific Onward error."""

from __future__ import annotations

import inspect
import sqlite3

import aiokafka.errors as kafka_errors
import asyncpg.exceptions as pg_errors
import pytest
import redis.exceptions as redis_errors

import onward.errors as errors
from onward._storage import classify, translate
from onward.errors import OnwardError

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


def test_indeterminate_calls_are_never_retryable() -> None:
    error = errors.IndeterminateToolCallError("run r: call c1 undecided", calls=("c1",))
    assert error.retryable is False
    assert error.calls == ("c1",)
