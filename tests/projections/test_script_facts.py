"""The oracle the projector tests and the fault table measure with: it counts what each run's
script wrote, so a stored row that counts an event twice, misses one or is not completed shows
in the row's columns (duplicates, lost, waiting)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Collection

import msgspec
import pytest
from support.histories import append_all, run_ids_of, tally_against_scripts, workload

from onward.eventlog import Event
from onward.eventlog.memory import MemoryEventLog
from onward.projections.base import StoredFrontier
from onward.projections.frontier import Frontier
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.log_projector import LogProjector
from onward.projections.memory import MemoryFrontierStore

Tamper = Callable[[Frontier], Frontier | None]


class TamperedStore(MemoryFrontierStore):
    """Loads ``victim``'s row as folded, then changed by ``tamper`` (``None`` drops it)."""

    def __init__(self, tamper: Tamper) -> None:
        super().__init__()
        self.tamper = tamper
        self.victim = ""

    async def load(self, run_ids: Collection[str]) -> dict[str, StoredFrontier]:
        loaded = await super().load(run_ids)
        row = loaded.pop(self.victim, None)
        if row is None:  # folding, before a victim is chosen
            return loaded
        assert row.frontier is not None
        changed = self.tamper(row.frontier)
        if changed is not None:
            loaded[self.victim] = dataclasses.replace(row, frontier=changed)
        return loaded


async def _fold(rng: random.Random, store: MemoryFrontierStore) -> list[list[Event]]:
    steps = workload(rng, 30, zombies=0.3)
    async with MemoryEventLog(partitions=4) as log:
        await append_all(log, steps)
        await LogProjector(log, FrontierProjection(store, log)).catch_up()
    return steps


async def test_the_direct_fold_of_a_workload_counts_what_its_scripts_wrote(
    rng: random.Random,
) -> None:
    store = MemoryFrontierStore()
    steps = await _fold(rng, store)
    tally = await tally_against_scripts(store, steps)
    assert tally.wrong == []
    assert (tally.runs, tally.duplicates, tally.lost, tally.waiting) == (30, 0, 0, 0)
    assert tally.folded == sum(len(step) for step in steps)


@pytest.mark.parametrize(
    ("tamper", "duplicates", "lost", "waiting"),
    [
        pytest.param(
            lambda f: msgspec.structs.replace(f, input_tokens=f.input_tokens + 1),
            1,
            0,
            0,
            id="tokens-of-an-answer-counted-twice",
        ),
        pytest.param(
            lambda f: msgspec.structs.replace(f, refused=f.refused + 1),
            1,
            0,
            0,
            id="an-event-refused-twice",
        ),
        pytest.param(
            lambda f: msgspec.structs.replace(f, iteration=f.iteration - 1),
            0,
            1,
            0,
            id="a-settled-turn-missing",
        ),
        pytest.param(lambda f: None, 0, 1, 0, id="no-row"),
        pytest.param(
            lambda f: msgspec.structs.replace(f, status="running"), 0, 0, 1, id="not-completed"
        ),
    ],
)
async def test_a_row_that_differs_from_its_script_shows_in_the_columns(
    tamper: Tamper, duplicates: int, lost: int, waiting: int, rng: random.Random
) -> None:
    store = TamperedStore(tamper)
    steps = await _fold(rng, store)
    store.victim = rng.choice(run_ids_of(steps))
    tally = await tally_against_scripts(store, steps)
    assert (tally.duplicates, tally.lost, tally.waiting) == (duplicates, lost, waiting)
    assert len(tally.wrong) == 1
    assert tally.wrong[0].startswith(store.victim)
