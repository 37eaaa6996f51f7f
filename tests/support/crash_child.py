"""Runs one agent run and kills itself with SIGKILL at a chosen point.

Usage: PYTHONPATH=tests python -m support.crash_child [CONFIG_JSON]
Without an argument it reads CONFIG_JSON as one line on stdin, once its imports are done: a test
can start it ahead of the case that will use it.
CONFIG: {"backend": "sqlite"|"kafka", "db": path, "bootstrap": ..., "topic": ...,
         "database_url": ..., "schema": ..., "run_id": ..., "point": ..., "call_id": ...,
         "variant": "plain"|"reconcile"|"retry_safe"|"approval", "ledger": path}
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence

from onward.eventlog import Event, kind_of
from support.crash_world import CRASHED_LEASE, TENANT, open_world, the_agent, the_runner


class KillAt:
    def __init__(self, point: str, call_id: str | None) -> None:
        self.point = point
        self.call_id = call_id

    def _die(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    async def appended(self, events: Sequence[Event]) -> None:
        for event in events:
            if kind_of(type(event)) != self.point:
                continue
            if self.call_id is None or getattr(event, "call_id", None) == self.call_id:
                self._die()

    async def tool_returned(self, call_id: str) -> None:
        if self.point == "tool.returned" and call_id == self.call_id:
            self._die()

    async def before_model_call(self) -> None:
        if self.point == "model.call":
            self._die()


async def main(config: dict[str, str]) -> None:
    async with open_world(config) as world:
        observer = KillAt(config["point"], config.get("call_id") or None)
        runner = the_runner(config, world, "child", lease_policy=CRASHED_LEASE, observer=observer)
        result = await runner.run(the_agent(config), "go", tenant=TENANT, run_id=config["run_id"])
        print(json.dumps({"status": result.status}), flush=True)
        # A run waiting on a person: this worker stays up until it is killed.
        await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1] if len(sys.argv) > 1 else sys.stdin.readline())))
