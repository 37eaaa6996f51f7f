"""``ENVIRONMENT`` and ``CHECKPOINTER_BACKEND``: production refuses what only a developer should
choose, and another kit's name for the backend variable is read as ``ONWARD_BACKEND``."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from onward import Settings
from onward.errors import ConfigurationError
from onward.runtime import Redactor
from onward.runtime.cli import app


@pytest.fixture(autouse=True)
def _unset(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("ENVIRONMENT", "ONWARD_BACKEND", "CHECKPOINTER_BACKEND"):
        monkeypatch.delenv(variable, raising=False)


def one_line(exc: pytest.ExceptionInfo[ConfigurationError]) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_the_environment_is_dev_unless_said(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().environment == "dev"
    assert Settings(backend="memory").backend == "memory"
    monkeypatch.setenv("ENVIRONMENT", "Production")
    assert Settings().environment == "prod"


def test_prod_refuses_the_memory_backend_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ENVIRONMENT", "prod")
    assert Settings(backend="sqlite").backend == "sqlite"
    monkeypatch.setenv("ONWARD_BACKEND", "memory")
    with pytest.raises(ConfigurationError) as caught:
        Settings()
    assert one_line(caught).startswith(
        "invalid configuration: ENVIRONMENT=prod refuses ONWARD_BACKEND=memory"
    )
    result = CliRunner().invoke(app, ["runs"])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"ConfigurationError: {caught.value}"


def test_an_unknown_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVIRONMENT", "prdo")
    with pytest.raises(ConfigurationError) as caught:
        Settings()
    assert one_line(caught) == (
        "invalid configuration: ENVIRONMENT (environment): must be dev or prod (or ci, "
        "development, local, production, stage, staging, test, testing), got 'prdo'"
    )
    with pytest.raises(ConfigurationError, match="ENVIRONMENT: must be dev or prod"):
        Redactor(enabled=False)


@pytest.mark.parametrize(("value", "strict"), [("staging", True), ("test", False), ("CI", False)])
def test_the_usual_names_of_other_environments_are_read(
    monkeypatch: pytest.MonkeyPatch, value: str, strict: bool
) -> None:
    """``ENVIRONMENT`` is often set for other tools; its common values must not stop Onward,
    and a staging deployment is held to production's refusals."""
    monkeypatch.setenv("ENVIRONMENT", value)
    assert Settings().environment == ("prod" if strict else "dev")


def test_prod_refuses_disabled_redaction(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not Redactor(enabled=False).enabled
    monkeypatch.setenv("ENVIRONMENT", "prod")
    assert Redactor().redact_text("password=hunter2hunter2") != "password=hunter2hunter2"
    with pytest.raises(ConfigurationError) as caught:
        Redactor(enabled=False)
    assert one_line(caught).startswith(
        "invalid configuration: ENVIRONMENT=prod refuses disabled redaction"
    )


@pytest.mark.parametrize(
    ("value", "backend"),
    [("memory", "memory"), ("session_service", "kafka"), ("SQLite", "sqlite"), ("kafka", "kafka")],
)
def test_checkpointer_backend_names_the_onward_backend(
    monkeypatch: pytest.MonkeyPatch, value: str, backend: str
) -> None:
    monkeypatch.setenv("CHECKPOINTER_BACKEND", value)
    assert Settings().backend == backend
    assert Settings(checkpointer_backend=value).backend == backend


def test_checkpointer_backend_postgres_is_onward_backend_postgres(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Whether or not this Onward has a postgres backend, the alias means exactly it.
    try:
        expected: str | None = Settings(backend="postgres").backend
    except ConfigurationError:
        expected = None
    monkeypatch.setenv("CHECKPOINTER_BACKEND", "postgres")
    if expected is None:
        with pytest.raises(ConfigurationError, match="means ONWARD_BACKEND=postgres"):
            Settings()
    else:
        assert Settings().backend == expected


def test_an_unknown_checkpointer_backend_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHECKPOINTER_BACKEND", "redis")
    with pytest.raises(ConfigurationError) as caught:
        Settings()
    assert one_line(caught).startswith(
        "invalid configuration: CHECKPOINTER_BACKEND='redis' names no backend"
    )


def test_both_backend_variables_must_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHECKPOINTER_BACKEND", "memory")
    monkeypatch.setenv("ONWARD_BACKEND", "memory")
    assert Settings().backend == "memory"
    monkeypatch.setenv("ONWARD_BACKEND", "sqlite")
    with pytest.raises(ConfigurationError) as caught:
        Settings()
    assert one_line(caught) == (
        "invalid configuration: CHECKPOINTER_BACKEND=memory (ONWARD_BACKEND=memory) and "
        "ONWARD_BACKEND=sqlite disagree; set one of them"
    )


def test_a_backend_given_in_python_wins_over_the_checkpointer_backend_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As it wins over ONWARD_BACKEND: code that names its backend (a test on memory) works
    wherever CHECKPOINTER_BACKEND is set for another kit; both given in Python must agree."""
    monkeypatch.setenv("ONWARD_BACKEND", "sqlite")
    assert Settings(backend="memory").backend == "memory"
    monkeypatch.delenv("ONWARD_BACKEND")
    monkeypatch.setenv("CHECKPOINTER_BACKEND", "session_service")
    assert Settings(backend="memory").backend == "memory"
    assert Settings().backend == "kafka"
    monkeypatch.setenv("CHECKPOINTER_BACKEND", "vertex")
    assert Settings(backend="memory").backend == "memory"
    with pytest.raises(ConfigurationError, match="disagree"):
        Settings(backend="sqlite", checkpointer_backend="memory")


def test_prod_refuses_memory_named_through_the_alias(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVIRONMENT", "prod")
    monkeypatch.setenv("CHECKPOINTER_BACKEND", "memory")
    with pytest.raises(ConfigurationError, match="ENVIRONMENT=prod refuses ONWARD_BACKEND=memory"):
        Settings()
