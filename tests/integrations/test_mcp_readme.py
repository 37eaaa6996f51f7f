"""The README's MCP example runs as written and prints what the text says."""

from __future__ import annotations

from pathlib import Path

from support.readme import run_example


def test_readme_mcp_example_runs(tmp_path: Path) -> None:
    _, printed = run_example("MCP tools", tmp_path)
    assert printed == "completed {'result': 'hello Ada, key onward-'}"
