"""The README's MCP example runs as written and prints what the text says."""

from __future__ import annotations

import re
from pathlib import Path

from support.readme import run_example


def test_readme_mcp_example_runs(tmp_path: Path) -> None:
    """The server echoes the start of the key it was sent: the constant ``onward-`` prefix
    alone showed no key at all, so the example proved nothing about it."""
    _, printed = run_example("MCP tools", tmp_path)
    assert re.fullmatch(r"completed \{'result': 'hello Ada, key onward-[0-9a-f]{8}'\}", printed), (
        printed
    )
