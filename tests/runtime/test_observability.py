"""Metrics, health and readiness, and OpenTelemetry spans, in one process.

The runner counts what it did (steps, tool calls by how they ended, leases, fenced writes) and
the process's registry exposes it; a span per run step and per tool call goes to whatever
tracer provider the application set, and nothing happens without `opentelemetry-api`. The
processes (`onward worker`, `onward projector` with ``--metrics-port``) are tested in
``test_observability_processes.py``.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.compaction_world import sqlite_world
from typer.testing import CliRunner

from onward.errors import FencedError, IndeterminateToolCallError, ResumeConflictError
from onward.eventlog import MemoryEventLog, Message, ToolCall
from onward.runtime.agent import Agent
from onward.runtime.cli import app
from onward.runtime.compaction import CheckpointCompactor
from onward.runtime.leases import LeasePolicy
from onward.runtime.leases.holder import Leaseholder
from onward.runtime.leases.memory import MemoryLeaseStore
from onward.runtime.observability import (
    COUNTS,
    HealthServer,
    process_registry,
    server,
    use_tracer_provider,
)
from onward.runtime.providers import ModelReply, ScriptedProvider, reply
from onward.runtime.runner import AgentRunner
from onward.runtime.tools import Reconciled, tool

TENANT = "tenant-that-never-shows"


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scraped() -> Samples:
    """Every sample of the process's registry, by name and labels."""
    text = generate_latest(process_registry()).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Spans of this test, through a provider of its own (the global one is left alone)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    use_tracer_provider(provider)
    try:
        yield exporter
    finally:
        use_tracer_provider(None)
        provider.shutdown()


def two_calls_agent() -> tuple[Agent, ScriptedProvider]:
    """One turn: a call that returns and one that fails; then the answer."""

    @tool
    async def look(*, idempotency_key: str) -> str:
        return "found"

    @tool
    async def book(*, idempotency_key: str) -> str:
        raise RuntimeError("sold out")

    model = ScriptedProvider(
        [
            reply("", ToolCall(call_id="a", tool="look"), ToolCall(call_id="b", tool="book")),
            reply("done"),
        ]
    )
    return Agent(name="booker", instructions="book", tools=[look, book]), model


async def test_a_run_counts_its_steps_tool_calls_and_lease() -> None:
    agent, model = two_calls_agent()
    before = scraped()
    result = await AgentRunner(provider=model, log=MemoryEventLog(), worker="w").run(
        agent, "go", tenant=TENANT
    )
    assert result.status == "completed"
    after = scraped()
    assert moved(before, after, "onward_run_steps_total", step="model") == 2
    assert moved(before, after, "onward_run_steps_total", step="tools") == 1
    assert moved(before, after, "onward_run_step_duration_seconds_count", step="model") == 2
    assert moved(before, after, "onward_tool_calls_total", disposition="completed") == 1
    assert moved(before, after, "onward_tool_calls_total", disposition="error") == 1
    assert moved(before, after, "onward_tool_call_duration_seconds_count") == 2
    assert moved(before, after, "onward_lease_claims_total") == 1
    assert not any(TENANT in "".join(v for _, v in labels) for _, labels in after)


async def test_calls_cut_off_at_their_deadline_count_as_reconciled_or_indeterminate() -> None:
    async def took_effect(key: str) -> Reconciled:
        return Reconciled("completed", {"booked": key})

    @tool(max_call_s=0.05, reconcile=took_effect)
    async def book(*, idempotency_key: str) -> str:
        await asyncio.sleep(1)
        return "late"

    @tool(max_call_s=0.05)
    async def charge(*, idempotency_key: str) -> str:
        await asyncio.sleep(1)
        return "late"

    before = scraped()
    for name, tools in (("booker", [book]), ("charger", [charge])):
        call = ToolCall(call_id="c", tool=tools[0].name)
        model = ScriptedProvider([reply("", call), reply("done")])
        runner = AgentRunner(provider=model, log=MemoryEventLog(), worker="w")
        agent = Agent(name=name, instructions=name, tools=tools)
        if name == "charger":
            with pytest.raises(IndeterminateToolCallError):
                await runner.run(agent, "go", tenant=TENANT)
        else:
            assert (await runner.run(agent, "go", tenant=TENANT)).status == "completed"
    after = scraped()
    assert moved(before, after, "onward_tool_calls_total", disposition="reconciled") == 1
    assert moved(before, after, "onward_tool_calls_total", disposition="indeterminate") == 1


async def test_a_lease_taken_by_another_counts_a_conflict() -> None:
    store = MemoryLeaseStore()
    conflicts = COUNTS.lease_conflicts
    async with Leaseholder(store, "r", tenant=TENANT, holder="a"):
        with pytest.raises(ResumeConflictError):
            async with Leaseholder(store, "r", tenant=TENANT, holder="b"):
                pass
    assert COUNTS.lease_conflicts == conflicts + 1


async def test_a_write_after_the_lease_was_taken_over_counts_as_refused() -> None:
    """Another holder takes the run while its tool runs: the outcome's write is refused, and
    the call counts as interrupted."""
    log = MemoryEventLog()
    runner: AgentRunner | None = None

    @tool
    async def slow(*, idempotency_key: str) -> str:
        assert runner is not None
        held = await runner.leases.current("r")
        assert held is not None
        await runner.leases.release(held)
        await runner.leases.acquire("r", tenant=TENANT, holder="thief", ttl_s=60)
        await asyncio.sleep(0.6)  # the holder's renewal is refused meanwhile
        return "done"

    model = ScriptedProvider([reply("", ToolCall(call_id="c", tool="slow")), reply("done")])
    policy = LeasePolicy(ttl=timedelta(seconds=0.4), renew_within=timedelta(seconds=0.2))
    runner = AgentRunner(provider=model, log=log, worker="w", lease_policy=policy)
    refused = COUNTS.fenced_writes_refused
    interrupted = COUNTS.tool_calls["interrupted"]
    with pytest.raises(FencedError):
        await runner.run(
            Agent(name="a", instructions="a", tools=[slow]), "go", tenant=TENANT, run_id="r"
        )
    assert COUNTS.fenced_writes_refused == refused + 1
    assert COUNTS.tool_calls["interrupted"] == interrupted + 1


async def test_one_span_per_step_and_per_tool_call_with_ids_only(
    spans: InMemorySpanExporter,
) -> None:
    agent, model = two_calls_agent()
    log = MemoryEventLog()
    await AgentRunner(provider=model, log=log, worker="w").run(
        agent, "go", tenant=TENANT, run_id="r1"
    )
    fence = (await log.read_run("r1"))[-1].event.fence
    finished = spans.get_finished_spans()
    steps = sorted((s for s in finished if s.name == "onward.run.step"), key=_start)
    calls = sorted((s for s in finished if s.name == "onward.tool_call"), key=_start)
    assert [_attrs(s)["onward.step"] for s in steps] == ["model", "tools", "model"]
    assert {(_attrs(s)["onward.tool"], _attrs(s)["onward.disposition"]) for s in calls} == {
        ("look", "completed"),
        ("book", "error"),
    }
    for span in [*steps, *calls]:
        assert _attrs(span)["onward.run_id"] == "r1"
        assert _attrs(span)["onward.fence"] == fence
        assert TENANT not in repr(dict(_attrs(span)))
    turn = steps[1]
    for call in calls:
        assert call.parent is not None
        assert turn.context is not None
        assert call.parent.span_id == turn.context.span_id


async def test_a_failed_step_s_span_names_the_error_type_not_its_message(
    spans: InMemorySpanExporter,
) -> None:
    """An exception out of a step (here the model's) may hold the run's data: its span says
    that the step failed and with which type, never the message or the traceback."""

    class Failing:
        async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
            raise RuntimeError(f"could not answer {messages[-1].content}")

    secret = "card 4111 1111 1111 1111"
    with pytest.raises(RuntimeError):
        await AgentRunner(provider=Failing(), log=MemoryEventLog(), worker="w").run(
            Agent(name="a", instructions="a"), secret, tenant=TENANT, run_id="r1"
        )
    (step,) = spans.get_finished_spans()
    assert step.name == "onward.run.step"
    assert step.status.status_code.name == "ERROR"
    assert step.status.description == "RuntimeError"
    recorded = repr(
        (dict(step.attributes or {}), [(e.name, dict(e.attributes or {})) for e in step.events])
    )
    assert secret not in recorded
    assert "4111" not in recorded


def _start(span: ReadableSpan) -> int:
    return span.start_time or 0


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_without_opentelemetry_nothing_is_traced_and_runs_go_on() -> None:
    """`opentelemetry` cannot be imported (the ``otel`` extra is not installed)."""
    script = textwrap.dedent(
        """
        import asyncio, sys
        sys.modules["opentelemetry"] = None  # import fails, as when it is not installed
        from onward.eventlog import MemoryEventLog
        from onward.runtime.agent import Agent
        from onward.runtime.observability import COUNTS, tracing
        from onward.runtime.providers import ScriptedProvider, reply
        from onward.runtime.runner import AgentRunner

        assert tracing._tracer is None
        runner = AgentRunner(provider=ScriptedProvider([reply("hi")]), log=MemoryEventLog())
        result = asyncio.run(runner.run(Agent(name="a", instructions="a"), "go", tenant="t"))
        print(result.status, COUNTS.steps["model"])
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["completed", "1"]


async def test_the_server_answers_metrics_health_and_readiness(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    why: list[str | None] = [None]
    hang = asyncio.Event()

    async def ready() -> str | None:
        if why[0] == "hang":
            await hang.wait()
        return why[0]

    async with (
        HealthServer(process_registry(), ready=ready, port=0) as health,
        httpx.AsyncClient(base_url=health.url) as http,
    ):
        assert health.port > 0
        answer = await http.get("/healthz")
        assert (answer.status_code, answer.text) == (200, "ok\n")
        assert (await http.get("/readyz")).status_code == 200
        why[0] = "PostgreSQL unreachable: connection refused"
        answer = await http.get("/readyz")
        assert (answer.status_code, answer.text) == (503, f"{why[0]}\n")
        monkeypatch.setattr(server, "READY_WITHIN_S", 0.1)
        why[0] = "hang"
        answer = await http.get("/readyz")
        assert answer.status_code == 503
        assert answer.text.startswith("not ready: no answer within")
        assert (await http.get("/healthz")).status_code == 200
        answer = await http.get("/metrics")
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/plain; version=")
        names = {f.name for f in text_string_to_metric_families(answer.text)}
        assert {
            "onward_run_steps",
            "onward_tool_calls",
            "onward_lease_claims",
            "onward_checkpoints_not_written",
        } <= names
        head = await http.head("/metrics")
        assert head.status_code == 200
        assert head.content == b""
        assert int(head.headers["content-length"]) > 0
        assert (await http.get("/other")).status_code == 404
        assert (await http.post("/metrics")).status_code == 405
        port = health.port
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient() as http:
            await http.get(f"http://127.0.0.1:{port}/healthz")


async def test_closing_the_server_ends_the_connections_it_holds() -> None:
    """A connection still open, or still being answered, when the server closes is closed
    with it: nothing of the server outlives `close` to answer later (from stores that are
    being closed meanwhile)."""
    asked = asyncio.Event()
    checked: list[str] = []

    async def ready() -> str | None:
        asked.set()
        try:
            await asyncio.sleep(3)
        except asyncio.CancelledError:
            checked.append("cancelled")
            raise
        checked.append("answered")
        return None

    health = HealthServer(process_registry(), ready=ready, port=0)
    await health.start()
    idle = await asyncio.open_connection("127.0.0.1", health.port)
    asking = await asyncio.open_connection("127.0.0.1", health.port)
    asking[1].write(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(asked.wait(), 5)
    await asyncio.wait_for(health.close(), 1)
    for reader, writer in (idle, asking):
        assert await asyncio.wait_for(reader.read(), 1) == b""
        writer.close()
    assert checked == ["cancelled"]
    assert not [t for t in asyncio.all_tasks() if "HealthServer" in repr(t.get_coro())]


async def test_a_compaction_pass_that_cuts_counts_the_records_and_bytes(tmp_path: Path) -> None:
    """What a dry run says it would cut is what the pass that cuts counts."""
    async with sqlite_world(tmp_path) as world:
        await world.finished_run("done-0", turns=2)
        await world.finished_run("done-1", turns=3)
        await world.fold()
        compactor = CheckpointCompactor(world.log, world.frontiers, world.store, no_archive=True)
        planned = await compactor.dry_run()
        assert planned.events_cut > 0
        assert planned.bytes_cut
        events, size = COUNTS.compaction_events_cut, COUNTS.compaction_bytes_cut
        report = await compactor.compact()
        assert report.events_cut == planned.events_cut
        assert report.bytes_cut is None  # the report of a pass that cut still says nothing
        assert COUNTS.compaction_events_cut == events + planned.events_cut
        assert COUNTS.compaction_bytes_cut == size + planned.bytes_cut


def test_a_metrics_port_in_use_exits_2_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "x.db")}
        args = ["worker", "--agent", "support.fleet:agents", "--provider", "support.fleet:provider"]
        result = CliRunner().invoke(app, [*args, "--metrics-port", str(port)], env=env)
    assert result.exit_code == 2, result.output
    assert f"--metrics-port: cannot serve on 127.0.0.1:{port}" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


async def test_a_flood_of_connections_is_bounded_and_shares_one_readiness_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Connections past the cap are answered 503 and closed at once (each one held would take
    a file descriptor the stores need), and readiness requests arriving together probe the
    stores once, not once each."""
    monkeypatch.setattr(server, "MAX_CONNECTIONS", 4, raising=False)
    checks = 0
    release = asyncio.Event()

    async def ready() -> str | None:
        nonlocal checks
        checks += 1
        await release.wait()
        return None

    async with HealthServer(process_registry(), ready=ready, port=0) as health:
        asking = [await asyncio.open_connection("127.0.0.1", health.port) for _ in range(3)]
        for _, writer in asking:
            writer.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        silent = await asyncio.open_connection("127.0.0.1", health.port)
        await asyncio.sleep(0.2)
        over = await asyncio.open_connection("127.0.0.1", health.port)
        answer = await asyncio.wait_for(over[0].read(), 1)
        assert answer.startswith(b"HTTP/1.1 503 ")
        assert answer.endswith(b"too many connections\n")
        release.set()
        for reader, writer in asking:
            assert (await asyncio.wait_for(reader.read(), 2)).startswith(b"HTTP/1.1 200 ")
            writer.close()
        assert checks == 1
        async with httpx.AsyncClient(base_url=health.url) as http:
            assert (await http.get("/readyz")).status_code == 200
        assert checks == 2
        for _, writer in (silent, over):
            writer.close()


class _WideSeries:
    """A collector of ``count`` series, each labelled ``width`` characters wide: a `/metrics`
    answer far larger than a socket holds, from few series (each series costs the event loop
    time to render, and the server renders on it)."""

    def __init__(self, count: int, width: int) -> None:
        self.count = count
        self.width = width

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("wide_series", "One gauge per partition.", labels=["n"])
        for n in range(self.count):
            family.add_metric([str(n).rjust(self.width, "0")], n)
        yield family


async def test_clients_that_never_read_their_answer_do_not_hold_the_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client that asks for `/metrics` and never reads the answer held its connection for as
    long as it stayed open (the wait for the answer to be sent had no bound): enough of them
    and every `/healthz` after was answered 503, so the orchestrator killed a healthy worker."""
    monkeypatch.setattr(server, "MAX_CONNECTIONS", 4, raising=False)
    monkeypatch.setattr(server, "_REQUEST_WITHIN_S", 0.5, raising=False)
    registry = CollectorRegistry()
    registry.register(_WideSeries(2_000, width=4_000))  # 8 MB: past any socket buffer

    async def ready() -> str | None:
        return None

    stuck: list[socket.socket] = []
    async with HealthServer(registry, ready=ready, port=0) as health:
        try:
            for _ in range(4):
                client = socket.socket()
                client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                client.connect(("127.0.0.1", health.port))
                client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                stuck.append(client)
            # Each stuck answer gives up after `_REQUEST_WITHIN_S`: /healthz is answered again
            # then, and never was while the wait had no bound.
            async with httpx.AsyncClient(base_url=health.url) as http:
                deadline = asyncio.get_running_loop().time() + 10
                answer = await http.get("/healthz")
                while answer.status_code != 200 and asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(0.05)
                    answer = await http.get("/healthz")
        finally:
            for client in stuck:
                client.close()
    assert (answer.status_code, answer.text) == (200, "ok\n")
