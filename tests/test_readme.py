"""The README's Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

from support.readme import README, run_block


def test_readme_python_blocks_run(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert blocks, "the README has no Python example"
    outputs = [run_block(block, tmp_path, f"block{i}.py") for i, block in enumerate(blocks)]
    assert "['RunStarted', 'RunClaimed']" in outputs[0]
    assert outputs[1].strip() == "completed booked 1"
    assert outputs[2].strip() == "held by w1"
