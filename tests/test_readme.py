"""The README's Python examples run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert blocks, "the README has no Python example"
    outputs: list[str] = []
    for index, block in enumerate(blocks):
        script = tmp_path / f"block{index}.py"
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
        outputs.append(result.stdout)
    assert "['RunStarted', 'RunClaimed']" in outputs[0]
    assert outputs[1].strip() == "completed booked 1"
    assert outputs[2].strip() == "held by w1"
