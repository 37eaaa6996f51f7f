"""A worker on a really full disk, then another that resumes its run once there is room.

Run as ``python -m support.disk_full_child DIR`` where ``DIR`` is a small filesystem of its own (a
tmpfs the parent test mounted in a private mount namespace). Prints one JSON object: whether
the run failed with a `BackendError`, whether the lease was still held then (its release failed
like the append), and how long the resume took once the filler file was deleted.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from onward.errors import BackendError, ResumeConflictError
from onward.eventlog import Event, RunStarted, SqliteEventLog
from onward.runtime import Agent, AgentRunner, ScriptedProvider, SqliteLeaseStore, reply

AGENT = Agent(name="writer", instructions="answer at length")


class FillsTheDisk:
    """Writes a filler file until the filesystem is full, once the run has started."""

    def __init__(self, filler: Path) -> None:
        self.filler = filler

    async def appended(self, events: Sequence[Event]) -> None:
        if any(isinstance(e, RunStarted) for e in events):
            with self.filler.open("wb") as out:
                try:
                    while True:
                        out.write(bytes(65_536))
                        out.flush()
                except OSError:
                    pass

    async def tool_returned(self, call_id: str) -> None:
        return None

    async def before_model_call(self) -> None:
        return None


async def main(folder: Path) -> dict[str, Any]:
    db = folder / "onward.db"
    filler = folder / "filler"
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    report: dict[str, Any] = {}
    async with SqliteEventLog(db) as log, SqliteLeaseStore(db) as leases:
        model = ScriptedProvider([reply("x" * 300_000), reply("done")])
        runner = AgentRunner(
            provider=model, log=log, leases=leases, worker="w1", observer=FillsTheDisk(filler)
        )
        try:
            await runner.run(AGENT, "go", tenant="acme", run_id=run_id)
        except BackendError as exc:
            report["failed"] = str(exc)
        report["held_after_failure"] = await leases.current(run_id) is not None
        filler.unlink()
        freed = time.monotonic()
        async with SqliteEventLog(db) as log2, SqliteLeaseStore(db) as leases2:
            resumer = AgentRunner(
                provider=ScriptedProvider([reply("done")]), log=log2, leases=leases2, worker="w2"
            )
            while time.monotonic() - freed < 30:
                try:
                    result = await resumer.resume(AGENT, run_id, tenant="acme")
                except ResumeConflictError:
                    await asyncio.sleep(0.1)
                    continue
                report["status"] = result.status
                report["resumed_after_s"] = time.monotonic() - freed
                break
    return report


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(Path(sys.argv[1])))))
