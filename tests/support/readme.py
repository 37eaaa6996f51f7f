"""Running the README's examples as written, as their tests do."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def section(title: str) -> str:
    """The README's text under ``## title``, up to the next section."""
    return README.read_text().split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def run_block(block: str, where: Path, name: str = "example.py") -> str:
    """Run one Python block as a script in ``where``; its standard output (it must succeed)."""
    script = where / name
    script.write_text(block)
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=where,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def run_example(title: str, where: Path) -> tuple[str, str]:
    """The section's one Python example, run: the section's text and what it printed."""
    text = section(title)
    (block,) = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    return text, run_block(block, where).strip()
