"""PostgreSQL restarted under running workers when it is the whole backend
(``ONWARD_BACKEND=postgres``): the log, the leases and the frontiers folded inline all go down
together.

The cluster is private (the shared one serves other tests). An append cut off by the restart
may or may not have committed; the run stops with a retryable error and its resume reads what
the log holds. Afterwards no side effect happened twice, every run completed, and every
frontier row equals the fold computed directly from the log.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from support.fault_runs import drive_all, new_run_ids, step_agent, step_provider, through_fault
from support.histories import assert_stored_is_the_direct_fold
from support.pg import create_schema
from support.private_servers import PrivatePostgres

from onward.eventlog import PostgresEventLog
from onward.projections.postgres import PostgresFrontierStore
from onward.runtime.checkpoint import Checkpointer
from onward.runtime.demo_ledger import Ledger
from onward.runtime.leases import LeasePolicy, PostgresLeaseStore
from onward.runtime.runner import AgentRunner

pytestmark = [pytest.mark.faults]
PARTITIONS = 4
DOWN_S = 4.0


@pytest.mark.timeout(420)
async def test_postgres_restart_under_workers_on_postgres_alone(
    private_postgres: PrivatePostgres,
    rng: random.Random,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs, steps_per_run = 20, 4
    ledger = Ledger(tmp_path / "ledger.jsonl")
    agent = step_agent(ledger, tool_s=0.3)
    run_ids = new_run_ids(rng, runs)
    began = time.time()
    url = private_postgres.url
    schema = await create_schema(url)  # thrown away with the cluster
    async with (
        PostgresEventLog(url, schema=schema, partitions=PARTITIONS) as log,
        PostgresFrontierStore(url, schema=schema) as frontiers,
        PostgresLeaseStore(url, schema=schema) as leases,
    ):
        runner = AgentRunner(
            provider=step_provider(steps_per_run),
            log=log,
            leases=leases,
            frontiers=frontiers,
            checkpoint_inline=True,
            lease_policy=LeasePolicy(ttl=timedelta(seconds=10)),
        )

        async def restart() -> None:
            await asyncio.to_thread(private_postgres.stop, "immediate")
            await asyncio.sleep(DOWN_S)
            await asyncio.to_thread(private_postgres.start)

        driving = drive_all(lambda: runner, agent, run_ids)
        window = await through_fault(driving, ledger, runs, restart, began=began, within_s=300)
        # A fold the restart cut off is made good by the next one, as a process that appends
        # after an outage does.
        await Checkpointer(frontiers, log).catch_up()
        await assert_stored_is_the_direct_fold(frontiers, log, run_ids)
    tracebacks = Counter(r.name for r in caplog.records if r.exc_info)
    window.assert_all_completed(
        "postgres alone: restart under workers (log, leases, frontiers)",
        ledger,
        steps=steps_per_run,
        notes=f"(folded inline; logged tracebacks by logger {dict(tracebacks)})",
    )
    onward_tracebacks = sum(n for name, n in tracebacks.items() if name.startswith("onward"))
    assert onward_tracebacks <= runs, tracebacks
