"""Appends large atomic batches until killed; prints each acknowledged run id.

Usage: PYTHONPATH=tests python -m support.append_child sqlite PATH PREFIX
       PYTHONPATH=tests python -m support.append_child kafka BOOTSTRAP TOPIC PREFIX
"""

from __future__ import annotations

import asyncio
import sys

from onward.eventlog import KafkaEventLog, SqliteEventLog, ToolCompleted
from onward.eventlog.base import EventLog

EVENTS_PER_BATCH = 40
BODY = "x" * 20_000
PARTITIONS = 4


async def main(argv: list[str]) -> None:
    log: EventLog
    if argv[0] == "sqlite":
        log = await SqliteEventLog.open(argv[1], partitions=PARTITIONS)
        prefix = argv[2]
    else:
        log = await KafkaEventLog.open(argv[1], topic=argv[2], partitions=PARTITIONS)
        prefix = argv[3]
    for index in range(10_000):
        run_id = f"{prefix}-{index:05d}"
        batch = [
            ToolCompleted(run_id=run_id, tenant="t", seq=seq, fence=1, call_id="c", result=BODY)
            for seq in range(1, EVENTS_PER_BATCH + 1)
        ]
        await log.append(batch)
        print(run_id, flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
