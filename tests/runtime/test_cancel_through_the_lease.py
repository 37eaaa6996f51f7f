"""A run another process drives is cancelled through its lease, on the backends that have no
requests topic to reach a worker by: `onward cancel --wait` and `App.cancel` ask the holder
(`AgentRunner.ask_to_cancel`, kept with the run's lease), the holder hears the ask at its next
lease renewal or tool call, and it ends the run itself before its next model call.

The driver is an application process of its own (``python -m support.appapi``) carrying a
``looper`` run, which never ends by itself, on the embedded SQLite file, on PostgreSQL alone, or
on Kafka with no request key (no `CancelRun` can reach it).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from support.appapi import agents, provider, script, until
from support.deployment import kafka_settings
from support.servers import KafkaServers
from typer.testing import CliRunner, Result

import onward
from onward.eventlog import Message, ModelAnswered, RunFinished
from onward.runtime.agent import Agent
from onward.runtime.backends import open_backends
from onward.runtime.cli import app as cli
from onward.runtime.demo_ledger import Ledger
from onward.runtime.leases.base import CancelAsked
from onward.runtime.providers import ModelReply
from onward.runtime.settings import Settings

TESTS = Path(__file__).resolve().parents[1]
TENANT = "default"
PARTITIONS = 3


@dataclass
class Deployment:
    """One deployment's settings, as this process opens it and as a process is given it."""

    settings: Settings
    env: dict[str, str]
    ledger: Ledger
    kafka: KafkaServers | None = None


@pytest.fixture(params=["sqlite", "postgres", pytest.param("kafka", marks=pytest.mark.kafka)])
def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> Deployment:
    """The embedded file, PostgreSQL alone, or Kafka + PostgreSQL + Redis without a request key
    (so no `CancelRun` can be sent: the lease is the only way to the driver)."""
    ledger = tmp_path / "ledger.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": str(TESTS),
        "ONWARD_APP_MODE": "in_process",
        "APP_LEDGER": str(ledger),
    }
    if request.param == "kafka":
        servers: KafkaServers = request.getfixturevalue("kafka_servers")
        env |= servers.env(partitions=PARTITIONS)
        del env["ONWARD_REQUEST_KEY"]
        return Deployment(
            kafka_settings(servers, PARTITIONS, request_key=None), env, Ledger(ledger), servers
        )
    if request.param == "postgres":
        url, schema = request.getfixturevalue("database_url"), request.getfixturevalue("pg_schema")
        env |= {"ONWARD_BACKEND": "postgres", "DATABASE_URL": url, "ONWARD_DATABASE_SCHEMA": schema}
        settings = Settings(backend="postgres", database_url=url, database_schema=schema)
    else:
        db = tmp_path / "onward.db"
        env |= {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)}
        settings = Settings(backend="sqlite", sqlite_path=db)
    return Deployment(settings, env, Ledger(ledger))


@dataclass
class Driver:
    """An application process carrying one runaway run."""

    process: asyncio.subprocess.Process
    run_id: str

    async def messages(self) -> list[dict[str, object]]:
        """What it printed of the run's stream, once it has ended (it must end by itself)."""
        out, err = await asyncio.wait_for(self.process.communicate(), 60)
        assert self.process.returncode == 0, err.decode()
        return [json.loads(line) for line in out.decode().splitlines()]


@pytest_asyncio.fixture
async def driver(deployment: Deployment) -> AsyncIterator[Driver]:
    """A ``looper`` run carried by another process, three calls in and going on."""
    if deployment.kafka is not None:
        async with deployment.kafka.log(partitions=PARTITIONS):
            pass  # the events topic, created once, as a deployment creates it
    run_id = f"runaway-{os.urandom(4).hex()}"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "support.appapi",
        "query",
        "looper",
        run_id,
        env=deployment.env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )

    async def going() -> bool:
        if process.returncode is not None:
            assert process.stderr is not None
            said = (await process.stderr.read()).decode()
            pytest.fail(f"the driver exited {process.returncode} before its third call: {said}")
        return deployment.ledger.path.exists() and deployment.ledger.count("tick") >= 3

    try:
        await until(going, "the runaway run's first three calls")
        yield Driver(process, run_id)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def assert_ended_by_its_holder(deployment: Deployment, driver: Driver) -> None:
    """The driver's stream ended with the cancel, and every call the model asked for was made
    once: the run stopped before a model call, and nothing ran after its end."""
    last = (await driver.messages())[-1]
    assert (last["type"], last["status"]) == ("error", "cancelled")
    assert last["content"] == "cancelled by ops: runaway loop"
    async with open_backends(deployment.settings) as backends:
        events = [s.event for s in await backends.log.read_run(driver.run_id)]
    answers = [e for e in events if isinstance(e, ModelAnswered)]
    ticks = [e["n"] for e in deployment.ledger.entries() if e["tool"] == "tick"]
    assert len(answers) == len(ticks) >= 3
    assert ticks == list(range(1, len(ticks) + 1))
    finished = events[-1]
    assert isinstance(finished, RunFinished)
    assert (finished.status, finished.error) == ("cancelled", "cancelled by ops: runaway loop")
    assert sum(isinstance(e, RunFinished) for e in events) == 1


async def test_onward_cancel_with_wait_ends_a_run_another_process_drives(
    deployment: Deployment, driver: Driver
) -> None:
    def cancel(*extra: str) -> Result:
        args = ["cancel", driver.run_id, "--by", "ops", "--why", "runaway loop", *extra]
        return CliRunner().invoke(cli, args, env=deployment.env)

    # Each command runs its own event loop, so it gets a thread of its own.
    held = await asyncio.to_thread(cancel)
    assert held.exit_code == 3, held.output  # without --wait: refused, nothing asked
    assert "--wait SECONDS asks its holder to end it" in held.stderr
    cancelled = await asyncio.to_thread(cancel, "--wait", "60", "--json")
    assert cancelled.exit_code == 0, cancelled.output
    assert "asked it to end the run cancelled" in cancelled.stderr
    assert "hears the ask at its next lease renewal or tool call" in cancelled.stderr
    assert "the worker that owns it" not in cancelled.stderr  # no fleet was sent anything
    facts = json.loads(cancelled.stdout)
    assert (facts["status"], facts["undecided_calls"]) == ("cancelled", [])
    await assert_ended_by_its_holder(deployment, driver)


async def test_app_cancel_asks_the_process_driving_the_run_to_end_it(
    deployment: Deployment, driver: Driver
) -> None:
    async with onward.open(deployment.settings, agents=agents, provider=provider()) as app:
        await app.cancel(driver.run_id, by="ops", why="runaway loop")
        async with open_backends(deployment.settings) as backends:
            holding = await backends.leases.current(driver.run_id)
        # The ask is with the driver's lease until it hears it and lets go.
        assert holding is None or holding.cancel_asked == CancelAsked("ops", "runaway loop")
        await assert_ended_by_its_holder(deployment, driver)
        state = await app.get_session_state(driver.run_id)
        assert state is not None
        assert (state.status, state.holder) == ("cancelled", None)


class LongModelCall:
    """The ``looper``'s model, except that its third call would take an hour: a run inside one
    long model call when the cancel comes."""

    def __init__(self) -> None:
        self.turns = 0
        self.waiting = asyncio.Event()
        self.abandoned = asyncio.Event()

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        self.turns += 1
        if self.turns == 3:
            self.waiting.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.abandoned.set()
                raise
        return script(messages)


async def test_a_model_call_in_flight_is_abandoned_when_its_holder_hears_the_ask(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder hears the ask with its next lease renewal (a third of the ttl, here 3 s) and
    abandons the model call it is in, rather than end the run only once the call returns."""
    monkeypatch.setenv("APP_LEDGER", str(deployment.ledger.path))
    if deployment.kafka is not None:
        async with deployment.kafka.log(partitions=PARTITIONS):
            pass  # the events topic, created once, as a deployment creates it
    settings = deployment.settings.model_copy(update={"lease_ttl": 3.0})
    run_id = f"long-call-{os.urandom(4).hex()}"
    model = LongModelCall()
    async with open_backends(settings) as backends:
        runner = backends.runner(model)
        driving = asyncio.create_task(
            runner.run(agents["looper"], "loop", tenant=TENANT, run_id=run_id)
        )
        await asyncio.wait_for(model.waiting.wait(), 60)
        args = ["cancel", run_id, "--by", "ops", "--why", "runaway loop", "--wait", "60"]
        cancelled = await asyncio.to_thread(CliRunner().invoke, cli, args, env=deployment.env)
        assert cancelled.exit_code == 0, cancelled.output
        ended = await asyncio.wait_for(driving, 30)
        events = [s.event for s in await backends.log.read_run(run_id)]
    assert model.abandoned.is_set()
    assert model.turns == 3
    assert (ended.status, ended.error) == ("cancelled", "cancelled by ops: runaway loop")
    assert sum(isinstance(e, ModelAnswered) for e in events) == 2  # the third never answered
    assert [e.error for e in events if isinstance(e, RunFinished)] == [ended.error]
    assert deployment.ledger.count("tick") == 2
