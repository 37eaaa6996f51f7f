"""The fleet's requests in PostgreSQL (``onward_requests``), for a deployment on PostgreSQL alone.

The table itself: a run's requests are taken in order, a claim lapses when its worker dies and
the next worker takes the request, a full worker takes cancels alone, bad input stores nothing.
End to end: an application in fleet mode on ``ONWARD_BACKEND=postgres`` starts, answers and
cancels runs through real ``onward worker`` processes, and a row nobody signed is set aside.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import pytest_asyncio
from support.appapi import agents, naps_begun, one_more_turn, provider, until
from support.appapi import script as provider_script
from support.deployment import postgres_fleet_settings
from support.fleet_checks import SlowListings
from support.pg import new_schema_name
from support.processes import TESTS, kill_running, spawn_onward, stop_children
from support.proxy import TcpProxy
from support.servers import REQUEST_KEY
from typer.testing import CliRunner

import onward
from onward.errors import (
    InvalidInputError,
    NothingToResumeError,
    ResumeConflictError,
    RunTimeoutError,
)
from onward.eventlog import Message
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.cli import app as cli
from onward.runtime.demo_ledger import Ledger
from onward.runtime.fleet.requests import (
    AnswerRequest,
    CancelRun,
    ResumeRun,
    StartRun,
    TagRun,
    prepare_requests,
)
from onward.runtime.fleet.requests_postgres import ClaimedRequest, PostgresRequests
from onward.runtime.fleet.worker import Worker
from onward.runtime.providers import ModelReply
from onward.runtime.redaction import Redactor
from onward.runtime.settings import Settings
from onward.runtime.signing import RequestSigner
from onward.testing import storage

PARTITIONS = 4


@pytest_asyncio.fixture
async def table(database_url: str, pg_schema: str) -> AsyncIterator[PostgresRequests]:
    async with PostgresRequests(database_url, schema=pg_schema) as requests:
        yield requests


def _start(run_id: str, value: object = "go") -> StartRun:
    return StartRun(run_id=run_id, tenant="acme", agent="stepper", input=value)


async def test_a_run_s_requests_are_taken_in_order_each_once(table: PostgresRequests) -> None:
    await table.submit(_start("r1"), ResumeRun(run_id="r1", tenant="acme"), _start("r2"))
    first = await table.claim("w1", 10)
    # The resume waits while r1's start is unclaimed; r2's start does not wait for r1's.
    assert [(r.run_id, r.kind) for r in first] == [("r1", "start"), ("r2", "start")]
    # Claimed is not enough: the resume waits until r1's start is acted on (r1 exists).
    assert await table.claim("w2", 10) == []
    await table.finish("w1", [first[0].id])
    second = await table.claim("w2", 10)
    assert [(r.run_id, r.kind) for r in second] == [("r1", "resume")]
    assert await table.claim("w3", 10) == []
    assert [type(r.request()) for r in first + second] == [StartRun, StartRun, ResumeRun]


async def test_a_dead_worker_s_claim_lapses_to_the_next_and_acted_on_is_deleted(
    table: PostgresRequests,
) -> None:
    await table.submit(_start("r1"))
    (mine,) = await table.claim("dead", 10, claim_s=0.3)
    assert await table.claim("next", 10) == []
    taken_by_next: list[ClaimedRequest] = []

    async def lapsed() -> bool:
        taken_by_next.extend(await table.claim("next", 10))
        return bool(taken_by_next)

    await until(lapsed, "the dead worker's claim lapsing")
    (taken,) = taken_by_next
    assert taken.id == mine.id
    await table.finish("dead", [mine.id])  # the dead worker's late word changes nothing
    assert await table.waiting() == 1
    await table.finish("next", [taken.id])
    assert await table.waiting() == 0


async def test_a_request_handed_back_is_taken_at_once_and_renewed_claims_hold(
    table: PostgresRequests,
) -> None:
    await table.submit(_start("r1"), _start("r2"))
    one, two = await table.claim("w1", 10, claim_s=0.5)
    await table.release("w1", [one.id])
    await asyncio.sleep(0.3)
    await table.renew("w1", [two.id], 5)
    await asyncio.sleep(0.4)
    assert [r.id for r in await table.claim("w2", 10)] == [one.id]


async def test_a_full_worker_takes_cancels_alone_past_what_waits_before_them(
    table: PostgresRequests,
) -> None:
    await table.submit(_start("r1"), CancelRun(run_id="r0", tenant="acme", by="ann"))
    taken = await table.claim("full", 10, cancels_only=True)
    assert [(r.run_id, r.kind) for r in taken] == [("r0", "cancel")]


async def test_a_request_a_worker_would_refuse_stores_nothing_of_its_batch(
    table: PostgresRequests,
) -> None:
    await table.submit(_start("kept"))
    with pytest.raises(InvalidInputError, match=r"TagRun\.label"):
        await table.submit(_start("r1"), TagRun(run_id="r1", tenant="acme", label=""))
    with pytest.raises(InvalidInputError, match=r"StartRun\.input"):
        await table.submit(_start("r2", float("nan")))
    assert await table.waiting() == 1


async def test_values_are_masked_signed_and_waiting_workers_are_woken(
    database_url: str, pg_schema: str
) -> None:
    signer = RequestSigner(REQUEST_KEY)
    async with PostgresRequests(database_url, schema=pg_schema, signer=signer) as table:
        async with table.listening() as woken:
            await table.submit(_start("r1", {"note": "sk-ant-abcdefghijklmnopqrstuvwx"}))
            await asyncio.wait_for(woken.wait(), 10)
        (row,) = await table.claim("w1", 1)
    assert b"sk-ant-abcdefghijklmnopqrstuvwx" not in row.value
    assert row.signature is not None
    assert signer.refusal(b"r1", row.value, [("onward-signature", row.signature)]) is None


async def test_a_schema_with_a_long_name_takes_requests_and_wakes_workers(
    database_url: str,
) -> None:
    """A schema name may be 63 bytes long; the notification channel named after it may not
    (PostgreSQL refuses a ``pg_notify`` channel of 64 bytes or more): every submit to such a
    schema failed, storing nothing."""
    schema = f"{new_schema_name()}_{'x' * 48}"[:63]
    await storage.create_schema(database_url, schema, migrated=True)
    try:
        async with PostgresRequests(database_url, schema=schema) as table:
            async with table.listening() as woken:
                await table.submit(_start("r1"))
                await asyncio.wait_for(woken.wait(), 10)
            (row,) = await table.claim("w1", 1)
        assert row.run_id == "r1"
    finally:
        await storage.drop_schema(database_url, schema)


async def test_a_cancel_s_reason_is_masked_as_the_event_log_masks_it(
    table: PostgresRequests,
) -> None:
    """A cancel's ``why`` is free text that ends the run as its recorded reason (masked
    there); the table keeps it for as long as a request waits, so it is masked before too."""
    why = "leaked in chat, rotate it: sk-ant-abcdefghijklmnopqrstuvwx"

    await table.submit(CancelRun(run_id="r1", tenant="acme", by="ann", why=why))

    (row,) = await table.claim("w1", 1)
    assert b"sk-ant-abcdefghijklmnopqrstuvwx" not in row.value
    request = row.request()
    assert isinstance(request, CancelRun)
    assert request.why == "leaked in chat, rotate it: [REDACTED]"


async def test_a_closed_table_says_so() -> None:
    table = PostgresRequests("postgresql://nobody@127.0.0.1:1/none")
    with pytest.raises(InvalidInputError, match="requests table is not open"):
        await table.submit(_start("r1"))


# -- end to end: an application in fleet mode and `onward worker` processes on PostgreSQL ------


def _env(database_url: str, schema: str, tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(TESTS),
        "ONWARD_BACKEND": "postgres",
        "DATABASE_URL": database_url,
        "ONWARD_DATABASE_SCHEMA": schema,
        "ONWARD_PARTITIONS": str(PARTITIONS),
        "ONWARD_REQUEST_KEY": REQUEST_KEY,
        "APP_LEDGER": str(tmp_path / "ledger.jsonl"),
    }


async def _worker(env: dict[str, str], tmp_path: Path, name: str) -> asyncio.subprocess.Process:
    argv = ["worker", "--agent", "support.appapi:agents", "--provider", "support.appapi:provider"]
    argv += ["--name", name, "--lease-ttl", "3", "--recheck", "1", "--backoff", "0.2"]
    child = await spawn_onward(tmp_path / f"{name}.log", env, *argv)

    async def ready() -> bool:
        assert child.returncode is None, (tmp_path / f"{name}.log").read_text()
        ready = "ready (postgres: requests table), taking starts of looper, payer, stepper"
        return ready in (tmp_path / f"{name}.log").read_text()

    try:
        await until(ready, f"{name} ready")
    except BaseException:
        await kill_running([child])  # it would serve on after the test
        raise
    return child


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_an_app_in_fleet_mode_on_postgres_runs_answers_and_cancels_through_workers(
    database_url: str, pg_schema: str, tmp_path: Path
) -> None:
    env = _env(database_url, pg_schema, tmp_path)
    workers: list[asyncio.subprocess.Process] = []
    try:
        for n in range(2):  # one by one: a failed start leaves those before it to be stopped
            workers.append(await _worker(env, tmp_path, f"w{n}"))  # noqa: PERF401
        async with onward.open(postgres_fleet_settings(database_url, pg_schema, PARTITIONS)) as app:
            done = await app.query("work", {"agent": "stepper"}, timeout=60).collect()
            assert done[-1].type == "result"
            pay = {"agent": "payer", "run_id": "p1"}
            waiting = await app.query("pay 5", pay, follow_waits=False, timeout=60).collect()
            assert waiting[-1].type == "approval_request"
            after = waiting[-1].position
            paid = await app.resume("p1", {"ok": "ann"}, after=after, timeout=60).collect()
            assert [m.type for m in paid][-1] == "result"
            paid_with = [
                e["approval"] for e in Ledger(env["APP_LEDGER"]).entries() if e["tool"] == "pay"
            ]
            assert paid_with == [{"ok": "ann"}]
            looping = app.query("loop", {"agent": "looper", "run_id": "l1"}, timeout=60)
            async for _ in looping:
                break  # it is going: a worker drives it
            await app.cancel("l1", by="ann", why="runaway")

            async def cancelled() -> bool:
                state = await app.get_session_state("l1")
                return state is not None and state.status == "cancelled"

            await until(cancelled, "l1 ended cancelled")
        async with PostgresRequests(database_url, schema=pg_schema) as table:
            await until(lambda: _none_waiting(table), "every request acted on and deleted")
    finally:
        await stop_children(workers, within_s=60)
    logs = [(tmp_path / f"w{n}.log").read_text() for n in range(2)]
    assert [w.returncode for w in workers] == [0, 0], logs


async def _none_waiting(table: PostgresRequests) -> bool:
    return await table.waiting() == 0


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_row_nobody_signed_is_set_aside_and_starts_nothing(
    database_url: str, pg_schema: str, tmp_path: Path
) -> None:
    env = _env(database_url, pg_schema, tmp_path)
    worker = await _worker(env, tmp_path, "w0")
    try:
        async with PostgresRequests(database_url, schema=pg_schema) as unsigned:
            await unsigned.submit(_start("forged"))
            await until(lambda: _none_waiting(unsigned), "the unsigned row set aside")
        conn = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
        try:
            started = await conn.fetchval("SELECT count(*) FROM onward_log WHERE run_id = 'forged'")
        finally:
            await conn.close()
    finally:
        worker.send_signal(signal.SIGTERM)
        await asyncio.wait_for(worker.wait(), 60)
    log = (tmp_path / "w0.log").read_text()
    assert "set aside: request not acted on" in log, log
    assert started == 0
    assert worker.returncode == 0, log


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_row_stored_again_days_after_it_was_signed_is_set_aside_and_starts_nothing(
    database_url: str, pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signed start captured from the table and stored again days later was acted on: a
    replay, once its run is collected. Now a row signed longer than ONWARD_REQUEST_MAX_AGE (a
    day) ago is set aside, saying so, and the worker goes on to the start sent afresh."""
    env = _env(database_url, pg_schema, tmp_path)
    three_days_ago = time.time() - 3 * 86_400
    with monkeypatch.context() as then:
        then.setattr(time, "time", lambda: three_days_ago)
        (captured,) = prepare_requests([_start("replayed")], Redactor(), RequestSigner(REQUEST_KEY))
    worker = await _worker(env, tmp_path, "w0")
    try:
        conn = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
        try:
            await conn.execute(
                "INSERT INTO onward_requests (run_id, kind, body, signature, agent) "
                "VALUES ($1, $2, $3, $4, $5)",
                captured.run_id,
                captured.kind,
                captured.value,
                captured.signature,
                "stepper",
            )
            async with PostgresRequests(
                database_url, schema=pg_schema, signer=RequestSigner(REQUEST_KEY)
            ) as table:
                await until(lambda: _none_waiting(table), "the replayed row set aside")
                started = await conn.fetchval(
                    "SELECT count(*) FROM onward_log WHERE run_id = 'replayed'"
                )
                await table.submit(_start("replayed"))

                async def ran() -> bool:
                    return bool(
                        await conn.fetchval(
                            "SELECT count(*) FROM onward_log WHERE run_id = 'replayed'"
                        )
                    )

                await until(ran, "the start sent afresh acted on")
        finally:
            await conn.close()
    finally:
        worker.send_signal(signal.SIGTERM)
        await asyncio.wait_for(worker.wait(), 60)
    log = (tmp_path / "w0.log").read_text()
    assert started == 0
    assert re.search(r"set aside: request not acted on: expired: signed 2592\d\ds ago", log), log
    assert worker.returncode == 0, log


async def test_a_worker_renews_its_claim_while_it_acts_and_deletes_the_row_after(
    database_url: str, pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel of a run someone else holds waits for it to be free; meanwhile the claim on
    the request, 0.6 s unrenewed, must never lapse (another worker would take it)."""
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    settings = Settings.model_validate(
        {
            "ONWARD_BACKEND": "postgres",
            "DATABASE_URL": database_url,
            "ONWARD_DATABASE_SCHEMA": pg_schema,
            "ONWARD_PARTITIONS": str(PARTITIONS),
        }
    )
    signer = RequestSigner(REQUEST_KEY)
    stop = asyncio.Event()
    async with (
        open_backends(settings) as backends,
        PostgresRequests(database_url, schema=pg_schema, signer=signer) as table,
    ):
        waiting = await backends.runner(provider()).run(
            agents["payer"], "pay 5", tenant="acme", run_id="held"
        )
        assert waiting.status == "waiting"
        lease = await backends.leases.acquire("held", tenant="acme", holder="someone", ttl_s=60)
        worker = Worker(backends, provider(), agents, name="a", recheck_s=60, backoff_s=0.1)
        serving = asyncio.create_task(
            worker.serve_postgres(stop, requests=table, signer=signer, claim_s=0.6, poll_s=0.1)
        )
        try:
            await table.submit(CancelRun(run_id="held", tenant="acme", by="ann"))

            async def claimed() -> bool:
                return await _claim_of(database_url, pg_schema) == ("a", True)

            await until(claimed, "the worker claiming the cancel")
            claims = []
            for _ in range(40):  # 2 s of a cancel waiting for the run: three claims' worth
                claims.append(await _claim_of(database_url, pg_schema))
                await asyncio.sleep(0.05)
            await backends.leases.release(lease)
            await until(lambda: _none_waiting(table), "the cancel acted on and deleted")
        finally:
            stop.set()
            await asyncio.wait_for(serving, 30)
        ended = await backends.runner(provider()).inspect("held", tenant="acme")
    assert set(claims) == {("a", True)}, claims
    assert ended.status == "cancelled"


async def _claim_of(database_url: str, schema: str) -> tuple[str | None, bool] | None:
    conn = await asyncpg.connect(database_url, server_settings={"search_path": schema})
    try:
        row = await conn.fetchrow(
            "SELECT claimed_by, claimed_until > now() AS live FROM onward_requests"
        )
    finally:
        await conn.close()
    return None if row is None else (row["claimed_by"], bool(row["live"]))


async def test_workers_carrying_different_agents_each_take_their_own_agents_starts(
    database_url: str, pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One table, workers with different agents: each start goes to a worker that carries its
    agent (a worker without it would have refused it for good), and a start for an agent no
    worker carries waits in the table, unclaimed, until a worker that carries it comes."""
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    settings = postgres_fleet_settings(database_url, pg_schema, PARTITIONS).model_copy(
        update={"app_mode": "in_process"}
    )
    stop, later = asyncio.Event(), asyncio.Event()
    async with (
        open_backends(settings) as backends,
        PostgresRequests(database_url, schema=pg_schema) as table,
    ):

        def worker(name: str, *carried: str) -> Worker:
            chosen = {n: agents[n] for n in carried}
            return Worker(backends, provider(), chosen, name=name, recheck_s=60, backoff_s=0.1)

        steps, pays = worker("steps", "stepper"), worker("pays", "payer")
        serving = [
            asyncio.create_task(w.serve_postgres(stop, requests=table, accept_unsigned=True))
            for w in (steps, pays)
        ]
        try:
            await table.submit(
                _start("s1"),
                StartRun(run_id="p1", tenant="acme", agent="payer", input="pay 5"),
                _start("s2"),
                StartRun(run_id="l1", tenant="acme", agent="looper", input="loop"),
            )

            async def one_left() -> bool:
                return await table.waiting() == 1

            await until(one_left, "the stepper's and the payer's starts acted on")
            await asyncio.sleep(1.5)  # a second and more of polls: nobody takes the looper's
            assert await _claim_of(database_url, pg_schema) == (None, False)
            assert (steps.stats.started, pays.stats.started) == (2, 1)
            assert (steps.stats.failures, pays.stats.failures) == (0, 0)
            loops = worker("loops", "looper")
            serving.append(
                asyncio.create_task(
                    loops.serve_postgres(later, requests=table, accept_unsigned=True)
                )
            )
            await until(lambda: _none_waiting(table), "the looper's start taken by its worker")
            assert loops.carrying("l1")  # it loops until stopped: a worker carrying it drives it
        finally:
            stop.set()
            later.set()
            await asyncio.wait_for(asyncio.gather(*serving), 60)
        frontiers = backends.frontiers
        statuses = {r: (await frontiers.get(r)) for r in ("s1", "s2", "p1")}
    assert {r: f is not None and f.summary.status for r, f in statuses.items()} == {
        "s1": "completed",
        "s2": "completed",
        "p1": "waiting",
    }


async def test_an_answer_goes_to_a_worker_carrying_the_run_s_agent(
    database_url: str,
    pg_schema: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An application's answer names the run's agent, so only a worker carrying it takes it:
    one that did not could record it but not carry the run on, which then waited for a
    carrier's next look for lapsed runs (a minute here). While none is there, the stream
    following the answered run says which worker it waits for."""
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    settings = postgres_fleet_settings(database_url, pg_schema, PARTITIONS)
    in_process = settings.model_copy(update={"app_mode": "in_process"})
    async with (
        open_backends(in_process) as backends,
        PostgresRequests(database_url, schema=pg_schema) as table,
        onward.open(settings) as app,
    ):

        def serve(name: str, carried: str, stop: asyncio.Event) -> asyncio.Task[None]:
            worker = Worker(
                backends, provider(), {carried: agents[carried]}, name=name, recheck_s=60
            )
            signed = RequestSigner(REQUEST_KEY)  # the app signs with the settings' key
            return asyncio.create_task(worker.serve_postgres(stop, requests=table, signer=signed))

        first_payer, steps, second_payer = asyncio.Event(), asyncio.Event(), asyncio.Event()
        serving = [serve("pays", "payer", first_payer), serve("steps", "stepper", steps)]
        try:
            asked = app.query("pay 5", {"agent": "payer", "run_id": "p1"}, follow_waits=False)
            assert (await asked.collect())[-1].is_hil_request
            first_payer.set()  # the payer's worker goes; the stepper's stays
            await asyncio.wait_for(serving[0], 30)

            napping = naps_begun(app, monkeypatch)
            answered = app.resume("p1", {"authorized": True}, timeout=60)
            following = asyncio.create_task(answered.collect())
            await until(lambda: _stored_for(database_url, pg_schema, "payer"), "answer stored")

            async def said_unheld() -> bool:
                return any("no worker has taken" in r.getMessage() for r in caplog.records)

            with caplog.at_level("INFO", logger="onward.app"):
                # Said after `SAY_UNHELD_AFTER_S`: many of the stepper's polls meanwhile.
                await until(said_unheld, "the stream saying no worker has taken its run")
                # Said once: the stream's next turn, which would say it again, is waited for.
                await one_more_turn(answered, napping)
            assert await table.waiting() == 1  # not taken by a worker that cannot carry it
            said = [m for r in caplog.records if "no worker has taken" in (m := r.getMessage())]
            assert len(said) == 1, said
            assert "run 'p1': nothing new for" in said[0]
            assert "is a worker carrying agent 'payer' running" in said[0]

            serving.append(serve("pays-again", "payer", second_payer))
            messages = await asyncio.wait_for(following, 30)  # well before the minute
        finally:
            for stop in (first_payer, steps, second_payer):
                stop.set()
            await asyncio.wait_for(asyncio.gather(*serving), 60)
    assert messages[-1].output == "paid"
    assert [e["approval"] for e in Ledger(tmp_path / "ledger.jsonl").entries()] == [
        {"authorized": True}
    ]


async def _stored_for(database_url: str, schema: str, agent: str) -> bool:
    """Whether an answer stored for ``agent`` waits in the table."""
    conn = await asyncpg.connect(database_url, server_settings={"search_path": schema})
    try:
        found = await conn.fetchval(
            "SELECT count(*) FROM onward_requests WHERE kind = 'answer' AND agent = $1", agent
        )
    finally:
        await conn.close()
    return bool(found)


async def test_a_start_whose_agent_column_was_changed_is_set_aside(
    table: PostgresRequests, database_url: str, pg_schema: str
) -> None:
    """The agent column routes a start but is not signed: a row whose column names another
    agent than its body is refused when read, not acted on by a worker for the wrong agent."""
    await table.submit(_start("r1"))
    conn = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
    try:
        await conn.execute("UPDATE onward_requests SET agent = 'payer'")
    finally:
        await conn.close()
    assert await table.claim("stepper-only", 10, agents=["stepper"]) == []
    (row,) = await table.claim("payer-only", 10, agents=["payer"])
    with pytest.raises(InvalidInputError, match="stored for agent 'payer' but names another"):
        row.request()


async def test_a_start_stored_for_no_agent_taken_by_a_worker_without_it_waits_for_one_with_it(
    database_url: str,
    pg_schema: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A start stored without the agent column (before migration 0019, by a sender of then, or
    with the unsigned column emptied) goes to any worker. One without the agent its signed
    body names neither ends the run failed (its sender meant it for a worker that carries the
    agent) nor sets it aside (deleted: lost to that worker, and its stream ended): it routes
    the row to that agent, and a worker carrying it starts the run."""
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    settings = postgres_fleet_settings(database_url, pg_schema, PARTITIONS).model_copy(
        update={"app_mode": "in_process"}
    )
    signer = RequestSigner(REQUEST_KEY)
    async with (
        open_backends(settings) as backends,
        PostgresRequests(database_url, schema=pg_schema, signer=signer) as table,
    ):
        await table.submit(_start("r1"))
        conn = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
        try:
            await conn.execute("UPDATE onward_requests SET agent = NULL")

            async def routed() -> bool:
                return bool(
                    await conn.fetchval(
                        "SELECT count(*) FROM onward_requests "
                        "WHERE agent = 'stepper' AND claimed_by IS NULL"
                    )
                )

            pays = Worker(
                backends, provider(), {"payer": agents["payer"]}, name="pays", recheck_s=60
            )
            stop_paying = asyncio.Event()
            paying = asyncio.create_task(
                pays.serve_postgres(stop_paying, requests=table, signer=signer, poll_s=0.1)
            )
            try:
                with caplog.at_level("INFO", logger="onward.worker"):
                    await until(routed, "the row routed to its agent")
                    await asyncio.sleep(0.5)  # many polls of a worker that cannot start it
            finally:
                stop_paying.set()
                await asyncio.wait_for(paying, 30)
        finally:
            await conn.close()
        assert await table.waiting() == 1
        assert not await backends.runner(provider()).resumer.exists("r1")
        assert (pays.stats.set_aside, pays.stats.failures, pays.stats.started) == (0, 0, 0)
        said = [m for r in caplog.records if "routed" in (m := r.getMessage())]
        assert len(said) == 1, said
        assert "names agent 'stepper'" in said[0]

        steps = Worker(
            backends, provider(), {"stepper": agents["stepper"]}, name="steps", recheck_s=60
        )
        stop = asyncio.Event()
        serving = asyncio.create_task(steps.serve_postgres(stop, requests=table, signer=signer))
        try:
            await until(lambda: _none_waiting(table), "the row acted on")
            await steps.drained()
        finally:
            stop.set()
            await asyncio.wait_for(serving, 30)
        assert steps.stats.set_aside == 0
        assert await backends.runner(provider()).resumer.exists("r1")


async def test_a_start_stored_for_no_agent_is_started_by_a_worker_carrying_its_agent(
    database_url: str, pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start stored without the agent column (before migration 0019, or by a sender of
    then) goes to any worker, as the migration says: one that carries the agent its signed
    body names starts it; it is not set aside."""
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    settings = postgres_fleet_settings(database_url, pg_schema, PARTITIONS).model_copy(
        update={"app_mode": "in_process"}
    )
    signer = RequestSigner(REQUEST_KEY)
    stop = asyncio.Event()
    async with (
        open_backends(settings) as backends,
        PostgresRequests(database_url, schema=pg_schema, signer=signer) as table,
    ):
        await table.submit(_start("r1"))
        conn = await asyncpg.connect(database_url, server_settings={"search_path": pg_schema})
        try:
            await conn.execute("UPDATE onward_requests SET agent = NULL")
        finally:
            await conn.close()
        steps = Worker(
            backends, provider(), {"stepper": agents["stepper"]}, name="steps", recheck_s=60
        )
        serving = asyncio.create_task(steps.serve_postgres(stop, requests=table, signer=signer))
        try:
            await until(lambda: _none_waiting(table), "the row acted on or set aside")
            await steps.drained()
        finally:
            stop.set()
            await asyncio.wait_for(serving, 30)
        assert steps.stats.set_aside == 0
        assert await backends.runner(provider()).resumer.exists("r1")


async def test_a_start_no_worker_took_is_cancelled_from_the_table_and_its_stream_ends(
    database_url: str, pg_schema: str
) -> None:
    """A start waits in the table for a worker carrying its agent (here none runs at all):
    `cancel` takes it back and records the run ended cancelled, so whoever follows it reads
    who cancelled it instead of waiting on."""
    async with onward.open(postgres_fleet_settings(database_url, pg_schema, PARTITIONS)) as app:
        stream = app.query("loop", {"agent": "looper", "run_id": "waits"}, timeout=60)
        following = asyncio.create_task(stream.collect())
        async with PostgresRequests(database_url, schema=pg_schema) as table:

            async def stored() -> bool:
                return await table.waiting() == 1

            await until(stored, "the start stored")
            await app.cancel("waits", by="ops", why="no pool tonight")
            assert await table.waiting() == 0
        messages = await asyncio.wait_for(following, 30)
        state = await app.get_session_state("waits")
        with pytest.raises(InvalidInputError, match=r"ended already \(cancelled\)"):
            await app.cancel("waits", by="ops")
        with pytest.raises(NothingToResumeError):
            await app.cancel("never-asked-for", by="ops")
    last = messages[-1]
    assert (last.type, last.status, last.content) == (
        "error",
        "cancelled",
        "cancelled by ops: no pool tonight",
    )
    assert state is not None
    assert (state.status, state.agent) == ("cancelled", "looper")


async def test_a_start_is_withdrawn_only_by_its_tenant_unclaimed_and_signed(
    database_url: str, pg_schema: str
) -> None:
    signer = RequestSigner(REQUEST_KEY)
    ended: list[StartRun] = []

    async def record(start: StartRun) -> None:
        ended.append(start)

    async def refused(start: StartRun) -> None:
        raise InvalidInputError(f"run {start.run_id!r} already exists")

    async with (
        PostgresRequests(database_url, schema=pg_schema, signer=signer) as table,
        PostgresRequests(database_url, schema=pg_schema) as unsigned,
    ):
        await table.submit(_start("mine"), _start("taken"))
        await unsigned.submit(_start("forged"))
        assert not await table.withdraw_start("mine", tenant="other", ended=record)
        claimed = await table.claim("w1", 10)
        await table.release("w1", [r.id for r in claimed if r.run_id != "taken"])
        with pytest.raises(ResumeConflictError, match="being started by w1"):
            await table.withdraw_start("taken", tenant="acme", ended=record)
        assert not await table.withdraw_start("forged", tenant="acme", ended=record)
        assert ended == []
        # The run could not be recorded as ended: the start stays, for a worker to take.
        with pytest.raises(InvalidInputError, match="already exists"):
            await table.withdraw_start("mine", tenant="acme", ended=refused)
        assert await table.waiting() == 3
        assert await table.withdraw_start("mine", tenant="acme", ended=record)
        assert ended == [_start("mine")]
        assert not await table.withdraw_start("mine", tenant="acme", ended=record)
        assert await table.waiting() == 2


async def test_a_start_waiting_longer_than_the_max_age_can_still_be_withdrawn(
    database_url: str, pg_schema: str
) -> None:
    """Taking back a start only ends its run cancelled: a start too old for a worker to act
    on is withdrawn all the same, not left to hold up its run's cancel."""
    three_days_ago = time.time() - 3 * 86_400
    signed_then = RequestSigner(REQUEST_KEY, clock=lambda: three_days_ago)
    ended: list[StartRun] = []

    async def record(start: StartRun) -> None:
        ended.append(start)

    async with (
        PostgresRequests(database_url, schema=pg_schema, signer=signed_then) as then,
        PostgresRequests(
            database_url, schema=pg_schema, signer=RequestSigner(REQUEST_KEY)
        ) as table,
    ):
        await then.submit(_start("old"))
        assert await table.withdraw_start("old", tenant="acme", ended=record)
        assert ended == [_start("old")]
        assert await table.waiting() == 0


def test_onward_cancel_takes_back_a_start_no_worker_took(database_url: str, pg_schema: str) -> None:
    async def submitted() -> None:
        signer = RequestSigner(REQUEST_KEY)
        async with PostgresRequests(database_url, schema=pg_schema, signer=signer) as table:
            await table.submit(_start("r1"))

    async def waiting() -> int:
        async with PostgresRequests(database_url, schema=pg_schema) as table:
            return await table.waiting()

    asyncio.run(submitted())
    env = {
        "ONWARD_BACKEND": "postgres",
        "DATABASE_URL": database_url,
        "ONWARD_DATABASE_SCHEMA": pg_schema,
        "ONWARD_PARTITIONS": str(PARTITIONS),
        "ONWARD_REQUEST_KEY": REQUEST_KEY,
    }
    args = ["cancel", "r1", "--tenant", "acme", "--by", "ops", "--json"]
    cancelled = CliRunner().invoke(cli, args, env=env)
    assert cancelled.exit_code == 0, cancelled.output
    assert json.loads(cancelled.stdout)["status"] == "cancelled"
    assert asyncio.run(waiting()) == 0
    again = CliRunner().invoke(cli, args, env=env)
    assert again.exit_code == 2, again.output  # ended already (cancelled)
    unknown = CliRunner().invoke(cli, ["cancel", "r2", "--tenant", "acme", "--by", "ops"], env=env)
    assert unknown.exit_code == 1, unknown.output


# -- a run's requests are acted on in the order they were stored --------------------------------


async def _set_aside(worker: Worker) -> bool:
    """Whether ``worker`` set a request aside: one whose max age passed while it was tried."""
    return worker.stats.set_aside > 0


async def _status_within(backends: Backends, run_id: str, seconds: float) -> str | None:
    """The run's status once it is no longer running, or as it is after ``seconds``."""
    deadline = asyncio.get_running_loop().time() + seconds
    status = None
    while asyncio.get_running_loop().time() < deadline:
        frontier = await backends.frontiers.get(run_id)
        status = None if frontier is None else str(frontier.summary.status)
        if status not in (None, "running"):
            return status
        await asyncio.sleep(0.1)
    return status


def _loop(run_id: str) -> StartRun:
    return StartRun(run_id=run_id, tenant="acme", agent="looper", input="loop")


async def test_a_full_worker_does_not_act_on_a_cancel_before_its_run_s_start(
    database_url: str, pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full worker takes cancels alone, but a cancel stored after its run's start must not be
    acted on before that start: the run does not exist yet, so the cancel is refused for good
    (deleted), and once a slot frees the start is taken and the run goes on, never cancelled."""
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    settings = postgres_fleet_settings(database_url, pg_schema, PARTITIONS).model_copy(
        update={"app_mode": "in_process"}
    )
    stop = asyncio.Event()
    async with (
        open_backends(settings) as backends,
        PostgresRequests(database_url, schema=pg_schema) as table,
    ):
        worker = Worker(
            backends, provider(), agents, name="full", max_runs=1, recheck_s=60, backoff_s=0.1
        )
        serving = asyncio.create_task(
            worker.serve_postgres(stop, requests=table, accept_unsigned=True, poll_s=0.1)
        )
        try:
            await table.submit(_loop("busy"))
            await until(lambda: _none_waiting(table), "busy started: the worker is full")
            assert worker.carrying("busy")
            assert worker.free == 0
            await table.submit(_loop("r2"), CancelRun(run_id="r2", tenant="acme", by="ann"))
            await asyncio.sleep(1)  # ten polls of a full worker, for cancels alone
            await table.submit(CancelRun(run_id="busy", tenant="acme", by="ann"))
            assert await _status_within(backends, "busy", 20) == "cancelled"
            r2 = await _status_within(backends, "r2", 10)
        finally:
            stop.set()
            await asyncio.wait_for(serving, 30)
    assert r2 == "cancelled"


async def test_a_request_behind_a_dead_worker_s_start_waits_for_that_start(
    database_url: str, pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker claims a start and dies before the run exists. The cancel stored after that
    start must wait for it (taken again once the claim lapses), not be acted on at once by
    another worker: the run does not exist yet, the cancel is refused and deleted, and the
    start, taken after the lapse, starts a run nobody cancels."""
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    settings = postgres_fleet_settings(database_url, pg_schema, PARTITIONS).model_copy(
        update={"app_mode": "in_process"}
    )
    stop = asyncio.Event()
    async with (
        open_backends(settings) as backends,
        PostgresRequests(database_url, schema=pg_schema) as table,
    ):
        await table.submit(_loop("r1"), CancelRun(run_id="r1", tenant="acme", by="ann"))
        (dead,) = await table.claim("dead", 10, claim_s=1.5)  # and then it dies
        assert dead.kind == "start"
        worker = Worker(backends, provider(), agents, name="next", recheck_s=60, backoff_s=0.1)
        serving = asyncio.create_task(
            worker.serve_postgres(stop, requests=table, accept_unsigned=True, poll_s=0.1)
        )
        try:
            await until(lambda: _none_waiting(table), "the start and the cancel acted on")
            r1 = await _status_within(backends, "r1", 10)
        finally:
            stop.set()
            await asyncio.wait_for(serving, 30)
    assert r1 == "cancelled"


class _HeldModel:
    """`script`, each call held until ``gate`` is set (``asked`` set meanwhile): a run whose
    worker is draining and cannot stop it before its model answers."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.gate = asyncio.Event()

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        self.asked.set()
        await self.gate.wait()
        return provider_script(messages)


async def test_a_draining_worker_keeps_the_claims_of_what_it_still_acts_on(
    database_url: str, pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A draining worker waits for its runs to reach their next boundary, which can take longer
    than a claim: meanwhile it must keep renewing the claims on the requests it still acts on,
    as while serving, or another worker takes them and acts on them a second time."""
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    settings = postgres_fleet_settings(database_url, pg_schema, PARTITIONS).model_copy(
        update={"app_mode": "in_process"}
    )
    first_stop, other_stop = asyncio.Event(), asyncio.Event()
    async with (
        open_backends(settings) as backends,
        PostgresRequests(database_url, schema=pg_schema) as table,
    ):
        runner = backends.runner(provider())
        waiting = await runner.run(agents["payer"], "pay 5", tenant="acme", run_id="p1")
        assert waiting.status == "waiting"
        asked = (await runner.inspect("p1", tenant="acme")).waiting_on
        assert asked is not None
        model = _HeldModel()
        first = Worker(backends, model, agents, name="a", recheck_s=60, backoff_s=0.1)
        other = Worker(backends, provider(), agents, name="b", recheck_s=60, backoff_s=0.1)

        def serve(worker: Worker, stop: asyncio.Event) -> asyncio.Task[None]:
            return asyncio.create_task(
                worker.serve_postgres(
                    stop, requests=table, accept_unsigned=True, claim_s=0.6, poll_s=0.1
                )
            )

        serving = [serve(first, first_stop)]
        try:
            await table.submit(
                AnswerRequest(run_id="p1", tenant="acme", request_id=asked, approve=True, by="ann")
            )
            await asyncio.wait_for(model.asked.wait(), 30)  # approved; its next call is held
            first_stop.set()  # a drains, its run in a model call
            serving.append(serve(other, other_stop))
            claims = []
            for _ in range(40):  # 2 s of draining: three claims' worth
                claims.append(await _claim_of(database_url, pg_schema))
                await asyncio.sleep(0.05)
            model.gate.set()
            await asyncio.wait_for(serving[0], 30)
            await until(lambda: _none_waiting(table), "the answer acted on and deleted")
        finally:
            first_stop.set()
            other_stop.set()
            model.gate.set()
            await asyncio.wait_for(asyncio.gather(*serving), 60)
        ended = await runner.inspect("p1", tenant="acme")
    assert ended.status == "completed"
    assert set(claims) == {("a", True)}, claims
    assert (other.stats.failures, other.stats.conflicts) == (0, 0)


async def test_a_start_taken_while_the_stores_do_not_answer_is_not_dropped(
    database_url: str,
    pg_schema: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker claims a start and the database goes away before the run is written (the
    claim came through, the lease or the log's write does not): the start was not acted on,
    and must be taken again once the stores answer, not deleted as refused for good."""
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    parts = urlsplit(database_url)
    assert parts.hostname is not None
    stop = asyncio.Event()
    async with TcpProxy(parts.hostname, parts.port or 5432) as proxy:
        user = parts.netloc.rsplit("@", 1)[0]
        proxied = urlunsplit(parts._replace(netloc=f"{user}@127.0.0.1:{proxy.port}"))
        settings = postgres_fleet_settings(proxied, pg_schema, PARTITIONS).model_copy(
            update={"app_mode": "in_process"}
        )
        async with (
            open_backends(settings) as backends,
            PostgresRequests(database_url, schema=pg_schema) as table,
        ):
            worker = Worker(backends, provider(), agents, name="w", recheck_s=60, backoff_s=0.1)
            serving = asyncio.create_task(
                worker.serve_postgres(stop, requests=table, accept_unsigned=True, poll_s=0.1)
            )
            try:
                await proxy.cut()  # the database goes away under the worker's stores
                await table.submit(_start("r1"))
                await asyncio.sleep(2)  # the start is claimed and tried meanwhile
                await proxy.restore()
                await until(lambda: _none_waiting(table), "the start acted on")
                r1 = await _status_within(backends, "r1", 15)
            finally:
                stop.set()
                await asyncio.wait_for(serving, 30)
    assert r1 == "completed", [r.getMessage() for r in caplog.records]


async def test_a_start_that_expired_while_the_stores_did_not_answer_is_set_aside(
    database_url: str,
    pg_schema: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker claims a signed start and the database goes away for longer than the max age:
    the application's stream has meanwhile told its user to send the start again, so a worker
    that then started it once the stores came back would do the work twice. The age is checked
    again before each try: the start is set aside as expired, and nothing of it is written."""
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    parts = urlsplit(database_url)
    assert parts.hostname is not None
    stop = asyncio.Event()
    signer = RequestSigner(REQUEST_KEY, max_age_s=2)
    async with TcpProxy(parts.hostname, parts.port or 5432) as proxy:
        user = parts.netloc.rsplit("@", 1)[0]
        proxied = urlunsplit(parts._replace(netloc=f"{user}@127.0.0.1:{proxy.port}"))
        settings = postgres_fleet_settings(proxied, pg_schema, PARTITIONS).model_copy(
            update={"app_mode": "in_process"}
        )
        async with (
            open_backends(settings) as backends,
            PostgresRequests(database_url, schema=pg_schema, signer=signer) as table,
        ):
            worker = Worker(backends, provider(), agents, name="w", recheck_s=60, backoff_s=0.1)
            serving = asyncio.create_task(
                worker.serve_postgres(stop, requests=table, signer=signer, poll_s=0.1)
            )
            try:
                await proxy.cut()  # the database goes away under the worker's stores
                with caplog.at_level(logging.WARNING, logger="onward.worker"):
                    await table.submit(_start("late"))
                    await until(lambda: _set_aside(worker), "the start set aside, expired")
                    await proxy.restore()
                    await until(lambda: _none_waiting(table), "the start handled")
                    late = await _status_within(backends, "late", 3)
            finally:
                stop.set()
                await asyncio.wait_for(serving, 30)
    assert late is None
    assert worker.stats.set_aside == 1
    assert re.search(r"set aside: .*expired: signed \ds ago", caplog.text), caplog.text


async def test_a_start_that_expired_while_another_held_its_run_is_set_aside(
    database_url: str,
    pg_schema: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A signed start meets its run id's lease held by another who never writes the run, for
    longer than the max age: the application's stream has meanwhile told its user to send the
    start again, so a worker that started it once the lease was let go would do the work twice.
    Its age is checked again before each ask: the start is set aside as expired."""
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    stop = asyncio.Event()
    signer = RequestSigner(REQUEST_KEY, max_age_s=2)
    settings = postgres_fleet_settings(database_url, pg_schema, PARTITIONS)
    async with (
        open_backends(settings) as backends,
        PostgresRequests(database_url, schema=pg_schema, signer=signer) as table,
    ):
        lease = await backends.leases.acquire("late", tenant="acme", holder="someone", ttl_s=60)
        worker = Worker(backends, provider(), agents, name="w", recheck_s=60, backoff_s=0.1)
        serving = asyncio.create_task(
            worker.serve_postgres(stop, requests=table, signer=signer, poll_s=0.1)
        )
        try:
            with caplog.at_level(logging.WARNING, logger="onward.worker"):
                await table.submit(_start("late"))
                await until(lambda: _set_aside(worker), "the start set aside, expired")
                await backends.leases.release(lease)
                await until(lambda: _none_waiting(table), "the start handled")
                late = await _status_within(backends, "late", 3)
        finally:
            stop.set()
            await asyncio.wait_for(serving, 30)
    assert late is None
    assert worker.stats.set_aside == 1
    assert "set aside: request not acted on: expired" in caplog.text


async def test_a_tag_that_expired_while_another_held_its_run_is_set_aside(
    database_url: str,
    pg_schema: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A signed tag of a run another holds waits for the run to be free; once older than the
    max age it is no longer acted on (its sender may have sent it again): set aside."""
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    stop = asyncio.Event()
    signer = RequestSigner(REQUEST_KEY, max_age_s=2)
    settings = postgres_fleet_settings(database_url, pg_schema, PARTITIONS)
    async with (
        open_backends(settings) as backends,
        PostgresRequests(database_url, schema=pg_schema, signer=signer) as table,
    ):
        waiting = await backends.runner(provider()).run(
            agents["payer"], "pay 5", tenant="acme", run_id="held"
        )
        assert waiting.status == "waiting"
        lease = await backends.leases.acquire("held", tenant="acme", holder="someone", ttl_s=60)
        worker = Worker(backends, provider(), agents, name="w", recheck_s=60, backoff_s=0.1)
        serving = asyncio.create_task(
            worker.serve_postgres(stop, requests=table, signer=signer, poll_s=0.1)
        )
        try:
            with caplog.at_level(logging.WARNING, logger="onward.worker"):
                await table.submit(TagRun(run_id="held", tenant="acme", label="late"))
                await until(lambda: _set_aside(worker), "the tag set aside, expired")
                await backends.leases.release(lease)
                await until(lambda: _none_waiting(table), "the tag handled")
        finally:
            stop.set()
            await asyncio.wait_for(serving, 30)
        frontier = await backends.runner(provider()).inspect("held", tenant="acme")
    assert [t.label for t in frontier.tags] == []
    assert worker.stats.set_aside == 1
    assert "set aside: request not acted on: expired" in caplog.text


async def test_a_stream_whose_start_a_worker_set_aside_ends_saying_so(
    database_url: str,
    pg_schema: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The workers hold another request key than the application (a key rolled out to one side
    only): they set every start it sends aside, writing nothing of it to the run. The table
    tells the application so (no row of the run is left, and nothing of it is in the log): its
    stream ends within seconds saying where the cause is, rather than wait out the request's
    max age (a day by default) for a run that never comes."""
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    settings = postgres_fleet_settings(database_url, pg_schema, PARTITIONS)
    in_process = settings.model_copy(update={"app_mode": "in_process"})
    stop = asyncio.Event()
    async with (
        open_backends(in_process) as backends,
        PostgresRequests(database_url, schema=pg_schema) as table,
        onward.open(settings) as app,
    ):
        worker = Worker(backends, provider(), agents, name="w", recheck_s=60, backoff_s=0.1)
        other_key = RequestSigner("f" * 64)
        serving = asyncio.create_task(
            worker.serve_postgres(stop, requests=table, signer=other_key, poll_s=0.1)
        )
        try:
            stream = app.query("work", {"agent": "stepper", "run_id": "unsigned-here"})
            with pytest.raises(RunTimeoutError) as ended:
                await asyncio.wait_for(stream.collect(), 20)
        finally:
            stop.set()
            await asyncio.wait_for(serving, 30)
    assert worker.stats.set_aside == 1
    assert "nothing came of its start: a worker took it and did not act on it" in str(ended.value)
    assert "set aside" in str(ended.value)


async def test_a_slow_recovery_pass_is_not_overlapped_by_the_next(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass that takes longer than ``recheck_s`` is not joined by the next one, each listing
    the runs and checking their leases again; the next starts once it ended."""
    settings = Settings.model_validate(
        {
            "ONWARD_BACKEND": "postgres",
            "DATABASE_URL": database_url,
            "ONWARD_DATABASE_SCHEMA": pg_schema,
            "ONWARD_PARTITIONS": str(PARTITIONS),
        }
    )
    stop = asyncio.Event()
    async with (
        open_backends(settings) as backends,
        PostgresRequests(database_url, schema=pg_schema) as table,
    ):
        worker = Worker(backends, provider(), agents, name="w", recheck_s=0.05)
        listings = SlowListings(worker, monkeypatch, delay_s=0.4)
        serving = asyncio.create_task(
            worker.serve_postgres(stop, requests=table, accept_unsigned=True, poll_s=0.05)
        )

        async def a_second_pass() -> bool:
            return listings.started >= 2

        await until(a_second_pass, "a pass after the first")
        stop.set()
        await asyncio.wait_for(serving, 10)
    assert listings.most_at_once == 1


async def test_cancelling_a_start_a_worker_took_and_refused_says_there_is_no_run(
    database_url: str, pg_schema: str
) -> None:
    """A start on the PostgreSQL requests table that a worker took and refused (its row
    deleted, nothing of its run written) cannot be cancelled: `cancel` said nothing and stored
    a cancel that a worker then refused for good, as if the run it names were ended. It says
    there is no such run, as before the start was sent, and stores nothing."""
    async with onward.open(postgres_fleet_settings(database_url, pg_schema, PARTITIONS)) as app:
        stream = app.query("loop", {"agent": "looper", "run_id": "refused"}, timeout=60)
        following = asyncio.create_task(stream.collect())
        try:
            async with PostgresRequests(database_url, schema=pg_schema) as table:

                async def stored() -> bool:
                    return await table.waiting() == 1

                await until(stored, "the start stored")
                taken = await table.claim("w1", 10)
                assert [row.kind for row in taken] == ["start"]
                await table.finish("w1", [row.id for row in taken])  # refused, nothing written
                with pytest.raises(NothingToResumeError):
                    await app.cancel("refused", by="ops", why="not wanted")
                assert await table.waiting() == 0
        finally:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError, RunTimeoutError):
                await following
