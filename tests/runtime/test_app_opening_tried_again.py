"""A stream's opening that failed part way is tried again at its next read (`RunStream`): the
start or answer it sent may have landed all the same, and the try again must follow that run,
not call it someone else's nor the answer someone else's.

* A fleet's start whose submit failed after the request was stored (its acknowledgement lost, a
  `BackendUnavailableError` that says it may still land): the worker starts the run, and the
  stream read again follows it to its end, the run started once. PostgreSQL: the application
  in fleet mode, a worker serving the requests table in the same process.
* An answer (``resume(run_id, value)``) cut off the moment it was recorded, before the run was
  handed on to be carried on: the run is carried on all the same, and the stream read again
  follows it from that answer rather than refuse it as answered already (in process, on the
  embedded SQLite file).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from support.appapi import agents, provider, until
from support.deployment import postgres_fleet_settings
from support.servers import REQUEST_KEY

import onward
from onward.errors import BackendUnavailableError
from onward.eventlog import ApprovalGranted, RunFinished, RunStarted
from onward.runtime.agent import Agent
from onward.runtime.backends import open_backends
from onward.runtime.fleet.requests import Request
from onward.runtime.fleet.requests_postgres import PostgresRequests
from onward.runtime.fleet.worker import Worker
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.settings import Settings
from onward.runtime.signing import RequestSigner

QUICK = Agent(name="quick", instructions="answer at once")


@pytest.mark.timeout(120)
async def test_a_start_stored_though_its_submit_failed_is_followed_when_read_again(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = postgres_fleet_settings(database_url, pg_schema)
    in_process = settings.model_copy(update={"app_mode": "in_process"})
    submit = PostgresRequests.submit
    lost: list[Request] = []

    async def acknowledgement_lost(self: PostgresRequests, *requests: Request) -> None:
        await submit(self, *requests)
        if not lost:
            lost.extend(requests)
            raise BackendUnavailableError("PostgreSQL did not answer (the insert was committed)")

    monkeypatch.setattr(PostgresRequests, "submit", acknowledgement_lost)
    run_id = "ack-lost"
    stop = asyncio.Event()
    async with (
        open_backends(in_process) as backends,
        PostgresRequests(database_url, schema=pg_schema) as table,
        onward.open(settings) as app,
    ):
        model = ScriptedProvider([reply("done")])
        worker = Worker(backends, model, {"quick": QUICK}, name="w", recheck_s=60)
        signer = RequestSigner(REQUEST_KEY)
        serving = asyncio.create_task(worker.serve_postgres(stop, requests=table, signer=signer))
        try:
            stream = app.query("go", {"agent": "quick", "run_id": run_id}, timeout=30)
            with pytest.raises(BackendUnavailableError):
                await anext(stream)

            async def ended() -> bool:
                events = [s.event for s in await backends.log.read_run(run_id)]
                return bool(events) and isinstance(events[-1], RunFinished)

            await until(ended, "the run the stored start asked for")  # it landed
            messages = await asyncio.wait_for(stream.collect(), 30)
        finally:
            stop.set()
            await asyncio.wait_for(serving, 30)
        events = [s.event for s in await backends.log.read_run(run_id)]
    assert [m.type for m in messages][-1] == "result"
    assert messages[-1].status == "completed"
    assert sum(isinstance(e, RunStarted) for e in events) == 1


@pytest.mark.timeout(60)
async def test_an_answer_cut_off_once_recorded_carries_the_run_on_when_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")
    run_id = "answer-cut-off"
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        asked = await app.query(
            "pay 5", {"agent": "payer", "run_id": run_id}, follow_waits=False
        ).collect()
        assert asked[-1].is_hil_request
        runner = app._worker.runner  # type: ignore[union-attr]
        approve = runner.approve
        stream = app.resume(run_id, {"ok": True}, after=asked[-1].position)
        reading = asyncio.create_task(anext(stream))

        async def recorded_then_cut_off(*args: Any, **kwargs: Any) -> Any:
            answered = await approve(*args, **kwargs)
            reading.cancel()  # the reader gives up the moment its answer is recorded
            await asyncio.sleep(0)
            return answered

        monkeypatch.setattr(runner, "approve", recorded_then_cut_off)
        with pytest.raises(asyncio.CancelledError):
            await reading
        monkeypatch.setattr(runner, "approve", approve)
        rest = await asyncio.wait_for(stream.collect(), 30)
        events = [s.event for s in await app.backends.log.read_run(run_id)]
    assert rest[-1].type == "result"
    assert rest[-1].status == "completed"
    assert sum(isinstance(e, ApprovalGranted) for e in events) == 1


@pytest.mark.timeout(60)
async def test_an_answer_cut_off_once_recorded_carries_the_run_on_all_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process: nobody reads the stream again, and the answered run must not be left for
    nobody to carry on (the app's worker takes no requests but the app's own)."""
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")
    run_id = "answer-cut-off"
    async with onward.open(settings, agents=agents, provider=provider()) as app:
        asked = await app.query(
            "pay 5", {"agent": "payer", "run_id": run_id}, follow_waits=False
        ).collect()
        runner = app._worker.runner  # type: ignore[union-attr]
        approve = runner.approve
        reading = asyncio.create_task(anext(app.resume(run_id, {"ok": True})))

        async def recorded_then_cut_off(*args: Any, **kwargs: Any) -> Any:
            answered = await approve(*args, **kwargs)
            reading.cancel()
            await asyncio.sleep(0)
            return answered

        monkeypatch.setattr(runner, "approve", recorded_then_cut_off)
        with pytest.raises(asyncio.CancelledError):
            await reading
        assert asked[-1].is_hil_request
        for _ in range(200):
            state = await app.get_session_state(run_id)
            if state is not None and state.status == "completed":
                break
            await asyncio.sleep(0.05)
        assert state is not None
        assert state.status == "completed", state
