"""A PostgreSQL server that stops answering stops every store's call in bounded time: the
frontier store (frontiers, the transcript, positions, a projector's write) and the blob store,
not only the lease store the run tests cut.

Each store is opened through a `TcpProxy` with ``timeout_s`` of one second and answers a first
call; then the proxy goes silent (connections stay open, nothing comes back, new ones are
accepted and never answered: a partition or a hung server, which only a timeout ends). The
next call must raise the retryable `BackendUnavailableError` within the bound on the pooled
connection it has, and so must the call after it; opening a store against the silent server
must too. Once the proxy is restored, the same store answers again. And a run carried on while
one of the two is silent stops in bounded time, hands its lease back, and finishes afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from support import cli_agent
from support.crashes import Crash, CrashAt
from support.proxy import TcpProxy, through, upstream

from onward.errors import BackendUnavailableError
from onward.eventlog import RunStarted, SqliteEventLog
from onward.projections.postgres import PostgresFrontierStore
from onward.runtime import AgentRunner, SqliteLeaseStore
from onward.runtime.blobs import DEFAULT_THRESHOLD, PostgresBlobStore, digest_of
from onward.runtime.observability import HealthServer, probe
from onward.runtime.observability.server import READY_WITHIN_S, REFRESH_WITHIN_S

TENANT = "acme"
BOUND_S = 1.0
"""Every store's ``timeout_s`` here."""
GIVES_UP_WITHIN_S = 3 * BOUND_S + 2.0
"""A wait for a connection and one statement, and room for a loaded machine: still far below
the default bound (thirty seconds), let alone a wait without one."""
BODY = b"a body kept out of the log"

Store = PostgresFrontierStore | PostgresBlobStore
Call = Callable[[Any], Awaitable[object]]

CALLS: dict[str, tuple[type[Store], Call]] = {
    "frontiers": (PostgresFrontierStore, lambda s: s.load(["run-1"])),
    "transcript": (
        PostgresFrontierStore,
        lambda s: s.transcript("run-1", tenant=TENANT, through=10),
    ),
    "positions": (PostgresFrontierStore, lambda s: s.positions("projector")),
    "tool calls": (PostgresFrontierStore, lambda s: s.tool_calls("run-1")),
    "write": (PostgresFrontierStore, lambda s: s.write("projector", {0: 1}, [], [])),
    "blob put": (PostgresBlobStore, lambda s: s.put(BODY)),
    "blob get": (PostgresBlobStore, lambda s: s.get(digest_of(BODY))),
}


async def gives_up_in_bounded_time(call: Awaitable[object]) -> float:
    """How long ``call`` took to fail with `BackendUnavailableError` (a call still waiting
    long after the bound fails the test instead of hanging it)."""
    started = time.monotonic()
    with pytest.raises(BackendUnavailableError):
        await asyncio.wait_for(call, 10 * GIVES_UP_WITHIN_S)
    return time.monotonic() - started


async def answers_again(call: Call, store: Store) -> None:
    """The same store answers once the server does: at once, or after one call that finds a
    connection the restore reset (what that error tells the caller to do: retry)."""
    try:
        await call(store)
        return
    except BackendUnavailableError as lost:
        said = str(lost)
    if "was lost" not in said:
        pytest.fail(f"not a reset connection: {said}")
    await call(store)


@pytest.mark.parametrize("name", list(CALLS))
async def test_a_call_to_a_silent_postgres_fails_retryably_within_the_bound(
    database_url: str, pg_schema: str, name: str
) -> None:
    kind, call = CALLS[name]
    async with TcpProxy(*upstream(database_url)) as proxy:
        store = kind(through(database_url, proxy), schema=pg_schema, timeout_s=BOUND_S)
        async with store:
            if isinstance(store, PostgresBlobStore):
                await store.put(BODY)  # the body "blob get" reads
            await call(store)  # answered while the server answers
            await proxy.cut(silent=True)
            # On the pooled connection: the statement's bound ends it.
            took = await gives_up_in_bounded_time(call(store))
            assert BOUND_S * 0.9 <= took < GIVES_UP_WITHIN_S, f"{name}: {took:.1f} s"
            # And the call after it, whichever connection the pool gives it.
            took = await gives_up_in_bounded_time(call(store))
            assert BOUND_S * 0.9 <= took < GIVES_UP_WITHIN_S, f"{name} again: {took:.1f} s"
            await proxy.restore()
            await answers_again(call, store)


async def test_readiness_and_a_scrape_answer_within_their_bounds_while_postgres_is_silent(
    database_url: str, pg_schema: str
) -> None:
    """`/readyz` said "did not answer within 1s" only once the store's own bound had passed
    (thirty seconds by default), and a scrape waited as long: the probe and the refresh each
    waited for their cancelled call to give its connection back, which asks the silent server.
    """
    store_bound_s = 10.0  # far over the readiness and refresh bounds, as the default is
    async with TcpProxy(*upstream(database_url)) as proxy:
        store = PostgresFrontierStore(
            through(database_url, proxy), schema=pg_schema, timeout_s=store_bound_s
        )
        async with store:

            async def ready() -> str | None:
                return await probe("the frontier store", store.positions("projector"))

            async def refresh() -> None:
                await store.positions("projector")

            async with (
                HealthServer(CollectorRegistry(), ready=ready, refresh=refresh) as health,
                httpx.AsyncClient(base_url=health.url, timeout=4 * store_bound_s) as http,
            ):
                assert (await http.get("/readyz")).status_code == 200
                await proxy.cut(silent=True)
                started = time.monotonic()
                answer = await http.get("/readyz")
                took = time.monotonic() - started
                assert (answer.status_code, answer.text) == (
                    503,
                    "the frontier store did not answer within 1s\n",
                )
                assert took < READY_WITHIN_S, f"/readyz: {took:.1f} s"
                started = time.monotonic()
                assert (await http.get("/metrics")).status_code == 200
                took = time.monotonic() - started
                assert took < REFRESH_WITHIN_S + 1.0, f"/metrics: {took:.1f} s"
                await proxy.restore()


@pytest.mark.parametrize("kind", [PostgresFrontierStore, PostgresBlobStore])
async def test_opening_a_store_on_a_silent_postgres_fails_retryably_within_the_bound(
    database_url: str, pg_schema: str, kind: type[Store]
) -> None:
    async with TcpProxy(*upstream(database_url)) as proxy:
        await proxy.cut(silent=True)
        store = kind(through(database_url, proxy), schema=pg_schema, timeout_s=BOUND_S)
        took = await gives_up_in_bounded_time(store.start())
        assert took < GIVES_UP_WITHIN_S, f"opening gave up after {took:.1f} s"
        assert not store.is_open
        await proxy.restore()


# A run carried on while PostgreSQL is silent: the resume's first read of the run (its frontier
# row), or of a body its history keeps in the blob store, fails within the bound, the run's
# lease is handed back, and once the server answers a resume finishes the run with its booking
# made once. The log and the leases are in SQLite, so only the store under test is cut.

INPUT = "book 3A " + "x" * (DEFAULT_THRESHOLD + 1)
"""A run input over the claim-check threshold: its body is kept in the blob store."""
STOPS_WITHIN_S = GIVES_UP_WITHIN_S + 1.0
"""The failing call's bound, and the claim and release around it."""


@pytest.mark.parametrize("silent", ["frontiers", "blobs"])
async def test_a_resume_while_postgres_is_silent_stops_in_bounded_time_and_finishes_after(
    database_url: str, pg_schema: str, tmp_path: Path, silent: str
) -> None:
    db = tmp_path / "onward.db"
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    async with AsyncExitStack() as stack:
        proxy = await stack.enter_async_context(TcpProxy(*upstream(database_url)))
        urls = {"frontiers": database_url, "blobs": database_url}
        urls[silent] = through(database_url, proxy)
        log = await stack.enter_async_context(SqliteEventLog(db))
        leases = await stack.enter_async_context(SqliteLeaseStore(db))
        frontiers = await stack.enter_async_context(
            PostgresFrontierStore(urls["frontiers"], schema=pg_schema, timeout_s=BOUND_S)
        )
        blobs = await stack.enter_async_context(
            PostgresBlobStore(urls["blobs"], schema=pg_schema, timeout_s=BOUND_S)
        )

        def runner(worker: str, observer: CrashAt | None = None) -> AgentRunner:
            return AgentRunner(
                provider=cli_agent.booking_model(),
                log=log,
                leases=leases,
                frontiers=frontiers,
                blobs=blobs,
                worker=worker,
                observer=observer,
            )

        with contextlib.suppress(Crash):
            await runner("w1", CrashAt("model.call")).run(
                cli_agent.booker(), INPUT, tenant=TENANT, run_id=run_id
            )
        [first] = [s.event for s in await log.read_run(run_id)][:1]
        assert isinstance(first, RunStarted)
        assert first.input != INPUT  # the log holds a reference; the body is in the blob store
        await proxy.cut(silent=True)
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError):
            await asyncio.wait_for(
                runner("w2").resume(cli_agent.booker(), run_id, tenant=TENANT),
                10 * STOPS_WITHIN_S,
            )
        took = time.monotonic() - started
        assert BOUND_S * 0.9 <= took < STOPS_WITHIN_S, f"the resume stopped after {took:.1f} s"
        assert await leases.current(run_id) is None  # handed back, not held for its ttl

        await proxy.restore()
        result = await runner("w3").resume(cli_agent.booker(), run_id, tenant=TENANT)
    assert result.status == "completed"
    assert cli_agent.effects("book", run_id, "b") == 1
