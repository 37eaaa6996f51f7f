"""A stream that fell behind (its reader stopped for a while) and whose run's events were cut
meanwhile: "a consumer that stops reading neither stops nor loses the run", so reading it again
gives the messages of the events the log still holds, once each, and its end. It raised
`LogTruncatedError` (the offset it had reached was gone) although the run had ended well."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Literal

import pytest
from support.appapi import agents, provider, until_completed
from support.deployment import postgres_fleet_settings
from support.servers import REQUEST_KEY

import onward
from onward.errors import InvalidInputError
from onward.runtime.application.messages import RunMessage
from onward.runtime.application.stream import RunStream
from onward.runtime.backends import open_backends
from onward.runtime.compaction import CheckpointCompactor
from onward.runtime.demo_ledger import Ledger
from onward.runtime.fleet.requests_postgres import PostgresRequests
from onward.runtime.fleet.worker import Worker
from onward.runtime.settings import Settings
from onward.runtime.signing import RequestSigner


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    return Ledger(tmp_path / "ledger.jsonl")


async def read_until_it_waits(stream: RunStream) -> list[RunMessage]:
    """The stream's messages up to the first that waits on a person; the reader then stops."""
    seen = []
    async for message in stream:
        seen.append(message)
        if message.waits:
            break
    return seen


async def test_a_stream_left_behind_a_compaction_ends_with_its_runs_result(
    tmp_path: Path, ledger: Ledger
) -> None:
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        stream = app.query("pay 5", {"agent": "payer"}, timeout=5)
        seen = await read_until_it_waits(stream)
        asked = seen[-1]
        await asked.respond("ok")  # this stream's reader stops reading meanwhile
        done = await app.resume(asked.run_id, timeout=10).collect()
        assert done[-1].type == "result"
        for _ in range(3):
            await app.query("work", {"agent": "stepper"}).collect()
        assert app.backends.compaction is not None
        compactor = CheckpointCompactor(
            app.backends.log, app.backends.frontiers, app.backends.compaction, no_archive=True
        )
        assert (await compactor.compact()).events_cut > 0
        assert not await app.backends.log.read_run(asked.run_id)
        rest = await asyncio.wait_for(stream.collect(), 30)
    assert [(m.type, m.status) for m in rest][-1:] == [("result", "completed")]


@pytest.mark.parametrize("backend", ["sqlite", "memory"])
async def test_a_stream_left_behind_a_cut_of_the_logs_start_goes_on_with_what_is_kept(
    tmp_path: Path, ledger: Ledger, backend: Literal["sqlite", "memory"]
) -> None:
    """Cut below the run's later events with no compaction record (retention): the stream
    goes on with the messages of the events kept, once each, and the run's result."""
    settings = Settings(backend=backend, sqlite_path=tmp_path / "onward.db")
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        stream = app.query("pay 5", {"agent": "payer"}, timeout=5)
        seen = await read_until_it_waits(stream)
        await seen[-1].respond("ok")
        done = await app.resume(seen[-1].run_id, timeout=10).collect()
        log = app.backends.log
        stored = await log.read_run(seen[-1].run_id)
        kept = [s for s in stored if s.event.seq > seen[-1].seq + 2]
        await log.truncate_before(kept[0].position.partition, kept[0].position.offset)
        rest = await asyncio.wait_for(stream.collect(), 30)
    assert rest, "nothing after the cut"
    assert rest[-1].position == done[-1].position
    assert (rest[-1].type, rest[-1].status) == ("result", "completed")
    assert all(m.seq >= kept[0].event.seq for m in rest)
    assert [m.position for m in rest] == sorted({m.position for m in rest})
    assert rest[-1].iteration == done[-1].iteration


async def test_a_stream_whose_own_start_was_cut_before_it_read_it_goes_on(
    database_url: str, pg_schema: str, ledger: Ledger
) -> None:
    """A query's stream that sent its start and stopped reading before it read the run's
    `RunStarted`, which a cut then took: the run's row says whose run it is (its tenant and
    agent), so the stream goes on from it as any stream behind a cut does, to the run's
    result. It raised `LogTruncatedError`, the run having gone well."""
    settings = postgres_fleet_settings(database_url, pg_schema)
    in_process = settings.model_copy(update={"app_mode": "in_process"})
    async with (
        open_backends(in_process) as backends,
        PostgresRequests(database_url, schema=pg_schema) as table,
        onward.open(settings) as app,
    ):
        stream = app.query("work", {"agent": "stepper", "run_id": "cut-1"}, timeout=30)
        # Another agent's start of the same id, sent after it: its stream must not take the
        # stepper's run for its own, its start cut or not.
        other = app.query("pay 5", {"agent": "payer", "run_id": "cut-1"}, timeout=30)
        for sent in (stream, other):
            with pytest.raises(TimeoutError):  # its start is sent; no worker takes it yet
                await asyncio.wait_for(sent.__anext__(), 1)
        stop = asyncio.Event()
        worker = Worker(backends, provider(), agents, name="w1")
        serving = asyncio.create_task(
            worker.serve_postgres(stop, requests=table, signer=RequestSigner(REQUEST_KEY))
        )
        try:
            await until_completed(app, "cut-1")
        finally:
            stop.set()
            await asyncio.wait_for(serving, 30)
        stored = await backends.log.read_run("cut-1")
        end = stored[-1].position
        await backends.log.truncate_before(end.partition, end.offset)
        rest = await asyncio.wait_for(stream.collect(), 30)
        with pytest.raises(InvalidInputError, match="already exists"):
            await asyncio.wait_for(other.collect(), 30)
    assert [(m.type, m.status) for m in rest] == [("result", "completed")]
    assert rest[0].seq == stored[-1].event.seq
