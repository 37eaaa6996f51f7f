"""A run out of attempts with a call that may have taken effect is left for a person.

Recovery ends a run ``failed`` once its attempts to carry it on made no progress. An attempt
counts once its claim is in the log, so the attempts of a run whose dispatched charge is still
undecided can run out before the plan ever refuses it: the charge's status check does not
answer (its service is down as well), or the store fails between the claim and the plan. Ending
such a run ``failed`` would hide a charge that may have gone through: it is tagged
``needs-person`` instead, and a person settles the charge (`onward resolve`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import pytest_asyncio
from support.crashes import Crash, CrashAt
from support.held_writes import postgres_backends
from support.proxy import TcpProxy

from onward.eventlog import Event, ResumePlanned, RunClaimed, ToolCall
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.fleet.requests import ResumeRun
from onward.runtime.fleet.worker import Worker
from onward.runtime.leases.base import LeasePolicy, unheard
from onward.runtime.manager import ExecutionManager, needs_person
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.settings import Settings
from onward.runtime.tools import Reconciled, tool
from onward.testing.eventlog import new_run_id

TENANT = "acme"


@pytest_asyncio.fixture
async def backends(tmp_path: Path) -> AsyncIterator[Backends]:
    settings = Settings.model_validate(
        {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "undecided.db")}
    )
    async with open_backends(settings) as opened:
        yield opened


async def payments_unreachable(key: str) -> Reconciled:
    raise ConnectionError("payments.example: connection refused")


@tool(reconcile=payments_unreachable)
async def checked_charge(amount: int, *, idempotency_key: str) -> str:
    return f"charged {amount}"


@tool
async def charge(amount: int, *, idempotency_key: str) -> str:
    return f"charged {amount}"


def charging(tool_name: str) -> ScriptedProvider:
    return ScriptedProvider(
        [reply("", ToolCall(call_id="c1", tool=tool_name, args={"amount": 5})), reply("charged")]
    )


async def left_for_a_person(worker: Worker, run_id: str) -> None:
    frontier = await worker.runner.inspect(run_id, tenant=TENANT)
    assert frontier.status == "running", frontier.error
    assert needs_person(frontier)
    assert frontier.attempts >= worker.max_attempts
    assert worker.stats.gave_up == 0
    (pending,) = await ExecutionManager(
        worker.backends.frontiers, worker.backends.leases
    ).list_pending(tenant=TENANT)
    assert pending.attention == "needs_person"


async def test_a_charge_whose_status_check_never_answers_is_left_for_a_person(
    backends: Backends,
) -> None:
    """The worker died right after dispatching a charge; the charge's status check fails on
    every attempt (the payment service is down). Out of attempts, the run is left for a
    person, not ended ``failed`` over a charge that may have gone through."""
    agent = Agent(name="charger", instructions="charge", tools=[checked_charge])
    with pytest.raises(Crash):
        await backends.runner(charging("checked_charge"), observer=CrashAt("tool.dispatched")).run(
            agent, "charge 5", tenant=TENANT, run_id="r"
        )
    worker = Worker(backends, charging("checked_charge"), {"charger": agent}, backoff_s=0)
    for _ in range(worker.max_attempts + 1):
        worker.submit(ResumeRun(run_id="r", tenant=TENANT))
        await worker.drained()
    await left_for_a_person(worker, "r")


def through(url: str, proxy: TcpProxy) -> str:
    parts = urlsplit(url)
    credentials = parts.netloc.rsplit("@", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{credentials}@{proxy.host}:{proxy.port}"))


def cut_after(
    kind: type[Event], backends: Backends, proxy: TcpProxy, times: int, outage_s: float
) -> None:
    """The database goes away for ``outage_s`` as each of the next ``times`` events of
    ``kind`` lands: after a claim, the attempt counts and the rest of it (the plan's record,
    the lease's release) meets the outage; after the plan, the run's tag ``needs-person``
    does."""
    append = backends.log.append
    restores: set[asyncio.Task[None]] = set()

    async def restore() -> None:
        await asyncio.sleep(outage_s)
        await proxy.restore()

    async def appending(events: Sequence[Event]) -> Any:
        nonlocal times
        positions = await append(events)
        if times and any(isinstance(e, kind) for e in events):
            times -= 1
            await proxy.cut()
            task = asyncio.create_task(restore())
            restores.add(task)
            task.add_done_callback(restores.discard)
        return positions

    backends.log.append = appending  # type: ignore[method-assign]


@pytest.mark.parametrize("kind", [RunClaimed, ResumePlanned], ids=["claim", "plan"])
async def test_a_charge_whose_resumes_meet_an_outage_is_left_for_a_person(
    database_url: str, pg_schema: str, kind: type[Event]
) -> None:
    """The worker died right after dispatching a charge with no status check; PostgreSQL goes
    away for a moment right after each claim lands (or each plan, refusing the charge, before
    the run is tagged), until the attempts run out (the worker tries the request again after
    each outage). The run is left for a person, not ended ``failed``."""
    parts = urlsplit(database_url)
    assert parts.hostname is not None
    assert parts.port is not None
    agent = Agent(name="charger", instructions="charge", tools=[charge])
    run_id = new_run_id()
    async with (
        TcpProxy(parts.hostname, parts.port) as proxy,
        postgres_backends(through(database_url, proxy), pg_schema) as backends,
    ):
        with pytest.raises(Crash):
            await backends.runner(charging("charge"), observer=CrashAt("tool.dispatched")).run(
                agent, "charge 5", tenant=TENANT, run_id=run_id
            )
        # A lease whose release met the outage lapses before the database is back.
        policy = LeasePolicy(ttl=timedelta(seconds=0.2))
        worker = Worker(
            backends, charging("charge"), {"charger": agent}, backoff_s=0.05, lease_policy=policy
        )
        cut_after(kind, backends, proxy, worker.max_attempts, outage_s=0.5)
        worker.submit(ResumeRun(run_id=run_id, tenant=TENANT))
        await asyncio.wait_for(worker.drained(), 30)
        await left_for_a_person(worker, run_id)


async def test_a_charge_that_kills_its_worker_every_time_runs_out_of_attempts(
    backends: Backends,
) -> None:
    """The worker dies right after dispatching a charge, on every attempt (the call brings its
    process down); the charge's status check says each time that it did not go through, so
    each attempt makes it again. Those settlements are no progress: the attempts still run
    out, and the run is left for a person, not carried on (and the charge made) for ever."""
    made: list[str] = []

    async def not_through(key: str) -> Reconciled:
        return Reconciled("never_ran")

    @tool(reconcile=not_through)
    async def fatal_charge(amount: int, *, idempotency_key: str) -> str:
        made.append(idempotency_key)
        return f"charged {amount}"

    agent = Agent(name="charger", instructions="charge", tools=[fatal_charge])
    dies = backends.runner(charging("fatal_charge"), observer=CrashAt("tool.dispatched"))
    with pytest.raises(Crash):
        await dies.run(agent, "charge 5", tenant=TENANT, run_id="r")
    worker = Worker(backends, charging("fatal_charge"), {"charger": agent}, backoff_s=0)
    for _ in range(worker.max_attempts):
        dies = backends.runner(charging("fatal_charge"), observer=CrashAt("tool.dispatched"))
        with pytest.raises(Crash):
            await dies.resume(agent, "r", tenant=TENANT)
    worker.submit(ResumeRun(run_id="r", tenant=TENANT))
    await worker.drained()
    assert made == []
    await left_for_a_person(worker, "r")


async def test_a_cancel_asked_of_a_run_left_for_a_person_still_ends_it(
    backends: Backends,
) -> None:
    """Ann asked the run's holder to cancel it as its worker died (the ask kept with the
    lease). Left for a person over the charge, the run must still end as asked once the
    person settles the charge and it is resumed: recovery's last look let it go undriven."""
    agent = Agent(name="charger", instructions="charge", tools=[checked_charge])
    with pytest.raises(Crash):
        await backends.runner(charging("checked_charge"), observer=CrashAt("tool.dispatched")).run(
            agent, "charge 5", tenant=TENANT, run_id="r"
        )
    dying = await backends.leases.acquire("r", tenant=TENANT, holder="died", ttl_s=60)
    assert await backends.leases.ask_to_cancel("r", tenant=TENANT, by="ann", why="stop it")
    await backends.leases.release(unheard(dying))  # it died without hearing the ask
    worker = Worker(backends, charging("checked_charge"), {"charger": agent}, backoff_s=0)
    for _ in range(worker.max_attempts + 1):
        worker.submit(ResumeRun(run_id="r", tenant=TENANT))
        await worker.drained()
    await left_for_a_person(worker, "r")
    runner = backends.runner(charging("checked_charge"))
    await runner.resolve("r", "c1", tenant=TENANT, outcome="never_ran", by="bob", why="checked")

    result = await runner.resume(agent, "r", tenant=TENANT)

    assert (result.status, result.error) == ("cancelled", "cancelled by ann: stop it")


async def test_a_run_found_waiting_as_recovery_gives_up_ends_as_a_cancel_asked_of_it(
    backends: Backends,
) -> None:
    """Recovery gives up on a run it last saw running, but another worker has since driven it
    to wait for an approval, letting go as Ann asked it to cancel (the ask kept with the
    lease). The run must end ``cancelled`` as asked, not wait for a person to answer it."""

    @tool(requires_approval=True)
    async def pay(amount: int, *, idempotency_key: str) -> str:
        return f"paid {amount}"

    agent = Agent(name="payer", instructions="pay", tools=[pay])
    with pytest.raises(Crash):
        await backends.runner(charging("pay"), observer=CrashAt("run.started")).run(
            agent, "pay 5", tenant=TENANT, run_id="r"
        )
    running = await backends.runner(charging("pay")).inspect("r", tenant=TENANT)
    assert running.status == "running"
    waiting = await backends.runner(charging("pay")).resume(agent, "r", tenant=TENANT)
    assert waiting.status == "waiting"
    dying = await backends.leases.acquire("r", tenant=TENANT, holder="went", ttl_s=60)
    assert await backends.leases.ask_to_cancel("r", tenant=TENANT, by="ann", why="stop it")
    await backends.leases.release(unheard(dying))  # let go without hearing the ask
    worker = Worker(backends, charging("pay"), {"payer": agent}, backoff_s=0)

    await worker._recovery._give_up(running, "gave up")

    ended = await worker.runner.inspect("r", tenant=TENANT)
    assert (ended.status, ended.error) == ("cancelled", "cancelled by ann: stop it")
