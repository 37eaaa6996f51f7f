"""Worker A of the fencing test: runs the steps graph on one thread, one invocation per line.

``python -m integrations.langgraph.fence_child WORLD_JSON THREAD_ID TTL_S``; for each line
``step`` on standard input it invokes the graph and prints ``ok``, ``fenced`` or
``error <type>``. For ``pause`` it does the same, but its node prints ``in-node`` and waits a
moment first, so the test can stop the process in the middle of a graph run. It holds the
thread's lease from its first write on, with the given ttl.
"""

from __future__ import annotations

import asyncio
import json
import sys

from onward.errors import FencedError, OnwardError

from .graphs import config, steps_graph
from .worlds import open_world


async def main(world_spec: str, thread_id: str, ttl_s: float) -> None:
    opened = open_world(json.loads(world_spec))
    loop = asyncio.get_running_loop()
    pausing = False

    async def inside() -> None:
        if not pausing:
            return
        # Stop between two renewals, never inside one: a process stopped in the middle of a
        # SQLite write transaction would hold the file's lock and stop everyone else too.
        lease = saver.lease(thread_id)
        while saver.lease(thread_id) == lease:  # noqa: ASYNC110 - the lease is what we watch
            await asyncio.sleep(0.01)
        print("in-node", flush=True)
        await asyncio.sleep(0.5)  # the test stops this process in here

    async with (
        opened as world,
        world.saver(holder="worker-a", ttl_s=ttl_s, renew_within_s=ttl_s / 5) as saver,
    ):
        graph = steps_graph("A", saver, inside=inside)
        print("ready", flush=True)
        while line := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
            pausing = line == "pause"
            try:
                # durability="sync": the checkpoint before the node is saved before the node
                # runs, so nothing but the lease renewal touches the database meanwhile.
                await graph.ainvoke({"steps": []}, config(thread_id), durability="sync")
            except FencedError:
                print("fenced", flush=True)
            except OnwardError as exc:
                print(f"error {type(exc).__name__}", flush=True)
            else:
                print("ok", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
