"""What the `--json` outputs of `replay` and `inspect` print: valid JSON of one shape per
command, with no character a terminal acts on left raw.

JSON escapes the C0 controls by itself, but not DEL, the C1 controls (0x9B is CSI and 0x9D OSC
on terminals that read them) nor the Unicode line separators and bidirectional overrides, all
of which `printable` escapes in the tables: a run's content written raw by `--json` to the
operator's terminal could still drive it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from support.poison import not_json
from typer.testing import CliRunner, Result

from onward.eventlog import (
    Event,
    Message,
    ModelAnswered,
    RunClaimed,
    RunFinished,
    RunStarted,
    SqliteEventLog,
    Tagged,
    ToolCall,
    ToolCompleted,
    ToolDispatched,
)
from onward.runtime.cli import app
from onward.testing.eventlog import Envelope, new_run_id

TENANT = "acme"
RAW = "\x7f\x9b2J\x9d0;OWNED\x9c\u2028forged line\u202eetouq\u2066"
"""DEL, C1 CSI, OSC and ST, a line separator, a bidirectional override and an isolate."""
FORBIDDEN = ("\x7f", "\x9b", "\x9d", "\x9c", "\u2028", "\u202e", "\u2066")


def env(run_id: str, seq: int) -> Envelope:
    return Envelope(run_id=run_id, tenant=TENANT, seq=seq, fence=1, at=seq)


def write(db: Path, history: list[Event], *, raw_after: int | None = None) -> None:
    """Append ``history``; with ``raw_after``, an unreadable record after that many events."""

    async def go() -> None:
        async with SqliteEventLog(db) as log:
            head = history if raw_after is None else history[:raw_after]
            await log.append(head)
            if raw_after is not None:
                log.write_raw(history[0].run_id, not_json(history[0].run_id, raw_after + 1))
                await log.append(history[raw_after:])

    asyncio.run(go())


def finished_run(run_id: str, content: str = RAW) -> list[Event]:
    """A run whose tool result, tag and output hold ``content``."""
    call = ToolCall(call_id="c1", tool="look")
    return [
        RunStarted(**env(run_id, 1), agent="booker", revision="r1", input="hi"),
        RunClaimed(**env(run_id, 2), worker="w1"),
        ModelAnswered(
            **env(run_id, 3), message=Message(role="assistant", content=""), tool_calls=[call]
        ),
        ToolDispatched(**env(run_id, 4), call_id="c1", tool="look", idempotency_key="k"),
        ToolCompleted(**env(run_id, 5), call_id="c1", result=content),
        Tagged(**env(run_id, 6), target_seq=5, label=f"looked{content}"),
        RunFinished(**env(run_id, 7), status="completed", output=content),
    ]


def onward(db: Path, *args: str) -> Result:
    environment = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)}
    return CliRunner().invoke(app, list(args), env=environment)


def json_lines(result: Result) -> list[dict[str, Any]]:
    assert result.exit_code == 0, result.output
    for char in FORBIDDEN:
        assert char not in result.stdout, f"raw {char!r} on standard output"
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_replay_json_escapes_what_a_terminal_acts_on_and_keeps_the_values(
    tmp_path: Path,
) -> None:
    db = tmp_path / "onward.db"
    run_id = f"run-{new_run_id()}"
    write(db, finished_run(run_id))
    lines = json_lines(onward(db, "replay", run_id, "--tenant", TENANT, "--json"))
    by_kind = {line["kind"]: line["event"] for line in lines}
    assert by_kind["tool.completed"]["result"] == RAW
    assert by_kind["tagged"]["label"] == f"looked{RAW}"
    assert by_kind["run.finished"]["output"] == RAW


def test_inspect_json_escapes_what_a_terminal_acts_on_and_keeps_the_values(
    tmp_path: Path,
) -> None:
    db = tmp_path / "onward.db"
    run_id = f"run-{new_run_id()}"
    write(db, finished_run(run_id))
    (facts,) = json_lines(onward(db, "inspect", run_id, "--tenant", TENANT, "--json"))
    assert facts["output"] == RAW
    assert [tag["label"] for tag in facts["tags"]] == [f"looked{RAW}"]


@pytest.mark.parametrize("raw_after", [2, 6])
def test_replay_json_lines_have_one_shape_with_an_unreadable_record(
    tmp_path: Path, raw_after: int
) -> None:
    """A script reading ``line["retained"]`` (as for a compacted run) must not fail on the
    line of an unreadable record."""
    db = tmp_path / "onward.db"
    run_id = f"run-{new_run_id()}"
    write(db, finished_run(run_id, "ok"), raw_after=raw_after)
    lines = json_lines(onward(db, "replay", run_id, "--tenant", TENANT, "--json"))
    assert [line["unreadable"] for line in lines].count(True) == 1
    shapes = {tuple(line) for line in lines}
    assert len(shapes) == 1, shapes
    (hole,) = [line for line in lines if line["unreadable"]]
    assert (hole["refused"], hole["retained"]) == (False, False)


def test_replay_of_a_run_whose_first_record_is_unreadable_says_so_not_that_it_was_cut(
    tmp_path: Path,
) -> None:
    """The run's first record is in the log, unreadable: the timeline starts with its hole,
    and nothing was cut from the log. Said to be cut, a person would look for the cut (and
    an archive) instead of at the record."""
    db = tmp_path / "onward.db"
    run_id = f"run-{new_run_id()}"
    history = finished_run(run_id, "ok")

    async def go() -> None:
        async with SqliteEventLog(db) as log:
            log.write_raw(run_id, not_json(run_id, 1))
            await log.append(history[1:])

    asyncio.run(go())
    result = onward(db, "replay", run_id, "--tenant", TENANT)
    assert result.exit_code == 0, result.output
    assert "1 record(s) cannot be read" in result.stderr
    assert "cut" not in result.stderr, result.stderr
