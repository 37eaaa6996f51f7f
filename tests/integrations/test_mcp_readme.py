"""The README's MCP example runs as written and prints what the text says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_mcp_example_runs(tmp_path: Path) -> None:
    section = README.read_text().split("## MCP tools", 1)[1]
    (block,) = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], flags=re.DOTALL)
    script = tmp_path / "example.py"
    script.write_text(block)
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "completed {'result': 'hello Ada, key onward-'}"
