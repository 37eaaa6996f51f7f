"""``checkpoint_frequency=N``: the chosen boundaries of every Nth step are checkpoints.

Recorded in the run's `RunStarted`, so the stream and a collaborative run's pauses keep to it
after the process that started the run is gone; the runner's own policy thins the frontier rows
its inline checkpointer writes. Checkpoint messages carry where the run stands in ``metadata``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support.appapi import agents, provider

import onward
from onward.errors import InvalidInputError
from onward.eventlog import RunStarted
from onward.eventlog.base import StoredEvent, partition_for
from onward.eventlog.memory import MemoryEventLog
from onward.projections.memory import MemoryFrontierStore
from onward.runtime import AgentRunner, CheckpointPolicy
from onward.runtime.application.messages import RunMessage
from onward.runtime.options import Options, checked_options
from onward.runtime.settings import Settings

COLLABORATIVE = {"agent": "stepper", "mode": "collaborative"}


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    return Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")


def checkpoints(messages: Sequence[RunMessage]) -> list[tuple[int, str | None]]:
    return [(m.iteration, m.boundary) for m in messages if m.is_checkpoint]


@pytest.mark.parametrize("bad", [0, -3, 2.5, 2.0, "2", True, None, 10**9])
def test_a_frequency_that_is_not_a_whole_number_of_steps_is_refused(bad: Any) -> None:
    with pytest.raises(InvalidInputError, match="checkpoint_frequency must be a whole number"):
        CheckpointPolicy(checkpoint_frequency=bad)
    with pytest.raises(InvalidInputError, match=r"invalid options: checkpoints: .*checkpoint_fr"):
        Options.of({"checkpoints": {"checkpoint_frequency": bad}})
    if bad is not None:  # None is the field's own default: no frequency given
        with pytest.raises(InvalidInputError, match="invalid options: checkpoint_frequency: "):
            Options(checkpoint_frequency=bad)
        with pytest.raises(InvalidInputError, match="invalid options: checkpoint_frequency: "):
            checked_options({"checkpoint_frequency": bad})


def test_the_frequency_is_recorded_once_whichever_way_it_was_given() -> None:
    assert "checkpoint_frequency" not in Options().recorded()
    given = Options(checkpoint_frequency=3).recorded()
    assert given["checkpoint_frequency"] == 3
    assert Options(checkpoints=CheckpointPolicy(checkpoint_frequency=3)).recorded() == given
    # A fleet's StartRun carries the recorded form, which must come back the same.
    assert checked_options(given) == given
    with pytest.raises(InvalidInputError, match="disagree"):
        Options(checkpoint_frequency=2, checkpoints=CheckpointPolicy(checkpoint_frequency=3))


async def test_only_every_nth_step_streams_checkpoints(settings: Settings) -> None:
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        every = await app.query("work", {"agent": "stepper"}).collect()
        options = {"agent": "stepper", "checkpoint_frequency": 2}
        second = await app.query("work", options).collect()
        run_id = second[-1].run_id
        log = app.backends.log
        partition = partition_for(run_id, log.partitions)
        records = await log.read_records(partition, 0, (await log.bounds(partition)).end)
        row = await app.backends.frontiers.get(run_id)
    assert checkpoints(every) == [
        (n, b) for n in (1, 2, 3) for b in ("after_model_call", "after_tool_result")
    ]
    assert checkpoints(second) == [(2, "after_model_call"), (2, "after_tool_result")]
    assert second[-1].output == every[-1].output
    started = [
        r.event
        for r in records
        if isinstance(r, StoredEvent)
        and isinstance(r.event, RunStarted)
        and r.event.run_id == run_id
    ]
    assert started[0].options["checkpoint_frequency"] == 2
    assert row is not None
    assert row.frontier is not None
    assert row.frontier.checkpoint_frequency == 2


async def test_a_resumed_collaborative_run_pauses_only_every_nth_step(settings: Settings) -> None:
    options = {**COLLABORATIVE, "checkpoint_frequency": 2, "run_id": "steps-1"}
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        async for pause in app.query("work", options):
            if pause.waits:
                break
    # Paused after the model call of step 2, not before; and the process is gone.
    assert (pause.is_checkpoint, pause.boundary, pause.iteration) == (True, "after_model_call", 2)
    assert pause.metadata["tool_calls"] == [{"call_id": "s2", "tool": "step", "args": {"n": 2}}]
    assert pause.metadata["waiting"] is True
    pauses = [pause]
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        async for message in app.resume("steps-1", "go on", after=pause.position):
            if message.is_checkpoint:
                pauses.append(message)
                await message.respond(f"note {len(pauses)}")
            last = message
    assert [(p.iteration, p.boundary) for p in pauses] == [
        (2, "after_model_call"),
        (2, "after_tool_result"),
    ]
    assert last.is_result
    assert last.output == "notes: note 2"


async def test_the_runners_policy_folds_rows_only_every_nth_step() -> None:
    written = {}
    for every in (1, 2):
        log = MemoryEventLog(partitions=1)
        store = MemoryFrontierStore()
        runner = AgentRunner(
            provider=provider(),
            log=log,
            frontiers=store,
            checkpoint_inline=True,
            checkpoints=CheckpointPolicy(checkpoint_frequency=every),
        )
        result = await runner.run(agents["stepper"], "work", tenant="acme", run_id="r")
        assert result.status == "completed"
        row = await store.get("r")
        assert row is not None
        assert row.frontier is not None
        assert row.frontier.status == "completed"
        assert runner.checkpointer is not None
        written[every] = runner.checkpointer.written
    # Started, 3 steps of 2 boundaries, the last answer with the run's end: 8 folds; every
    # second step: started, step 2's two boundaries, the end.
    assert written == {1: 8, 2: 4}
