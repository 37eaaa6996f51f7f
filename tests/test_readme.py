"""The README's Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.chat_completions import chat_completions_server
from support.readme import README, run_block, section


@pytest.mark.timeout(300)  # every example twice, each a fresh interpreter: a minute when idle
def test_readme_python_blocks_run_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every example runs as written, and again in the same directory with the same output
    (an example that leaves state behind for its second run is a defect). The quickstart's
    model is a local OpenAI-compatible server. What an example prints is checked too (the
    examples with a section of their own have their own tests): an application example that
    stopped asking for approval or found no state would still exit 0."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert blocks, "the README has no Python example"
    with chat_completions_server() as base_url:
        monkeypatch.setenv("OPENAI_BASE_URL", base_url)
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        outputs = [run_block(block, tmp_path, f"block{i}.py") for i, block in enumerate(blocks)]
        again = [run_block(block, tmp_path, f"block{i}.py") for i, block in enumerate(blocks)]
    assert again == outputs
    assert outputs[0].splitlines()[-1] == "result The answer is 5."
    assert "['RunStarted', 'RunClaimed']" in outputs[1]
    assert outputs[2].strip() == "completed booked 1"
    assert outputs[3].strip() == "held by w1"
    printed = dict(zip(blocks, outputs, strict=True))
    application, fastapi = (printed[block] for block in python_blocks("The application API"))
    assert application.splitlines() == ["asked: refund {'amount': 30}", "result: done", "completed"]
    assert fastapi.strip() == "['text', 'result']"
    (compaction,) = (printed[block] for block in python_blocks("Compaction"))
    assert compaction.strip() == "would cut 0"


def python_blocks(title: str) -> list[str]:
    """The Python examples of the README's section ``title``, in order."""
    return re.findall(r"```python\n(.*?)```", section(title), flags=re.DOTALL)


def test_every_test_the_security_table_names_exists() -> None:
    """The Security section's table points at the test that guards each finding: each one it
    names is a test function in the file it names, and every finding has one."""
    rows = [line for line in section("Security").splitlines() if re.match(r"\| \d+ \|", line)]
    assert [int(row.split("|")[1]) for row in rows] == list(range(1, 25))
    root = README.parent
    for row in rows:
        named = re.findall(r"`((?:tests/[\w/]+\.py)?)::(\w+)`", row.split("|")[4])
        assert named, row
        path = ""
        for file, name in named:
            path = file or path
            source = (root / path).read_text()
            assert re.search(rf"^(async )?def {name}\(", source, re.MULTILINE), (path, name)
