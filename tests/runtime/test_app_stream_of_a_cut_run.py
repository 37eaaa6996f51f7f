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
from onward.runtime.application.messages import RunMessage
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


@pytest.mark.parametrize("cut", ["compacted", "cut-by-other-means"])
async def test_the_end_of_a_run_cut_whole_says_how_far_it_went(
    tmp_path: Path, ledger: Ledger, cut: str
) -> None:
    """The message a run cut whole ends with counts its model calls and tool calls as the
    message its end gave when it was read from the log."""
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        ran = await app.query("work", {"agent": "stepper"}).collect()
        if cut == "compacted":
            await _cut(app, ran[-1].run_id)
        else:
            await _cut_below(app, ran[-1].run_id, 10_000)
        again = await app.resume(ran[-1].run_id, timeout=5).collect()
    assert ran[-1].tools_done == 3
    assert [(m.type, m.iteration, m.tools_done) for m in again] == [
        ("result", ran[-1].iteration, ran[-1].tools_done)
    ]


def _seen(messages: list[RunMessage]) -> list[tuple[object, ...]]:
    return [
        (m.type, m.position, m.boundary, m.waits, m.iteration, m.tools_done, m.progress_percent)
        for m in messages
    ]


async def _answered(stream: onward.RunStream, until_waits: bool = False) -> list[RunMessage]:
    """The stream's messages, each wait answered (up to the first wait, with ``until_waits``,
    left unanswered)."""
    seen: list[RunMessage] = []
    async for message in stream:
        seen.append(message)
        if message.waits:
            if until_waits:
                break
            await message.respond()
    return seen


@pytest.mark.parametrize("cut", ["compacted", "cut-by-other-means"])
async def test_a_run_cut_below_its_start_streams_what_comes_as_if_it_were_whole(
    tmp_path: Path, ledger: Ledger, cut: str
) -> None:
    """A collaborative run whose first events were cut while it waited: the stream opened on
    it after gives what comes as a stream that read it whole does, counting the model calls
    and tool calls made before the cut, with its pauses and iteration bound (no checkpoint
    given twice, once as a pause and once not)."""
    options = {"agent": "stepper", "mode": "collaborative", "max_iterations": 10}
    whole = Settings(backend="sqlite", sqlite_path=tmp_path / "whole.db")
    async with onward.open(whole, agents=agents, provider=provider()) as app:
        expected = await _answered(app.query("work", options))
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        first = await _answered(app.query("work", options), until_waits=True)
        run_id = first[-1].run_id
        if cut == "compacted":
            await _cut(app, run_id)
        else:
            await _cut_below(app, run_id, 10_000)
        await first[-1].respond()
        after = await _answered(app.resume(run_id, timeout=5))
    assert _seen(after) == _seen([m for m in expected if m.position > first[-1].position])


@pytest.mark.parametrize("cut", ["compacted", "cut-by-other-means"])
async def test_a_waiting_run_cut_whole_is_said_to_wait(
    tmp_path: Path, ledger: Ledger, cut: str
) -> None:
    """A run that waits on a person and whose events were all cut (the message that asked
    with them): a stream that does not follow waits ends, as for a run read whole, rather
    than wait for good (for a worker, it would say); the run is answered and goes on."""
    options = {"agent": "stepper", "mode": "collaborative"}
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        first = await _answered(app.query("work", options), until_waits=True)
        run_id = first[-1].run_id
        if cut == "compacted":
            await _cut(app, run_id)
        else:
            await _cut_below(app, run_id, 10_000)
        again = await app.resume(run_id, follow_waits=False, timeout=5).collect()
        await first[-1].respond()
        rest = await _answered(app.resume(run_id, timeout=5))
    assert again == []
    assert rest[-1].is_result
    assert rest[-1].status == "completed"


@pytest.mark.parametrize(
    "chosen",
    [
        {"checkpoints": {"after_model_call": False, "after_tool_result": False}},
        {"checkpoint_frequency": 2},
    ],
    ids=["before-approval-only", "every-2nd-step"],
)
@pytest.mark.parametrize("cut", ["compacted", "cut-by-other-means"])
async def test_an_autonomous_run_cut_below_its_start_streams_only_the_checkpoints_it_chose(
    tmp_path: Path, ledger: Ledger, cut: str, chosen: dict[str, object]
) -> None:
    """An autonomous run that chose its checkpoints (or every how many steps they come), cut
    below its start while it waited on a person's approval: the stream opened on it after
    shows the checkpoints it chose, as a stream that read it whole does, not every boundary
    of every step."""
    options = {"agent": "payer", **chosen}
    whole = Settings(backend="sqlite", sqlite_path=tmp_path / "whole.db")
    async with onward.open(whole, agents=agents, provider=provider()) as app:
        expected = await _answered(app.query("pay 5", options))
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        first = await _answered(app.query("pay 5", options), until_waits=True)
        run_id = first[-1].run_id
        if cut == "compacted":
            await _cut(app, run_id)
        else:
            await _cut_below(app, run_id, 10_000)
        await first[-1].respond()
        after = await _answered(app.resume(run_id, timeout=5))
    assert [m.boundary for m in expected if m.is_checkpoint] == ["before_approval"]
    assert _seen(after) == _seen([m for m in expected if m.position > first[-1].position])


@pytest.mark.parametrize("cut", ["whole", "compacted", "cut-by-other-means"])
async def test_the_last_run_of_a_chain_says_how_far_the_chain_went(
    tmp_path: Path, ledger: Ledger, cut: str
) -> None:
    """A run carried on three times ends counting the model calls and the tool calls of the
    whole chain, as one run that was never carried on does, read whole or cut."""
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        ran = await app.query("work", {"agent": "stepper"}).collect()
        runner = app.backends.runner(ScriptedProvider(script))
        runner.continuation = ContinuationPolicy(max_steps=4)
        last = await runner.run(agents["stepper"], "work", tenant=app.tenant, run_id="long")
        assert (last.status, last.run_id) == ("completed", "long~c3")
        if cut == "compacted":
            await _cut(app, "long~c3")
        elif cut == "cut-by-other-means":
            await _cut_below(app, "long~c3", 10_000)
        again = await app.resume("long~c3", timeout=5).collect()
    assert ran[-1].tools_done == 3
    assert [(m.type, m.iteration, m.tools_done) for m in again][-1:] == [
        ("result", ran[-1].iteration, ran[-1].tools_done)
    ]
