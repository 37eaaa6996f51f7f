"""A request id that only looks like a collaborative checkpoint's is an ordinary request.

`checkpoint_of` reads the seq at the end of ``onward.checkpoint:<boundary>:<seq>``. A request id
written to the log by another producer (or a damaged record) may end in characters that
`str.isdigit` accepts and `int` does not (superscripts, circled digits, more digits than `int`
reads from text): every fold of the run would then fail on it, and `onward inspect` with it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from typer.testing import CliRunner

from onward.eventlog import (
    ApprovalGranted,
    ApprovalRequested,
    Event,
    RunClaimed,
    RunStarted,
    SqliteEventLog,
)
from onward.projections.transcript import checkpoint_of, message_of
from onward.runtime.cli import app
from onward.testing.eventlog import Envelope, new_run_id

ODD_DIGITS = ["²", "①", "3²", "9" * 5000]


@pytest.mark.parametrize("seq", ODD_DIGITS)
def test_a_seq_int_cannot_read_is_no_checkpoint(seq: str) -> None:
    request = f"onward.checkpoint:after_tool_result:{seq}"
    assert checkpoint_of(request) is None
    granted = ApprovalGranted(
        **Envelope(run_id="r", tenant="acme", seq=3, fence=1, at=3),
        request_id=request,
        by="ann",
        value="go",
    )
    assert message_of(granted) is None


def test_inspect_shows_a_run_answered_under_such_a_request(tmp_path: Path) -> None:
    db = tmp_path / "onward.db"
    run_id = f"run-{new_run_id()}"
    request = "onward.checkpoint:after_tool_result:²"

    def env(seq: int) -> Envelope:
        return Envelope(run_id=run_id, tenant="acme", seq=seq, fence=1, at=seq)

    history: list[Event] = [
        RunStarted(**env(1), agent="booker", revision="r1", input="hi"),
        RunClaimed(**env(2), worker="w1"),
        ApprovalRequested(**env(3), request_id=request),
        ApprovalGranted(**env(4), request_id=request, by="ann", value="go"),
    ]

    async def write() -> None:
        async with SqliteEventLog(db) as log:
            await log.append(history)

    asyncio.run(write())
    environment = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)}
    result = CliRunner().invoke(app, ["inspect", run_id, "--tenant", "acme"], env=environment)
    assert result.exit_code == 0, result.output
    assert run_id in result.stdout
