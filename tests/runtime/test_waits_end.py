"""Every wait of the application API ends or speaks (issue: the first hour).

A stream whose run needs a person to settle a call ends with a ``needs_person`` message naming
the call and the command that settles it; one whose run is held by another process past the
caller's ``timeout=`` raises `RunTimeoutError` saying who holds it and until when, and one no
worker takes says so. None waits in silence.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import pytest_asyncio
from support.crashes import Crash, CrashAt
from support.deployment import kafka_settings
from support.kafka import delete_topic
from support.servers import KafkaServers

import onward
from onward.errors import RunTimeoutError
from onward.eventlog import ToolCall
from onward.runtime.agent import Agent
from onward.runtime.application.stream import SAY_UNHELD_AFTER_S
from onward.runtime.backends import open_backends
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.settings import Settings
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
    assert time.monotonic() - started < 2
    last = messages[-1]
    assert last.type == "needs_person"
    assert last.metadata["calls"] == {"c1": "charge"}
    assert "onward resolve r1 c1 --tenant acme --outcome completed|never_ran" in last.content
    again = await asyncio.wait_for(app.resume("r1", tenant=TENANT).collect(), 10)
    assert again[-1].type == "needs_person"
    assert (
        await asyncio.wait_for(app.resume("r1", tenant=TENANT, after=last.position).collect(), 10)
        == []
    )


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
    kafka_servers: KafkaServers, caplog: pytest.LogCaptureFixture
) -> None:
    """A fleet app's start that no worker takes (none runs): the stream says so once, after
    a few quiet seconds, rather than wait in silence, and its timeout names the cause."""
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
            started = time.monotonic()
            with (
                caplog.at_level("INFO", logger="onward.app"),
                pytest.raises(RunTimeoutError) as late,
            ):
                await app.query(
                    "go",
                    {"agent": "charger", "run_id": "nobody-takes"},
                    timeout=SAY_UNHELD_AFTER_S + 2,
                ).collect()
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


async def test_a_stream_whose_start_is_refused_ends_with_the_cause(app: onward.App) -> None:
    """The worker refuses the start for good (a value no store can keep); the stream had
    waited for ever for a run that never came."""
    started = time.monotonic()
    messages = await asyncio.wait_for(app.query({"ratio": float("nan")}).collect(), 10)
    assert time.monotonic() - started < 2
    (refused,) = messages
    assert (refused.type, refused.status) == ("error", "refused")
    assert "the run could not be started: InvalidInputError" in refused.content
    assert "nan" in refused.content
