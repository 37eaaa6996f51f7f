"""PostgreSQL restarted under a worker serving the requests table (``ONWARD_BACKEND=postgres``):
the worker neither dies nor stops taking requests. Its claims, its notifications' connection and
every store go down together; once the server is back a request submitted afterwards is acted
on (found by polling, the notifications' connection being gone), and the worker drains cleanly.

The cluster is private (the shared one serves other tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import pytest
from support.appapi import agents, provider, until
from support.pg import create_schema
from support.private_servers import PrivatePostgres
from support.servers import REQUEST_KEY

from onward.errors import BackendUnavailableError
from onward.runtime.backends import Backends, open_backends
from onward.runtime.fleet.requests import StartRun
from onward.runtime.fleet.requests_postgres import PostgresRequests
from onward.runtime.fleet.worker import Worker
from onward.runtime.settings import SecretUrl, Settings
from onward.runtime.signing import RequestSigner

pytestmark = [pytest.mark.faults]
DOWN_S = 3.0


async def _completed(backends: Backends, run_id: str) -> bool:
    with contextlib.suppress(BackendUnavailableError):
        row = await backends.frontiers.get(run_id)
        return row is not None and row.summary.status == "completed"
    return False


async def _submit_once_back(requests: PostgresRequests, request: StartRun) -> None:
    """Submit, retrying while the server is still coming back."""
    for _ in range(200):
        try:
            await requests.submit(request)
        except BackendUnavailableError:
            await asyncio.sleep(0.2)
        else:
            return
    raise AssertionError("PostgreSQL did not come back")


@pytest.mark.timeout(240)
async def test_a_worker_keeps_serving_the_requests_table_through_a_restart(
    private_postgres: PrivatePostgres,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="onward.worker")
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    url = private_postgres.url
    schema = await create_schema(url)
    settings = Settings(
        backend="postgres",
        database_url=SecretUrl(url),
        database_schema=schema,
        partitions=2,
        backend_timeout=5,
    )
    signer = RequestSigner(REQUEST_KEY)
    stop = asyncio.Event()
    async with (
        open_backends(settings) as backends,
        PostgresRequests(url, schema=schema, signer=signer, timeout_s=5) as requests,
    ):
        worker = Worker(backends, provider(), agents, name="w", recheck_s=1, backoff_s=0.2)
        serving = asyncio.create_task(
            worker.serve_postgres(stop, requests=requests, signer=signer, poll_s=0.5)
        )
        try:
            await requests.submit(StartRun(run_id="before", tenant="acme", agent="stepper"))
            await until(lambda: _completed(backends, "before"), "the run before the restart")

            await asyncio.to_thread(private_postgres.stop, "immediate")
            await asyncio.sleep(DOWN_S)
            await asyncio.to_thread(private_postgres.start)

            after = StartRun(run_id="after", tenant="acme", agent="stepper")
            await _submit_once_back(requests, after)
            await until(lambda: _completed(backends, "after"), "the run after the restart")
            assert not serving.done(), serving
            await until(lambda: _none_waiting(requests), "both requests deleted")
        finally:
            stop.set()
            await asyncio.wait_for(serving, 60)
    assert worker.stats.started == 2
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "finding them by polling" in warned


async def _none_waiting(requests: PostgresRequests) -> bool:
    with contextlib.suppress(BackendUnavailableError):
        return await requests.waiting() == 0
    return False
