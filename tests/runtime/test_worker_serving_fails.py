"""A worker whose serving fails (its requests table refuses a statement for good) still stops
the runs it drives at their next boundary and hands their leases back before it raises, as a
drain does: otherwise they go on in the background of a worker that has given up, and the
process that exits cuts them off mid-step, their leases held for a ttl."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import asyncpg
import pytest
from support.appapi import agents, script
from support.servers import REQUEST_KEY

from onward.errors import OnwardError
from onward.eventlog import Message
from onward.runtime.agent import Agent
from onward.runtime.backends import open_backends
from onward.runtime.fleet.requests import StartRun
from onward.runtime.fleet.requests_postgres import PostgresRequests
from onward.runtime.fleet.worker import Worker
from onward.runtime.providers import ModelReply
from onward.runtime.settings import Settings


class _HeldModel:
    """`script`, each call held until ``gate`` is set (``asked`` set meanwhile)."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.gate = asyncio.Event()

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        self.asked.set()
        await self.gate.wait()
        return script(messages)


def _settings(database_url: str, schema: str) -> Settings:
    return Settings.model_validate(
        {
            "ONWARD_BACKEND": "postgres",
            "DATABASE_URL": database_url,
            "ONWARD_DATABASE_SCHEMA": schema,
            "ONWARD_PARTITIONS": "4",
            "ONWARD_REQUEST_KEY": REQUEST_KEY,
            "ONWARD_APP_MODE": "in_process",
        }
    )


async def test_a_worker_whose_requests_table_fails_stops_its_runs_before_it_raises(
    database_url: str, pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    stop = asyncio.Event()
    async with (
        open_backends(_settings(database_url, pg_schema)) as backends,
        PostgresRequests(database_url, schema=pg_schema) as table,
    ):
        model = _HeldModel()
        worker = Worker(backends, model, agents, name="w", recheck_s=60, backoff_s=0.1)
        serving = asyncio.create_task(
            worker.serve_postgres(stop, requests=table, accept_unsigned=True, poll_s=0.1)
        )
        in_flight_when_it_ended: list[int] = []
        serving.add_done_callback(lambda _: in_flight_when_it_ended.append(worker.in_flight))
        try:
            await table.submit(StartRun(run_id="r1", tenant="acme", agent="stepper", input="go"))
            await asyncio.wait_for(model.asked.wait(), 30)  # r1 is in a model call
            conn = await asyncpg.connect(database_url)
            try:
                await conn.execute(
                    f'ALTER TABLE "{pg_schema}".onward_requests RENAME TO onward_requests_gone'
                )
            finally:
                await conn.close()
            await asyncio.wait({serving}, timeout=3)  # the next claim fails
            model.gate.set()
            with pytest.raises(OnwardError):
                await asyncio.wait_for(serving, 30)
        finally:
            stop.set()
            model.gate.set()
            if not serving.done():
                serving.cancel()
        lease = await backends.leases.current("r1")
    assert in_flight_when_it_ended == [0]
    assert lease is None
