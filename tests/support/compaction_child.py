"""Runs one compaction pass and stops at a step of a cut, waiting to be killed.

Usage: PYTHONPATH=tests python -m support.compaction_child CONFIG_JSON
CONFIG: {"kind": "sqlite"|"kafka", "folder": path (sqlite), "servers": [...] (kafka),
         "partitions": n, "archive": path, "pause_at": "archived"|"cut", "max_checkpoints": n}
Prints ``paused at STEP of partition P`` and sleeps once the step is reached.
"""

from __future__ import annotations

import asyncio
import json
import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from onward.eventlog.archive import DirectoryArchive
from onward.runtime.compaction import CheckpointCompactor
from support.compaction_world import World, kafka_stores, sqlite_world
from support.servers import KafkaServers


def stores(config: dict[str, Any]) -> AbstractAsyncContextManager[World]:
    """The stores the config names, as the test that wrote it opened them."""
    if config["kind"] == "sqlite":
        return sqlite_world(Path(config["folder"]), partitions=config["partitions"])
    return kafka_stores(KafkaServers(*config["servers"]), partitions=config["partitions"])


async def main(config: dict[str, Any]) -> None:
    async def pause(step: str, partition: int) -> None:
        if step == config["pause_at"]:
            print(f"paused at {step} of partition {partition}", flush=True)
            await asyncio.Event().wait()

    async with stores(config) as world:
        compactor = CheckpointCompactor(
            world.log,
            world.frontiers,
            world.store,
            archive=DirectoryArchive(config["archive"]),
            max_checkpoints=config["max_checkpoints"],
            pause=pause,
        )
        await compactor.compact()
    print("finished without pausing", flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
