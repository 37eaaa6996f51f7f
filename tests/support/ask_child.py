"""Starts one run whose tool asks a person a question, says when it waits, and stays up to be
killed (SIGKILL) between the question and its answer.

Usage: PYTHONPATH=tests python -m support.ask_child CONFIG_JSON
CONFIG: as for `support.crash_child` ("backend", "db" or the Kafka and PostgreSQL fields,
"run_id", "ledger").
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from onward.runtime.demo_ledger import Ledger
from onward.runtime.runner import AgentRunner
from support.ask_world import refund_agent, refund_provider
from support.crash_world import CRASHED_LEASE, TENANT, open_world


async def main(config: dict[str, Any]) -> None:
    async with open_world(config) as world:
        runner = AgentRunner(
            provider=refund_provider(),
            log=world.log,
            leases=world.leases,
            blobs=world.blobs,
            frontiers=world.frontiers,
            worker="child",
            lease_policy=CRASHED_LEASE,
        )
        agent = refund_agent(Ledger(config["ledger"]))
        result = await runner.run(agent, "refund A-1", tenant=TENANT, run_id=config["run_id"])
        print(json.dumps({"status": result.status, "waiting_on": result.waiting_on}), flush=True)
        await asyncio.sleep(3600)  # waits here, holding nothing, until it is killed


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
