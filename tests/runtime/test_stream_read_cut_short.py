"""A read of a stream cut short (a caller's own deadline, ``asyncio.wait_for`` or
``asyncio.timeout`` around one message) loses nothing: reading on gives every message once.

`RunStream` keeps its place: "stop reading, come back later, and it goes on from the message
after the last one it gave". A read that is cancelled has given nothing, so the next read must
give the message it was about to hand out. Here the row of the run is folded slowly (the moment
the stream waits before handing out a message that ends the run or waits on a person), and each
read is bounded by a deadline shorter than that. Runs on the embedded SQLite file and memory,
where the stream folds the row itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import cast

import pytest
from support.appapi import agents, provider

import onward
from onward.runtime.application.messages import RunMessage
from onward.runtime.settings import Settings
from onward.runtime.spend.base import Spend, SpendLedger


@pytest.fixture(params=["sqlite", "memory"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    return Settings(backend=request.param, sqlite_path=tmp_path / "onward.db")


async def read_with_deadlines(stream: onward.RunStream) -> list[RunMessage]:
    """Every message of the stream, each read given 0.1 s; a read that overran is read again."""
    read: list[RunMessage] = []
    for _ in range(200):
        try:
            read.append(await asyncio.wait_for(anext(stream), 0.1))
        except TimeoutError:
            continue  # the caller's deadline passed: it reads on
        except StopAsyncIteration:
            break
    return read


async def test_a_read_cut_short_while_the_row_is_folded_loses_no_message(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        fold = app.fold
        folds: list[int] = []

        async def slow_fold(partition: int) -> None:
            folds.append(partition)
            if len(folds) == 1:  # the first fold only: the reads after it go through
                await asyncio.sleep(0.3)
            await fold(partition)

        monkeypatch.setattr(app, "fold", slow_fold)
        stream = app.query("work", {"agent": "stepper", "run_id": "cut-short"})
        read = await read_with_deadlines(stream)
        monkeypatch.setattr(app, "fold", fold)
        everything = await app.resume("cut-short").collect()
    assert everything[-1].is_result
    assert [m.position for m in read] == [m.position for m in everything]


class SlowFirstTotal:
    """A spend ledger whose first `run_total` takes 0.3 s; the rest as the ledger it wraps."""

    def __init__(self, ledger: SpendLedger) -> None:
        self._ledger = ledger
        self.reads = 0

    async def run_total(self, run_id: str) -> Spend:
        self.reads += 1
        if self.reads == 1:
            await asyncio.sleep(0.3)
        return await self._ledger.run_total(run_id)


async def test_a_read_cut_short_while_the_run_s_spend_is_read_loses_no_message(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's end is handed out with what it spent: a read cut short while the spend
    ledger answers must leave that end to the next read, not count it as taken."""
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        spend = app.backends.spend
        slow = SlowFirstTotal(spend)
        # The stream reads its app's stores; the worker driving the run keeps its own.
        monkeypatch.setattr(
            app, "_backends", dataclasses.replace(app.backends, spend=cast(SpendLedger, slow))
        )
        stream = app.query("work", {"agent": "stepper", "run_id": "cut-short"})
        read = await read_with_deadlines(stream)
        monkeypatch.undo()
        everything = await app.resume("cut-short").collect()
    assert slow.reads >= 1
    assert everything[-1].is_result
    assert [m.position for m in read] == [m.position for m in everything]
