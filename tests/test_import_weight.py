"""A process imports only what it uses.

The projector (`KafkaProjector`, `FrontierProjection`, `PostgresFrontierStore`) needs aiokafka,
asyncpg, msgspec and zstandard; the agent runtime, pydantic settings, HTTP clients and redis-py
would add ~40 MiB and ~300 ms to every projector process. Each check runs a fresh interpreter,
so what the test session has imported already does not hide an eager import.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.main import get_command

import onward
import onward.runtime.application.api
from onward.runtime.cli import app

HEAVY = (
    "onward.runtime",  # the agent runtime: runner, providers, leases, settings
    "redis",
    "httpx",
    "pydantic",
    "pydantic_settings",
    "jsonschema",
    "cryptography",
    "prometheus_client",
    "opentelemetry",
    "rich",
    "typer",
    "importlib.metadata",
)
"""Modules a process that only reads the log or runs the projector must not load."""

NOT_FOR_THE_PROJECTOR_COMMAND = (
    "onward.runtime.cli.runs",  # the other commands' modules
    "onward.runtime.cli.listing",
    "onward.runtime.cli.worker",
    "onward.runtime.cli.embedding",
    "onward.runtime.fleet",
    "onward.runtime.openai",
    "onward.integrations",
    "redis",
    "httpx",
    "jsonschema",
    "cryptography",
)
"""Modules ``onward projector`` must not load: it needs its settings, metrics and the fold."""


def imported_by(code: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running ``code``."""
    report = "import json, sys; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\n{report}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def command_on_sqlite(
    args: list[str], path: Path, *, created: bool = True, exits: tuple[int, ...] = (0, 1, 2)
) -> str:
    """Code running ``onward *args`` on the SQLite file ``path`` (``created``: made an Onward
    database first) with no ``REDIS_URL``, which must end with one of ``exits``."""
    create = (
        "from onward.eventlog import SqliteEventLog\n"
        "async def create():\n"
        "    async with SqliteEventLog(os.environ['ONWARD_SQLITE_PATH']):\n"
        "        pass\n"
        "asyncio.run(create())\n"
        if created
        else ""
    )
    return f"""
import asyncio, os, sys
os.environ.pop("REDIS_URL", None)
os.environ.update(ONWARD_BACKEND="sqlite", ONWARD_SQLITE_PATH={str(path)!r})
{create}sys.argv = ["onward", *{args!r}]
from onward.runtime.cli import main
try:
    main()
except SystemExit as exc:
    assert exc.code in {exits!r}, exc.code
"""


def heavy_in(modules: set[str]) -> list[str]:
    """The heavy modules (or any of their submodules) among ``modules``."""
    return sorted(
        name for name in modules if any(name == h or name.startswith(f"{h}.") for h in HEAVY)
    )


@pytest.mark.parametrize(
    "code",
    [
        "import onward",
        "import onward.eventlog",
        "import onward.projections, onward.eventlog",
        "from onward.projections import KafkaProjector, FrontierProjection, PostgresFrontierStore",
        "from onward import KafkaEventLog, StoredEvent, OnwardError",
    ],
)
def test_the_log_and_the_projector_load_nothing_heavy(code: str) -> None:
    assert heavy_in(imported_by(code)) == []


def test_the_projector_loads_what_it_needs() -> None:
    """The check above would pass vacuously if the imports loaded nothing at all."""
    modules = imported_by(
        "from onward.projections import KafkaProjector, FrontierProjection, PostgresFrontierStore"
    )
    assert {"aiokafka", "asyncpg", "msgspec", "zstandard", "onward.projections.kafka"} <= modules


def test_a_lazily_exported_name_loads_its_module() -> None:
    modules = imported_by("from onward import Settings, open")
    assert {"onward.runtime.settings", "pydantic_settings"} <= modules


def test_lazy_names_are_the_objects_they_name() -> None:
    assert onward.open is onward.runtime.application.api.open_app
    assert onward.query is onward.runtime.application.api.query
    assert isinstance(onward.__version__, str)
    assert set(onward.__all__) <= set(dir(onward))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = onward.no_such_name  # type: ignore[attr-defined]
    with pytest.raises(ImportError):
        from onward import no_such_name  # type: ignore[attr-defined]  # noqa: F401, PLC0415


def test_redis_errors_translate_when_redis_is_imported_after_storage() -> None:
    """Translation learns redis-py's errors once redis-py is loaded, however late."""
    code = """
import onward._storage as storage
from onward.errors import BackendUnavailableError, ConfigurationError
assert "redis" not in sys.modules
import redis.exceptions as redis_errors
assert storage.classify(redis_errors.AuthenticationError) is ConfigurationError
try:
    with storage.translated("reading"):
        raise redis_errors.ConnectionError("refused")
except BackendUnavailableError as exc:
    assert isinstance(exc.__cause__, redis_errors.ConnectionError)
else:
    raise AssertionError("a redis error left translated() untranslated")
"""
    assert "redis" in imported_by(f"import sys\n{code}")


def test_the_projector_command_loads_no_other_command() -> None:
    code = """
import sys
sys.argv = ["onward", "projector", "--help"]
from onward.runtime.cli import main
try:
    main()
except SystemExit as exc:
    assert exc.code == 0, exc.code
"""
    modules = imported_by(code)
    assert "onward.runtime.cli.projections" in modules
    loaded = [m for m in NOT_FOR_THE_PROJECTOR_COMMAND if m in modules]
    assert loaded == []


NOT_ON_SQLITE = ("redis", "onward.runtime.gc.redis", "onward.projections.redis")
"""Modules a command on the embedded SQLite backend (or ``--help``, or a usage error) must not
load: redis-py is for a deployment that sets ``REDIS_URL`` or a Redis frontier store."""


@pytest.mark.parametrize(
    "args",
    [["--help"], ["no-such-command"], ["runs"], ["inspect", "nosuch"], ["gc", "--help"]],
)
def test_a_command_on_sqlite_loads_no_redis(args: list[str], tmp_path: Path) -> None:
    """A command on SQLite loads no redis-py, nor does a usage error, nor ``--help``, nor
    ``gc --help``, which imports the garbage collector's command."""
    modules = imported_by(command_on_sqlite(args, tmp_path / "onward.db", created=False))
    assert "onward.runtime.cli._common" in modules
    assert [m for m in NOT_ON_SQLITE if m in modules] == []


def test_a_mistyped_command_loads_no_command() -> None:
    """A typo's "did you mean" needs only the commands' names: it is answered without importing
    every command's module (the worker, the fleet, the runner), and still suggests the command
    whose module was never imported."""
    code = """
import contextlib, io, sys
sys.argv = ["onward", "rnus"]
from onward.runtime.cli import main
stderr = io.StringIO()
with contextlib.redirect_stderr(stderr):
    try:
        main()
    except SystemExit as exc:
        assert exc.code == 2, exc.code
assert "Did you mean 'runs'?" in stderr.getvalue(), stderr.getvalue()
"""
    modules = imported_by(code)
    loaded = [
        m for m in ("onward.runtime.cli.listing", *NOT_FOR_THE_PROJECTOR_COMMAND) if m in modules
    ]
    assert loaded == []


def test_every_listed_command_loads() -> None:
    """The lazy command table names modules and functions as strings, which no type checker
    reads: each must resolve to the command it is listed as."""
    root = get_command(app)
    assert isinstance(root, typer.core.TyperGroup)
    context = typer.Context(root)
    groups = [root]
    seen = []
    while groups:
        group = groups.pop()
        for name in group.list_commands(context):
            command = group.get_command(context, name)
            assert command is not None, name
            assert command.name == name
            if isinstance(command, typer.core.TyperGroup):
                groups.append(command)
            else:
                seen.append(f"{group.name} {name}")
    assert "onward projector" in seen
    assert "projections rebuild" in seen
    assert "db pack-records" in seen
    assert "quarantine dismiss" in seen
    assert len(seen) == 23


NO_SERVER_DRIVER_ON_SQLITE = ("aiokafka", "asyncpg")
"""Drivers a command on the embedded SQLite backend (or ``--help``, or a usage error) must not
load: aiokafka is for ``ONWARD_BACKEND=kafka``, asyncpg for a deployment on PostgreSQL."""


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["no-such-command"],
        ["runs"],
        ["inspect", "nosuch"],
        ["tag", "nosuch", "a-tag"],
        ["demo", "--help"],
        ["worker", "--help"],
        ["projector", "--help"],
        ["projections", "rebuild", "--help"],
    ],
)
def test_a_command_on_sqlite_loads_no_kafka_nor_postgres_driver(
    args: list[str], tmp_path: Path
) -> None:
    """A command on SQLite, its database opened, loads neither aiokafka (~170 ms) nor asyncpg
    (~40 ms), nor does a usage error or a command's ``--help`` (which imports its module, the
    projector's say): each driver is imported where its backend is chosen."""
    modules = imported_by(command_on_sqlite(args, tmp_path / "onward.db"))
    assert "onward.runtime.cli._common" in modules
    assert [m for m in NO_SERVER_DRIVER_ON_SQLITE if m in modules] == []


def test_kafka_and_postgres_errors_translate_when_imported_after_storage() -> None:
    """Translation learns aiokafka's and asyncpg's errors once each is loaded, however late:
    the same rules, the same messages, and `translated` catches them."""
    code = """
import onward._storage as storage
from onward.errors import (
    BackendUnavailableError, ConfigurationError, ProducerFatalError, SchemaMismatchError,
)
assert "aiokafka" not in sys.modules and "asyncpg" not in sys.modules
assert storage.classify(OSError) is BackendUnavailableError
import aiokafka.errors as kafka_errors
import asyncpg.exceptions as pg_errors
assert storage.classify(kafka_errors.ProducerFenced) is ProducerFatalError
assert storage.classify(kafka_errors.LeaderNotAvailableError) is BackendUnavailableError
assert storage.classify(pg_errors.InvalidPasswordError) is ConfigurationError
assert storage.classify(pg_errors.UndefinedTableError) is SchemaMismatchError
assert storage.classify(pg_errors.ConnectionDoesNotExistError) is BackendUnavailableError
assert set(storage.DRIVER_ERRORS) >= {kafka_errors.KafkaError, pg_errors.PostgresError}
refused = storage.translate(pg_errors.InvalidPasswordError("no"), context="connecting")
assert isinstance(refused, ConfigurationError), refused
assert "check the user and password in DATABASE_URL" in str(refused), refused
contended = storage.translate(pg_errors.DeadlockDetectedError("x"), context="writing")
assert "it lost to a concurrent transaction; retry" in str(contended), contended
unreachable = (kafka_errors.KafkaConnectionError("gone"), pg_errors.PostgresConnectionError("gone"))
for raised in unreachable:
    try:
        with storage.translated("reading"):
            raise raised
    except BackendUnavailableError as exc:
        assert exc.__cause__ is raised
    else:
        raise AssertionError(f"{raised!r} left translated() untranslated")
"""
    assert {"aiokafka", "asyncpg"} <= imported_by(f"import sys\n{code}")


NOT_FOR_READING_RUNS = (
    "onward.runtime.runner",  # the runner, its checkpoints and their metrics
    "onward.runtime.ask",
    "onward.runtime.observability",
    "prometheus_client",
    "opentelemetry",
    "onward.runtime.fleet",
    "onward.runtime.application",
)
"""Modules ``onward runs`` must not load: it reads the frontier store and prints a table."""

NOT_FOR_INSPECTING = (
    "onward.runtime.fleet",
    "onward.runtime.application",
    "onward.runtime.observability.metrics",
    "onward.runtime.observability.server",
    "prometheus_client",
)
"""Modules ``onward inspect`` must not load: the fleet's worker and requests are for cancel and
the worker, the application for a product's own process; it reads through the runner, which
counts into plain objects (`onward.runtime.observability.counts`): Prometheus's collectors and
the metrics server are for the processes that serve them."""


@pytest.mark.parametrize(
    ("args", "unneeded"),
    [
        (["runs"], NOT_FOR_READING_RUNS),
        (["runs", "--json"], NOT_FOR_READING_RUNS),
        (["inspect", "nosuch"], NOT_FOR_INSPECTING),
    ],
)
def test_a_reading_command_on_sqlite_loads_only_what_it_reads_with(
    args: list[str], unneeded: tuple[str, ...], tmp_path: Path
) -> None:
    """``onward runs`` loads neither the runner nor the metrics (prometheus_client,
    OpenTelemetry: ~60 ms) nor `ask` (pydantic's JSON Schema), and ``onward inspect`` neither
    the fleet nor the application (~90 ms) nor the metrics: each is imported by the commands
    that run, cancel or serve."""
    modules = imported_by(command_on_sqlite(args, tmp_path / "onward.db", exits=(0, 1)))
    assert "onward.runtime.cli._common" in modules
    loaded = sorted(m for m in modules if any(m == u or m.startswith(f"{u}.") for u in unneeded))
    assert loaded == []


COMMAND_MODULES = (
    "onward.runtime.cli.listing",
    "onward.runtime.cli.runs",
    "onward.runtime.cli.compact",
    "onward.runtime.cli.gc",
    "onward.runtime.cli.projections",
    "onward.runtime.cli.worker",
    "onward.runtime.cli.schema",
    "onward.runtime.cli.demo",
    "onward.runtime.cli.db",
    "onward.runtime.cli.quarantine",
)


@pytest.mark.parametrize("args", [["--help"], ["db", "--help"], ["quarantine", "--help"]])
def test_help_lists_the_commands_without_importing_them(args: list[str]) -> None:
    """A group's ``--help`` lists its commands, each with its docstring's first paragraph, read
    from its module's source: no command's module is imported, nor the runner, the fleet and
    the metrics they load (~400 ms of ``onward --help``), nor the settings (pydantic-settings),
    `ask` (pydantic's JSON Schema) and the providers (the agent, the tools and their models:
    ~90 ms of ``onward --help``) the commands share."""
    code = f"""
import sys
sys.argv = ["onward", *{args!r}]
from onward.runtime.cli import main
try:
    main()
except SystemExit as exc:
    assert exc.code == 0, exc.code
"""
    modules = imported_by(code)
    unneeded = (*COMMAND_MODULES, "onward.runtime.runner", "onward.runtime.fleet")
    assert [m for m in unneeded if m in modules] == []
    shared = (
        "prometheus_client",
        "pydantic_settings",
        "onward.runtime.ask",
        "onward.runtime.providers",
        "onward.runtime.tools",
    )
    assert [m for m in shared if m in modules] == []


def test_help_lists_the_commands_as_their_modules_say() -> None:
    """Each group's ``--help`` reads the same whether its commands' modules were imported or
    not: the listing read from the source is the one the commands themselves give."""
    code = """
import json
from typer.testing import CliRunner
from onward.runtime.cli import app
from onward.runtime.cli import _COMMANDS
runner = CliRunner()
groups = [[], ["db"], ["projections"], ["quarantine"]]
def helps():
    shown = [runner.invoke(app, [*group, "--help"], env={"COLUMNS": "300"}) for group in groups]
    assert all(result.exit_code == 0 for result in shown), [r.output for r in shown]
    return [result.output for result in shown]
listed = helps()
assert "onward.runtime.cli.runs" not in sys.modules
for group in groups:
    for name in _COMMANDS[group[0] if group else "onward"]:
        assert runner.invoke(app, [*group, name, "--help"]).exit_code == 0, name
assert "onward.runtime.cli.runs" in sys.modules
assert helps() == listed, (helps(), listed)
assert "approve" in listed[0] and "pack-records" in listed[1]
"""
    imported_by(f"import sys\n{code}")


def test_ask_is_the_function_whoever_imports_its_module_first() -> None:
    """`onward.runtime.ask` is imported on first use, and importing the submodule of the same
    name (as the runner does) does not put the module where the function is."""
    code = """
import onward.runtime.runner
import onward.runtime
from onward.runtime import ask
from onward.runtime.ask import ask as the_function
assert onward.runtime.ask is ask is the_function, onward.runtime.ask
import onward
assert onward.ask is the_function
"""
    assert "onward.runtime.ask" in imported_by(code)
    assert "onward.runtime.ask" not in imported_by("import onward.runtime")


def test_rebuild_is_the_function_whoever_imports_its_module_first() -> None:
    """`onward.projections.rebuild` is exported on first use, and importing the submodule of the
    same name (as a lazy `rebuild_frontiers` does) does not put the module where the function
    is."""
    code = """
from onward.projections import rebuild_frontiers
import onward.projections.rebuild
from onward.projections import rebuild
from onward.projections.rebuild import rebuild as the_function
assert onward.projections.rebuild is rebuild is the_function, onward.projections.rebuild
"""
    assert "onward.projections.rebuild" in imported_by(code)
    assert "onward.projections.rebuild" not in imported_by("import onward.projections")


@pytest.mark.parametrize(
    ("package", "submodule"),
    [
        ("onward.runtime.observability", "server"),
        ("onward.eventlog", "kafka"),
        ("onward.projections", "postgres"),
        ("onward._storage", "redis"),
    ],
)
def test_a_package_s_submodule_is_an_attribute_after_a_plain_import(
    package: str, submodule: str
) -> None:
    """Packages that export lazily used to import their submodules eagerly, so code reading a
    submodule as an attribute after ``import package`` worked; it still does, in a fresh
    interpreter, and a name that is no submodule is still an AttributeError."""
    code = f"""
import importlib
package = importlib.import_module({package!r})
assert getattr(package, {submodule!r}) is importlib.import_module({package!r} + "." + {submodule!r})
try:
    package.no_such_submodule
except AttributeError as exc:
    assert "no_such_submodule" in str(exc), exc
else:
    raise AssertionError("no AttributeError")
assert not hasattr(package, "__wrapped__")
"""
    assert f"{package}.{submodule}" in imported_by(code)
