"""The application API against a fleet: the app submits requests on the requests topic and
follows its runs in the log, while ``onward worker`` processes (and a projector) do the work.

Real processes on Kafka, PostgreSQL and Redis. The "hours later" story ends every process (the
application, the worker, the projector) while the run waits on a person, and answers it from
new ones.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio
from support.appapi import app_process, until, until_completed
from support.deployment import kafka_settings, process_env, worker_argv
from support.kafka import delete_topic
from support.processes import spawn_onward
from support.servers import KafkaServers
from typer.testing import CliRunner, Result

import onward
from onward.errors import InvalidInputError
from onward.eventlog import ApprovalGranted, ModelAnswered, RunFinished, Tagged
from onward.runtime.application.messages import RunMessage
from onward.runtime.application.stream import RunStream
from onward.runtime.cli import app as cli
from onward.runtime.demo_ledger import Ledger
from onward.runtime.fleet.requests import AnswerRequest
from onward.runtime.settings import Settings

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
PARTITIONS = 3


@dataclass
class Fleet:
    """The environment every process of the fleet shares, and the processes running now."""

    env: dict[str, str]
    settings: Settings
    tmp: Path
    children: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)

    @property
    def ledger(self) -> Ledger:
        return Ledger(self.env["APP_LEDGER"])

    async def start(self) -> None:
        """A projector and one worker, the worker ready once it owns every partition."""
        generation = len(self.children) // 2
        await self._spawn(f"projector{generation}", "projector", "--session-timeout-ms", "6000")
        worker = f"worker{generation}"
        await self._spawn(
            worker, *worker_argv("support.appapi", self.settings.requests_topic, worker)
        )
        await until(lambda: self._owns_everything(worker), f"{worker} owning its partitions")

    async def _owns_everything(self, worker: str) -> bool:
        return f"partitions assigned: {list(range(PARTITIONS))}" in self.output(worker)

    async def _spawn(self, name: str, *argv: str) -> None:
        self.children[name] = await spawn_onward(self.tmp / f"{name}.log", self.env, *argv)

    def output(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    async def stop(self) -> None:
        """SIGTERM every process still running, then wait for all: a worker drains and exits
        0 (a projector says nothing when it is ready, so one still starting may die of the
        signal)."""
        running = {n: c for n, c in self.children.items() if c.returncode is None}
        for child in running.values():
            child.send_signal(signal.SIGTERM)
        codes = {n: await asyncio.wait_for(c.wait(), 60) for n, c in running.items()}
        for name, code in codes.items():
            allowed = {0} if name.startswith("worker") else {0, -signal.SIGTERM}
            assert code in allowed, self.output(name)

    def app(self, *argv: str) -> list[dict[str, object]]:
        """The application as a process of its own (`support.appapi`); what it printed."""
        return app_process(self.env, *argv)


@pytest_asyncio.fixture
async def fleet(kafka_servers: KafkaServers, tmp_path: Path) -> AsyncIterator[Fleet]:
    requests_topic = f"{kafka_servers.topic}.requests"
    env = process_env(
        kafka_servers,
        PARTITIONS,
        ONWARD_APP_MODE="fleet",
        ONWARD_REQUESTS_TOPIC=requests_topic,
        APP_LEDGER=str(tmp_path / "ledger.jsonl"),
    )
    settings = kafka_settings(
        kafka_servers, PARTITIONS, app_mode="fleet", requests_topic=requests_topic
    )
    kafka_bootstrap = kafka_servers.bootstrap
    async with kafka_servers.log(partitions=PARTITIONS):
        pass  # the events topic, created once, before any process opens it
    world = Fleet(env, settings, tmp_path)
    try:
        await world.start()
        yield world
    finally:
        await world.stop()
        await delete_topic(kafka_bootstrap, settings.requests_topic)


async def test_an_approval_answered_hours_later_continues_the_run_with_the_value(
    fleet: Fleet,
) -> None:
    before = fleet.app("query", "payer", "later-1")
    assert [m["type"] for m in before][-1] == "approval_request"
    await fleet.stop()  # hours pass: no application, no worker, no projector
    assert not fleet.ledger.path.exists()

    await fleet.start()
    seen = [str(before[-1]["seq"]), str(before[-1]["part"])]
    after = fleet.app("resume", "later-1", json.dumps({"authorized": "hours later"}), *seen)
    assert [m["type"] for m in after] == ["progress", "checkpoint", "text", "result"]
    assert after[-1]["output"] == "paid"
    effects = [(e["tool"], e["approval"]) for e in fleet.ledger.entries()]
    assert effects == [("pay", {"authorized": "hours later"})]
    assert fleet.app("resume", "later-1") == before + after
    async with onward.open(fleet.settings) as app:
        events = [s.event for s in await app.backends.log.read_run("later-1")]
    granted = [e.value for e in events if isinstance(e, ApprovalGranted)]
    assert granted == [{"authorized": "hours later"}]


async def test_a_collaborative_run_pauses_at_each_checkpoint_and_a_tag_is_recorded(
    fleet: Fleet,
) -> None:
    pauses: list[RunMessage] = []
    async with onward.open(fleet.settings) as app:
        async for message in app.query("work", {"agent": "stepper", "mode": "collaborative"}):
            if message.waits:
                state = await app.get_session_state(message.run_id)
                assert state is not None
                assert (state.status, state.waiting_on) == ("waiting", message.request_id)
                assert fleet.ledger.count("step") == (len(pauses) + 1) // 2
                if not pauses:
                    await message.tag("milestone")
                pauses.append(message)
                await message.respond(f"note {len(pauses)}")
            last = message
        events = [s.event for s in await app.backends.log.read_run(last.run_id)]
    assert [p.boundary for p in pauses] == ["after_model_call", "after_tool_result"] * 3
    assert last.output == "notes: note 2 | note 4 | note 6"
    tags = [(e.target_seq, e.label) for e in events if isinstance(e, Tagged)]
    assert tags == [(pauses[0].seq, "milestone")]


async def test_a_reader_that_stops_mid_run_later_sees_every_message_once(fleet: Fleet) -> None:
    async with onward.open(fleet.settings) as app:
        stream = app.query("work", {"agent": "stepper", "user": "ann"})
        first = [await stream.__anext__() for _ in range(3)]
        await until_completed(app, stream.run_id)  # the run goes on while nobody reads
        rest = await stream.collect()
        again = await app.resume(stream.run_id).collect()
    assert first + rest == again
    assert [m.type for m in again][-1] == "result"
    assert len({m.position for m in again}) == len(again)


async def test_an_answer_sent_twice_is_written_once_and_the_second_dropped_quietly(
    fleet: Fleet,
) -> None:
    """An application whose submit of an answer was cut off after it landed sends it again:
    the worker writes the first and carries the run on; the second finds the run no longer
    waiting on that request and is dropped, said so, not refused as a bad request."""
    async with onward.open(fleet.settings) as app:
        stream = app.query("pay", {"agent": "payer", "run_id": "twice-1"})
        asked = await anext(m async for m in stream if m.waits)
        assert asked.request_id is not None
        answer = AnswerRequest(
            run_id="twice-1", tenant=app.tenant, request_id=asked.request_id, approve=True, by="ann"
        )
        assert app._requests is not None
        await app._requests.submit(answer, answer)
        last = (await asyncio.wait_for(stream.collect(), 60))[-1]
        events = [s.event for s in await app.backends.log.read_run("twice-1")]

    async def second_answer_done() -> bool:
        said = fleet.output("worker0")
        return "answered already" in said or "refused for good" in said

    await until(second_answer_done, "the second answer acted on")
    assert (last.type, last.status) == ("result", "completed")
    assert sum(isinstance(e, ApprovalGranted) for e in events) == 1
    assert fleet.ledger.count("pay") == 1
    assert "refused for good" not in fleet.output("worker0")


async def test_a_start_the_worker_refuses_for_good_ends_its_stream_with_the_cause(
    fleet: Fleet,
) -> None:
    """A budget on a model the workers have no price for: the worker cannot start the run
    (nothing could be counted against the budget). The run is recorded as failed saying why,
    so the application's stream ends with the cause rather than wait for a run that never
    comes, saying no worker has taken it."""
    async with onward.open(fleet.settings) as app:
        options = {"agent": "payer", "run_id": "unpriced-1", "budget_micros": 1_000}
        messages = await app.query("pay", options, timeout=30).collect()
        state = await app.get_session_state("unpriced-1")
    last = messages[-1]
    assert (last.type, last.status) == ("error", "failed")
    assert "a budget needs the price of model 'default'" in last.content
    assert state is not None
    assert state.status == "failed"
    assert fleet.ledger.count("pay") == 0


async def runaway_going(app: onward.App, run_id: str) -> RunStream:
    """Start a run of ``looper`` and read its stream until three calls are done: it goes on,
    with nothing to end it but a person."""
    stream = app.query("loop", {"agent": "looper", "run_id": run_id})
    async for message in stream:
        if message.type == "progress" and (message.tools_done or 0) >= 3:
            break
    return stream


async def test_a_start_for_an_agent_the_fleet_does_not_carry_ends_failed_naming_it(
    fleet: Fleet,
) -> None:
    """The app does not know the fleet's agents; the worker owning the run's partition does
    not carry this one: the stream ends at once with the reason, not after a wait."""
    async with onward.open(fleet.settings) as app:
        messages = await app.query(
            "go", {"agent": "charger", "run_id": "nobody-carries"}, timeout=60
        ).collect()
        state = await app.get_session_state("nobody-carries")
    last = messages[-1]
    assert (last.type, last.status) == ("error", "failed")
    assert "no agent 'charger' on worker worker0 (it carries looper, payer, stepper)" in str(
        last.content
    )
    assert state is not None
    assert state.status == "failed"
    assert "no agent 'charger'" in fleet.output("worker0")


async def test_a_runaway_run_its_worker_drives_is_cancelled_through_the_requests_topic(
    fleet: Fleet,
) -> None:
    async with onward.open(fleet.settings) as app:
        stream = await runaway_going(app, "runaway-1")
        state = await app.get_session_state("runaway-1")
        assert state is not None
        assert state.status == "running"
        assert state.holder == "worker0"
        await app.cancel("runaway-1", by="ops", why="runaway loop")
        last = (await asyncio.wait_for(stream.collect(), 60))[-1]
        assert (last.type, last.status) == ("error", "cancelled")
        assert last.content == "cancelled by ops: runaway loop"
        state = await app.get_session_state("runaway-1")
        assert state is not None
        assert (state.status, state.holder) == ("cancelled", None)
        events = [s.event for s in await app.backends.log.read_run("runaway-1")]
        with pytest.raises(InvalidInputError, match="ended already"):
            await app.cancel("runaway-1", by="ops")
    ticks = [e["n"] for e in fleet.ledger.entries() if e["tool"] == "tick"]
    answers = [e for e in events if isinstance(e, ModelAnswered)]
    # Stopped before a model call, so every call the model asked for was made, once.
    assert len(answers) == len(ticks) >= 3
    assert ticks == list(range(1, len(ticks) + 1))
    assert isinstance(events[-1], RunFinished)
    await asyncio.sleep(1)
    assert fleet.ledger.count("tick") == len(ticks)  # and nothing after its end


async def test_onward_cancel_with_wait_asks_the_worker_driving_the_run_to_stop_it(
    fleet: Fleet,
) -> None:
    async with onward.open(fleet.settings) as app:
        stream = await runaway_going(app, "runaway-2")

        def cancel(*extra: str) -> Result:
            args = ["cancel", "runaway-2", "--by", "ops", "--why", "runaway loop", *extra]
            return CliRunner().invoke(cli, args, env=fleet.env)

        # Each command runs its own event loop, so it gets a thread of its own.
        held = await asyncio.to_thread(cancel)
        assert held.exit_code == 3, held.output  # without --wait: refused, nothing asked
        assert "is held by 'worker0'" in held.stderr
        assert "--wait SECONDS asks its holder to end it at its next boundary" in held.stderr
        cancelled = await asyncio.to_thread(cancel, "--wait", "60", "--json")
        assert cancelled.exit_code == 0, cancelled.output
        assert "the worker that owns it was sent the cancel" in cancelled.stderr
        facts = json.loads(cancelled.stdout)
        assert (facts["status"], facts["undecided_calls"]) == ("cancelled", [])
        last = (await asyncio.wait_for(stream.collect(), 60))[-1]
        assert (last.type, last.status) == ("error", "cancelled")
        assert last.content == "cancelled by ops: runaway loop"
    ticks = [e["n"] for e in fleet.ledger.entries() if e["tool"] == "tick"]
    assert ticks == list(range(1, len(ticks) + 1))
    await asyncio.sleep(1)
    assert fleet.ledger.count("tick") == len(ticks)


async def test_a_worker_serves_the_requests_topic_the_settings_name(
    kafka_servers: KafkaServers, tmp_path: Path
) -> None:
    """``ONWARD_REQUESTS_TOPIC`` set for every process, and no ``--requests-topic``: the worker
    served onward.requests while the application submitted to the topic set, so a start
    waited for ever."""
    requests_topic = f"{kafka_servers.topic}.requests"
    env = process_env(
        kafka_servers,
        PARTITIONS,
        ONWARD_APP_MODE="fleet",
        ONWARD_REQUESTS_TOPIC=requests_topic,
        APP_LEDGER=str(tmp_path / "ledger.jsonl"),
    )
    settings = kafka_settings(
        kafka_servers, PARTITIONS, app_mode="fleet", requests_topic=requests_topic
    )
    async with kafka_servers.log(partitions=PARTITIONS):
        pass
    world = Fleet(env, settings, tmp_path)
    argv = worker_argv("support.appapi", requests_topic, "worker0")
    at = argv.index("--requests-topic")
    del argv[at : at + 2]
    try:
        await world._spawn("projector0", "projector", "--session-timeout-ms", "6000")
        await world._spawn("worker0", *argv)
        await until(lambda: world._owns_everything("worker0"), "worker0 owning its partitions")
        shown = await asyncio.to_thread(world.app, "query", "payer", "topic-1")
        assert [m["type"] for m in shown][-1] == "approval_request"
    finally:
        await world.stop()
        await delete_topic(kafka_servers.bootstrap, requests_topic)
