"""The README's pydantic-ai example runs as written and prints what the text says."""

from __future__ import annotations

from pathlib import Path

from support.readme import run_example


def test_readme_pydantic_ai_example_runs(tmp_path: Path) -> None:
    section, printed = run_example("pydantic-ai", tmp_path)
    first, second = printed.splitlines()
    assert first == "waiting ['book']"
    assert second == "completed done: seat 3A booked"
    assert f"It prints `{first}`, then `{second}`" in section
