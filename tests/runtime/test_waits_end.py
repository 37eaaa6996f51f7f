"""Every wait of the application API ends or speaks (issue: the first hour).

A stream whose run needs a person to settle a call ends with a ``needs_person`` message naming
the call and the command that settles it; one whose run is held by another process past the
caller's ``timeout=`` raises `RunTimeoutError` saying who holds it and until when, and one no
worker takes says so. None waits in silence.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from support.appapi import naps_begun, one_more_turn, refuse_every_start
from support.crashes import Crash, CrashAt
from support.deployment import kafka_settings
from support.kafka import delete_topic
from support.servers import REQUEST_KEY, KafkaServers
from support.serving import serving
from support.shell import pasted

import onward
from onward.errors import InvalidInputError, RunTimeoutError
from onward.eventlog import ToolCall
from onward.runtime.agent import Agent
from onward.runtime.application import stream as stream_module
from onward.runtime.application.stream import SAY_UNHELD_AFTER_S, RunStream
from onward.runtime.backends import open_backends
from onward.runtime.fleet.worker import Worker
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.settings import Settings
from onward.runtime.signing import MAX_CLOCK_SKEW_S, RequestSigner
from onward.runtime.tools import tool

TENANT = "acme"


@tool
async def charge(amount: int, *, idempotency_key: str) -> str:
    return f"charged {amount}"


AGENT = Agent(name="charger", instructions="charge", tools=[charge])


def model() -> ScriptedProvider:
    return ScriptedProvider(
        [reply("", ToolCall(call_id="c1", tool="charge", args={"amount": 5})), reply("charged")]
    )


PARTITIONS = 3


@pytest.fixture(params=["sqlite", "memory", "kafka"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    """The embedded file, memory, or a Kafka + PostgreSQL + Redis deployment of this test."""
    if request.param == "kafka":
        return kafka_settings(request.getfixturevalue("kafka_servers"), PARTITIONS)
    return Settings(backend=request.param, sqlite_path=tmp_path / "onward.db")


@pytest_asyncio.fixture
async def app(settings: Settings, request: pytest.FixtureRequest) -> AsyncIterator[onward.App]:
    async with AsyncExitStack() as stack:
        if settings.backend == "kafka":  # the events topic, made as a deployment makes it
            servers: KafkaServers = request.getfixturevalue("kafka_servers")
            await stack.enter_async_context(servers.log(partitions=PARTITIONS))
        yield await stack.enter_async_context(
            onward.open(settings, agents=[AGENT], provider=model(), recheck_s=0.2)
        )


async def left_mid_call(app: onward.App, run_id: str) -> None:
    """A run whose process died right after dispatching its plain call: nobody can tell
    whether the charge went through."""
    runner = app.backends.runner(model(), observer=CrashAt("tool.dispatched"))
    with pytest.raises(Crash):
        await runner.run(AGENT, "charge 5", tenant=TENANT, run_id=run_id)


async def test_a_stream_of_a_run_that_needs_a_person_ends_saying_what_to_settle(
    app: onward.App,
) -> None:
    await left_mid_call(app, "r1")
    started = time.monotonic()
    messages = await asyncio.wait_for(app.resume("r1", tenant=TENANT).collect(), 10)
    # Only a failure bound: no wait of the stream's is involved, and on a loaded machine
    # (load 12 on 2 cores) Kafka's took 3.5 s.
    assert time.monotonic() - started < 8
    last = messages[-1]
    assert last.type == "needs_person"
    assert last.metadata["calls"] == {"c1": "charge"}
    assert "onward resolve r1 c1 --tenant acme --outcome never_ran" in last.content
    again = await asyncio.wait_for(app.resume("r1", tenant=TENANT).collect(), 10)
    assert again[-1].type == "needs_person"
    assert (
        await asyncio.wait_for(app.resume("r1", tenant=TENANT, after=last.position).collect(), 10)
        == []
    )


async def test_the_command_a_needs_person_message_names_pasted_into_a_shell_gives_the_ids(
    app: onward.App,
) -> None:
    """A run id or call id may hold spaces, quotes, ``$`` or what a terminal must not get raw
    (a right-to-left override): the settling command, pasted into a shell, names them exactly
    and expands nothing."""
    run_id, call_id = "r 1'$HOME\u202e", "c $(echo x)"
    provider = ScriptedProvider(
        [reply("", ToolCall(call_id=call_id, tool="charge", args={"amount": 5})), reply("ok")]
    )
    runner = app.backends.runner(provider, observer=CrashAt("tool.dispatched"))
    with pytest.raises(Crash):
        await runner.run(AGENT, "charge 5", tenant=TENANT, run_id=run_id)
    (*_, last) = await asyncio.wait_for(app.resume(run_id, tenant=TENANT).collect(), 10)
    assert last.type == "needs_person"
    command = last.content.split("onward resolve ", 1)[1].split(" --outcome", 1)[0]
    assert pasted(command) == [run_id, call_id, "--tenant", TENANT]


async def test_each_command_a_needs_person_message_names_pastes_as_one_whole_command(
    app: onward.App,
) -> None:
    """Each line of the message that names a command is one command a shell runs as it is:
    an outcome written ``completed|never_ran`` pasted was a pipe into a command ``never_ran``."""
    await left_mid_call(app, "r5")
    (*_, last) = await asyncio.wait_for(app.resume("r5", tenant=TENANT).collect(), 10)
    assert last.type == "needs_person"
    commands = [f"onward {said.splitlines()[0]}" for said in last.content.split("onward ")[1:]]
    base = ["onward", "resolve", "r5", "c1", "--tenant", TENANT]
    assert [pasted(command) for command in commands] == [
        [*base, "--outcome", "completed", "--result", "JSON", "--by", "NAME", "--why", "REASON"],
        [*base, "--outcome", "never_ran", "--by", "NAME", "--why", "REASON"],
    ]


async def test_resolving_the_call_lets_the_run_go_on_past_its_needs_person_message(
    app: onward.App,
) -> None:
    await left_mid_call(app, "r2")
    (*_, asked) = await asyncio.wait_for(app.resume("r2", tenant=TENANT).collect(), 10)
    assert asked.type == "needs_person"
    await app.backends.runner(model()).resolve(
        "r2",
        "c1",
        tenant=TENANT,
        outcome="completed",
        by="ann",
        why="the bank says so",
        result="charged 5",
    )
    rest = await asyncio.wait_for(
        app.resume("r2", tenant=TENANT, after=asked.position).collect(), 10
    )
    assert rest[-1].is_result
    assert rest[-1].status == "completed"


async def test_a_stream_of_a_run_held_elsewhere_times_out_saying_by_whom_and_until_when(
    app: onward.App, caplog: pytest.LogCaptureFixture
) -> None:
    await left_mid_call(app, "r3")
    lease = await app.backends.leases.acquire("r3", tenant=TENANT, holder="other-host-42", ttl_s=60)
    started = time.monotonic()
    with caplog.at_level("INFO", logger="onward.app"), pytest.raises(RunTimeoutError) as late:
        await app.resume("r3", tenant=TENANT, timeout=1).collect()
    assert time.monotonic() - started < 3
    assert "nothing new for 1s" in str(late.value)
    assert f"held by other-host-42 under fence {lease.fence} until " in str(late.value)
    assert "held by other-host-42" in caplog.text


@pytest.mark.kafka
async def test_a_stream_no_worker_takes_says_so_and_times_out_saying_nobody_holds_it(
    kafka_servers: KafkaServers, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet app's start that no worker takes (none runs): the stream says so once, after
    a few quiet seconds (a turn after the one that said it says nothing), rather than wait in
    silence, and its timeout names the cause."""
    settings = kafka_settings(
        kafka_servers,
        PARTITIONS,
        app_mode="fleet",
        requests_topic=f"{kafka_servers.topic}.requests",
    )
    async with kafka_servers.log(partitions=PARTITIONS):
        pass  # the events topic, as a deployment creates it
    try:
        async with onward.open(settings) as app:
            napping = naps_begun(app, monkeypatch)
            started = time.monotonic()
            stream = app.query(
                "go", {"agent": "charger", "run_id": "nobody-takes"}, timeout=SAY_UNHELD_AFTER_S + 2
            )
            with (
                caplog.at_level("INFO", logger="onward.app"),
                pytest.raises(RunTimeoutError) as late,
            ):
                await _said_unheld_then_one_more_turn(stream, napping, caplog)
            waited = time.monotonic() - started
    finally:
        await delete_topic(kafka_servers.bootstrap, settings.requests_topic)
    assert SAY_UNHELD_AFTER_S + 2 <= waited < SAY_UNHELD_AFTER_S + 12
    said = [r.getMessage() for r in caplog.records if "no worker has taken it" in r.getMessage()]
    assert len(said) == 1
    for text in (said[0], str(late.value)):
        assert "run 'nobody-takes'" in text
        assert "nothing of it is in the log yet and nobody holds it" in text
        assert "is a worker carrying agent 'charger' running" in text
        assert "`onward worker`" in text


@pytest.mark.kafka
async def test_a_stream_no_worker_takes_says_until_when_it_waits_for_its_start(
    kafka_servers: KafkaServers, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Kafka fleet has no way to tell a stream that a worker set its start aside: the stream
    waits until no worker would act on the start any more (ONWARD_REQUEST_MAX_AGE after it
    was sent, plus the clock skew a worker allows), a day by default. The one line it says
    while it waits ended "; waiting", with no end given; it now says until when, and why."""
    settings = kafka_settings(
        kafka_servers,
        PARTITIONS,
        app_mode="fleet",
        requests_topic=f"{kafka_servers.topic}.requests",
        request_max_age=600,
    )
    async with kafka_servers.log(partitions=PARTITIONS):
        pass  # the events topic, as a deployment creates it
    try:
        async with onward.open(settings) as app:
            napping = naps_begun(app, monkeypatch)
            sent = time.time()
            stream = app.query(
                "go",
                {"agent": "charger", "run_id": "nobody-takes-until"},
                timeout=SAY_UNHELD_AFTER_S + 1,
            )
            with (
                caplog.at_level("INFO", logger="onward.app"),
                pytest.raises(RunTimeoutError),
            ):
                await _said_unheld_then_one_more_turn(stream, napping, caplog)
    finally:
        await delete_topic(kafka_servers.bootstrap, settings.requests_topic)
    said = [r.getMessage() for r in caplog.records if "no worker has taken it" in r.getMessage()]
    assert len(said) == 1
    assert "waiting until " in said[0], said[0]
    until = said[0].split("waiting until ", 1)[1].split(" ", 1)[0]
    bound = sent + 600 + MAX_CLOCK_SKEW_S
    assert abs(datetime.fromisoformat(until).timestamp() - bound) < 10, said[0]
    assert "ONWARD_REQUEST_MAX_AGE" in said[0].split("waiting until ", 1)[1]


async def _said_unheld_then_one_more_turn(
    stream: RunStream, napping: asyncio.Event, caplog: pytest.LogCaptureFixture
) -> None:
    """Follow ``stream`` to its end, but see it take a turn after the one that said nobody
    holds its run: the turn that would say it again, were it said more than once."""
    following = asyncio.create_task(stream.collect())
    while not any("no worker has taken it" in r.getMessage() for r in caplog.records):
        if following.done():
            break  # ended without saying it: the test's assertions on what was said fail
        await asyncio.wait({following}, timeout=0.05)
    else:
        await one_more_turn(stream, napping)
    await following


def test_query_sync_returns_the_needs_person_message(tmp_path: Path) -> None:
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")

    async def leave() -> None:
        async with open_backends(settings) as backends:
            runner = backends.runner(model(), observer=CrashAt("tool.dispatched"))
            with pytest.raises(Crash):
                await runner.run(AGENT, "charge 5", tenant="default", run_id="s1")

    asyncio.run(leave())
    started = time.monotonic()
    last = onward.resume_sync("s1", settings=settings, agents=[AGENT], provider=model())
    assert time.monotonic() - started < 4
    assert last is not None
    assert last.type == "needs_person"


async def test_a_stream_whose_start_is_refused_ends_with_the_cause(
    app: onward.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker refuses the start for good; the stream had waited for ever for a run that
    never came."""
    await refuse_every_start(app, monkeypatch)
    started = time.monotonic()
    messages = await asyncio.wait_for(app.query({"ratio": 0.5}).collect(), 10)
    assert time.monotonic() - started < 2
    (refused,) = messages
    assert (refused.type, refused.status) == ("error", "refused")
    assert "the run could not be started: InvalidInputError" in refused.content
    assert "refused by this runner" in refused.content


async def test_a_start_json_cannot_hold_is_refused_as_it_is_read(app: onward.App) -> None:
    """Run input JSON would not keep as it is raises `InvalidInputError` naming the path to
    the value, as the README says and a fleet's app does: nothing is handed to the worker."""
    with pytest.raises(InvalidInputError, match=r"StartRun\.input .*nan at `\$\.ratio`"):
        await asyncio.wait_for(app.query({"ratio": float("nan")}).collect(), 10)


@asynccontextmanager
async def fleet_with_another_key(
    kafka_servers: KafkaServers, requests_topic: str, **app_fields: Any
) -> AsyncIterator[onward.App]:
    """A fleet app whose request key is not the one its worker (in this process) checks with:
    the worker sets every request of the app aside."""
    settings = kafka_settings(
        kafka_servers,
        PARTITIONS,
        app_mode="fleet",
        requests_topic=requests_topic,
        request_key="another-key-" + "k" * 32,
        **app_fields,
    )
    async with kafka_servers.log(partitions=PARTITIONS):
        pass  # the events topic, as a deployment creates it
    async with open_backends(kafka_settings(kafka_servers, PARTITIONS)) as backends:
        worker = Worker(backends, model(), {"charger": AGENT}, backoff_s=0.1)
        async with (
            serving(worker, kafka_servers.bootstrap, requests_topic, signer=kafka_servers.signer()),
            onward.open(settings) as app,
        ):
            yield app
        assert worker.stats.set_aside >= 1


@pytest.mark.kafka
async def test_a_start_a_worker_set_aside_times_out_naming_the_set_aside(
    kafka_servers: KafkaServers, requests_topic: str
) -> None:
    """A worker runs, and sets the app's start aside (signed with another key): the stream's
    timeout said no worker runs, pointing away from the workers' logs, where the cause is."""
    async with fleet_with_another_key(kafka_servers, requests_topic) as app:
        with pytest.raises(RunTimeoutError) as late:
            await app.query(
                "go", {"agent": "charger", "run_id": "set-aside-1"}, timeout=SAY_UNHELD_AFTER_S
            ).collect()
    assert "run 'set-aside-1'" in str(late.value)
    assert '"set aside"' in str(late.value)
    assert "ONWARD_REQUEST_KEY" in str(late.value)


@pytest.mark.kafka
async def test_a_start_no_worker_acted_on_before_it_expired_ends_the_stream(
    kafka_servers: KafkaServers, requests_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no ``timeout=``, a stream whose start was set aside waited for ever: past the
    request's max age no worker acts on it, so the wait ends there, saying what it waited on."""
    monkeypatch.setattr(stream_module, "MAX_CLOCK_SKEW_S", 0.0)
    async with fleet_with_another_key(kafka_servers, requests_topic, request_max_age=2) as app:
        started = time.monotonic()
        with pytest.raises(RunTimeoutError) as expired:
            await asyncio.wait_for(
                app.query("go", {"agent": "charger", "run_id": "set-aside-2"}).collect(), 20
            )
    assert 2 <= time.monotonic() - started < 10
    text = str(expired.value)
    assert "run 'set-aside-2'" in text
    assert "its start" in text
    assert "ONWARD_REQUEST_MAX_AGE" in text
    assert '"set aside"' in text


@tool(requires_approval=True)
async def pay(amount: int, *, idempotency_key: str, approval: Any = None) -> str:
    return f"paid {amount}"


PAYER = Agent(name="payer", instructions="pay", tools=[pay])


@pytest.mark.kafka
@pytest.mark.parametrize("how", ["respond", "resume"])
async def test_an_answer_a_worker_set_aside_ends_the_stream_once_it_expired(
    kafka_servers: KafkaServers, requests_topic: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A fleet app answers the run's approval request (from its message, or resuming the run
    with the value); the worker sets the answer aside (it expired on the way: the worker's
    clock is ahead). The stream went on waiting for ever: it ends once no worker would act on
    the answer, naming it and where the cause is."""
    monkeypatch.setattr(stream_module, "MAX_CLOCK_SKEW_S", 0.0)
    ahead = [0.0]
    checks = RequestSigner(REQUEST_KEY, max_age_s=5, clock=lambda: time.time() + ahead[0])
    settings = kafka_settings(
        kafka_servers,
        PARTITIONS,
        app_mode="fleet",
        requests_topic=requests_topic,
        request_max_age=5,
    )
    provider = ScriptedProvider(
        [reply("", ToolCall(call_id="p", tool="pay", args={"amount": 7})), reply("paid")]
    )
    async with kafka_servers.log(partitions=PARTITIONS):
        pass
    async with open_backends(kafka_settings(kafka_servers, PARTITIONS)) as backends:
        worker = Worker(backends, provider, {"payer": PAYER}, backoff_s=0.1)
        async with (
            serving(worker, kafka_servers.bootstrap, requests_topic, signer=checks),
            onward.open(settings) as app,
        ):
            stream = app.query("pay 7", {"agent": "payer", "run_id": "answer-set-aside"})
            async for message in stream:
                if message.is_hil_request:
                    break
            ahead[0] = 60.0
            if how == "respond":
                await message.respond({"ok": True})
            else:
                stream = app.resume("answer-set-aside", {"ok": True}, after=message.position)
            started = time.monotonic()
            with pytest.raises(RunTimeoutError) as expired:
                await asyncio.wait_for(stream.collect(), 20)
            assert time.monotonic() - started < 10
        assert worker.stats.set_aside == 1
    text = str(expired.value)
    assert "run 'answer-set-aside'" in text
    assert f"the answer to {message.request_id!r}" in text
    assert '"set aside"' in text


@pytest.mark.kafka
async def test_a_start_dropped_for_a_zombie_lease_ends_the_stream_of_another_process(
    kafka_servers: KafkaServers, requests_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lease on the run id is held on, renewed, by a holder that never writes it: the worker
    drops the start, saying so in its own log alone. A fleet app's stream of it waited for
    ever; it ends once no worker would take the start, naming the holder and the cause's
    place."""
    monkeypatch.setattr(stream_module, "MAX_CLOCK_SKEW_S", 0.0)
    settings = kafka_settings(
        kafka_servers,
        PARTITIONS,
        app_mode="fleet",
        requests_topic=requests_topic,
        request_max_age=4,
    )
    async with kafka_servers.log(partitions=PARTITIONS):
        pass
    async with open_backends(kafka_settings(kafka_servers, PARTITIONS)) as backends:
        leases = backends.leases
        held = await leases.acquire("zombie-1", tenant=TENANT, holder="zombie-7", ttl_s=5)

        async def hold_on() -> None:
            nonlocal held
            while True:
                await asyncio.sleep(0.05)
                held = await leases.renew(held, ttl_s=5)

        renewing = asyncio.create_task(hold_on())
        worker = Worker(backends, model(), {"charger": AGENT}, max_attempts=1, backoff_s=0.01)
        try:
            async with (
                serving(
                    worker, kafka_servers.bootstrap, requests_topic, signer=kafka_servers.signer()
                ),
                onward.open(settings, tenant=TENANT) as app,
            ):
                with pytest.raises(RunTimeoutError) as expired:
                    await asyncio.wait_for(
                        app.query("go", {"agent": "charger", "run_id": "zombie-1"}).collect(), 20
                    )
            assert worker.stats.failures == 1  # the start, dropped
        finally:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing
    text = str(expired.value)
    assert "run 'zombie-1': nothing came of its start" in text
    assert "held by zombie-7" in text
    assert '"refused for good"' in text
