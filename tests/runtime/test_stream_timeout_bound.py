"""A stream's ``timeout`` bounds its wait whatever the app's ``poll_s``.

``query(..., timeout=s)`` and ``resume(..., timeout=s)`` raise `RunTimeoutError` after ``s``
seconds with nothing new (README, the application API). An app that polls seldom
(``onward.open(..., poll_s=...)`` larger than the timeout) still raises about when the timeout
says, not at its next poll. Runs on the embedded SQLite file and memory, in process.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.appapi import agents, provider

import onward
from onward.errors import RunTimeoutError
from onward.runtime.settings import Settings


@pytest.fixture(params=["sqlite", "memory"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    return Settings(backend=request.param, sqlite_path=tmp_path / "onward.db")


async def test_a_stream_times_out_when_its_timeout_says_not_at_its_next_poll(
    settings: Settings,
) -> None:
    async with onward.open(settings, agents=agents, provider=provider(), poll_s=4) as app:
        async for message in app.query("pay 5", {"agent": "payer", "run_id": "slow-poll"}):
            if message.is_hil_request:
                break
        started = time.monotonic()
        with pytest.raises(RunTimeoutError, match=r"nothing new for 0\.5s"):
            await app.resume("slow-poll", after=message.position, timeout=0.5).collect()
        waited = time.monotonic() - started
    assert 0.5 <= waited < 2


async def test_a_stream_of_a_run_waiting_on_a_person_times_out_saying_on_what(
    settings: Settings,
) -> None:
    """Nobody holds a run that waits on a person, and no worker is wanted: the timeout says
    what it waits on, not only that nothing came."""
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        async for message in app.query("pay 5", {"agent": "payer", "run_id": "asks"}):
            if message.is_hil_request:
                break
        with pytest.raises(RunTimeoutError) as late:
            await app.resume("asks", after=message.position, timeout=0.2).collect()
    assert "nothing new for 0.2s" in str(late.value)
    assert f"it waits on an answer to {message.request_id!r}" in str(late.value)
