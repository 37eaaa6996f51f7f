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
