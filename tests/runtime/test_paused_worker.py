"""A worker paused mid-call (SIGSTOP: a long GC, a frozen VM) past its lease, then let go on.

The worker confirms its lease, enters the tool and is stopped there; its lease lapses; this
process resumes the run as a second worker; then the first is continued. What keeps the one
call from taking effect twice is what each kind of tool depends on: an external system that
refuses older fences or deduplicates on the key (status-checked tools), a person (plain tools),
or the call's deadline (``max_call_s``, whose effect comes after an await). On the embedded
SQLite file and on Kafka + PostgreSQL + Redis.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import signal
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from rich.console import Console
from support.crashes import Crash, CrashAt
from support.deployment import kafka_settings, process_env
from support.paused_world import (
    MAX_CALL_S,
    POLICY,
    TENANT,
    TTL_S,
    Behaviour,
    ExternalSystem,
    booking_agent,
    booking_model,
)
from support.processes import spawn_support
from support.servers import KafkaServers

from onward.errors import ConfigurationError, IndeterminateToolCallError
from onward.eventlog import ToolCompleted, ToolDispatched, ToolResolved
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends, open_backends
from onward.runtime.cli.summary import run_summary
from onward.runtime.fleet.worker import Worker
from onward.runtime.leases.base import LeasePolicy
from onward.runtime.providers import ScriptedProvider
from onward.runtime.settings import Settings
from onward.runtime.tools import Reconciled, tool

PARTITIONS = 2


@pytest.fixture(params=["sqlite", pytest.param("kafka", marks=pytest.mark.kafka)])
def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Settings, dict[str, str]]:
    """The settings this process opens, and the environment the paused child opens them from."""
    if request.param == "sqlite":
        db = tmp_path / "onward.db"
        env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db)}
        return Settings(backend="sqlite", sqlite_path=db), env
    servers: KafkaServers = request.getfixturevalue("kafka_servers")
    return kafka_settings(servers, PARTITIONS), process_env(servers, PARTITIONS)


@pytest_asyncio.fixture
async def backends(deployment: tuple[Settings, dict[str, str]]) -> AsyncIterator[Backends]:
    settings, _ = deployment
    if settings.backend == "kafka":
        from onward.eventlog import KafkaEventLog  # noqa: PLC0415

        async with KafkaEventLog(
            settings.kafka_bootstrap_servers, topic=settings.kafka_topic, partitions=PARTITIONS
        ):
            pass  # the events topic exists before the child and this process open it
    async with open_backends(settings) as opened:
        yield opened


async def until(check: Any, what: str, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@dataclass
class Story:
    """What happened: the external system, the run, how the paused worker's run ended, and
    how this process's resume ended (its status, or the error it raised)."""

    system: ExternalSystem
    run_id: str
    paused: dict[str, Any]
    resumed: Exception | str


async def paused_then_resumed(
    tmp_path: Path,
    env: dict[str, str],
    backends: Backends,
    behaviour: Behaviour,
    *,
    checked: bool,
    bounded: bool = False,
    late_first: bool = False,
) -> Story:
    """The story of the module docstring. ``late_first``: the paused worker is continued
    once the second worker has asked the status check and entered the tool, and its late
    call reaches the system before the second worker's."""
    system = ExternalSystem(tmp_path / "system.json", behaviour)
    run_id = f"seat-{uuid.uuid4().hex[:8]}"
    config = {
        "system": str(system.path),
        "behaviour": behaviour,
        "checked": checked,
        "hold": not bounded,
        "bounded": bounded,
        "run_id": run_id,
    }
    child = await spawn_support(
        "paused_child", json.dumps(config), env=env, stdout=asyncio.subprocess.PIPE
    )
    try:
        await until(lambda: system.path.exists() and system.read()["entered"], "the tool call")
        child.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        await asyncio.sleep(max(0.0, stopped_at + TTL_S + 0.5 - time.monotonic()))
        agent = booking_agent(
            system, checked=checked, hold=False, bounded=bounded, second=late_first
        )
        runner = backends.runner(booking_model(), worker="second", lease_policy=POLICY)
        resuming = asyncio.create_task(runner.resume(agent, run_id, tenant=TENANT))
        if late_first:
            await until(lambda: len(system.read()["entered"]) > 1, "the second worker's call")
            system.let_go()
            child.send_signal(signal.SIGCONT)
        resumed: Exception | str
        try:
            resumed = (await resuming).status
        except IndeterminateToolCallError as exc:
            resumed = exc
        system.let_go()
        child.send_signal(signal.SIGCONT)
        out, _ = await asyncio.wait_for(child.communicate(), 60)
    finally:
        if child.returncode is None:
            child.send_signal(signal.SIGCONT)
            child.kill()
            await child.wait()
    return Story(system, run_id, json.loads(out.decode().strip().splitlines()[-1]), resumed)


@pytest.mark.timeout(120)
async def test_a_status_checked_tool_whose_system_refuses_older_fences_takes_effect_once(
    tmp_path: Path, deployment: tuple[Settings, dict[str, str]], backends: Backends
) -> None:
    """The status check truthfully answers "never ran", the second worker books under fence
    2; the paused one carries on under fence 1 and the system refuses it."""
    story = await paused_then_resumed(tmp_path, deployment[1], backends, "fences", checked=True)
    assert story.resumed == "completed"
    assert [e["fence"] for e in story.system.effects()] == [2]
    assert [r["fence"] for r in story.system.read()["refused"]] == [1]
    assert story.paused == {"error": "FencedError"}


@pytest.mark.timeout(120)
async def test_a_late_call_that_arrives_before_the_second_workers_is_refused_too(
    tmp_path: Path, deployment: tuple[Settings, dict[str, str]], backends: Backends
) -> None:
    """The paused worker is continued between the second worker's status check and its call,
    and its call under fence 1 reaches the system first: the status check, asked with fence
    2, raised the system's bar for the key before it answered "never ran", so the late call
    is refused and the second worker's is the one effect."""
    story = await paused_then_resumed(
        tmp_path, deployment[1], backends, "fences", checked=True, late_first=True
    )
    assert story.resumed == "completed"
    assert [e["fence"] for e in story.system.effects()] == [2]
    assert [r["fence"] for r in story.system.read()["refused"]] == [1]


@pytest.mark.timeout(120)
async def test_a_status_checked_tool_whose_system_deduplicates_on_the_key_takes_effect_once(
    tmp_path: Path, deployment: tuple[Settings, dict[str, str]], backends: Backends
) -> None:
    """The paused worker's call arrives second with the same key: the system answers it
    from the first, with no second effect."""
    story = await paused_then_resumed(tmp_path, deployment[1], backends, "dedupe", checked=True)
    assert story.resumed == "completed"
    assert len(story.system.effects()) == 1
    assert story.paused == {"error": "FencedError"}


@pytest.mark.timeout(120)
async def test_a_plain_tool_takes_effect_once_and_its_run_is_left_for_a_person(
    tmp_path: Path, deployment: tuple[Settings, dict[str, str]], backends: Backends
) -> None:
    """Nothing can tell the second worker whether the call ran: it leaves the run for a
    person and never calls again; the paused worker's one call is the only effect."""
    story = await paused_then_resumed(tmp_path, deployment[1], backends, "plain", checked=False)
    assert isinstance(story.resumed, IndeterminateToolCallError)
    assert [e["fence"] for e in story.system.effects()] == [1]
    assert story.paused == {"error": "FencedError"}


@pytest.mark.timeout(120)
async def test_a_bounded_call_is_cut_off_at_its_deadline_when_its_paused_worker_goes_on(
    tmp_path: Path, deployment: tuple[Settings, dict[str, str]], backends: Backends
) -> None:
    """The tool's effect comes after an await: the paused worker, continued past the call's
    deadline, is cut off there, so the status check asked after the deadline was right and
    the second worker's call is the only effect (a plain system: nothing else protects it)."""
    story = await paused_then_resumed(
        tmp_path, deployment[1], backends, "plain", checked=True, bounded=True
    )
    assert story.resumed == "completed"
    assert [e["fence"] for e in story.system.effects()] == [2]
    assert story.paused != {"error": "IndeterminateToolCallError"}  # its call was settled
    stored = [s.event for s in await backends.log.read_run(story.run_id)]
    (first, second) = [e for e in stored if isinstance(e, ToolDispatched)]
    assert first.deadline is not None
    assert first.deadline - first.at == pytest.approx(MAX_CALL_S * 1_000_000, abs=50_000)
    assert second.fence > first.fence


# -- in one process: what a tool receives, how long a call may take ----------------------------


def sqlite_runner(backends: Backends, model: ScriptedProvider, ttl_s: float = TTL_S) -> Any:
    return backends.runner(model, lease_policy=LeasePolicy(ttl=timedelta(seconds=ttl_s)))


@pytest_asyncio.fixture
async def embedded(tmp_path: Path) -> AsyncIterator[Backends]:
    async with open_backends(Settings(backend="sqlite", sqlite_path=tmp_path / "e.db")) as opened:
        yield opened


async def test_a_tool_receives_its_calls_fence_and_lease_expiry(embedded: Backends) -> None:
    """``fence`` and ``lease_expires_at`` are passed by Onward (not in the tool's schema)."""
    seen: list[tuple[int, float]] = []

    @tool
    async def book(seat: str, *, idempotency_key: str, fence: int, lease_expires_at: float) -> str:
        seen.append((fence, lease_expires_at))
        return "ok"

    assert set(book.parameters["properties"]) == {"seat"}
    agent = Agent(name="booker", instructions="book", tools=[book])
    before = time.time()
    result = await sqlite_runner(embedded, booking_model()).run(agent, "go", tenant=TENANT)
    assert result.status == "completed"
    ((fence, expires),) = seen
    dispatched = [
        s.event
        for s in await embedded.log.read_run(result.run_id)
        if isinstance(s.event, ToolDispatched)
    ]
    assert fence == dispatched[0].fence
    assert before + TTL_S - 1 < expires < time.time() + TTL_S + 1


async def test_a_tool_that_may_outlast_the_lease_is_refused(embedded: Backends) -> None:
    """A lease ttl shorter than a tool's max_call_s plus the renewal margin could end while
    the call is still going: refused before anything is written."""

    @tool(max_call_s=10)
    async def book(seat: str, *, idempotency_key: str) -> str:
        return "ok"

    agent = Agent(name="booker", instructions="book", tools=[book])
    runner = sqlite_runner(embedded, booking_model(), ttl_s=12)
    with pytest.raises(ConfigurationError, match=r"'book' may take 10s .* ttl of 12s"):
        await runner.run(agent, "go", tenant=TENANT, run_id="r")
    assert await embedded.log.read_run("r") == []


def slow_tool(*, retry_safe: bool = False, answer: Reconciled | None = None) -> Any:
    calls: list[str] = []

    async def status(key: str) -> Reconciled | None:
        return answer

    @tool(max_call_s=0.2, retry_safe=retry_safe, reconcile=status if answer else None)
    async def book(seat: str, *, idempotency_key: str) -> str:
        calls.append(idempotency_key)
        await asyncio.sleep(5)
        return "too late"

    return book, calls


@pytest.mark.parametrize(
    ("retry_safe", "answer", "outcome"),
    [
        (True, None, "DeadlineExceeded"),
        (False, Reconciled("never_ran"), "DeadlineExceeded"),
        (False, Reconciled("completed", "seat 3A booked"), "resolved"),
    ],
)
async def test_a_call_past_its_deadline_is_cut_off_and_settled_by_what_can_tell(
    embedded: Backends, retry_safe: bool, answer: Reconciled | None, outcome: str
) -> None:
    """Cut off at max_call_s: a retry-safe call, or one its status check says did not take
    effect, is an error the model reads; one its status check says did is its result."""
    book, _ = slow_tool(retry_safe=retry_safe, answer=answer)
    agent = Agent(name="booker", instructions="book", tools=[book])
    started = time.monotonic()
    result = await sqlite_runner(embedded, booking_model()).run(agent, "go", tenant=TENANT)
    assert time.monotonic() - started < 3
    assert result.status == "completed"
    events = [s.event for s in await embedded.log.read_run(result.run_id)]
    if outcome == "resolved":
        (resolved,) = [e for e in events if isinstance(e, ToolResolved)]
        assert (resolved.outcome, resolved.result) == ("completed", "seat 3A booked")
    else:
        (completed,) = [e for e in events if isinstance(e, ToolCompleted)]
        assert completed.error is not None
        assert completed.error.type == outcome


async def test_a_call_cut_off_that_nothing_can_decide_is_left_for_a_person(
    embedded: Backends,
) -> None:
    """A plain tool's call cut off at its deadline may or may not have taken effect."""
    book, calls = slow_tool()
    agent = Agent(name="booker", instructions="book", tools=[book])
    runner = sqlite_runner(embedded, booking_model())
    with pytest.raises(IndeterminateToolCallError, match="cut off at their deadline"):
        await runner.run(agent, "go", tenant=TENANT, run_id="r")
    with pytest.raises(IndeterminateToolCallError):
        await runner.resume(agent, "r", tenant=TENANT)
    assert len(calls) == 1


async def dispatched_then_died(embedded: Backends, agent: Agent, run_id: str) -> None:
    """A run whose process died right after its call's dispatch was written (lease 6 s)."""
    crashing = embedded.runner(
        booking_model(),
        lease_policy=LeasePolicy(ttl=timedelta(seconds=6)),
        observer=CrashAt("tool.dispatched"),
    )
    with pytest.raises(Crash):
        await crashing.run(agent, "go", tenant=TENANT, run_id=run_id)


async def test_a_status_check_is_asked_only_after_the_calls_deadline(
    embedded: Backends, caplog: pytest.LogCaptureFixture
) -> None:
    """Resumed before an earlier holder's call reached its deadline, the run waits until it,
    saying so with the time, and only then asks the status check."""
    asked: list[float] = []

    async def status(key: str) -> Reconciled:
        asked.append(time.time())
        return Reconciled("completed", "seat 3A booked")

    @tool(max_call_s=1.5, reconcile=status)
    async def book(seat: str, *, idempotency_key: str) -> str:
        return "unused"

    agent = Agent(name="booker", instructions="book", tools=[book])
    await dispatched_then_died(embedded, agent, "r")
    (dispatched,) = [
        s.event for s in await embedded.log.read_run("r") if isinstance(s.event, ToolDispatched)
    ]
    assert dispatched.deadline is not None
    deadline = dispatched.deadline
    runner = sqlite_runner(embedded, booking_model(), ttl_s=6)
    with caplog.at_level(logging.WARNING, logger="onward.runner"):
        result = await runner.resume(agent, "r", tenant=TENANT)
    assert result.status == "completed"
    (when,) = asked
    assert when >= deadline / 1_000_000
    assert "waiting" in caplog.text
    assert "for the deadline of b (book)" in caplog.text


async def test_inspect_says_what_keeps_each_undecided_call_from_taking_effect_twice(
    embedded: Backends,
) -> None:
    """The summary `onward inspect` and `onward run --resume` print names each call's kind of
    tool with the one condition its guarantee depends on, and a bounded call's deadline."""

    async def status(key: str) -> Reconciled | None:
        return None

    @tool(max_call_s=1, reconcile=status)
    async def book(seat: str, *, idempotency_key: str) -> str:
        return "unused"

    agent = Agent(name="booker", instructions="book", tools=[book])
    await dispatched_then_died(embedded, agent, "r")
    frontier = await sqlite_runner(embedded, booking_model()).inspect("r", tenant=TENANT)

    def printed(**known: Any) -> str:
        console = Console(width=400, record=True, file=io.StringIO())
        console.print(run_summary(frontier, lease=None, **known))
        return " ".join(console.export_text().split())

    with_tools = printed(agent=agent)
    assert "status-checked: takes effect once if its system refuses calls with an older fence" in (
        with_tools
    )
    assert "within max_call_s=1s" in with_tools
    assert "cut off at " in with_tools
    assert "a plain tool's call is never made again" in printed()


async def test_a_worker_refuses_at_start_a_tool_that_may_outlast_its_lease(
    embedded: Backends,
) -> None:
    """`onward worker --lease-ttl` shorter than a tool's max_call_s plus the renewal margin:
    the worker does not start, rather than refuse every run of that agent."""

    @tool(max_call_s=25)
    async def book(seat: str, *, idempotency_key: str) -> str:
        return "ok"

    agents = {"booker": Agent(name="booker", instructions="book", tools=[book])}
    with pytest.raises(ConfigurationError, match="max_call_s"):
        Worker(
            embedded, booking_model(), agents, lease_policy=LeasePolicy(ttl=timedelta(seconds=30))
        )
