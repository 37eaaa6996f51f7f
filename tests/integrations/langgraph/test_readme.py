"""The README's LangGraph example runs as written and prints what the text says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[3] / "README.md"


def test_readme_langgraph_example_runs(tmp_path: Path) -> None:
    section = README.read_text().split("## LangGraph", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
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
    printed = result.stdout.strip()
    assert printed == "['note 1', 'note 2', 'note 3']"
    assert f"It prints `{printed}`" in section
