"""The README's LangGraph examples run as written and print what the text says."""

from __future__ import annotations

import re
from pathlib import Path

from support.readme import run_block, section


def test_readme_langgraph_example_runs(tmp_path: Path) -> None:
    text = section("LangGraph")
    saver_example = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)[0]
    printed = run_block(saver_example, tmp_path).strip()
    assert printed == "['note 1', 'note 2', 'note 3']"
    assert f"It prints `{printed}`" in text


def test_readme_tool_middleware_example_runs(tmp_path: Path) -> None:
    text = section("LangGraph").split("### Tool calls", 1)[1]
    (middleware_example,) = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    asked, answered = run_block(middleware_example, tmp_path).strip().splitlines()
    assert asked == "book {'flight': 'LH123'} call-1"
    assert answered == "['LH123'] Booked."
    assert f"It prints `{asked}`, then `{answered}`" in text
