"""PostgreSQL restarted under the projector process and under running workers.

The cluster is private (the shared one serves other tests); Kafka is the shared broker, on a
topic of the test's own, since the fault here is PostgreSQL's. Afterwards every frontier must
equal the fold computed directly from the log.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from support.fault_runs import (
    Folding,
    Verdict,
    drive_all,
    new_run_ids,
    record,
    step_agent,
    step_provider,
    through_fault,
    until,
)
from support.histories import (
    append_all,
    assert_stored_is_the_direct_fold,
    assert_stored_is_what_the_scripts_wrote,
    run_ids_of,
    tally_against_scripts,
    workload,
)
from support.pg import create_schema
from support.private_servers import PrivatePostgres

from onward.errors import BackendError
from onward.eventlog import KafkaEventLog
from onward.projections.postgres import PostgresFrontierStore
from onward.runtime.demo_ledger import Ledger
from onward.runtime.leases import LeasePolicy, PostgresLeaseStore
from onward.runtime.runner import AgentRunner

pytestmark = [pytest.mark.faults, pytest.mark.kafka]
PARTITIONS = 4
DOWN_S = 4.0
ASSIGNED = "onward.projector assigned "


class Projector:
    """``python -m onward projector`` as a supervisor runs it: started again if it exits."""

    def __init__(self, env: dict[str, str], tmp: Path) -> None:
        self.env = env
        self.tmp = tmp
        self.child: asyncio.subprocess.Process | None = None
        self.exits: list[int] = []

    @property
    def outputs(self) -> list[Path]:
        return sorted(self.tmp.glob("projector-*.log"))

    def text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.outputs)

    async def start(self) -> None:
        argv = ["-m", "onward", "projector", "--group", "faults", "--batch", "400"]
        argv += ["--session-timeout-ms", "6000"]
        with (self.tmp / f"projector-{len(self.outputs)}.log").open("wb") as out:
            self.child = await asyncio.create_subprocess_exec(
                sys.executable, *argv, env=self.env, stdout=out, stderr=out
            )

    async def supervise(self) -> None:
        """Start it again if it exited (a failed projector exits; its supervisor restarts it)."""
        if self.child is not None and self.child.returncode is not None:
            self.exits.append(self.child.returncode)
            await self.start()

    async def stop(self) -> int:
        assert self.child is not None
        self.child.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.child.wait(), 60)

    async def kill(self) -> None:
        if self.child is not None and self.child.returncode is None:
            self.child.kill()
            await self.child.wait()


async def caught_up(store: PostgresFrontierStore, log: KafkaEventLog) -> bool:
    try:
        stored = await store.positions("frontiers")
    except BackendError:
        return False
    ends = [(await log.bounds(p)).end for p in range(PARTITIONS)]
    return all(stored.get(p, 0) >= end for p, end in enumerate(ends))


@pytest.mark.timeout(420)
async def test_postgres_restart_under_the_projector(
    private_postgres: PrivatePostgres,
    kafka_bootstrap: str,
    kafka_topic: str,
    rng: random.Random,
    tmp_path: Path,
) -> None:
    steps = workload(rng, 300)
    thirds = len(steps) // 3
    began = time.time()
    # Thrown away with the private cluster: never dropped, since no connection made before the
    # restart survives it.
    schema = await create_schema(private_postgres.url)
    async with (
        KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=PARTITIONS) as log,
        PostgresFrontierStore(private_postgres.url, schema=schema) as store,
    ):
        env = {
            **os.environ,
            "ONWARD_BACKEND": "kafka",
            "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "DATABASE_URL": private_postgres.url,
            "ONWARD_DATABASE_SCHEMA": schema,
            "ONWARD_KAFKA_TOPIC": kafka_topic,
            "ONWARD_PARTITIONS": str(PARTITIONS),
        }
        projector = Projector(env, tmp_path)
        try:
            await projector.start()
            await append_all(log, steps[:thirds])
            await until(lambda: ASSIGNED in projector.text(), "the projector's assignment")
            deadline = time.monotonic() + 120
            while not await caught_up(store, log):
                assert time.monotonic() < deadline, projector.text()[-3000:]
                await asyncio.sleep(0.2)

            await asyncio.to_thread(private_postgres.stop, "immediate")
            await append_all(log, steps[thirds : 2 * thirds])
            await asyncio.sleep(DOWN_S)
            await asyncio.to_thread(private_postgres.start)
            lifted = time.time()
            await append_all(log, steps[2 * thirds :])
            deadline = time.monotonic() + 180
            while not await caught_up(store, log):
                assert time.monotonic() < deadline, projector.text()[-3000:]
                await projector.supervise()
                await asyncio.sleep(0.2)
            recovered = time.time() - lifted
            assert await projector.stop() == 0, projector.text()[-3000:]
            tally = await tally_against_scripts(store, steps)
            # Measured, and recorded before anything is asserted, so a failing run shows too:
            # side effects here are the events the stored rows account for; a duplicate is a
            # run whose row counts more than its script wrote, a lost run one that counts less.
            record(
                Verdict(
                    fault="postgres: restart under the projector",
                    runs=tally.runs,
                    side_effects=tally.folded,
                    duplicates=tally.duplicates,
                    lost=tally.lost,
                    waiting=tally.waiting,
                    recover_s=recovered,
                    total_s=time.time() - began,
                    retries=len(projector.exits),
                    notes=(
                        f"(events folded, of {sum(len(s) for s in steps)} written; projector "
                        f"exits {projector.exits})"
                    ),
                )
            )
            await assert_stored_is_the_direct_fold(store, log, run_ids_of(steps))
            await assert_stored_is_what_the_scripts_wrote(store, steps)
        finally:
            await projector.kill()
        output = projector.text()
    tracebacks = output.count("Traceback")
    # The projector rides the restart out (test_projector_outage); were it to exit, asyncpg's
    # pool could add one traceback of its own on the way out. More than one per exit is spam.
    assert tracebacks <= len(projector.exits), output[-5000:]


@pytest.mark.timeout(420)
async def test_postgres_restart_under_running_workers(
    private_postgres: PrivatePostgres,
    kafka_bootstrap: str,
    kafka_topic: str,
    rng: random.Random,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs, steps_per_run = 20, 4
    ledger = Ledger(tmp_path / "ledger.jsonl")
    agent = step_agent(ledger, tool_s=0.3)
    run_ids = new_run_ids(rng, runs)
    began = time.time()
    schema = await create_schema(private_postgres.url)  # thrown away with the cluster
    async with (
        KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=PARTITIONS) as log,
        PostgresFrontierStore(private_postgres.url, schema=schema) as frontiers,
        PostgresLeaseStore(private_postgres.url, schema=schema) as leases,
        Folding(kafka_bootstrap, log, frontiers) as folding,
    ):
        runner = AgentRunner(
            provider=step_provider(steps_per_run),
            log=log,
            leases=leases,
            frontiers=frontiers,
            lease_policy=LeasePolicy(ttl=timedelta(seconds=10)),
        )

        async def restart() -> None:
            await asyncio.to_thread(private_postgres.stop, "immediate")
            await asyncio.sleep(DOWN_S)
            await asyncio.to_thread(private_postgres.start)

        driving = drive_all(lambda: runner, agent, run_ids)
        window = await through_fault(driving, ledger, runs, restart, began=began, within_s=300)
        await folding.caught_up()
        await assert_stored_is_the_direct_fold(frontiers, log, run_ids)
    tracebacks = Counter(r.name for r in caplog.records if r.exc_info)
    window.assert_all_completed(
        "postgres: restart under workers (leases, frontiers)",
        ledger,
        steps=steps_per_run,
        notes=(
            f"(a projector folding all along, restarts {folding.restarts}; logged tracebacks by "
            f"logger {dict(tracebacks)})"
        ),
    )
    # At most one traceback per run from Onward (a lease that could not be released while the
    # server was down) and a few of asyncpg's own: no traceback per retry.
    onward_tracebacks = sum(n for name, n in tracebacks.items() if name.startswith("onward"))
    assert onward_tracebacks <= runs, tracebacks
