"""While a server is unreachable a run waits a bounded time, stops retryably, and resumes cleanly.

Each case puts a `TcpProxy` in front of one of Kafka, PostgreSQL or Redis, runs an agent
through `AgentRunner` with a booking tool that keeps its own ledger (its status check answers
from it), and cuts the proxy silently mid-run: nothing answers, nothing is refused, the case
that only a timeout ends. The run must stop with `BackendUnavailableError` within a few times
the configured bound (the call that waits, then the lease release that waits too), and once the
proxy is restored another worker must finish the run with the booking made exactly once; also
with a plain booking tool (no status check) when the lease store goes silent between the
dispatch and the call, which then is never made: the log says so, and the resume makes it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiokafka.cluster
import pytest
from support.proxy import TcpProxy
from support.runners import log_runner

from onward.errors import BackendUnavailableError, ResumeConflictError
from onward.eventlog import Event, KafkaEventLog, ModelAnswered, RunStarted, ToolCall
from onward.runtime import (
    Agent,
    PostgresLeaseStore,
    RedisLeaseStore,
    ScriptedProvider,
    reply,
)
from onward.runtime.leases import LeaseStore
from onward.runtime.tools import Reconciled, tool

pytestmark = pytest.mark.kafka

TENANT = "acme"
BOUND_S = 1.0
"""The configured wait of every store in these tests."""
STOPS_WITHIN_S = 4 * BOUND_S + 2.0
"""The failing call's bound, the release's, and room for a loaded machine."""


@dataclass
class Bookings:
    """The tool's own ledger: what really took effect, whatever the log says."""

    made: dict[str, int] = field(default_factory=dict)

    def agent(self, *, checked: bool = True) -> Agent:
        async def status(key: str) -> Reconciled:
            return (
                Reconciled("completed", "booked") if key in self.made else Reconciled("never_ran")
            )

        @tool(reconcile=status if checked else None)
        async def book(seat: str, *, idempotency_key: str) -> str:
            """Book a seat: a side effect that must not happen twice."""
            self.made[idempotency_key] = self.made.get(idempotency_key, 0) + 1
            return f"booked {seat}"

        return Agent(name="booker", instructions="book a seat", tools=[book])


def model() -> ScriptedProvider:
    return ScriptedProvider(
        [reply("booking", ToolCall(call_id="b", tool="book", args={"seat": "3A"})), reply("done")]
    )


class CutAfter:
    """Cuts the proxy silently once an event of ``kind`` is durable; remembers when."""

    def __init__(self, proxy: TcpProxy, kind: type[Event]) -> None:
        self.proxy = proxy
        self.kind = kind
        self.at: float | None = None

    async def appended(self, events: Sequence[Event]) -> None:
        if self.at is None and any(isinstance(e, self.kind) for e in events):
            await self.proxy.cut(silent=True)
            self.at = time.monotonic()

    async def tool_returned(self, call_id: str) -> None:
        return None

    async def before_model_call(self) -> None:
        return None


@dataclass
class Servers:
    kafka: str
    database_url: str
    redis_url: str
    topic: str
    schema: str
    prefix: str


def through(url: str, proxy: TcpProxy) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"{proxy.host}:{proxy.port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) > 1 else host))


def upstream(url: str) -> tuple[str, int]:
    parts = urlsplit(url if "//" in url else f"//{url}")
    assert parts.hostname is not None
    assert parts.port is not None
    return parts.hostname, parts.port


@pytest.fixture
def servers(
    kafka_bootstrap: str, database_url: str, redis_url: str, kafka_topic: str, pg_schema: str
) -> Servers:
    prefix = f"onward-test-{uuid.uuid4().hex}:"
    return Servers(kafka_bootstrap, database_url, redis_url, kafka_topic, pg_schema, prefix)


@pytest.fixture
def kafka_through_proxies() -> Iterator[dict[tuple[str, int], int]]:
    """Broker addresses to reach through a proxy: the broker advertises its own address, so
    the clients are told the proxy's instead (fault injection in the client, not the broker).

    Undone by this fixture's own teardown, not ``monkeypatch``'s, which may run after the
    topic fixture's: its admin client would then be sent to a proxy that is gone.
    """
    redirected: dict[tuple[str, int], int] = {}
    original = aiokafka.cluster.ClusterMetadata.broker_metadata

    def broker_metadata(self: Any, broker_id: Any) -> Any:
        found = original(self, broker_id)
        if found is not None:
            for (host, port), proxied in redirected.items():
                if found.port == port and found.host in (host, "localhost", "127.0.0.1"):
                    return found._replace(host="127.0.0.1", port=proxied)
        return found

    aiokafka.cluster.ClusterMetadata.broker_metadata = broker_metadata
    try:
        yield redirected
    finally:
        redirected.clear()
        aiokafka.cluster.ClusterMetadata.broker_metadata = original


@asynccontextmanager
async def stores(
    servers: Servers, *, kafka: str, leases_on: str, lease_url: str
) -> AsyncIterator[tuple[KafkaEventLog, LeaseStore]]:
    async with AsyncExitStack() as stack:
        log = await stack.enter_async_context(
            KafkaEventLog(kafka, topic=servers.topic, partitions=1, request_timeout_s=BOUND_S)
        )
        leases: LeaseStore
        if leases_on == "redis":
            leases = RedisLeaseStore(lease_url, prefix=servers.prefix, timeout_s=BOUND_S)
        else:
            leases = PostgresLeaseStore(lease_url, schema=servers.schema, timeout_s=BOUND_S)
        await stack.enter_async_context(leases)
        yield log, leases


async def resume_when_released(
    log: KafkaEventLog, leases: LeaseStore, bookings: Bookings, run_id: str, *, checked: bool = True
) -> str:
    runner = log_runner(model(), log, leases, worker="w2")
    deadline = time.monotonic() + 10
    while True:
        try:
            return (
                await runner.resume(bookings.agent(checked=checked), run_id, tenant=TENANT)
            ).status
        except (ResumeConflictError, BackendUnavailableError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


CASES: dict[str, tuple[type[Event], str]] = {
    # server cut: (the event after which it is cut, where the leases live)
    "kafka": (RunStarted, "redis"),
    "postgres": (ModelAnswered, "postgres"),
    "redis": (ModelAnswered, "redis"),
}


@pytest.mark.parametrize("cut", list(CASES))
async def test_a_silent_server_stops_the_run_in_bounded_time_and_a_resume_finishes_it(
    servers: Servers, kafka_through_proxies: dict[tuple[str, int], int], cut: str
) -> None:
    after, leases_on = CASES[cut]
    direct = {"kafka": servers.kafka, "postgres": servers.database_url, "redis": servers.redis_url}
    async with TcpProxy(*upstream(direct[cut])) as proxy:
        urls = dict(direct)
        if cut == "kafka":
            kafka_through_proxies[upstream(servers.kafka)] = proxy.port
            urls["kafka"] = f"127.0.0.1:{proxy.port}"
        else:
            urls[cut] = through(direct[cut], proxy)
        bookings = Bookings()
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        cutter = CutAfter(proxy, after)
        async with stores(
            servers, kafka=urls["kafka"], leases_on=leases_on, lease_url=urls[leases_on]
        ) as (log, leases):
            runner = log_runner(model(), log, leases, worker="w1", observer=cutter)
            with pytest.raises(BackendUnavailableError):
                await runner.run(bookings.agent(), "go", tenant=TENANT, run_id=run_id)
            assert cutter.at is not None
            waited = time.monotonic() - cutter.at
            assert waited < STOPS_WITHIN_S
            await proxy.restore()
            async with stores(
                servers, kafka=urls["kafka"], leases_on=leases_on, lease_url=urls[leases_on]
            ) as (log2, leases2):
                status = await resume_when_released(log2, leases2, bookings, run_id)
    assert status == "completed"
    assert list(bookings.made.values()) == [1]


@pytest.mark.parametrize("leases_on", ["redis", "postgres"])
async def test_a_plain_call_dispatched_as_the_lease_store_went_silent_is_made_once_on_resume(
    servers: Servers, leases_on: str
) -> None:
    """The answer and its dispatch are durable, then the lease store goes silent before it
    confirms the lease: the tool is not called and the run stops in bounded time. The call
    has no status check, and the log says it never ran, so the resume makes it (once) rather
    than leave the run to a person over a call that was never made."""
    direct = {"postgres": servers.database_url, "redis": servers.redis_url}
    async with TcpProxy(*upstream(direct[leases_on])) as proxy:
        bookings = Bookings()
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        cutter = CutAfter(proxy, ModelAnswered)
        lease_url = through(direct[leases_on], proxy)
        async with stores(
            servers, kafka=servers.kafka, leases_on=leases_on, lease_url=lease_url
        ) as (log, leases):
            runner = log_runner(model(), log, leases, worker="w1", observer=cutter)
            with pytest.raises(BackendUnavailableError):
                await runner.run(bookings.agent(checked=False), "go", tenant=TENANT, run_id=run_id)
            assert bookings.made == {}
            await proxy.restore()
            async with stores(
                servers, kafka=servers.kafka, leases_on=leases_on, lease_url=lease_url
            ) as (log2, leases2):
                status = await resume_when_released(log2, leases2, bookings, run_id, checked=False)
    assert status == "completed"
    assert list(bookings.made.values()) == [1]


async def test_a_kafka_log_closes_in_bounded_time_while_the_broker_is_silent(
    servers: Servers, kafka_through_proxies: dict[tuple[str, int], int]
) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    first = RunStarted(
        run_id=run_id, tenant=TENANT, seq=1, fence=1, at=1, agent="a", revision="r1", input="go"
    )
    second = ModelAnswered(
        run_id=run_id,
        tenant=TENANT,
        seq=2,
        fence=1,
        at=2,
        message=reply("thinking").message,
        tool_calls=[],
    )
    async with TcpProxy(*upstream(servers.kafka)) as proxy:
        kafka_through_proxies[upstream(servers.kafka)] = proxy.port
        log = KafkaEventLog(
            f"127.0.0.1:{proxy.port}", topic=servers.topic, partitions=1, request_timeout_s=BOUND_S
        )
        running_before = asyncio.all_tasks()
        await log.start()
        await log.append([first])
        await proxy.cut(silent=True)
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError, match="did not acknowledge"):
            await log.append([second])
        await log.close()
        assert time.monotonic() - started < 3 * BOUND_S + 2.0
        await proxy.restore()
        # Nothing of the closed log's clients runs on once the requests in flight end: a
        # metadata task left behind would open a connection every few minutes for as long as
        # the event loop lives.
        ends_by = time.monotonic() + 10 * BOUND_S
        while left := [t for t in asyncio.all_tasks() - running_before if _of_aiokafka(t)]:
            assert time.monotonic() < ends_by, f"still running after the log closed: {left}"
            await asyncio.sleep(0.05)
    kafka_through_proxies.clear()
    async with KafkaEventLog(servers.kafka, topic=servers.topic, partitions=1) as reader:
        stored = [s.event for s in await reader.read_run(run_id)]
    assert stored[0] == first  # what was acknowledged is there; the rest may or may not be


def _of_aiokafka(task: asyncio.Task[object]) -> bool:
    """Whether a task runs aiokafka's code (its client's metadata refresh, a sender)."""
    coro = task.get_coro()
    module = getattr(getattr(coro, "cr_code", None), "co_filename", "")
    return "aiokafka" in module
