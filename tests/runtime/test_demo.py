"""`onward demo`, the README's main job, ends with exactly one booking."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_the_demo_prints_the_plan_and_ends_with_one_booking(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "onward", "demo", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "killed with SIGKILL (exit -9)" in out
    assert "replayed the recorded result" in out
    assert "indeterminate" in out
    assert "status check, which answered completed" in out
    assert "bookings in the airline's ledger: 1" in out
    ledger = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert len(ledger) == 1


def test_the_demo_prints_commands_that_show_what_it_did(tmp_path: Path) -> None:
    """The demo ends with the commands to look at its run; each works as printed."""
    result = subprocess.run(
        [sys.executable, "-m", "onward", "demo", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "300"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    commands = [line.split()[1:] for line in result.stdout.splitlines() if "onward " in line]
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
