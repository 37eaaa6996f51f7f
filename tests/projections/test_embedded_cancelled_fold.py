"""An inline fold cancelled while its store is written, then another process folding the file.

The cancelled fold lets go of the fold lock with its store still in flight, so this process no
longer knows which position it stored. Another process then folds the same partition on; this
process's next fold must fold onto the rows in the file, not onto the frontiers it kept from the
cancelled fold (which lack what the other process folded).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import textwrap
from pathlib import Path
from typing import Any

from support.histories import RunScript, assert_stored_is_the_direct_fold
from support.processes import reaped

from onward.eventlog import SqliteEventLog
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.checkpoint import Checkpointer

PARTITIONS = 1

_FOLD_IN_ANOTHER_PROCESS = textwrap.dedent(
    """
    import asyncio, sys
    from onward.eventlog import SqliteEventLog
    from onward.projections.sqlite import SqliteFrontierStore
    from onward.runtime.checkpoint import Checkpointer

    async def main(path):
        async with SqliteEventLog(path, partitions={partitions}) as log:
            async with SqliteFrontierStore(path) as store:
                await Checkpointer(store, log).catch_up()

    asyncio.run(main(sys.argv[1]))
    """
).format(partitions=PARTITIONS)


async def fold_in_another_process(path: Path) -> None:
    async with reaped() as children:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _FOLD_IN_ANOTHER_PROCESS,
            str(path),
            stderr=asyncio.subprocess.PIPE,
        )
        children.append(child)
        _, err = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == 0, err.decode()


async def test_a_fold_cancelled_mid_store_never_folds_on_from_what_it_kept(
    tmp_path: Path, rng: random.Random
) -> None:
    path = tmp_path / "onward.db"
    script = RunScript(rng)
    steps = script.steps()
    assert len(steps) >= 3
    async with (
        SqliteEventLog(path, partitions=PARTITIONS) as log,
        SqliteFrontierStore(path) as store,
    ):
        checkpointer = Checkpointer(store, log)
        real_write = store.write
        writing, gate, landed = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def held_write(*args: Any, **options: Any) -> None:
            writing.set()
            await gate.wait()
            try:
                await real_write(*args, **options)
            finally:
                landed.set()

        store.write = held_write  # type: ignore[method-assign]
        await log.append(steps[0])
        fold = asyncio.create_task(checkpointer.catch_up([0]))
        await asyncio.wait_for(writing.wait(), 10)
        fold.cancel()  # the run (or a stream's reader) is cancelled while its fold is stored
        with contextlib.suppress(asyncio.CancelledError):
            await fold

        for step in steps[1:-1]:
            await log.append(step)
        await fold_in_another_process(path)
        gate.set()  # the cancelled fold's store lands now, behind the other process's
        await asyncio.wait_for(landed.wait(), 10)
        store.write = real_write  # type: ignore[method-assign]

        await log.append(steps[-1])
        await checkpointer.catch_up([0])
        assert checkpointer.last_error is None
        row = await store.get(script.run_id)
        assert row is not None
        assert row.frontier is not None
        assert row.summary.refused == 0, "folded on from a frontier the file had moved past"
        assert row.frontier.last_seq == steps[-1][-1].seq
        await assert_stored_is_the_direct_fold(store, log, [script.run_id])
