"""Files on this machine that a command cannot use: `onward schema -o` and `onward demo --dir`
given a path they cannot write, or one an earlier demo used, exit 2 naming the option. An
`OSError` that reaches the command boundary is otherwise taken for a server that did not
answer (exit 5, "retry once it is reachable"), which no retry mends.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from support.cli_agent import booker, booking_model
from typer.testing import CliRunner, Result

from onward import Settings
from onward import open as open_app
from onward.errors import ConfigurationError
from onward.runtime.cli import app
from onward.runtime.demo import run_demo

AGENT = ["--agent", "support.cli_agent:booker", "--provider", "support.cli_agent:booking_model"]


def onward(*args: str) -> Result:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "300"})


def assert_usage_error(result: Result, option: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert option in result.stderr, result.stderr
    assert "did not answer" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("where", ["missing/events.json", "."])
def test_schema_to_a_path_it_cannot_write_exits_2(tmp_path: Path, where: str) -> None:
    assert_usage_error(onward("schema", "-o", str(tmp_path / where)), "--output")


def test_schema_writes_the_file_it_is_given(tmp_path: Path) -> None:
    result = onward("schema", "-o", str(tmp_path / "events.json"))
    assert result.exit_code == 0, result.output
    assert "RunStarted" in json.loads((tmp_path / "events.json").read_text())["$defs"]


def test_the_demo_refuses_a_dir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine\n")
    assert_usage_error(onward("demo", "--dir", str(tmp_path / "notes.txt")), "--dir")
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


def test_the_demo_run_again_in_its_dir_is_refused_not_passed_off_as_a_demo(
    tmp_path: Path,
) -> None:
    """The second demo's child would find the run started already and start nothing, and the
    demo would still report the first one's booking as its own, exit 0."""
    first = onward("demo", "--dir", str(tmp_path))
    assert first.exit_code == 0, first.output
    again = onward("demo", "--dir", str(tmp_path))
    assert_usage_error(again, "--dir")
    assert "killed with SIGKILL" not in again.stdout
    assert len((tmp_path / "ledger.jsonl").read_text().splitlines()) == 1


def test_a_demo_whose_worker_1_fails_says_so_rather_than_that_it_was_killed(
    tmp_path: Path,
) -> None:
    """A second demo racing the first into one --dir found the run started: its worker-1 exited
    2 at once, yet it printed "worker-1 was killed with SIGKILL (exit 2) right after the airline
    booked the seat" and, counting the other demo's booking, exit 0."""
    assert run_demo(tmp_path, Console(file=io.StringIO())) == 1
    said = io.StringIO()
    assert run_demo(tmp_path, Console(file=said, width=300)) is None
    assert "killed with SIGKILL" not in said.getvalue(), said.getvalue()
    assert "worker-1 ended with exit 2" in said.getvalue(), said.getvalue()
    assert len((tmp_path / "ledger.jsonl").read_text().splitlines()) == 1


@pytest.mark.parametrize("command", ["start", "worker"])
def test_a_sqlite_file_in_a_directory_that_is_not_there_exits_2_naming_it(
    tmp_path: Path, command: str
) -> None:
    """A mistyped directory is a setting to fix, not a store that did not answer (exit 5,
    "retry"): the file cannot be made, so no retry mends it."""
    missing = tmp_path / "no-such-dir"
    agent = ["--agent", "support.cli_agent:booker", "--provider", "support.cli_agent:booking_model"]
    args = [command, "go", *agent] if command == "start" else [command, *agent]
    env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(missing / "onward.db")}
    result = CliRunner().invoke(app, args, env={"COLUMNS": "300", **env})
    assert_usage_error(result, str(missing))
    assert "ONWARD_SQLITE_PATH" in result.stderr
    assert not missing.exists()


@pytest.mark.parametrize("command", [["start", "go", *AGENT], ["runs"], ["inspect", "run-1"]])
def test_a_sqlite_path_that_is_a_directory_exits_2_saying_so(
    tmp_path: Path, command: list[str]
) -> None:
    """A directory given for the file was "no such database file" to a reader and "unable to
    open database file" (exit 5, "retry") to a writer; neither says the path is a directory."""
    env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path)}
    result = CliRunner().invoke(app, command, env={"COLUMNS": "300", **env})
    assert_usage_error(result, f"{tmp_path} is a directory")
    assert "ONWARD_SQLITE_PATH" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("where", "said"), [(".", "is a directory"), ("no-such-dir/onward.db", "does not exist")]
)
async def test_an_app_on_a_sqlite_path_no_file_can_be_made_at_is_a_configuration_error(
    tmp_path: Path, where: str, said: str
) -> None:
    """`onward.open` on a directory, or in one that is not there, said only "unable to open
    database file", as a `BackendError` a caller would retry; it now names the cause."""
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / where)
    with pytest.raises(ConfigurationError, match=said) as refused:
        async with open_app(settings, agents=[booker()], provider=booking_model()):
            pass
    assert "ONWARD_SQLITE_PATH" in str(refused.value)
    assert list(tmp_path.iterdir()) == []  # noqa: ASYNC240 - the test's own folder, once closed
