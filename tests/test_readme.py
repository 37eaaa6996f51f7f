"""The README's Python examples run as written, and its `onward` command lines name what the
CLI has."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
from support.chat_completions import chat_completions_server
from support.readme import README, run_block, section
from typer._click import Command, Context
from typer.core import TyperGroup

from onward.runtime.cli import app


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


def test_every_onward_command_line_of_the_readme_names_commands_and_flags_that_exist() -> None:
    """Each ``onward ...`` line of the README's shell blocks names a command the CLI has and
    only options that command takes, spelt as it spells them: a reader who pastes one never
    meets "No such option". Placeholders (``[--json]``, ``...``, ``JSON|@FILE|-``) are read as
    the options they show."""
    command = typer.main.get_command(app)
    blocks = re.findall(r"```(?:sh|bash)\n(.*?)```", README.read_text(), flags=re.DOTALL)
    lines = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    checked = 0
    for line in lines:
        words = shlex.split(line.split("#", 1)[0].replace("[", " ").replace("]", " "))
        if not words or words[0] != "onward":
            continue
        current: Command = command
        for word in words[1:]:
            found = None
            if isinstance(current, TyperGroup):
                found = current.get_command(Context(current), word)
            if found is not None:
                current = found
            elif word.startswith("-") and word not in ("-", "--"):
                options = {o for p in current.params for o in (*p.opts, *p.secondary_opts)}
                assert word in options, f"{line!r}: {current.name} takes no {word}"
            else:
                assert not isinstance(current, TyperGroup), f"{line!r}: no command {word!r}"
        assert not isinstance(current, TyperGroup) or words[1:] == ["--version"], line
        checked += 1
    assert checked >= 40, checked
