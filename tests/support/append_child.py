"""Appends large atomic batches until killed, saying on stdout where it is.

Each append is framed by two lines: ``appending RUN`` once the batch is built, right before the
append, and ``appended RUN`` once it returned. Both are flushed at once, so when the process
dies the last line it wrote says whether it died inside an append (an ``appending`` line with
no ``appended`` after it) and which run that append was for.

Usage: PYTHONPATH=tests python -m support.append_child sqlite PATH PREFIX
       PYTHONPATH=tests python -m support.append_child kafka BOOTSTRAP TOPIC PREFIX
       PYTHONPATH=tests python -m support.append_child postgres DATABASE_URL SCHEMA PREFIX
"""

from __future__ import annotations

import asyncio
import sys

from onward.eventlog import KafkaEventLog, PostgresEventLog, SqliteEventLog, ToolCompleted
from onward.eventlog.base import EventLog

EVENTS_PER_BATCH = 40
BODY = "x" * 20_000
PARTITIONS = 4
APPENDING = "appending"
APPENDED = "appended"


async def main(argv: list[str]) -> None:
    log: EventLog
    if argv[0] == "sqlite":
        log = await SqliteEventLog.open(argv[1], partitions=PARTITIONS)
        prefix = argv[2]
    elif argv[0] == "postgres":
        log = await PostgresEventLog.open(argv[1], schema=argv[2], partitions=PARTITIONS)
        prefix = argv[3]
    else:
        log = await KafkaEventLog.open(argv[1], topic=argv[2], partitions=PARTITIONS)
        prefix = argv[3]
    for index in range(10_000):
        run_id = f"{prefix}-{index:05d}"
        batch = [
            ToolCompleted(run_id=run_id, tenant="t", seq=seq, fence=1, call_id="c", result=BODY)
            for seq in range(1, EVENTS_PER_BATCH + 1)
        ]
        print(APPENDING, run_id, flush=True)
        await log.append(batch)
        print(APPENDED, run_id, flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
