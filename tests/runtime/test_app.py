"""The application API in process: query, respond, tag, resume, who is waiting, the lifespan.

Runs go through `onward.open` on the embedded SQLite file, on PostgreSQL alone and on the
memory backend; the "hours later" story runs the application as two separate processes, the
first ended while its run waits on a person.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from support.appapi import GatedModel, agents, app_process, provider, until, until_completed
from support.processes import TESTS

import onward
from onward.errors import ConfigurationError, InvalidInputError, NothingToResumeError
from onward.eventlog import RunFinished, Tagged
from onward.eventlog.archive import DirectoryArchive
from onward.eventlog.base import partition_for
from onward.runtime.application.messages import RunMessage
from onward.runtime.checkpoint import Checkpointer
from onward.runtime.compaction import CheckpointCompactor, compaction_store
from onward.runtime.demo_ledger import Ledger
from onward.runtime.providers import ModelReply, ScriptedProvider
from onward.runtime.runner import AgentRunner
from onward.runtime.settings import Settings

COLLABORATIVE = {"agent": "stepper", "mode": "collaborative"}


@pytest.fixture(params=["sqlite", "memory", "postgres"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    if request.param == "postgres":
        return Settings(
            backend="postgres",
            database_url=request.getfixturevalue("database_url"),
            database_schema=request.getfixturevalue("pg_schema"),
        )
    return Settings(backend=request.param, sqlite_path=tmp_path / "onward.db")


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    return Ledger(tmp_path / "ledger.jsonl")


@pytest_asyncio.fixture
async def app(settings: Settings, ledger: Ledger) -> AsyncIterator[onward.App]:
    async with onward.open(settings, agents=agents, provider=provider()) as opened:
        yield opened


def kinds(messages: list[RunMessage]) -> list[str]:
    return [m.type for m in messages]


async def test_query_streams_the_run_as_it_goes(app: onward.App, ledger: Ledger) -> None:
    messages = await app.query("work", {"agent": "stepper", "user": "ann"}).collect()
    per_step = ["text", "checkpoint", "progress", "checkpoint"]
    assert kinds(messages) == per_step * 3 + ["text", "result"]
    assert [m.position for m in messages] == sorted({m.position for m in messages})
    assert [m.boundary for m in messages[:4]] == [
        None,
        "after_model_call",
        None,
        "after_tool_result",
    ]
    progress = [m for m in messages if m.type == "progress"]
    assert [(m.tools_done, m.progress_percent) for m in progress] == [(1, 4.0), (2, 8.0), (3, 12.0)]
    result = messages[-1]
    assert result.is_result
    assert result.status == "completed"
    assert result.output == result.content == "notes: "
    assert not any(m.waits for m in messages)
    assert ledger.count("step") == 3
    state = await app.get_session_state(result.run_id)
    assert state is not None
    assert (state.status, state.user, state.get("iteration")) == ("completed", "ann", 4)


async def test_in_process_a_stream_sees_each_event_as_it_is_written_not_at_its_next_poll(
    settings: Settings, ledger: Ledger
) -> None:
    # Polls half a minute apart: only the wake-ups of the app's own worker's appends can
    # bring the run's messages within the ten seconds allowed.
    async with onward.open(settings, agents=agents, provider=provider(), poll_s=30) as slow:
        messages = await asyncio.wait_for(
            slow.query("work", {"agent": "stepper", "user": "ann"}).collect(), 10
        )
    assert kinds(messages) == ["text", "checkpoint", "progress", "checkpoint"] * 3 + [
        "text",
        "result",
    ]
    assert ledger.count("step") == 3


async def test_an_approval_is_answered_from_its_message_with_a_value(
    app: onward.App, ledger: Ledger
) -> None:
    seen: list[RunMessage] = []
    async for message in app.query("pay 5", {"agent": "payer", "run_id": "pay-1", "user": "ann"}):
        seen.append(message)
        if message.is_hil_request:
            assert (message.tool_name, message.args) == ("pay", {"amount": 5})
            waiting = await app.manager.list_pending(user="ann")
            assert [(p.summary.run_id, p.attention) for p in waiting] == [
                ("pay-1", "waiting_on_approval")
            ]
            assert await app.manager.list_pending(user="bob") == []
            await message.respond({"authorized": True}, by="ann")
    assert kinds(seen)[-3:] == ["checkpoint", "text", "result"]
    assert [e["approval"] for e in ledger.entries()] == [{"authorized": True}]
    assert seen[-1].output == "paid"


async def test_what_a_message_says_the_run_s_row_shows_when_it_is_handed_out(
    app: onward.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The process appending folds the row right after the append is durable; a stream reads
    # the log and may see the event first. Holding that fold back opens the moment wide.
    fold_after_append = Checkpointer.after_append

    async def held_back(self: Checkpointer, *args: Any, **kwargs: Any) -> None:
        await asyncio.sleep(0.5)
        await fold_after_append(self, *args, **kwargs)

    monkeypatch.setattr(Checkpointer, "after_append", held_back)
    async for message in app.query("pay 5", {"agent": "payer", "run_id": "row-1", "user": "ann"}):
        if message.is_hil_request:
            waiting = await app.manager.list_pending(user="ann")
            assert [(p.summary.run_id, p.attention) for p in waiting] == [
                ("row-1", "waiting_on_approval")
            ]
            await message.respond({"authorized": True}, by="ann")
        last = message
    assert last.is_result
    state = await app.get_session_state("row-1")
    assert state is not None
    assert (state.status, state.output) == ("completed", "paid")


async def test_a_collaborative_run_waits_at_each_checkpoint_until_answered(
    app: onward.App, ledger: Ledger
) -> None:
    pauses: list[RunMessage] = []
    async for message in app.query("work", COLLABORATIVE):
        if message.is_checkpoint:
            assert message.waits
            state = await app.get_session_state(message.run_id)
            assert state is not None
            assert (state.status, state.waiting_on) == ("waiting", message.request_id)
            assert ledger.count("step") == (len(pauses) + 1) // 2
            pauses.append(message)
            await message.respond(f"note {len(pauses)}")
        last = message
    assert [p.boundary for p in pauses] == ["after_model_call", "after_tool_result"] * 3
    # What was said after each settled turn reached the model, in order.
    assert last.output == "notes: note 2 | note 4 | note 6"


async def test_a_denied_checkpoint_ends_the_run(app: onward.App) -> None:
    async for message in app.query("work", COLLABORATIVE):
        if message.waits:
            await message.respond(approve=False, by="ann")
        last = message
    assert (last.type, last.status) == ("error", "cancelled")


async def test_a_tag_from_a_checkpoint_is_a_tagged_event_on_its_seq(app: onward.App) -> None:
    """A tag written while the worker still holds the run (it releases the lease just after
    the run reaches its wait) goes through the worker and lands once the run is free: looked
    for until a deadline, not at once."""
    tagged: list[int] = []
    async for message in app.query("work", COLLABORATIVE):
        if message.waits:
            if not tagged:
                await message.tag("milestone")
                tagged.append(message.seq)
            await message.respond()
        last = message

    async def tags() -> list[tuple[int, str]]:
        events = [s.event for s in await app.backends.log.read_run(last.run_id)]
        return [(e.target_seq, e.label) for e in events if isinstance(e, Tagged)]

    await until(tags, "the tag's Tagged event")
    assert await tags() == [(tagged[0], "milestone")]


async def test_a_tag_from_a_message_survives_compaction(tmp_path: Path, ledger: Ledger) -> None:
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        tagged: list[int] = []
        async for message in app.query("work", COLLABORATIVE):
            if message.waits:
                if len(tagged) < 1:
                    await message.tag("milestone")
                    tagged.append(message.seq)
                await message.respond()
            last = message
        log = app.backends.log
        async with compaction_store(app.backends) as store:
            compactor = CheckpointCompactor(
                log, app.backends.frontiers, store, no_archive=True, max_checkpoints=1
            )
            report = await compactor.compact()
            retained = {e.seq: e for e in await store.retained(last.run_id)}
        start = (await log.bounds(partition_for(last.run_id, log.partitions))).start
        kept = {s.event.seq for s in await log.read_run(last.run_id, start=start)}
    assert report.events_cut > 0
    assert tagged[0] not in kept  # cut from the log ...
    assert tagged[0] in retained  # ... and kept where compaction keeps tagged events


async def test_a_waiting_run_whose_partition_was_cut_is_answered_and_followed(
    tmp_path: Path, ledger: Ledger
) -> None:
    """The stream of a run compaction cut below starts at the first of its events the log
    still holds: what the run says from there on, to its result."""
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        stream = app.query("work", COLLABORATIVE)
        waiting = await anext(m async for m in stream if m.waits)
        for _ in range(5):
            await app.query("work", {"agent": "stepper"}).collect()
        assert app.backends.compaction is not None
        compactor = CheckpointCompactor(
            app.backends.log,
            app.backends.frontiers,
            app.backends.compaction,
            archive=DirectoryArchive(tmp_path / "archive"),
        )
        assert (await compactor.compact()).events_cut > 0
        assert not await app.backends.log.read_run(stream.run_id)
        followed: list[RunMessage] = []
        async for message in app.resume(stream.run_id, {"go": True}):
            followed.append(message)
            if message.waits:
                await message.respond()
    assert followed[-1].is_result
    assert followed[-1].status == "completed"
    assert followed[0].seq > waiting.seq  # what came before the cut is not streamed again


async def test_a_tag_on_a_run_that_is_going_waits_for_its_lease(app: onward.App) -> None:
    stream = app.query("work", {"agent": "stepper"})
    async for message in stream:
        if message.is_checkpoint and message.boundary == "after_tool_result":
            await message.tag("first turn")
            target = message.seq
            break
    assert [m.type for m in await stream.collect()][-1] == "result"

    async def tags() -> list[tuple[int, str]]:
        events = [s.event for s in await app.backends.log.read_run(stream.run_id)]
        return [(e.target_seq, e.label) for e in events if isinstance(e, Tagged)]

    await until(tags, "the tag")
    assert await tags() == [(target, "first turn")]


async def test_a_reader_that_stops_misses_nothing_and_sees_nothing_twice(
    app: onward.App,
) -> None:
    stream = app.query("work", {"agent": "stepper"})
    first = [await stream.__anext__() for _ in range(3)]

    await until_completed(app, stream.run_id)  # the run goes on while nobody reads
    rest = await stream.collect()
    everything = await app.resume(stream.run_id).collect()
    assert [m.position for m in first + rest] == [m.position for m in everything]
    assert first + rest == everything
    after_first = await app.resume(stream.run_id, after=first[-1].position).collect()
    assert after_first == rest
    after_seq = await app.resume(stream.run_id, after=first[0].seq).collect()
    assert after_seq == [m for m in everything if m.seq > first[0].seq]


async def test_resume_carries_on_a_run_whose_process_died(app: onward.App) -> None:
    class ModelDownError(RuntimeError):
        pass

    def down(_messages: object) -> ModelReply:
        raise ModelDownError("the model is down")

    stepper = agents["stepper"]
    dead = AgentRunner(
        provider=ScriptedProvider(down),
        log=app.backends.log,
        frontiers=app.backends.frontiers,
        leases=app.backends.leases,
        checkpoint_inline=True,
    )
    with pytest.raises(ModelDownError):
        await dead.run(stepper, "work", tenant="acme", run_id="left", options={"user": "ann"})
    state = await app.get_session_state("left", tenant="acme")
    assert state is not None
    assert state.status == "interrupted"
    messages = await app.resume("left", tenant="acme").collect()
    assert messages[-1].is_result
    assert messages[-1].tenant == "acme"


async def test_bad_requests_are_refused_with_what_was_wrong(app: onward.App) -> None:
    with pytest.raises(InvalidInputError, match="max_iterations"):
        app.query("x", {"agent": "stepper", "max_iterations": 0})
    with pytest.raises(InvalidInputError, match="no agent 'nobody'"):
        app.query("x", {"agent": "nobody"})
    with pytest.raises(InvalidInputError, match="name the agent"):
        app.query("x")
    with pytest.raises(NothingToResumeError):
        await app.resume("never-started").__anext__()
    assert await app.get_session_state("never-started") is None
    done = await app.query("work", {"agent": "stepper", "run_id": "done"}).collect()
    with pytest.raises(InvalidInputError, match="already exists"):
        await app.query("again", {"agent": "stepper", "run_id": "done"}).__anext__()
    with pytest.raises(InvalidInputError, match="not waiting on an answer"):
        await app.resume("done", {"go": True}).__anext__()
    with pytest.raises(InvalidInputError, match="waits on no answer"):
        await done[0].respond("hello")


async def test_a_cancel_stops_a_run_being_driven_at_its_next_boundary(
    settings: Settings, ledger: Ledger
) -> None:
    model = GatedModel()
    async with onward.open(settings, agents=agents, provider=model) as app:
        stream = app.query("work", {"agent": "stepper", "run_id": "stopped-1"})
        reading = asyncio.create_task(stream.collect())
        await asyncio.wait_for(model.asked.wait(), 30)
        await app.cancel("stopped-1", by="ops", why="not wanted any more")
        await app.cancel("stopped-1", by="ann")  # asked twice while it is going: one end
        model.gate.set()  # the turn in flight is answered and its call made; then it stops
        messages = await asyncio.wait_for(reading, 30)
        last = messages[-1]
        assert (last.type, last.status) == ("error", "cancelled")
        # Whichever of the two cancels took the lease first ended it; the other found it ended.
        assert last.content in ("cancelled by ops: not wanted any more", "cancelled by ann")

        async def let_go() -> bool:  # the canceller hands the lease back after writing the end
            state = await app.get_session_state("stopped-1")
            assert state is not None
            assert state.status == "cancelled"
            return state.holder is None

        await until(let_go, "the lease handed back")
        events = [s.event for s in await app.backends.log.read_run("stopped-1")]
        finished = [(e.status, e.error) for e in events if isinstance(e, RunFinished)]
        assert finished == [("cancelled", last.content)]
    assert model.turns == 2  # no model call after the cancel
    assert sorted(e["n"] for e in ledger.entries()) == [1, 2]  # the call in flight, once


async def test_a_cancel_ends_a_waiting_run_at_once_and_refuses_what_it_cannot(
    app: onward.App, ledger: Ledger
) -> None:
    async for message in app.query("pay 5", {"agent": "payer", "run_id": "waiting-1"}):
        if message.is_hil_request:
            break
    with pytest.raises(InvalidInputError, match="by"):
        await app.cancel("waiting-1", by="")
    with pytest.raises(InvalidInputError, match="why"):
        await app.cancel("waiting-1", by="ops", why="bad\x00note")
    with pytest.raises(NothingToResumeError):
        await app.cancel("never-started", by="ops")
    waiting = await app.get_session_state("waiting-1")
    assert waiting is not None
    assert waiting.status == "waiting"

    await app.cancel("waiting-1", by="ops")
    state = await app.get_session_state("waiting-1")
    assert state is not None
    assert state.status == "cancelled"
    with pytest.raises(InvalidInputError, match=r"ended already \(cancelled\)"):
        await app.cancel("waiting-1", by="ops")
    last = (await app.resume("waiting-1").collect())[-1]
    assert (last.type, last.status, last.content) == ("error", "cancelled", "cancelled by ops")
    assert ledger.count("pay") == 0


async def test_a_cancel_waits_out_the_worker_handing_a_waiting_run_back(app: onward.App) -> None:
    """The stream shows a person's request a moment before the worker that wrote it has let
    the run go: a cancel then still ends the run before it returns, not some time after."""
    async for message in app.query("pay 5", {"agent": "payer", "run_id": "handing-back"}):
        if message.is_hil_request:
            break
    leases = app.backends.leases

    async def let_go() -> bool:
        return await leases.current("handing-back") is None

    await until(let_go, "the worker letting the waiting run go")
    worker = app._worker
    assert worker is not None
    held = await leases.acquire("handing-back", tenant="default", holder=worker.name, ttl_s=30)

    async def hand_back() -> None:
        await asyncio.sleep(0.3)
        await leases.release(held)

    handing_back = asyncio.create_task(hand_back())
    await app.cancel("handing-back", by="ops")
    await handing_back
    state = await app.get_session_state("handing-back")
    assert state is not None
    assert state.status == "cancelled"


async def test_resuming_an_id_nobody_wrote_keeps_no_lease_state(app: onward.App) -> None:
    """`AgentRunner.resume` takes the lease before it can read the run; finding no run hands
    it back as if never taken, so ids asked for by mistake (or by a caller probing) pile no
    rows or keys up: the next acquisition gets the first fence again."""
    runner = app.backends.runner(provider())
    for _ in range(2):
        with pytest.raises(NothingToResumeError):
            await runner.resume(agents["stepper"], "never-written", tenant="default")
    leases = app.backends.leases
    assert await leases.current("never-written") is None
    again = await leases.acquire("never-written", tenant="default", holder="probe", ttl_s=30)
    assert again.fence == 1
    await leases.release(again)


async def test_the_module_functions_use_the_app_opened_last(
    settings: Settings, ledger: Ledger
) -> None:
    with pytest.raises(ConfigurationError, match="no Onward app is open"):
        onward.query("work", {"agent": "stepper"})
    async with onward.open(settings, agents=agents, provider=provider()):
        messages = await onward.query("work", {"agent": "stepper", "run_id": "m"}).collect()
        state = await onward.get_session_state("m")
        assert state is not None
        assert state.status == "completed"
        assert await onward.resume("m").collect() == messages
    with pytest.raises(ConfigurationError):
        onward.resume("m")


async def test_the_module_query_ends_at_a_wait_as_app_query_does(
    settings: Settings, ledger: Ledger
) -> None:
    """`onward.query` is `App.query` on the open app: ``follow_waits=False`` ends its stream
    once the run waits on a person (the module function did not take it, so a script could
    not stop there the way `onward.resume` and `App.query` let it)."""
    async with onward.open(settings, agents=agents, provider=provider()):
        stream = onward.query("pay 5", {"agent": "payer", "run_id": "w"}, follow_waits=False)
        messages = await asyncio.wait_for(stream.collect(), 30)
    assert messages[-1].is_hil_request


def test_an_app_that_cannot_work_is_refused_at_once(tmp_path: Path) -> None:
    sqlite = Settings(backend="sqlite", sqlite_path=tmp_path / "x.db")
    with pytest.raises(ConfigurationError, match="agents= and provider="):
        onward.App(sqlite)
    with pytest.raises(
        ConfigurationError, match=r"needs ONWARD_BACKEND=kafka or postgres \(it is sqlite\)"
    ):
        onward.App(Settings(backend="sqlite", app_mode="fleet"))


def test_scripts_query_and_resume_synchronously(tmp_path: Path, ledger: Ledger) -> None:
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")
    model = provider()
    asked = onward.query_sync(
        "pay 5", {"agent": "payer", "run_id": "s"}, settings=settings, agents=agents, provider=model
    )
    assert asked is not None
    assert asked.is_hil_request
    done = onward.resume_sync(
        "s", {"authorized": "script"}, settings=settings, agents=agents, provider=model
    )
    assert done is not None
    assert (done.type, done.output) == ("result", "paid")
    assert [e["approval"] for e in ledger.entries()] == [{"authorized": "script"}]


def test_resume_sync_takes_the_options_resume_takes(tmp_path: Path, ledger: Ledger) -> None:
    """``follow_waits`` is one of `App.resume`'s options: given, it is heeded (it raised a
    bare TypeError, `resume_sync` passing it itself)."""
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")
    model = provider()
    asked = onward.query_sync(
        "pay 5", {"agent": "payer", "run_id": "f"}, settings=settings, agents=agents, provider=model
    )
    assert asked is not None
    assert asked.is_hil_request
    done = onward.resume_sync(
        "f",
        {"authorized": "script"},
        settings=settings,
        agents=agents,
        provider=model,
        follow_waits=True,
        timeout=30,
    )
    assert done is not None
    assert (done.type, done.output) == ("result", "paid")


def sqlite_app(db: Path, ledger: Path, *argv: str) -> list[dict[str, object]]:
    """The application as a process of its own, in process on ``db``; what it printed."""
    env = {
        **os.environ,
        "PYTHONPATH": str(TESTS),
        "ONWARD_BACKEND": "sqlite",
        "ONWARD_SQLITE_PATH": str(db),
        "ONWARD_APP_MODE": "in_process",
        "APP_LEDGER": str(ledger),
    }
    return app_process(env, *argv)


def test_an_approval_answered_hours_later_continues_the_run_with_the_value(
    tmp_path: Path,
) -> None:
    db, ledger = tmp_path / "onward.db", tmp_path / "ledger.jsonl"
    before = sqlite_app(db, ledger, "query", "payer", "later-1")
    assert [m["type"] for m in before][-1] == "approval_request"
    assert not ledger.exists()  # nothing paid while the application was gone

    seen = [str(before[-1]["seq"]), str(before[-1]["part"])]
    value = json.dumps({"authorized": "hours later"})
    after = sqlite_app(db, ledger, "resume", "later-1", value, *seen)
    assert [m["type"] for m in after] == ["progress", "checkpoint", "text", "result"]
    assert sqlite_app(db, ledger, "resume", "later-1") == before + after
    assert after[-1]["output"] == "paid"
    effects = Ledger(ledger).entries()
    assert [(e["tool"], e["approval"]) for e in effects] == [("pay", {"authorized": "hours later"})]

    replay = subprocess.run(
        [sys.executable, "-m", "onward", "replay", "later-1", "--tenant", "default", "--json"],
        env={**os.environ, "ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    granted = [
        json.loads(line) for line in replay.stdout.splitlines() if "approval.granted" in line
    ]
    assert len(granted) == 1
    assert _value_of(granted[0]) == {"authorized": "hours later"}


def _value_of(line: dict[str, object]) -> object:
    """The answer's value in a replay line (the event's own fields)."""
    event = line.get("event", line)
    assert isinstance(event, dict)
    return event["value"]


def test_options_record_what_outlives_the_process() -> None:
    recorded = onward.Options(
        user="ann", max_iterations=3, mode=onward.ExecutionMode.COLLABORATIVE
    ).recorded()
    assert recorded == {
        "mode": "collaborative",
        "checkpoints": ["after_model_call", "after_tool_result", "before_approval"],
        "user": "ann",
        "max_iterations": 3,
    }
