"""Appends batches from many concurrent tasks to one SQLite log, then says ``done``.

Each task owns one run and appends `BATCHES` batches to it, of one to five events each; every
event names its batch in ``call_id`` (``PREFIX-RUN-BATCH-SIZE``), so whoever reads the log
afterwards can check each batch is whole and its offsets contiguous.

Usage: PYTHONPATH=tests python -m support.group_append_child PATH PARTITIONS PREFIX RUNS
"""

from __future__ import annotations

import asyncio
import random
import sys

from onward.eventlog import SqliteEventLog, ToolCompleted

BATCHES = 8
DONE = "done"


def batch_events(
    prefix: str, run: int, batch: int, first_seq: int, size: int
) -> list[ToolCompleted]:
    """One batch of ``size`` events of run ``PREFIX-RUN``, each naming its batch."""
    run_id = f"{prefix}-{run}"
    return [
        ToolCompleted(
            run_id=run_id,
            tenant="t",
            seq=first_seq + i,
            fence=1,
            call_id=f"{run_id}-{batch}-{size}",
            result="r" * 200,
        )
        for i in range(size)
    ]


async def append_run(log: SqliteEventLog, prefix: str, run: int, rng: random.Random) -> None:
    seq = 1
    for batch in range(BATCHES):
        size = rng.randint(1, 5)
        await log.append(batch_events(prefix, run, batch, seq, size))
        seq += size


async def main(argv: list[str]) -> None:
    path, partitions, prefix, runs = argv[0], int(argv[1]), argv[2], int(argv[3])
    rng = random.Random(prefix)
    async with SqliteEventLog(path, partitions=partitions) as log:
        await asyncio.gather(*(append_run(log, prefix, run, rng) for run in range(runs)))
    print(DONE, flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
