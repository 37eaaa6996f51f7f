"""Durations and positions an application passes are checked where it passes them.

``poll_s``, ``recheck_s``, a stream's ``timeout`` and ``resume(..., after=)`` that are no such
thing are refused with an `InvalidInputError` naming the field: a ``poll_s`` of 0 would read the
log without a pause for as long as a stream waits, and a string timeout or position failed, on
the first quiet read, as a bare ``TypeError``. A position that went through JSON (a list) is
a position.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.appapi import agents, provider, until

import onward
from onward.errors import InvalidInputError
from onward.runtime.settings import Settings


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("poll_s", 0),
        ("poll_s", -1.0),
        ("poll_s", float("nan")),
        ("poll_s", "0.05"),
        ("recheck_s", -5),
        ("recheck_s", float("inf")),
    ],
)
def test_an_app_with_a_bad_timing_is_refused_naming_it(
    settings: Settings, field: str, value: Any
) -> None:
    with pytest.raises(InvalidInputError, match=field):
        onward.App(settings, agents=agents, provider=provider(), **{field: value})


async def test_a_bad_timeout_or_position_is_refused_naming_it(settings: Settings) -> None:
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        everything = await app.query("work", {"agent": "stepper", "run_id": "r"}).collect()
        bad_timeouts: list[Any] = ["5", -1, float("nan"), True]
        for bad_timeout in bad_timeouts:
            with pytest.raises(InvalidInputError, match="timeout"):
                app.query("work", {"agent": "stepper"}, timeout=bad_timeout)
            with pytest.raises(InvalidInputError, match="timeout"):
                app.resume("r", timeout=bad_timeout)
        bad_afters: list[Any] = ["3", -1, 1.5, (1,), (1, "0"), [1, 2, 3], None]
        for bad_after in bad_afters:
            with pytest.raises(InvalidInputError, match="after"):
                app.resume("r", after=bad_after)
        middle = everything[3]
        as_json: Any = list(middle.position)
        rest = await app.resume("r", after=as_json).collect()
        assert rest == everything[4:]


async def test_a_position_past_the_run_s_last_event_is_refused_not_followed(
    settings: Settings,
) -> None:
    """A position from another run's stream (one further on) would have the stream skip every
    message of this run up to it: in silence for a run that ended, for as long as it takes to
    get there for one that goes on. Refused at the first read, answering nothing."""
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        longer = await app.query("work", {"agent": "stepper", "run_id": "long"}).collect()
        async for asked in app.query("pay 5", {"agent": "payer", "run_id": "short"}):
            if asked.is_hil_request:
                break

        async def let_go() -> bool:
            held = await app.get_session_state("short")
            return held is not None and held.holder is None

        # The run waits on a person: its driver lets go of it, which may land after the break.
        await until(let_go, "the run waiting on a person let go of by its driver")
        state = await app.get_session_state("short")
        assert state is not None
        assert longer[-1].seq > state.last_seq
        for after in (longer[-1].position, longer[-1].seq):
            with pytest.raises(InvalidInputError, match=f"events are 1 to {state.last_seq}"):
                await app.resume("short", {"ok": True}, after=after).collect()
        assert (await app.get_session_state("short")) == state
        rest = await app.resume("short", after=state.last_seq, follow_waits=False).collect()
        assert rest == []
