"""`onward demo`, the README's main job, ends with exactly one booking."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.processes import kill_if_running
from typer.testing import CliRunner

from onward.runtime import demo as booking
from onward.runtime.cli import app


def demo(where: Path) -> str:
    """`onward demo --dir where` as a user runs it (a wide terminal); what it printed."""
    result = subprocess.run(
        [sys.executable, "-m", "onward", "demo", "--dir", str(where)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "300"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_demo_prints_the_plan_and_ends_with_one_booking(tmp_path: Path) -> None:
    out = demo(tmp_path)
    assert "killed with SIGKILL (exit -9)" in out
    # The wait for the dead worker's lease says once whose it is and how long it has left.
    waits = [line for line in out.splitlines() if "held by worker-1" in line]
    assert len(waits) == 1, out
    assert re.search(r"until its lease lapses, in \d\.\d s; waiting", waits[0]), waits
    assert "replayed the recorded result" in out
    assert "indeterminate" in out
    assert "status check, which answered completed" in out
    assert "bookings in the airline's ledger: 1" in out
    ledger = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert len(ledger) == 1


def test_the_demo_prints_commands_that_show_what_it_did(tmp_path: Path) -> None:
    """The demo ends with the commands to look at its run; each works as printed."""
    commands = [line.split()[1:] for line in demo(tmp_path).splitlines() if "onward " in line]
    assert [c[:2] for c in commands] == [["onward", "inspect"], ["onward", "replay"]]
    for command in commands:
        shown = subprocess.run(
            [sys.executable, "-m", *command],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={"PATH": "/usr/bin:/bin", "ONWARD_SQLITE_PATH": str(tmp_path / "onward.db")},
        )
        assert shown.returncode == 0, shown.stderr
        assert "run-booking-1" in shown.stdout


def test_sigterm_to_the_demo_exits_143_in_one_line(tmp_path: Path) -> None:
    """SIGTERM to `onward demo` while it waits for the dead worker's lease: it died of the
    signal without a word, where every other command says so and exits 143."""
    demoing = subprocess.Popen(
        [sys.executable, "-m", "onward", "demo", "--dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "300", "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert demoing.stdout is not None
        for line in demoing.stdout:
            # Waiting, not about to: a signal sent at "3. worker-2" landed as the resume's event
            # loop was being set up, now and then leaving a traceback (an instant no wait is in).
            if line.lstrip().startswith("held by") and line.rstrip().endswith("waiting"):
                break
        else:
            raise AssertionError(demoing.communicate())
        demoing.send_signal(signal.SIGTERM)
        _, stderr = demoing.communicate(timeout=30)
    finally:
        kill_if_running(demoing)  # one the signal did not end would outlive the test
    assert demoing.returncode == 143, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines() == ["terminated"], stderr


def test_sigterm_while_a_task_of_the_resume_runs_stops_the_demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM that lands while the resume's event loop runs a task other than the resume
    itself (a lease's renewal): raised in that task, it ended the task alone, and the demo
    went on as if it had never been sent."""

    def no_child(*args: Any, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, -9)

    async def resumed(workdir: Path, console: Any) -> Any:
        async def renewing() -> None:
            # Sent to this very process: only with the demo's handler in place, never killing it.
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN, None)
            os.kill(os.getpid(), signal.SIGTERM)

        renewal = asyncio.create_task(renewing())
        await asyncio.sleep(5)
        raise AssertionError(f"the demo went on after SIGTERM ({renewal})")

    monkeypatch.setattr(booking, "subprocess", SimpleNamespace(run=no_child))
    monkeypatch.setattr(booking, "_resume", resumed)

    result = CliRunner().invoke(app, ["demo", "--dir", str(tmp_path)])

    assert result.exit_code == 143, result.output
    assert result.stderr.strip().splitlines() == ["terminated"], result.stderr
