"""Embedded mode: SQLite log and SQLite frontiers in one file, folded right after appends.

The one embedded fold is the runner's `Checkpointer`; here it folds after every batch, so each
step's row can be checked.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest_asyncio
from support.histories import (
    RunScript,
    append_all,
    assert_stored_is_the_direct_fold,
    assert_stored_is_what_the_scripts_wrote,
    direct_fold,
    run_ids_of,
    workload,
)

from onward.eventlog import Event, Position, RunFinished, SqliteEventLog
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.checkpoint import Checkpointer


class CheckpointedLog:
    """Appends to the log, then has the checkpointer fold the batch's partition."""

    def __init__(self, inner: SqliteEventLog, checkpointer: Checkpointer) -> None:
        self.inner = inner
        self.checkpointer = checkpointer
        self.partitions = inner.partitions

    async def append(self, events: Sequence[Event]) -> list[Position]:
        positions = await self.inner.append(events)
        await self.checkpointer.catch_up([positions[0].partition])
        return positions

    async def catch_up(self) -> int:
        return await self.checkpointer.catch_up()


@dataclass
class Embedded:
    path: Path
    inner: SqliteEventLog
    store: SqliteFrontierStore
    log: CheckpointedLog


@pytest_asyncio.fixture
async def embedded(tmp_path: Path) -> AsyncIterator[Embedded]:
    path = tmp_path / "onward.db"
    async with (
        SqliteEventLog(path, partitions=4) as inner,
        SqliteFrontierStore(path) as store,
    ):
        yield Embedded(path, inner, store, CheckpointedLog(inner, Checkpointer(store, inner)))


async def test_the_frontier_is_current_as_soon_as_append_returns(
    embedded: Embedded, rng: random.Random
) -> None:
    script = RunScript(rng)
    for step in script.steps():
        await embedded.log.append(step)
        row = await embedded.store.get(script.run_id)
        assert row is not None
        assert row.frontier is not None
        assert row.frontier.last_seq == step[-1].seq
    final = await embedded.store.get(script.run_id)
    assert final is not None
    assert final.summary.status == "completed"


async def test_embedded_frontiers_equal_the_direct_fold(
    embedded: Embedded, rng: random.Random
) -> None:
    steps = workload(rng, 40)
    await append_all(embedded.log, steps, concurrency=8)  # type: ignore[arg-type]  # appends only
    await assert_stored_is_the_direct_fold(embedded.store, embedded.inner, run_ids_of(steps))
    await assert_stored_is_what_the_scripts_wrote(embedded.store, steps)


async def test_the_fence_rule_holds_in_embedded_mode(
    embedded: Embedded, rng: random.Random
) -> None:
    script = RunScript(rng, zombie=True)
    for step in script.steps():
        await embedded.log.append(step)
    row = await embedded.store.get(script.run_id)
    assert row is not None
    assert row.frontier is not None
    assert (row.summary.refused, row.frontier.fence) == (1, 2)
    assert row.frontier.last_refusal is not None
    assert "zombie-call" not in {c.call_id for c in await embedded.store.tool_calls(script.run_id)}


async def test_appends_a_crash_left_unfolded_are_folded_by_the_next_append(
    embedded: Embedded, rng: random.Random
) -> None:
    script = RunScript(rng)
    steps = script.steps()
    for step in steps[:-2]:
        await embedded.log.append(step)
    # A process appended this step and died before folding it.
    await embedded.inner.append(steps[-2])
    await embedded.log.append(steps[-1])
    row = await embedded.store.get(script.run_id)
    assert row is not None
    assert row.frontier is not None
    assert row.frontier.last_seq == steps[-1][-1].seq
    assert isinstance(steps[-1][-1], RunFinished)
    expected, _ = await direct_fold(embedded.inner, [script.run_id])
    assert row.frontier == expected[script.run_id]


async def test_catch_up_folds_what_another_process_appended(
    embedded: Embedded, rng: random.Random
) -> None:
    steps = workload(rng, 5)
    await append_all(embedded.inner, steps, concurrency=2)
    assert await embedded.store.load(run_ids_of(steps)) == {}
    assert await embedded.log.catch_up() == sum(len(s) for s in steps)
    expected, _ = await direct_fold(embedded.inner, run_ids_of(steps))
    loaded = await embedded.store.load(run_ids_of(steps))
    assert {r: row.frontier for r, row in loaded.items()} == expected


async def test_two_processes_checkpointing_one_file_fold_on_each_others_rows(
    tmp_path: Path, rng: random.Random
) -> None:
    """Each checkpointer caches frontiers between folds; one that sees a position it did not
    store drops what it cached for that partition, so it never folds on a stale row."""
    path = tmp_path / "onward.db"
    async with (
        SqliteEventLog(path, partitions=2) as log,
        SqliteFrontierStore(path) as first_store,
        SqliteFrontierStore(path) as second_store,
    ):
        first, second = Checkpointer(first_store, log), Checkpointer(second_store, log)
        steps = workload(rng, 12, zombies=0)
        for i, step in enumerate(steps):
            positions = await log.append(step)
            folder = first if (i // 3) % 2 == 0 else second  # the two take turns, a few each
            await folder.catch_up([positions[0].partition])
        await first.catch_up()
        run_ids = run_ids_of(steps)
        rows = await first_store.load(run_ids)
        assert sum(row.summary.refused for row in rows.values()) == 0
        await assert_stored_is_the_direct_fold(first_store, log, run_ids)
