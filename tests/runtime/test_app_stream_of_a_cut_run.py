"""A stream opened on a run that has ended and whose events compaction has cut.

Compaction keeps nothing of a finished run in the log but its tags: its row says how it ended.
A stream opened on it later (``app.resume``) ends at once with the message its end gave (the
result, the error, or, for a run carried into a new run, ``continued`` naming the run to
follow), rather than wait for events that will never come, saying no worker has taken it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.appapi import agents, provider, script

import onward
from onward.runtime.compaction import CheckpointCompactor
from onward.runtime.continuation import ContinuationPolicy
from onward.runtime.demo_ledger import Ledger
from onward.runtime.providers import ScriptedProvider
from onward.runtime.settings import Settings


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    return Ledger(tmp_path / "ledger.jsonl")


async def _cut(app: onward.App, run_id: str) -> None:
    """Compact the log until nothing of ``run_id`` is left in it."""
    for _ in range(3):  # other runs, so the partitions are worth compacting
        await app.query("work", {"agent": "stepper"}).collect()
    assert app.backends.compaction is not None
    compactor = CheckpointCompactor(
        app.backends.log, app.backends.frontiers, app.backends.compaction, no_archive=True
    )
    assert (await compactor.compact()).events_cut > 0
    assert not await app.backends.log.read_run(run_id)


async def test_a_stream_of_an_ended_run_cut_from_the_log_ends_with_its_result(
    tmp_path: Path, ledger: Ledger
) -> None:
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        ran = await app.query("work", {"agent": "stepper"}).collect()
        await _cut(app, ran[-1].run_id)
        again = await app.resume(ran[-1].run_id, timeout=5).collect()
        after = await app.resume(ran[-1].run_id, after=ran[-1].position, timeout=5).collect()
    assert [(m.type, m.status, m.output) for m in again] == [
        ("result", "completed", ran[-1].output)
    ]
    assert after == []


async def test_a_stream_of_a_continued_run_cut_from_the_log_names_the_run_to_follow(
    tmp_path: Path, ledger: Ledger
) -> None:
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        runner = app.backends.runner(ScriptedProvider(script))
        runner.continuation = ContinuationPolicy(max_steps=4)
        last = await runner.run(agents["stepper"], "work", tenant=app.tenant, run_id="long")
        assert (last.status, last.run_id) == ("completed", "long~c3")
        await _cut(app, "long")
        again = await app.resume("long", timeout=5).collect()
    assert [(m.type, m.status, m.metadata["new_run"]) for m in again] == [
        ("result", "continued", "long~c1")
    ]


async def _cut_below(app: onward.App, run_id: str, keep: int) -> None:
    """Cut the log of ``run_id``'s partition below its ``keep``-th event (its end when it has
    no such event), as retention does: no compaction writes down what it cut."""
    log = app.backends.log
    stored = await log.read_run(run_id)
    partition = stored[0].position.partition
    offset = (
        stored[keep].position.offset if keep < len(stored) else (await log.bounds(partition)).end
    )
    await log.truncate_before(partition, offset)


@pytest.mark.parametrize("keep", [3, 10_000], ids=["its-tail-kept", "cut-whole"])
async def test_a_stream_of_an_ended_run_cut_by_other_means_ends_with_its_result(
    tmp_path: Path, ledger: Ledger, keep: int
) -> None:
    """Cut below the run's first event with no compaction record (retention, a cut made
    elsewhere), the stream still ends with the run's result rather than wait for good."""
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        ran = await app.query("work", {"agent": "stepper"}).collect()
        await _cut_below(app, ran[-1].run_id, keep)
        again = await app.resume(ran[-1].run_id, timeout=5).collect()
    assert [(m.type, m.status, m.output) for m in again][-1:] == [
        ("result", "completed", ran[-1].output)
    ]
    assert [m.position for m in again] == sorted({m.position for m in again})
