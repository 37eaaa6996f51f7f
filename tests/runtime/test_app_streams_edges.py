"""What a stream, a start and a lookup promise where they are easiest to break (embedded
SQLite, memory, PostgreSQL).

* Two starts of one run id for one tenant at once: the loser's stream must say "already
  exists", not hand out the winner's run as the answer to its own prompt.
* A stream whose read failed for a moment (a blob store that timed out putting a large body
  back) keeps its place: reading it again gives every message once, and its end.
* An id the stores cannot hold (a control character, a lone surrogate) is refused naming the
  field, on every backend, never a raw driver or codec error.
* A stream that waits reads each of its partition's records once, not every other run's
  records since its run's last event again at every look.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from support.appapi import agents, provider, refuse_every_start, script, until
from support.deployment import postgres_fleet_settings

import onward
from onward.errors import BackendUnavailableError, ConfigurationError, InvalidInputError
from onward.eventlog import Message
from onward.eventlog.base import StoredEvent, partition_for
from onward.runtime.agent import Agent
from onward.runtime.application.messages import RunMessage
from onward.runtime.providers import ModelReply, ScriptedProvider, reply
from onward.runtime.resumer import Resumer
from onward.runtime.settings import SecretUrl, Settings


@pytest.fixture(params=["sqlite", "memory", "postgres"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    if request.param == "postgres":
        return Settings(
            backend="postgres",
            database_url=request.getfixturevalue("database_url"),
            database_schema=request.getfixturevalue("pg_schema"),
        )
    return Settings(backend=request.param, sqlite_path=tmp_path / "onward.db")


@pytest_asyncio.fixture
async def app(settings: Settings) -> AsyncIterator[onward.App]:
    async with onward.open(settings, agents=agents, provider=provider()) as opened:
        yield opened


async def test_a_start_that_lost_its_run_id_to_the_same_tenant_says_it_exists(
    app: onward.App,
) -> None:
    """`App.query`: reading the stream raises InvalidInputError when "the run id is taken
    (... or that another start took first)". The loser of two starts of one id had followed
    the winner's run: a "pay 5" caller was handed the stepper's messages and its result."""
    stepper = app.query("work", {"agent": "stepper", "run_id": "dup-1"})
    payer = app.query("pay 5", {"agent": "payer", "run_id": "dup-1"}, follow_waits=False)

    async def read(stream: onward.RunStream) -> list[RunMessage] | BaseException:
        try:
            return await asyncio.wait_for(stream.collect(), 30)
        except InvalidInputError as exc:
            return exc

    got = await asyncio.gather(read(stepper), read(payer))

    refused = [g for g in got if isinstance(g, InvalidInputError)]
    followed = [g for g in got if isinstance(g, list)]
    assert len(refused) == 1, [
        [(m.type, m.content[:12]) for m in g] if isinstance(g, list) else g for g in got
    ]
    assert "already exists" in str(refused[0])
    assert len(followed) == 1
    assert followed[0][-1].type in ("result", "approval_request")


async def test_a_start_whose_run_id_another_tenant_took_as_it_looked_says_it_exists(
    app: onward.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another tenant's start lands right after this start's stream found the id free and
    before it took its place in the log: the stream read the log from after that start, the
    worker dropped this start as "started before", and the stream waited for a run that never
    comes (to its timeout; with none, for ever). It now says the id is taken, naming no one."""
    looked = Resumer.exists
    raced = False

    async def looked_then_taken(self: Resumer, run_id: str) -> bool:
        nonlocal raced
        found = await looked(self, run_id)
        if not raced:
            raced = True
            taken = {"agent": "payer", "run_id": "race-1", "tenant": "evil"}
            await app.query("pay 5", taken, follow_waits=False).collect()
        return found

    monkeypatch.setattr(Resumer, "exists", looked_then_taken)
    mine = app.query("pay 5", {"agent": "payer", "run_id": "race-1", "tenant": "acme"}, timeout=5)
    with pytest.raises(InvalidInputError, match="already exists") as lost:
        await asyncio.wait_for(mine.collect(), 30)
    assert raced
    assert "evil" not in str(lost.value)


async def test_a_refused_start_ends_every_stream_of_its_run(
    app: onward.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two streams of one run (as `App.query` promises: one start of the same agent and tenant
    is not told apart, both follow it) whose starts the app's worker refused (its runner would
    not record the input): both end saying why. The refusal was handed to the first stream
    alone, and the second waited for a run that never comes."""
    with monkeypatch.context() as patched:
        await refuse_every_start(app, patched)
        first = app.query("refused", {"agent": "stepper", "run_id": "nan-1"})
        second = app.query("refused", {"agent": "stepper", "run_id": "nan-1"})
        got = await asyncio.wait_for(asyncio.gather(first.collect(), second.collect()), 10)
    for messages in got:
        assert [(m.type, m.status) for m in messages] == [("error", "refused")]
        assert "refused by this runner" in messages[0].content
    # The run's id tried again with an input it can take: its own start, not the refusal before.
    again = await asyncio.wait_for(
        app.query("work", {"agent": "stepper", "run_id": "nan-1"}).collect(), 10
    )
    assert again[-1].is_result


async def test_a_start_whose_run_began_and_then_failed_is_not_said_refused(
    settings: Settings,
) -> None:
    """A run whose first model call failed with an Onward error after its `RunStarted` was
    durable (a model not configured yet) exists and is carried on: its stream said "the run
    could not be started" (status ``refused``, nothing of it in the log) and ended, though the
    run was in the log and went on. It now follows the run to its end."""
    calls = 0

    def first_fails(messages: Sequence[Message]) -> ModelReply:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConfigurationError("the model has no key yet")
        return script(messages)

    async with onward.open(
        settings, agents=agents, provider=ScriptedProvider(first_fails), recheck_s=0.1
    ) as app:
        stream = app.query("work", {"agent": "stepper", "run_id": "began-1"})
        messages = await asyncio.wait_for(stream.collect(), 30)
    assert [m.status for m in messages if m.type == "error"] == []
    assert messages[-1].is_result


async def test_a_start_whose_run_began_and_then_failed_is_not_logged_refused(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """The same run, as the worker's log tells it: it said "StartRun refused for good" (no
    run named) for a run that was in the log and went on, the very words a stream that waits
    on a start sends its reader to look for in the workers' logs. It now names the run, says
    it began, and that it is carried on."""
    calls = 0

    def first_fails(messages: Sequence[Message]) -> ModelReply:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConfigurationError("the model has no key yet")
        return script(messages)

    with caplog.at_level("WARNING", logger="onward.worker"):
        async with onward.open(
            settings, agents=agents, provider=ScriptedProvider(first_fails), recheck_s=0.1
        ) as app:
            stream = app.query("work", {"agent": "stepper", "run_id": "began-2"})
            messages = await asyncio.wait_for(stream.collect(), 30)
    assert messages[-1].is_result
    said = [r.getMessage() for r in caplog.records if "the model has no key yet" in r.getMessage()]
    assert said, caplog.text
    assert not any("refused" in line for line in said), said
    assert any("run began-2" in line and "carried on" in line for line in said), said


UNKEEPABLE = {
    "nan": float("nan"),
    "inf inside": {"rows": [1.0, float("inf")]},
    "tuple key": {(1, 2): "pair"},
    "object": object(),
}


@pytest.mark.parametrize("mode", ["in_process", "fleet"])
@pytest.mark.parametrize("value", list(UNKEEPABLE.values()), ids=list(UNKEEPABLE))
async def test_an_input_json_cannot_hold_raises_in_every_mode(
    database_url: str, pg_schema: str, mode: str, value: object
) -> None:
    """One API, one answer: run input JSON would not keep as it is raises InvalidInputError
    naming the field, and nothing is written, whoever runs the run. In process it had been
    handed to the app's worker, whose refusal came back as an ``error`` message instead."""
    settings = postgres_fleet_settings(database_url, pg_schema).model_copy(
        update={"app_mode": mode}
    )
    in_process = mode == "in_process"
    opened = onward.open(
        settings,
        agents=agents if in_process else None,
        provider=provider() if in_process else None,
    )
    async with opened as app:
        stream = app.query(value, {"agent": "stepper", "run_id": "odd-1"})
        with pytest.raises(InvalidInputError, match=r"StartRun\.input"):
            await asyncio.wait_for(stream.__anext__(), 10)
        assert await app.get_session_state("odd-1") is None


BIG = "x" * 300_000  # over the claim check's threshold: the model's answer goes to the blob store


@pytest.mark.timeout(60)
async def test_a_stream_whose_read_failed_for_a_moment_misses_nothing_after(
    database_url: str, pg_schema: str
) -> None:
    """A blob store that times out while the stream puts a large body back fails that read
    (BackendUnavailableError: "the same call may succeed later"). The stream had already moved
    its place past the whole batch, so the next read skipped the failed event and every one
    after it: here the run's end, and a stream of an ended run waited for ever."""
    settings = Settings(
        backend="postgres",
        database_url=SecretUrl(database_url),
        database_schema=pg_schema,
        backend_timeout=1,
    )
    talker = Agent(name="talker", instructions="say a lot")
    model = ScriptedProvider([reply(BIG)])
    async with onward.open(settings, agents=[talker], provider=model) as app:
        everything = await app.query("go", {"agent": "talker", "run_id": "big-1"}).collect()
        assert [m.type for m in everything] == ["text", "result"]
        assert everything[0].content == BIG

        stream = app.resume("big-1", timeout=5)
        locker = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
        try:
            async with locker.transaction():
                await locker.execute("LOCK TABLE onward_blobs IN ACCESS EXCLUSIVE MODE")
                with pytest.raises(BackendUnavailableError):
                    await stream.__anext__()
        finally:
            await locker.close()
        rest = await stream.collect()  # the blob store answers again
        assert [m.position for m in rest] == [m.position for m in everything]
        assert rest == everything


ODD_IDS = ["a\x00b", "\ud800"]


@pytest.mark.parametrize("odd", ODD_IDS, ids=["nul", "surrogate"])
async def test_an_odd_run_id_or_tenant_is_refused_naming_it(app: onward.App, odd: str) -> None:
    """resume, get_session_state and cancel read a run id (and a tenant) straight from the
    caller; `query` refuses those same values through `Options`. A lone surrogate raised a raw
    UnicodeEncodeError on every backend, a NUL a BackendError ("loading frontiers:
    CharacterNotInRepertoireError") on PostgreSQL and "no such run" elsewhere."""
    with pytest.raises(InvalidInputError, match="run_id"):
        await app.get_session_state(odd)
    with pytest.raises(InvalidInputError, match="run_id"):
        await app.resume(odd).__anext__()
    with pytest.raises(InvalidInputError, match="run_id"):
        await app.resume(odd, {"ok": True}).__anext__()
    with pytest.raises(InvalidInputError, match="run_id"):
        await app.cancel(odd, by="ops")
    with pytest.raises(InvalidInputError, match="tenant"):
        await app.get_session_state("r", tenant=odd)
    with pytest.raises(InvalidInputError, match="tenant"):
        await app.resume("r", tenant=odd).__anext__()


@pytest.mark.timeout(60)
async def test_a_resume_whose_first_read_failed_for_a_moment_still_answers(
    database_url: str, pg_schema: str
) -> None:
    """`resume(run_id, value)` answers the run when the stream is first read. That read failed
    for a moment (the log did not answer: BackendUnavailableError, "the same call may succeed
    later"), and the stream had dropped its opening for good: read again, it never answered
    and, not following waits, ended at the very request the caller had answered."""
    settings = Settings(
        backend="postgres",
        database_url=SecretUrl(database_url),
        database_schema=pg_schema,
        backend_timeout=1,
    )
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        options = {"agent": "payer", "run_id": "pay-2", "user": "ann"}
        async for message in app.query("pay 5", options, follow_waits=False):
            if message.is_hil_request:
                break
        stream = app.resume("pay-2", {"ok": True}, follow_waits=False)
        locker = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
        try:
            async with locker.transaction():
                await locker.execute("LOCK TABLE onward_log IN ACCESS EXCLUSIVE MODE")
                with pytest.raises(BackendUnavailableError):
                    await stream.__anext__()
        finally:
            await locker.close()
        rest = await asyncio.wait_for(stream.collect(), 30)  # the log answers again
        assert rest[-1].type == "result", [(m.type, m.status) for m in rest]


async def test_a_waiting_stream_reads_no_other_run_s_records_again(settings: Settings) -> None:
    """A stream that waited found nothing of its run at each look and kept its place at its
    run's last event: each look read every record of its partition written since, other runs'
    (on Kafka a fetch of all of them, growing as the partition does, every look)."""
    async with onward.open(settings, agents=agents, provider=provider(), recheck_s=600) as app:
        await _reads_each_record_once(app)


async def _reads_each_record_once(app: onward.App) -> None:
    log = app.backends.log
    partition = partition_for("waits", log.partitions)
    other = next(
        f"other-{n}"
        for n in range(1000)
        if partition_for(f"other-{n}", log.partitions) == partition
    )
    async for asked in app.query("pay 5", {"agent": "payer", "run_id": "waits"}):
        if asked.is_hil_request:
            break
    starts: list[int | None] = []
    read_run = log.read_run

    async def spied(run_id: str, **kwargs: object) -> list[StoredEvent]:
        if run_id == "waits":
            starts.append(kwargs.get("start"))  # type: ignore[arg-type]
        return await read_run(run_id, **kwargs)  # type: ignore[arg-type]

    log.read_run = spied  # type: ignore[method-assign]
    stream = app.resume("waits", after=asked.position)
    reading = asyncio.create_task(stream.__anext__())
    await app.query("work", {"agent": "stepper", "run_id": other}).collect()
    written = (await log.bounds(partition)).end
    looked = len(starts)

    async def looked_again() -> bool:
        return len(starts) >= looked + 3

    await until(looked_again, "two more looks of the waiting stream")
    assert all(start is not None and start >= written for start in starts[looked + 2 :])
    await asked.respond({"ok": True})
    assert (await reading).type == "progress"
    assert [m.type for m in await stream.collect()][-1] == "result"
