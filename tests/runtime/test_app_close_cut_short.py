"""A close cut short while runs drain (a second Ctrl-C, a deadline on the close) still closes the
app: its runs are cancelled, as a worker's second SIGTERM cancels them, and its stores closed,
rather than left open behind an app that is no longer the current one. In process, on the
embedded SQLite file.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

import pytest
from support.appapi import GatedModel, agents

import onward
from onward.runtime.settings import Settings


def _sqlite_threads() -> int:
    return sum(t.name.startswith("onward-sqlite") for t in threading.enumerate())


@pytest.mark.timeout(60)
async def test_a_close_cut_short_while_runs_drain_still_closes_the_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")
    before = _sqlite_threads()
    model = GatedModel()
    app = onward.open(settings, agents=agents, provider=model)
    await app.start()
    reading = asyncio.create_task(
        app.query("work", {"agent": "stepper", "run_id": "cut-short"}).collect()
    )
    try:
        await asyncio.wait_for(model.asked.wait(), 30)  # held, in a model call that never ends
        closing = asyncio.create_task(app.close())
        await asyncio.sleep(0.3)  # draining: waiting for the call in flight
        closing.cancel()  # the second Ctrl-C
        with pytest.raises(asyncio.CancelledError):
            await closing
        assert not app.is_open
        for _ in range(100):
            if _sqlite_threads() <= before:
                break
            await asyncio.sleep(0.05)
        assert _sqlite_threads() <= before, "the app's SQLite stores were left open"
    finally:
        reading.cancel()
        with contextlib.suppress(BaseException):
            await reading
        await app.close()
    async with onward.open(settings, agents=agents, provider=GatedModel()) as again:
        state = await again.get_session_state("cut-short")
    assert state is not None
    assert state.holder is None  # handed back: a resume carries it on at once
