"""A worker built exactly as the README builds one: `AgentRunner(provider=..., log=...)`.

Usage: PYTHONPATH=tests python -m support.readme_worker DB LEDGER RUN_ID
Prints ``ready``, waits for a line on standard input (so several workers start at once), tries
to resume the run, and prints what happened as one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from onward.errors import ResumeConflictError
from onward.eventlog import SqliteEventLog
from onward.runtime.runner import AgentRunner
from support.workers import TENANT, Ledger, agent, provider


async def main(db: str, ledger_path: str, run_id: str) -> None:
    ledger = Ledger(ledger_path)
    async with SqliteEventLog(db) as log:
        runner = AgentRunner(provider=provider(), log=log, worker=f"worker-{os.getpid()}")
        print("ready", flush=True)
        sys.stdin.readline()
        try:
            result = await runner.resume(agent(ledger), run_id, tenant=TENANT)
            outcome = {"outcome": "carried", "status": result.status, "fence": result.fence}
        except ResumeConflictError as exc:
            outcome = {"outcome": "conflict", "holder": exc.holder}
        finally:
            await runner.close()
        print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
