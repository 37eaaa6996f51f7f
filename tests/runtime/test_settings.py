"""Settings check only what the chosen backend uses, and fail from Python with the one line the
command line prints."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from onward import Settings
from onward.errors import ConfigurationError
from onward.runtime.cli import app
from onward.runtime.settings import SecretUrl


def test_a_bad_value_given_in_python_is_a_configuration_error_in_one_line() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings(backend="bogus")  # type: ignore[arg-type]
    assert str(caught.value) == (
        "invalid configuration: ONWARD_BACKEND (backend): Input should be 'kafka', 'sqlite', "
        "'postgres' or 'memory'"
    )


def test_a_misspelt_field_given_in_python_is_refused_naming_the_field_it_resembles() -> None:
    """Dropped in silence, ``kafak_topic`` would send the events to the default topic."""
    with pytest.raises(ConfigurationError) as refused:
        Settings(backend="sqlite", kafak_topic="orders.events")  # type: ignore[call-arg]
    assert str(refused.value) == (
        "invalid configuration: settings: 'kafak_topic' is not a setting "
        "(did you mean 'kafka_topic'?)"
    )
    with pytest.raises(ConfigurationError, match=r"'tenant' is not a setting$"):
        Settings(tenant="acme")  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("redis_prefix", "schema_prefix"),
    [
        ("acme:", "acme:"),
        ("acme:onward:", "acme:"),
        ("acme:", "acme:fen"),
        ("acme:", "acme:lease:x:"),
        ("acme:", "acme:runs-by"),
        ("", "lease"),
    ],
)
def test_a_schema_cache_prefix_among_the_keys_of_leases_and_frontiers_is_refused(
    redis_prefix: str, schema_prefix: str
) -> None:
    """The schema cache's key is its prefix and the run id: under a prefix the leases' keys
    share, a run named ``lease:<run>`` would have another run's lease for its cache entry (its
    resume renewing the lease's expiry, its collection deleting it)."""
    with pytest.raises(ConfigurationError, match="MCP_SCHEMA_CACHE_PREFIX"):
        Settings(
            backend="sqlite",
            redis_url=SecretUrl("redis://127.0.0.1:6379/0"),
            redis_prefix=redis_prefix,
            schema_cache_prefix=schema_prefix,
        )


@pytest.mark.parametrize(
    ("redis_prefix", "schema_prefix"),
    [("onward:", "onward:mcp:schema:"), ("acme:", "acme:schemas:"), ("a:", "b:"), ("", "x")],
)
def test_a_schema_cache_prefix_apart_from_the_other_keys_is_taken(
    redis_prefix: str, schema_prefix: str
) -> None:
    settings = Settings(
        backend="sqlite",
        redis_url=SecretUrl("redis://127.0.0.1:6379/0"),
        redis_prefix=redis_prefix,
        schema_cache_prefix=schema_prefix,
    )
    assert settings.schema_cache_prefix == schema_prefix


def test_a_dict_of_the_environment_may_hold_variables_that_are_not_onwards() -> None:
    settings = Settings.model_validate({"ONWARD_BACKEND": "sqlite", "PATH": "/bin", "HOME": "/"})
    assert settings.backend == "sqlite"


def test_python_and_the_command_line_say_the_same_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONWARD_PARTITIONS", "0")
    with pytest.raises(ConfigurationError) as caught:
        Settings()
    result = CliRunner().invoke(app, ["inspect", "run-1", "--tenant", "acme"])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"ConfigurationError: {caught.value}"
    assert "ONWARD_PARTITIONS" in result.stderr


def test_a_sqlite_database_url_does_not_stop_the_embedded_backend() -> None:
    settings = Settings(backend="sqlite", database_url="sqlite:///app.db")  # type: ignore[arg-type]
    assert settings.backend == "sqlite"


def test_the_kafka_backend_refuses_a_database_url_that_is_not_postgresql() -> None:
    with pytest.raises(ConfigurationError, match=r"DATABASE_URL \(database_url\): sqlite:///"):
        Settings(backend="kafka", database_url="sqlite:///app.db")  # type: ignore[arg-type]


def test_using_a_database_url_that_is_not_postgresql_names_it() -> None:
    settings = Settings(backend="sqlite", database_url="sqlite:///app.db")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"DATABASE_URL: sqlite:///app\.db must start"):
        settings.require_database_url()


AGENT = ["--agent", "support.cli_agent:booker", "--provider", "support.cli_agent:booking_model"]


@pytest.mark.parametrize("command", [["start", "hi", *AGENT], ["runs"]])
def test_an_empty_sqlite_path_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    """``ONWARD_SQLITE_PATH=`` (an env file's line left blank) was the working directory: a
    command said ``.: no such database file``, naming neither the variable nor the cause."""
    monkeypatch.setenv("ONWARD_BACKEND", "sqlite")
    monkeypatch.setenv("ONWARD_SQLITE_PATH", "")
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 2, result.output
    assert "ONWARD_SQLITE_PATH (sqlite_path)" in result.stderr, result.stderr
    assert "empty" in result.stderr, result.stderr
    assert Settings(backend="postgres", sqlite_path="").backend == "postgres"  # type: ignore[arg-type]


@pytest.mark.parametrize("variable", ["ONWARD_KAFKA_TOPIC", "ONWARD_REQUESTS_TOPIC"])
@pytest.mark.parametrize("topic", ["", "orders events", "x" * 250, ".."])
def test_the_kafka_backend_refuses_a_topic_kafka_cannot_name(
    monkeypatch: pytest.MonkeyPatch, variable: str, topic: str
) -> None:
    """Taken, the projector said the topic had "None partitions", and inspect told the
    operator to start the projector."""
    monkeypatch.setenv(variable, topic)
    monkeypatch.setenv("ONWARD_BACKEND", "kafka")
    result = CliRunner().invoke(app, ["inspect", "run-1", "--tenant", "acme"])
    assert result.exit_code == 2, result.output
    assert f"{variable} " in result.stderr, result.stderr
    if variable == "ONWARD_REQUESTS_TOPIC" and not topic:
        return  # refused whatever the backend, as it always was
    assert "no Kafka topic name" in result.stderr, result.stderr
    monkeypatch.setenv("ONWARD_BACKEND", "sqlite")
    assert Settings().backend == "sqlite"


@pytest.mark.parametrize("database", ["abc", "1/2", "-1", "0x1"])
def test_a_redis_url_whose_database_is_not_a_number_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, database: str
) -> None:
    """redis-py reads ``redis://host:6379/abc`` as database 0 and ``/1/2`` as 12: taken, the
    leases and fences went to a database the operator never named, said nowhere."""
    monkeypatch.setenv("REDIS_URL", f"redis://127.0.0.1:6379/{database}")
    monkeypatch.setenv("ONWARD_BACKEND", "kafka")
    result = CliRunner().invoke(app, ["inspect", "run-1", "--tenant", "acme"])
    assert result.exit_code == 2, result.output
    assert "REDIS_URL (redis_url)" in result.stderr, result.stderr
    assert f"6379/{database}: what follows the host names no database" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("url", ["redis://cache", "redis://cache:6379/", "rediss://cache/15"])
def test_a_redis_url_with_no_database_or_a_numbered_one_is_taken(url: str) -> None:
    settings = Settings(backend="kafka", redis_url=url)  # type: ignore[arg-type]
    assert settings.require_redis_url() == url
