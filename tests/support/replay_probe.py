"""A test that writes the history one seeded workload appends, for the replay test to compare.

Not collected with the suite (the name does not start with ``test_``): ``test_fixtures`` runs it
in fresh pytest processes, with ``ONWARD_TEST_SEED`` set and ``ONWARD_REPLAY_OUT`` naming the
file to write.
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

from onward.eventlog.codec import encode
from onward.eventlog.memory import MemoryEventLog
from support.histories import append_all, workload

OUT_VARIABLE = "ONWARD_REPLAY_OUT"
PARTITIONS = 4


async def test_write_the_seeded_history(rng: random.Random) -> None:
    """Every stored record, partition by partition, offset and encoded bytes."""
    steps = workload(rng, 24)
    lines: list[bytes] = []
    async with MemoryEventLog(partitions=PARTITIONS) as log:
        await append_all(log, steps)
        for partition in range(PARTITIONS):
            for stored in await log.read_partition(partition, 0):
                at = stored.position
                lines.append(b"%d %d " % (at.partition, at.offset) + encode(stored.event))
    out = Path(os.environ[OUT_VARIABLE])
    await asyncio.to_thread(out.write_bytes, b"\n".join(lines) + b"\n")
