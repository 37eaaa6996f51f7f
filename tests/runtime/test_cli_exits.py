"""One mapping from what stopped a command to its documented exit code, in one line on stderr.

The mapping is checked through a command of its own that raises each error; the run commands'
own cases are in test_cli.py, the stores failing for real in test_cli_faults.py.
"""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

import asyncpg
import pytest
import redis.exceptions as redis_errors
import typer
from support.kinds import KindCounts
from typer.testing import CliRunner, Result

from onward import errors
from onward.projections.frontier import CallState
from onward.runtime.cli import app
from onward.runtime.cli._common import boundary, refuse
from onward.runtime.cli.projections import load_projection


@pytest.mark.parametrize(
    ("raised", "code"),
    [
        (errors.NothingToResumeError("no run 'r'"), 1),
        (errors.InvalidInputError("not waiting on 'p'"), 2),
        (errors.ConfigurationError("DATABASE_URL is not set"), 2),
        (errors.SchemaMismatchError("run onward db migrate"), 2),
        (asyncpg.InvalidPasswordError("password authentication failed"), 2),
        (errors.ResumeConflictError("held", holder="w2"), 3),
        (errors.FencedError("superseded"), 3),
        (errors.IndeterminateToolCallError("undecided"), 4),
        (errors.RevisionMismatchError("another revision"), 4),
        (errors.HistoryUnavailableError("evicted"), 4),
        (errors.EventDecodeError("unreadable"), 4),
        (errors.CheckpointFormatError("newer"), 4),
        (errors.LogTruncatedError("compacted"), 4),
        (errors.BackendError("the log failed"), 5),
        (errors.BackendUnavailableError("no answer"), 5),
        (errors.PayloadTooLargeError("too large"), 5),
        (asyncpg.PostgresConnectionError("gone"), 5),
        (redis_errors.ConnectionError("refused"), 5),
        (ConnectionRefusedError(111, "refused"), 5),
        (RuntimeError("a bug in the agent's tool"), 5),
        (KeyboardInterrupt(), 130),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_every_error_has_its_exit_code_and_one_line(raised: BaseException, code: int) -> None:
    def fail() -> None:
        raise raised

    single = typer.Typer()
    single.command()(boundary(fail, name="onward fail"))
    result = CliRunner().invoke(single, [])
    assert result.exit_code == code, result.output
    assert_one_line(result)


def assert_one_line(result: Result) -> None:
    assert "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of the user's own in the working directory, named as its file (``mine.py``):
    `onward` does not search the working directory for a bare module name."""
    name = f"mine_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            from support.kinds import KindCounts
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    return f"{name}.py"


def test_a_projection_is_found_in_the_working_directory(here: str) -> None:
    assert isinstance(load_projection(f"{here}:KindCounts"), KindCounts)


@pytest.mark.parametrize("spec", ["no-colon", "support.kinds:Nope", "support.nowhere:Kinds"])
def test_a_bad_projection_spec_exits_2_in_one_line(spec: str) -> None:
    env = {"DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}
    args = ["projections", "rebuild", "kinds", "--projection", spec]
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 2, result.output
    assert "--projection" in result.stderr
    assert_one_line(result)


def test_a_projection_given_to_a_rebuild_of_the_frontiers_is_refused() -> None:
    """The frontiers are built in: a --projection would be dropped and the frontiers rebuilt
    in place of the projection the user named."""
    env = {"DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none", "ONWARD_BACKEND": "postgres"}
    args = ["projections", "rebuild", "frontiers", "--projection", "support.kinds:KindCounts"]
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 2, result.output
    assert "--projection support.kinds:KindCounts" in result.stderr
    assert_one_line(result)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["approve", "run-1"], "Missing argument 'REQUEST'"),
        (["nosuch"], "No such command 'nosuch'"),
        (
            ["resolve", "r", "c", "-t", "a", "--outcome", "maybe", "--by", "x", "--why", "y"],
            "never",
        ),
        (["schema", "-o"], "requires an argument"),
        (["projector", "--cache-mib", "0"], "'--cache-mib'"),
    ],
)
def test_a_usage_error_exits_2_in_one_line(args: list[str], said: str) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert said in result.stderr
    assert_one_line(result)


def test_a_group_without_a_command_shows_its_help() -> None:
    result = CliRunner().invoke(app, ["db"])
    assert result.exit_code == 2
    assert "migrate" in result.stdout
    assert result.stderr == ""


def test_an_undecided_call_is_listed_with_its_arguments_not_a_blob_reference(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The arguments of a call are shown as the model gave them: one the log holds out of line
    is said to be in the blob store, not shown as the reference to it, and a value that only
    looked like a reference is shown as it was, not wrapped."""
    stored = {"$blob": "sha256:" + "ab" * 32, "size": 1_000_017}
    lookalike = {"$literal": {"$blob": "mine", "size": 3}}
    calls = (
        CallState(call_id="w", tool="write", args=stored, dispatched_fence=1),
        CallState(call_id="n", tool="note", args=lookalike, dispatched_fence=1),
    )
    refuse(errors.IndeterminateToolCallError("undecided", run_id="r", calls=calls), tenant="acme")
    printed = capsys.readouterr().err
    assert "sha256" not in printed
    assert "args in the blob store, 1000017 bytes" in printed
    assert '"$literal"' not in printed
    assert 'args {"$blob":"mine","size":3}' in printed
