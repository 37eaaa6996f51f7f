"""The application API in its default mode (in process) on the production backend: Kafka for
the log, PostgreSQL for frontiers, Redis for leases.

`onward.open` with nothing but the stack's settings drives its runs through a worker of its
own: a query streams the run to its result, an approval is answered from its message with a
value, a stream resumed after a position yields exactly the rest, a tag on a run that is going
is written under its lease, and closing the app lets a run in flight stop at its next boundary
and hands its lease back, so another app carries it on with every step made once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from support.appapi import GatedModel, agents, provider, until
from support.deployment import kafka_settings
from support.servers import KafkaServers

import onward
from onward.errors import NothingToResumeError
from onward.eventlog import KafkaEventLog, Tagged
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.log_projector import LogProjector
from onward.projections.postgres import PostgresFrontierStore
from onward.runtime import RedisLeaseStore
from onward.runtime.application.messages import RunMessage
from onward.runtime.demo_ledger import Ledger
from onward.runtime.settings import Settings

pytestmark = pytest.mark.kafka
PARTITIONS = 3
PER_STEP = ["text", "checkpoint", "progress", "checkpoint"]
"""What a stepper's turn with one tool call streams."""


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    return Ledger(tmp_path / "ledger.jsonl")


@pytest_asyncio.fixture
async def settings(kafka_servers: KafkaServers) -> Settings:
    async with kafka_servers.log(partitions=PARTITIONS):
        pass  # the events topic, created once, as a deployment creates it
    chosen = kafka_settings(kafka_servers, PARTITIONS)
    assert chosen.app_mode == "in_process"  # the default, not asked for
    return chosen


@pytest_asyncio.fixture
async def app(settings: Settings, ledger: Ledger) -> AsyncIterator[onward.App]:
    async with onward.open(settings, agents=agents, provider=provider()) as opened:
        stores = opened.backends
        assert isinstance(stores.log, KafkaEventLog)
        assert isinstance(stores.frontiers, PostgresFrontierStore)
        assert isinstance(stores.leases, RedisLeaseStore)
        yield opened


def kinds(messages: Sequence[RunMessage]) -> list[str]:
    return [m.type for m in messages]


async def test_a_query_streams_the_run_to_its_result_and_resume_after_yields_the_rest(
    app: onward.App, ledger: Ledger
) -> None:
    messages = await app.query("work", {"agent": "stepper", "user": "ann"}).collect()
    assert kinds(messages) == PER_STEP * 3 + ["text", "result"]
    result = messages[-1]
    assert (result.status, result.output) == ("completed", "notes: ")
    assert ledger.count("step") == 3
    state = await app.get_session_state(result.run_id)
    assert state is not None
    assert (state.status, state.user, state.get("iteration")) == ("completed", "ann", 4)

    assert await app.resume(result.run_id).collect() == messages
    after = await app.resume(result.run_id, after=messages[5].position).collect()
    assert after == messages[6:]


async def test_resuming_an_id_nobody_wrote_leaves_no_lease_or_fence_key_in_redis(
    app: onward.App, settings: Settings
) -> None:
    runner = app.backends.runner(provider())
    for _ in range(2):
        with pytest.raises(NothingToResumeError):
            await runner.resume(agents["stepper"], "never-written", tenant="default")
    client = aioredis.Redis.from_url(settings.require_redis_url())
    try:
        prefix = settings.redis_prefix
        left = await client.exists(f"{prefix}lease:never-written", f"{prefix}fence:never-written")
    finally:
        await client.aclose()
    assert left == 0


async def test_an_approval_is_answered_from_its_message_with_a_value(
    app: onward.App, ledger: Ledger
) -> None:
    seen: list[RunMessage] = []
    async for message in app.query("pay 5", {"agent": "payer", "run_id": "pay-1", "user": "ann"}):
        seen.append(message)
        if message.is_hil_request:
            assert (message.tool_name, message.args) == ("pay", {"amount": 5})
            assert not ledger.path.exists()  # nothing paid before the answer
            await message.respond({"authorized": "ann"}, by="ann")
    assert kinds(seen)[-3:] == ["checkpoint", "text", "result"]
    assert seen[-1].output == "paid"
    paid = [(e["tool"], e["approval"]) for e in ledger.entries()]
    assert paid == [("pay", {"authorized": "ann"})]


async def test_a_tag_on_a_run_that_is_going_is_written_under_its_lease(app: onward.App) -> None:
    stream = app.query("work", {"agent": "stepper"})
    async for message in stream:
        if message.is_checkpoint and message.boundary == "after_tool_result":
            await message.tag("first turn")
            target = message.seq
            break
    assert kinds(await stream.collect())[-1] == "result"

    async def tags() -> list[tuple[int, str, int]]:
        events = [s.event for s in await app.backends.log.read_run(stream.run_id)]
        return [(e.target_seq, e.label, e.fence) for e in events if isinstance(e, Tagged)]

    await until(tags, "the tag")
    [(seq, label, fence)] = await tags()
    assert (seq, label) == (target, "first turn")
    assert fence > 1  # under a lease of its own, taken after the run's worker let go


async def test_closing_the_app_hands_a_running_runs_lease_back_and_another_app_finishes_it(
    settings: Settings, ledger: Ledger, kafka_servers: KafkaServers
) -> None:
    model = GatedModel()
    async with onward.open(settings, agents=agents, provider=model) as first:
        stream = first.query("work", {"agent": "stepper", "run_id": "closed-1"})
        reading = asyncio.create_task(stream.collect())
        await asyncio.wait_for(model.asked.wait(), 60)
        closing = asyncio.create_task(first.close())
        await asyncio.sleep(0.2)  # the close is waiting on the run ...
        assert not closing.done()
        model.gate.set()  # ... which the model answers; the run stops at its next boundary
        await asyncio.wait_for(closing, 60)
        reading.cancel()
    # The turn in flight was settled (its step made) and the run stopped there, unfinished.
    assert ledger.count("step") == 2
    async with kafka_servers.leases() as leases:
        assert await leases.current("closed-1") is None  # handed back, not left to lapse

    async with onward.open(settings, agents=agents, provider=provider()) as second:
        state = await second.get_session_state("closed-1")
        assert state is not None
        assert state.status == "interrupted"
        carried = await second.resume("closed-1").collect()
    assert carried[-1].is_result
    assert carried[-1].status == "completed"
    steps = sorted(e["n"] for e in ledger.entries() if e["tool"] == "step")
    assert steps == [1, 2, 3]  # every step once, none again after the close


async def test_a_stream_of_an_ended_run_whose_events_retention_deleted_ends_with_its_result(
    app: onward.App,
) -> None:
    """Retention (here a DeleteRecords cut) removes a finished run's events and writes no
    compaction record: the stream still ends with the run's result, not a wait for good."""
    messages = await app.query("work", {"agent": "stepper"}).collect()
    result = messages[-1]
    log = app.backends.log
    partition = (await log.read_run(result.run_id))[0].position.partition
    end = (await log.bounds(partition)).end
    # Retention removes what the projector folded long since.
    stores = app.backends
    projection = FrontierProjection(stores.frontiers, log, compaction=stores.compaction)
    await LogProjector(log, projection).catch_up()
    await log.truncate_before(partition, end)
    again = await app.resume(result.run_id, timeout=10).collect()
    assert [(m.type, m.status, m.output) for m in again] == [("result", "completed", result.output)]


async def test_a_stream_left_behind_a_retention_cut_ends_with_its_runs_result(
    app: onward.App,
) -> None:
    """A reader that stopped reading while retention cut its run's events: reading the same
    stream again ends with the run's result, rather than fail on the truncated offset."""
    stream = app.query("pay 5", {"agent": "payer"}, timeout=10)
    seen = [message async for message in _until_it_waits(stream)]
    await seen[-1].respond("ok")
    done = await app.resume(seen[-1].run_id, timeout=10).collect()
    log = app.backends.log
    partition = (await log.read_run(seen[-1].run_id))[0].position.partition
    stores = app.backends
    projection = FrontierProjection(stores.frontiers, log, compaction=stores.compaction)
    await LogProjector(log, projection).catch_up()
    await log.truncate_before(partition, (await log.bounds(partition)).end)
    rest = await stream.collect()
    assert [(m.type, m.status, m.position) for m in rest] == [
        ("result", "completed", done[-1].position)
    ]


async def _until_it_waits(stream: onward.RunStream) -> AsyncIterator[RunMessage]:
    async for message in stream:
        yield message
        if message.waits:
            return
