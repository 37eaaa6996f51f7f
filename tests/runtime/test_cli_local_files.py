"""Files on this machine that a command cannot use: `onward schema -o` and `onward demo --dir`
given a path they cannot write, or one an earlier demo used, exit 2 naming the option. An
`OSError` that reaches the command boundary is otherwise taken for a server that did not
answer (exit 5, "retry once it is reachable"), which no retry mends.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from onward.runtime.cli import app


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
