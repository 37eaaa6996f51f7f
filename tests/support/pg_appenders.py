"""Appends many small batches to one partition of a PostgreSQL log, several at a time, and says
where each landed, for the test that several processes appending at once leave no gap.

Each line on stdout is ``RUN FIRST_SEQ FIRST_OFFSET COUNT`` for one append that returned.

Usage: PYTHONPATH=tests python -m support.pg_appenders DATABASE_URL SCHEMA PARTITION APPENDS
"""

from __future__ import annotations

import asyncio
import sys

from onward.eventlog import PostgresEventLog, ToolCompleted
from onward.testing.eventlog import runs_in_partition

PARTITIONS = 4
TASKS = 4


async def main(database_url: str, schema: str, partition: int, appends: int) -> None:
    async with PostgresEventLog(
        database_url, schema=schema, partitions=PARTITIONS, max_size=TASKS
    ) as log:

        async def append_run(run_id: str) -> None:
            seq = 1
            for index in range(appends // TASKS):
                count = 1 + index % 5
                batch = [
                    ToolCompleted(run_id=run_id, tenant="t", seq=s, fence=1, call_id="c", result=s)
                    for s in range(seq, seq + count)
                ]
                positions = await log.append(batch)
                print(run_id, seq, positions[0].offset, count, flush=True)
                seq += count

        runs = runs_in_partition(partition, TASKS, PARTITIONS)
        await asyncio.gather(*(append_run(run_id) for run_id in runs))


if __name__ == "__main__":
    url, schema_name, partition_number, count = sys.argv[1:]
    asyncio.run(main(url, schema_name, int(partition_number), int(count)))
