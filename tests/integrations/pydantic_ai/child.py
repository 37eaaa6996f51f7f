"""Starts the booking run in its own process, which the test stops and kills mid-way.

Usage: PYTHONPATH=tests python -m integrations.pydantic_ai.child CONFIG_JSON
CONFIG: {"backend": "sqlite"|"kafka", "run_id", "ledger", and the stores' places}
"""

from __future__ import annotations

import asyncio
import json
import sys

from integrations.pydantic_ai.world import (
    CRASHED_LEASE,
    booking_agent,
    durability_on,
    open_stores,
)
from onward.runtime.demo_ledger import Ledger


async def main(config: dict[str, str]) -> None:
    async with open_stores(config) as stores:
        durability = durability_on(stores, worker="child", lease_policy=CRASHED_LEASE)
        agent = booking_agent(durability, Ledger(config["ledger"]))
        await durability.run(agent, "book seat 3A", run_id=config["run_id"])


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
