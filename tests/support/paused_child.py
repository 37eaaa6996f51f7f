"""One worker process for the paused-worker tests: it starts the booking run and drives it.

Usage: PYTHONPATH=tests python -m support.paused_child CONFIG_JSON, with the deployment's
settings in the environment. CONFIG: {"system": path, "behaviour": ..., "checked": bool,
"hold": bool, "bounded": bool, "run_id": ...}. It prints one JSON line: how its run ended
(a status, or the error that stopped it).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from onward.errors import OnwardError
from onward.runtime.backends import open_backends
from onward.runtime.settings import load_settings
from support.paused_world import POLICY, TENANT, ExternalSystem, booking_agent, booking_model


async def main(config: dict[str, Any]) -> None:
    system = ExternalSystem(Path(config["system"]), config["behaviour"])
    agent = booking_agent(
        system, checked=config["checked"], hold=config["hold"], bounded=config["bounded"]
    )
    async with open_backends(load_settings()) as backends:
        runner = backends.runner(booking_model(), worker="paused", lease_policy=POLICY)
        try:
            result = await runner.run(agent, "book 3A", tenant=TENANT, run_id=config["run_id"])
            print(json.dumps({"status": result.status}), flush=True)
        except OnwardError as exc:
            print(json.dumps({"error": type(exc).__name__}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
