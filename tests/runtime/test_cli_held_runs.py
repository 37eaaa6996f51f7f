"""`approve`, `deny`, `resolve` and `cancel` take the run's lease, as `tag` does: while another
worker holds it they exit 3 naming the holder and write nothing, and once it is handed back the
same command goes through.

Each case leaves a run in an embedded SQLite file the way a worker leaves it (waiting on a
person, or killed with a call undecided), has "other-worker" take the run's lease, and drives
the command line in-process; one case does the same against Kafka, PostgreSQL and Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from pathlib import Path

import pytest
from support import cli_agent
from support.crashes import Crash, CrashAt
from support.runners import log_runner
from support.servers import KafkaServers
from typer.testing import CliRunner, Result

import onward
from onward.eventlog import SqliteEventLog
from onward.eventlog.base import EventLog
from onward.eventlog.events import Event, RunFinished
from onward.runtime import LeaseStore, RunLease, SqliteLeaseStore
from onward.runtime.cli import app
from onward.runtime.leases.base import CancelAsked
from onward.runtime.settings import Settings

TENANT = "acme"
OTHER = "other-worker"

ANSWERS: dict[str, list[str]] = {
    "approve": ["p", "--by", "ann"],
    "deny": ["p", "--by", "ann"],
    "resolve": ["b", "--outcome", "never_ran", "--by", "ops", "--why", "the airline has none"],
    "cancel": ["--by", "ops", "--why", "not wanted"],
}
"""Each command's arguments after the run id: the payment ``p`` of a run waiting on a person
(approve, deny), the booking ``b`` of a run killed after the call returned (resolve)."""


async def left_as_a_worker_leaves_it(log: EventLog, leases: LeaseStore, command: str) -> str:
    """A run waiting on the answer ``command`` gives; returns its id."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    if command == "resolve":
        agent, model = cli_agent.booker(), cli_agent.booking_model()
        observer: CrashAt | None = CrashAt("tool.returned")
    else:
        agent, model, observer = cli_agent.payer(), cli_agent.paying_model(), None
    runner = log_runner(model, log, leases, worker="w1", observer=observer)
    with contextlib.suppress(Crash):
        await runner.run(agent, "go", tenant=TENANT, run_id=run_id)
    return run_id


async def events_of(log: EventLog, run_id: str) -> list[Event]:
    return [stored.event for stored in await log.read_run(run_id)]


def assert_refused_for_the_holder(result: Result) -> None:
    assert result.exit_code == 3, result.output
    assert f"is held by '{OTHER}' until " in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("command", list(ANSWERS))
def test_an_answer_to_a_run_another_worker_holds_exits_3_and_writes_nothing(
    tmp_path: Path, command: str
) -> None:
    db = tmp_path / "onward.db"

    def cli(*args: str) -> Result:
        env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)}
        return CliRunner().invoke(app, list(args), env=env)

    async def prepare() -> tuple[str, list[Event], RunLease]:
        async with SqliteEventLog(db) as log, SqliteLeaseStore(db) as leases:
            run_id = await left_as_a_worker_leaves_it(log, leases, command)
            held = await leases.acquire(run_id, tenant=TENANT, holder=OTHER, ttl_s=300)
            return run_id, await events_of(log, run_id), held

    async def events_after(handing_back: RunLease | None) -> list[Event]:
        """The run's events, once the holder hands ``handing_back`` back (if given)."""
        async with SqliteEventLog(db) as log, SqliteLeaseStore(db) as leases:
            if handing_back is not None:
                await leases.release(handing_back)
            return await events_of(log, run_id)

    run_id, before, held = asyncio.run(prepare())
    refused = cli(command, run_id, *ANSWERS[command], "--tenant", TENANT)
    assert_refused_for_the_holder(refused)
    # Nothing was written; the holder now hands the lease back.
    assert asyncio.run(events_after(held)) == before

    answered = cli(command, run_id, *ANSWERS[command], "--tenant", TENANT)
    assert answered.exit_code == 0, answered.output
    assert len(asyncio.run(events_after(None))) > len(before)


@pytest.mark.kafka
@pytest.mark.parametrize("command", list(ANSWERS))
async def test_an_answer_to_a_held_run_on_kafka_postgres_and_redis_exits_3(
    kafka_servers: KafkaServers, command: str
) -> None:
    async with kafka_servers.log() as log, kafka_servers.leases() as leases:
        run_id = await left_as_a_worker_leaves_it(log, leases, command)
        held = await leases.acquire(run_id, tenant=TENANT, holder=OTHER, ttl_s=300)
        before = await events_of(log, run_id)

        def cli() -> Result:
            args = [command, run_id, *ANSWERS[command], "--tenant", TENANT]
            return CliRunner().invoke(app, args, env=kafka_servers.env())

        # Each command runs its own event loop, so it gets a thread of its own.
        assert_refused_for_the_holder(await asyncio.to_thread(cli))
        assert await events_of(log, run_id) == before
        await leases.release(held)
        answered = await asyncio.to_thread(cli)
        assert answered.exit_code == 0, answered.output
        assert len(await events_of(log, run_id)) > len(before)


def test_cancel_with_wait_ends_a_held_run_once_it_is_handed_back(tmp_path: Path) -> None:
    db = tmp_path / "onward.db"

    def cli(*args: str) -> Result:
        env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)}
        return CliRunner().invoke(app, ["cancel", run_id, "--tenant", TENANT, *args], env=env)

    async def prepare() -> tuple[str, list[Event], RunLease]:
        async with SqliteEventLog(db) as log, SqliteLeaseStore(db) as leases:
            run_id = await left_as_a_worker_leaves_it(log, leases, "cancel")
            held = await leases.acquire(run_id, tenant=TENANT, holder=OTHER, ttl_s=300)
            return run_id, await events_of(log, run_id), held

    async def hand_back(held: RunLease) -> None:
        async with SqliteLeaseStore(db) as leases:
            await leases.release(held)

    async def events() -> list[Event]:
        async with SqliteEventLog(db) as log:
            return await events_of(log, run_id)

    async def asked() -> CancelAsked | None:
        async with SqliteLeaseStore(db) as leases:
            holding = await leases.current(run_id)
            assert holding is not None
        settings = Settings(backend="sqlite", sqlite_path=db)
        payer, model = cli_agent.payer(), cli_agent.paying_model()
        async with onward.open(settings, agents=payer, provider=model) as application:
            state = await application.get_session_state(run_id, tenant=TENANT)
        assert state is not None
        assert (state.holder, state.cancel_asked) == (OTHER, holding.cancel_asked)
        return holding.cancel_asked

    run_id, before, held = asyncio.run(prepare())
    for bad in ("0", "-1", "nan", "inf"):
        refused = cli("--by", "ops", "--wait", bad)
        assert refused.exit_code == 2, refused.output
        assert "--wait must be positive, finite seconds" in refused.stderr
    refused = cli("--by", "ops")
    assert refused.exit_code == 3, refused.output
    hint = "; --wait SECONDS asks its holder to end it at its next boundary and waits for that"
    assert refused.stderr.strip().endswith(hint), refused.stderr
    assert asyncio.run(asked()) is None  # without --wait nothing is asked
    over = cli("--by", "ops", "--wait", "1e-9")  # over before the first refusal came back
    assert over.exit_code == 3, over.output
    assert "still held after --wait 1e-09 s" in over.stderr
    assert "asked" not in over.stderr
    assert asyncio.run(asked()) is None
    timed_out = cli("--by", "ops", "--wait", "0.5")
    assert timed_out.exit_code == 3, timed_out.output
    assert f"run {run_id} is held by {OTHER}; asked it to end the run cancelled" in timed_out.stderr
    assert "still held after --wait 0.5 s; its holder was asked" in timed_out.stderr
    assert "--wait SECONDS" not in timed_out.stderr  # it was given: no hint to give it
    assert "the worker that owns it" not in timed_out.stderr  # no fleet on an embedded file
    assert asyncio.run(events()) == before
    # The ask waits with the holder's lease (this holder is a test that never hears it).
    assert asyncio.run(asked()) == CancelAsked("ops", "")

    releasing = threading.Timer(1.0, lambda: asyncio.run(hand_back(held)))
    releasing.start()
    try:
        waited = cli("--by", "ops", "--why", "not wanted", "--wait", "30")
    finally:
        releasing.join()
    assert waited.exit_code == 0, waited.output
    assert f"cancelled run {run_id} (by ops)" in waited.stdout
    [*_, finished] = asyncio.run(events())
    assert isinstance(finished, RunFinished)
    assert (finished.status, finished.error) == ("cancelled", "cancelled by ops: not wanted")
