"""Checkpoint messages carry the checkpoint's data in ``metadata``: where the run stands at the
boundary, read from the run's events alone, so every reader of the stream says the same."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.appapi import agents, provider

import onward
from onward.runtime.settings import Settings


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    return Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")


async def test_checkpoint_messages_carry_the_checkpoints_data(settings: Settings) -> None:
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        messages = await app.query("work", {"agent": "stepper"}).collect()
    after_call, after_turn = [m for m in messages if m.is_checkpoint][:2]
    assert after_call.metadata == {
        "boundary": "after_model_call",
        "seq": after_call.seq,
        "iteration": 1,
        "tools_done": 0,
        "input_tokens": 10,
        "output_tokens": 5,
        "tool_calls": [{"call_id": "s1", "tool": "step", "args": {"n": 1}}],
    }
    assert after_turn.metadata == {
        "boundary": "after_tool_result",
        "seq": after_turn.seq,
        "iteration": 1,
        "tools_done": 1,
        "input_tokens": 10,
        "output_tokens": 5,
    }


async def test_a_collaborative_pause_carries_the_data_of_the_boundary_it_follows(
    settings: Settings,
) -> None:
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        async for pause in app.query("work", {"agent": "stepper", "mode": "collaborative"}):
            if pause.waits:
                break
    assert pause.metadata == {
        "boundary": "after_model_call",
        "seq": pause.metadata["after_seq"],
        "iteration": 1,
        "tools_done": 0,
        "input_tokens": 10,
        "output_tokens": 5,
        "tool_calls": [{"call_id": "s1", "tool": "step", "args": {"n": 1}}],
        "waiting": True,
        "after_seq": pause.seq - 1,
    }
