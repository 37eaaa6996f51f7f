"""The README's LangGraph examples run as written and print what the text says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[3] / "README.md"


def _section() -> str:
    return README.read_text().split("## LangGraph", 1)[1].split("\n## ", 1)[0]


def _run(block: str, tmp_path: Path) -> str:
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
    return result.stdout.strip()


def test_readme_langgraph_example_runs(tmp_path: Path) -> None:
    section = _section()
    saver_example = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)[0]
    printed = _run(saver_example, tmp_path)
    assert printed == "['note 1', 'note 2', 'note 3']"
    assert f"It prints `{printed}`" in section


def test_readme_tool_middleware_example_runs(tmp_path: Path) -> None:
    section = _section().split("### Tool calls", 1)[1]
    (middleware_example,) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    asked, answered = _run(middleware_example, tmp_path).splitlines()
    assert asked == "book {'flight': 'LH123'} call-1"
    assert answered == "['LH123'] Booked."
    assert f"It prints `{asked}`, then `{answered}`" in section
