"""Embedded mode under many concurrent runs: catch-ups are shared and ride the log's commits.

The runner folds right after an append (`Checkpointer.after_append`). With many runs appending
at once, a run that waited while another catch-up ran is served by the next one, which folds every
partition asked for meanwhile; and with the frontier store on the log's connection, its writes
share the log's group commits. Neither may cost a run its guarantee: once ``after_append``
returns, the run's row is folded through that batch.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from support.histories import (
    RunScript,
    assert_stored_is_the_direct_fold,
    assert_stored_is_what_the_scripts_wrote,
    interleaved,
)

from onward.eventlog import Event, SqliteEventLog
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.checkpoint import Checkpointer


async def test_concurrent_runs_share_catch_ups_and_each_row_is_current_on_return(
    tmp_path: Path, rng: random.Random
) -> None:
    path = tmp_path / "onward.db"
    scripts = [RunScript(rng).steps() for _ in range(120)]
    async with (
        SqliteEventLog(path, partitions=4) as log,
        SqliteFrontierStore(path, sharing=log) as store,
    ):
        checkpointer = Checkpointer(store, log)
        catch_ups = 0
        catch_up = checkpointer._projector.catch_up

        async def counted(partitions: object = None) -> int:
            nonlocal catch_ups
            catch_ups += 1
            return await catch_up(partitions)  # type: ignore[arg-type]

        checkpointer._projector.catch_up = counted  # type: ignore[method-assign]
        folds_wanted = 0
        stale: list[str] = []

        async def run(steps: list[list[Event]]) -> None:
            nonlocal folds_wanted
            for step in steps:
                positions = await log.append(step)
                await checkpointer.after_append(step, positions)
                if checkpointer.policy.wants(step):
                    folds_wanted += 1
                    row = await store.get(step[0].run_id)
                    if row is None or row.frontier is None or row.frontier.last_seq < step[-1].seq:
                        stale.append(f"{step[0].run_id} seq {step[-1].seq}")

        await asyncio.gather(*(run(steps) for steps in scripts))
        assert stale == [], "rows not folded through a batch once after_append returned"
        assert checkpointer.last_error is None
        assert catch_ups < folds_wanted / 3, f"{catch_ups} catch-ups for {folds_wanted} folds"
        assert log._db.commits < folds_wanted, "the store's writes did not share the log's commits"
        run_ids = [steps[0][0].run_id for steps in scripts]
        await assert_stored_is_the_direct_fold(store, log, run_ids)
        await assert_stored_is_what_the_scripts_wrote(store, interleaved(rng, scripts))
