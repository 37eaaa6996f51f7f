"""Recorded histories are classified by `plan_resume` exactly as they were when recorded.

The files in tests/fixtures/resume are the contract: a change to the fold, the codec or the
resume rules that classifies any of them differently fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.resume_fixtures import classification, fixture_agent

from onward.eventlog import Position, StoredEvent, decode
from onward.projections.frontier import Frontier, fold_all
from onward.runtime.planning import plan_resume

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "resume"
NAMES = sorted(p.name.removesuffix(".jsonl") for p in FIXTURES.glob("*.jsonl"))


def test_there_are_recorded_histories() -> None:
    assert len(NAMES) >= 10


@pytest.mark.parametrize("name", NAMES)
def test_recorded_history_is_classified_as_recorded(name: str) -> None:
    lines = (FIXTURES / f"{name}.jsonl").read_bytes().splitlines()
    stored = [StoredEvent(Position(0, i), decode(line)) for i, line in enumerate(lines) if line]
    frontier = fold_all(Frontier.empty(stored[0].event.run_id, stored[0].event.tenant), stored)
    plan = plan_resume(frontier, fixture_agent())
    expected = json.loads((FIXTURES / f"{name}.expected.json").read_text())
    assert classification(plan) == expected
