"""Bounds at every entry point (security review #10, #12, #16, #17, #18, #19): names without
control characters and of bounded length, values of bounded depth, refused requests that leave
no lease state behind, and refusals that tell another tenant nothing about a run."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import sqlite3
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, closing
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from support.kafka import delete_topic
from support.pg import fresh_schema
from support.redis import fresh_prefix
from support.workers import CountingLog

from onward.errors import (
    BackendUnavailableError,
    ConfigurationError,
    InvalidInputError,
    NothingToResumeError,
    ResumeConflictError,
)
from onward.eventlog import (
    MemoryEventLog,
    Message,
    ModelAnswered,
    RunStarted,
    SqliteEventLog,
    ToolCall,
    ToolCompleted,
    ToolDispatched,
)
from onward.eventlog.base import partition_for
from onward.projections.memory import MemoryFrontierStore
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.agent import Agent
from onward.runtime.backends import open_backends
from onward.runtime.checkpoint import CheckpointPolicy
from onward.runtime.fleet.requests import (
    AnswerRequest,
    CancelRun,
    Requests,
    ResumeRun,
    StartRun,
    TagRun,
    check_request,
    decode_request,
    encode_request,
)
from onward.runtime.fleet.worker import Worker
from onward.runtime.leases import (
    LeaseStore,
    MemoryLeaseStore,
    PostgresLeaseStore,
    RedisLeaseStore,
    SqliteLeaseStore,
)
from onward.runtime.limits import MAX_DEPTH, MAX_TAGS_PER_RUN, MAX_TOOL_CALLS_PER_TURN
from onward.runtime.openai import UNPARSED, OpenAICompatibleProvider
from onward.runtime.options import ExecutionMode, Options
from onward.runtime.providers import ModelReply, ScriptedProvider, reply
from onward.runtime.runner import TOO_DEEP_ARGUMENTS, AgentRunner
from onward.runtime.settings import Settings
from onward.runtime.tools import tool

TENANT = "acme"
LONG = "x" * 201


@tool(requires_approval=True)
async def pay(amount: int, *, idempotency_key: str) -> dict[str, Any]:
    return {"paid": amount}


def payer() -> Agent:
    return Agent(name="payer", instructions="pay", tools=[pay])


def paying_model() -> ScriptedProvider:
    return ScriptedProvider(
        [reply("paying", ToolCall(call_id="c1", tool="pay", args={"amount": 5})), reply("paid")]
    )


def memory_runner(log: MemoryEventLog | None = None) -> AgentRunner:
    return AgentRunner(
        provider=paying_model(),
        log=log or MemoryEventLog(partitions=2),
        frontiers=MemoryFrontierStore(),
        checkpoint_inline=True,
    )


async def waiting_run(runner: AgentRunner, run_id: str = "r1") -> str:
    """A run of ``TENANT`` waiting on a person's approval of call ``c1``."""
    result = await runner.run(payer(), "pay 5", tenant=TENANT, run_id=run_id)
    assert (result.status, result.waiting_on) == ("waiting", "c1")
    return run_id


async def log_size(runner: AgentRunner) -> int:
    sizes = [(await runner.log.bounds(p)).end for p in range(runner.log.partitions)]
    return sum(sizes)


Entry = Callable[[AgentRunner, str], Awaitable[object]]

ENTRIES: dict[str, tuple[Entry, str]] = {
    "run: NUL in the run id": (
        lambda r, _: r.run(payer(), "go", tenant=TENANT, run_id="a\x00b"),
        "run_id",
    ),
    "run: escape in the tenant": (
        lambda r, _: r.run(payer(), "go", tenant="ac\x1bme", run_id="new"),
        "tenant",
    ),
    "run: NUL in options.user": (
        lambda r, _: r.run(payer(), "go", tenant=TENANT, run_id="new", options={"user": "a\x00"}),
        "options.user",
    ),
    "run: a run id over 200 characters": (
        lambda r, _: r.run(payer(), "go", tenant=TENANT, run_id=LONG),
        "run_id",
    ),
    "approve: NUL in by": (
        lambda r, run: r.approve(run, "c1", tenant=TENANT, by="ann\x00"),
        "by",
    ),
    "approve: by over 200 characters": (
        lambda r, run: r.approve(run, "c1", tenant=TENANT, by=LONG),
        "by",
    ),
    "deny: newline in by": (
        lambda r, run: r.deny(run, "c1", tenant=TENANT, by="ann\nroot"),
        "by",
    ),
    "resolve: NUL in the call id": (
        lambda r, run: r.resolve(
            run, "c\x00", tenant=TENANT, outcome="never_ran", by="ann", why="checked"
        ),
        "call_id",
    ),
    "resolve: NUL in why": (
        lambda r, run: r.resolve(
            run, "c1", tenant=TENANT, outcome="never_ran", by="ann", why="checked\x00"
        ),
        "why",
    ),
    "tag: newline in the label": (
        lambda r, run: r.tag(run, "ok\nFAKE LOG LINE", tenant=TENANT),
        "label",
    ),
    "tag: a label over 200 characters": (lambda r, run: r.tag(run, LONG, tenant=TENANT), "label"),
    "tag: NUL in by": (lambda r, run: r.tag(run, "ok", tenant=TENANT, by="a\x00"), "by"),
    "cancel: why not a string": (
        lambda r, run: r.cancel(run, tenant=TENANT, by="ann", why=None),  # type: ignore[arg-type]
        "why",
    ),
    "ask_to_cancel: why not a string": (
        lambda r, run: r.ask_to_cancel(run, tenant=TENANT, by="ann", why=None),  # type: ignore[arg-type]
        "why",
    ),
}


@pytest.mark.parametrize("case", sorted(ENTRIES))
async def test_every_entry_point_refuses_a_name_out_of_bounds_and_writes_nothing(
    case: str,
) -> None:
    """security review #10/#12: NUL and other control characters, and names over 200
    characters, are refused at runner.run/approve/deny/resolve/tag with `InvalidInputError`
    naming the field; nothing is written."""
    call, field = ENTRIES[case]
    runner = memory_runner()
    run = await waiting_run(runner)
    before = await log_size(runner)
    with pytest.raises(InvalidInputError, match=field):
        await call(runner, run)
    assert await log_size(runner) == before


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"user": "ann\x00"}, "user"),
        ({"tenant": "ac\x07me"}, "tenant"),
        ({"run_id": "r\x00"}, "run_id"),
        ({"agent": "a" * 201}, "agent"),
    ],
)
def test_options_refuse_control_characters_and_long_names(
    fields: dict[str, str], named: str
) -> None:
    """security review #12: `Options` refuses control characters in its names (it already
    capped their length, now the agent's too), naming the field."""
    with pytest.raises(InvalidInputError, match=named):
        Options.of(fields)


def test_a_cancel_whose_why_is_not_a_string_is_refused() -> None:
    """`App.cancel` checks its request as built, not decoded: a ``why`` of ``None`` went on to
    the lease store's ask (and, in Redis, failed the other calls sent with it)."""
    request = CancelRun(run_id="r", tenant=TENANT, by="ops", why=None)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=r"CancelRun\.why"):
        check_request(request)


@pytest.mark.parametrize(
    ("request_", "named"),
    [
        (StartRun(run_id="r", tenant="a\x00", agent="payer"), "StartRun.tenant"),
        (StartRun(run_id=LONG, tenant=TENANT, agent="payer"), "StartRun.run_id"),
        (
            AnswerRequest(run_id="r", tenant=TENANT, request_id="c1", approve=True, by="\x00"),
            "AnswerRequest.by",
        ),
        (TagRun(run_id="r", tenant=TENANT, label="x" * 201), "TagRun.label"),
        (TagRun(run_id="r", tenant=TENANT, label="ok", by="a\rb"), "TagRun.by"),
        (CancelRun(run_id="r", tenant=TENANT, by=""), "CancelRun.by"),
        (CancelRun(run_id="r", tenant=TENANT, by="ops", why="x" * 10_001), "CancelRun.why"),
        (CancelRun(run_id="r", tenant=TENANT, by="ops", why="a\x07b"), "CancelRun.why"),
    ],
)
def test_requests_out_of_bounds_are_refused_when_decoded(request_: Any, named: str) -> None:
    """security review #10/#12: a request off the topic is held to the same bounds as a call
    of the runner, and refused naming the field."""
    with pytest.raises(InvalidInputError, match=named):
        decode_request(encode_request(request_))


async def test_a_run_holds_at_most_its_cap_of_tags() -> None:
    """security review #10: tags per run are capped (MAX_TAGS_PER_RUN): the one past the cap
    is refused and not written, so a flood of tags cannot push a frontier over its size cap."""
    runner = memory_runner()
    run = await waiting_run(runner)
    for n in range(MAX_TAGS_PER_RUN):
        await runner.tag(run, f"t{n}", tenant=TENANT, seq=1)
    before = await log_size(runner)
    with pytest.raises(InvalidInputError, match="tags"):
        await runner.tag(run, "one too many", tenant=TENANT, seq=1)
    assert await log_size(runner) == before
    assert len((await runner.inspect(run, tenant=TENANT)).tags) == MAX_TAGS_PER_RUN


# -- refused requests leave no lease state (#10, #19) -------------------------------------------


class LeaseWorld:
    """A runner on one lease backend, and a count of the lease state the store keeps."""

    def __init__(self, runner: AgentRunner, count: Callable[[], Awaitable[int]]) -> None:
        self.runner = runner
        self.count = count


@pytest_asyncio.fixture(params=["sqlite", "postgres", "redis"])
async def lease_world(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LeaseWorld]:
    async with AsyncExitStack() as stack:
        if request.param == "sqlite":
            path = tmp_path / "onward.db"
            log = await stack.enter_async_context(SqliteEventLog(path, partitions=2))
            frontiers = await stack.enter_async_context(SqliteFrontierStore(path))
            runner = AgentRunner(
                provider=paying_model(), log=log, frontiers=frontiers, checkpoint_inline=True
            )

            async def count() -> int:
                with closing(sqlite3.connect(path)) as conn:
                    return int(conn.execute("SELECT count(*) FROM onward_leases").fetchone()[0])

            yield LeaseWorld(runner, count)
            return
        leases: LeaseStore
        if request.param == "postgres":
            database_url: str = request.getfixturevalue("database_url")
            schema = await stack.enter_async_context(fresh_schema(database_url))
            leases = await stack.enter_async_context(
                PostgresLeaseStore(database_url, schema=schema)
            )

            async def count() -> int:
                conn = await asyncpg.connect(database_url)
                try:
                    return int(
                        await conn.fetchval(f'SELECT count(*) FROM "{schema}".onward_leases')
                    )
                finally:
                    await conn.close()

        else:
            redis_url: str = request.getfixturevalue("redis_url")
            prefix = await stack.enter_async_context(fresh_prefix(redis_url))
            leases = await stack.enter_async_context(RedisLeaseStore(redis_url, prefix=prefix))

            async def count() -> int:
                client = aioredis.from_url(redis_url)
                try:
                    return len([k async for k in client.scan_iter(f"{prefix}*")])
                finally:
                    await client.aclose()

        runner = AgentRunner(
            provider=paying_model(),
            log=MemoryEventLog(partitions=2),
            leases=leases,
            frontiers=MemoryFrontierStore(),
            checkpoint_inline=True,
        )
        yield LeaseWorld(runner, count)


async def test_refused_answers_tags_and_resumes_of_unknown_runs_leave_no_lease_state(
    lease_world: LeaseWorld,
) -> None:
    """security review #10: 2,000 approves, denies, tags and resumes of runs that do not exist
    are refused and leave no row in onward_leases (SQLite, PostgreSQL) and no lease: or fence:
    key in Redis. Answers and tags are refused before any lease is taken; a resume reads the
    run only under its lease, and forgets that lease when it finds no run."""
    runner = lease_world.runner
    for n in range(2_000):
        attempt = (
            runner.approve(f"nope-{n}", "c1", tenant=TENANT, by="ann")
            if n % 4 == 0
            else runner.deny(f"nope-{n}", "c1", tenant=TENANT, by="ann")
            if n % 4 == 1
            else runner.tag(f"nope-{n}", "label", tenant=TENANT)
            if n % 4 == 2
            else runner.resume(payer(), f"nope-{n}", tenant=TENANT)
        )
        with pytest.raises(NothingToResumeError):
            await attempt
    assert await lease_world.count() == 0


ANOTHER_TENANTS: dict[str, Callable[[AgentRunner, str], Awaitable[object]]] = {
    "approve": lambda runner, run: runner.approve(run, "c1", tenant="evil", by="mallory"),
    "resume": lambda runner, run: runner.resume(payer(), run, tenant="evil"),
}


@pytest.mark.parametrize("attempt", sorted(ANOTHER_TENANTS))
async def test_another_tenants_answers_and_resumes_never_take_the_runs_lease(
    lease_world: LeaseWorld, attempt: str
) -> None:
    """security review #19: another tenant's answers to a run, and resumes of it, are refused
    before its lease is taken: they neither hold the run, even briefly, nor raise its fence."""
    runner = lease_world.runner
    run = await waiting_run(runner)
    state = await lease_world.count()
    fence = (await runner.inspect(run, tenant=TENANT)).fence
    for _ in range(50):
        with pytest.raises(NothingToResumeError):
            await ANOTHER_TENANTS[attempt](runner, run)
    assert await lease_world.count() == state
    assert (await runner.inspect(run, tenant=TENANT)).fence == fence
    await runner.approve(run, "c1", tenant=TENANT, by="ann")
    assert (await runner.inspect(run, tenant=TENANT)).fence == fence + 1


async def test_another_tenants_starts_under_a_runs_id_never_take_its_lease(
    lease_world: LeaseWorld,
) -> None:
    """security review #19: a start under an id whose run is stored is refused before the
    lease is taken, so another tenant's flood of starts neither holds the run nor raises its
    fence (its resumes are not delayed), and the refusal reads "already exists or is not
    permitted"."""
    runner = lease_world.runner

    async def next_fence() -> int:
        lease = await runner.leases.acquire("r1", tenant=TENANT, holder="probe", ttl_s=30)
        await runner.leases.release(lease)
        return lease.fence

    run = await waiting_run(runner)
    before = await next_fence()
    for _ in range(50):
        with pytest.raises(InvalidInputError, match="already exists or is not permitted"):
            await runner.run(payer(), "go", tenant="evil", run_id=run)
    assert await next_fence() == before + 1


@pytest_asyncio.fixture(params=["memory", "sqlite", "postgres", "redis"])
async def lease_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LeaseStore]:
    store: LeaseStore
    async with AsyncExitStack() as stack:
        if request.param == "memory":
            store = MemoryLeaseStore()
        elif request.param == "sqlite":
            store = SqliteLeaseStore(tmp_path / "leases.db")
        elif request.param == "postgres":
            database_url: str = request.getfixturevalue("database_url")
            schema = await stack.enter_async_context(fresh_schema(database_url))
            store = PostgresLeaseStore(database_url, schema=schema)
        else:
            redis_url: str = request.getfixturevalue("redis_url")
            prefix = await stack.enter_async_context(fresh_prefix(redis_url))
            store = RedisLeaseStore(redis_url, prefix=prefix)
        async with store:
            yield store


async def test_a_conflict_names_the_holder_to_the_runs_own_tenant_only(
    lease_store: LeaseStore,
) -> None:
    """security review #19: `ResumeConflictError` names the holder (here a person's email) to
    the run's own tenant; another tenant learns neither the holder nor that the run is held
    for sure."""
    holder = "person:alice@acme.example"
    await lease_store.acquire("r1", tenant=TENANT, holder=holder, ttl_s=30)
    with pytest.raises(ResumeConflictError) as other:
        await lease_store.acquire("r1", tenant="evil", holder="w-evil", ttl_s=30)
    assert other.value.holder is None
    assert other.value.expires_at is None
    assert "alice" not in str(other.value)
    assert " until " not in str(other.value)
    assert "not this tenant's" in str(other.value)
    with pytest.raises(ResumeConflictError) as own:
        await lease_store.acquire("r1", tenant=TENANT, holder="w2", ttl_s=30)
    assert own.value.holder == holder
    assert holder in str(own.value)


async def test_starting_another_tenants_run_id_reads_like_not_permitted() -> None:
    """security review #19: starting a run under an id another tenant's run holds is refused
    with the words its own tenant gets, "already exists or is not permitted", so the refusal
    does not confirm that the id is another tenant's run."""
    runner = memory_runner()
    run = await waiting_run(runner)
    with pytest.raises(InvalidInputError) as theirs:
        await runner.run(payer(), "go", tenant="evil", run_id=run)
    with pytest.raises(InvalidInputError) as ours:
        await runner.run(payer(), "go", tenant=TENANT, run_id=run)
    assert "already exists or is not permitted" in str(theirs.value)
    assert str(theirs.value).replace("'evil'", "'acme'") == str(ours.value)


# -- limits on what a run may cost (#17) ---------------------------------------------------------


def always_calling(calls_per_answer: int) -> ScriptedProvider:
    """A model that asks for ``calls_per_answer`` calls of ``note`` in every answer, forever."""

    def script(messages: Sequence[Message]) -> ModelReply:
        turn = sum(1 for m in messages if m.role == "assistant")
        calls = [
            ToolCall(call_id=f"t{turn}-{n}", tool="note", args={"n": n})
            for n in range(calls_per_answer)
        ]
        return reply(f"turn {turn}", *calls)

    return ScriptedProvider(script)


@tool
async def note(n: int, *, idempotency_key: str) -> int:
    return n


def noter(max_iterations: int = 25) -> Agent:
    return Agent(name="noter", instructions="note", tools=[note], max_iterations=max_iterations)


async def test_options_lower_the_agents_iteration_bound_but_never_raise_it() -> None:
    """security review #17: a run's max_iterations above the agent's own bound runs with the
    agent's bound (recorded so in RunStarted); the agent's max_iterations is the ceiling."""
    log = MemoryEventLog(partitions=2)
    runner = AgentRunner(provider=always_calling(1), log=log)
    result = await runner.run(
        noter(max_iterations=2), "go", tenant=TENANT, run_id="r", options={"max_iterations": 5}
    )
    assert result.status == "failed"
    assert result.error is not None
    assert "max_iterations=2" in result.error
    (started,) = [s.event for s in await log.read_run("r") if isinstance(s.event, RunStarted)]
    assert started.options["max_iterations"] == 2
    lowered = await runner.run(
        noter(max_iterations=5), "go", tenant=TENANT, run_id="r2", options={"max_iterations": 1}
    )
    assert lowered.error is not None
    assert "max_iterations=1" in lowered.error


async def test_an_answer_over_the_tool_call_cap_fails_the_run_and_runs_no_call() -> None:
    """security review #17: a model answer asking for more calls than max_tool_calls_per_turn
    (64 by default) ends the run failed with the count in its error; no call is dispatched."""
    log = MemoryEventLog(partitions=2)
    runner = AgentRunner(provider=always_calling(MAX_TOOL_CALLS_PER_TURN + 1), log=log)
    result = await runner.run(noter(), "go", tenant=TENANT, run_id="r")
    assert result.status == "failed"
    assert result.error is not None
    assert f"{MAX_TOOL_CALLS_PER_TURN + 1} tool calls" in result.error
    assert f"max_tool_calls_per_turn={MAX_TOOL_CALLS_PER_TURN}" in result.error
    kinds = [type(s.event) for s in await log.read_run("r")]
    assert ToolDispatched not in kinds
    capped = AgentRunner(provider=always_calling(3), log=log, max_tool_calls_per_turn=2)
    assert (await capped.run(noter(), "go", tenant=TENANT, run_id="r2")).status == "failed"


async def test_a_worker_sets_aside_a_start_whose_options_options_refuses(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """security review #17: the worker validates StartRun.options through `Options`: a start
    with options it refuses is not acted on (no run), and its reason is logged."""
    settings = Settings.model_validate(
        {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "o.db")}
    )
    async with open_backends(settings) as backends:
        worker = Worker(backends, always_calling(0), {"noter": noter()})
        for options in ({"max_iterations": 0}, {"mode": "sideways"}, {"replays": True}):
            request = StartRun(run_id="r", tenant=TENANT, agent="noter", options=options)
            assert await worker.handle(request)
        assert worker.stats.failures == 3
        assert caplog.text.count("StartRun refused for good: invalid options") == 3
        assert worker.stats.started == 0
        assert (await backends.log.bounds(partition_for("r", backends.log.partitions))).end == 0


# -- nesting depth (#18) ---------------------------------------------------------------------------


def nested(levels: int) -> Any:
    """A list nested ``levels`` deep, built without recursion."""
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


async def test_over_deep_input_and_answers_are_refused_at_entry() -> None:
    """security review #18: run input and approval values nested past MAX_DEPTH are refused
    with `InvalidInputError` naming the field; nothing is written."""
    runner = memory_runner()
    with pytest.raises(InvalidInputError, match="input nests"):
        await runner.run(payer(), nested(MAX_DEPTH + 1), tenant=TENANT, run_id="deep")
    run = await waiting_run(runner)
    before = await log_size(runner)
    with pytest.raises(InvalidInputError, match="value nests"):
        await runner.approve(run, "c1", tenant=TENANT, by="ann", value=nested(MAX_DEPTH + 1))
    assert await log_size(runner) == before
    await runner.approve(run, "c1", tenant=TENANT, by="ann", value=nested(MAX_DEPTH))


@tool
async def deep_report(levels: int, *, idempotency_key: str) -> Any:
    return nested(levels)


async def test_an_over_deep_tool_result_is_a_typed_error_and_the_run_goes_on() -> None:
    """security review #18: a tool result nested 600 levels deep (past what the redactor could
    walk) is recorded as a `PayloadTooDeep` error on the call, and the run finishes instead of
    staying 'running' with the call dispatched and no outcome."""
    log = MemoryEventLog(partitions=2)
    model = ScriptedProvider(
        [reply("", ToolCall(call_id="d", tool="deep_report", args={"levels": 600})), reply("ok")]
    )
    runner = AgentRunner(provider=model, log=log)
    agent = Agent(name="reporter", instructions="report", tools=[deep_report])
    result = await runner.run(agent, "go", tenant=TENANT, run_id="r")
    assert result.status == "completed"
    (completed,) = [s.event for s in await log.read_run("r") if isinstance(s.event, ToolCompleted)]
    assert completed.result is None
    assert completed.error is not None
    assert completed.error.type == "PayloadTooDeep"


async def test_over_deep_model_arguments_are_not_recorded_and_the_tool_is_not_called() -> None:
    """security review #18: a model's tool arguments nested past MAX_DEPTH are not recorded;
    the call ends with a `PayloadTooDeep` error without the tool being called."""
    called: list[Any] = []

    @tool
    async def take(value: Any, *, idempotency_key: str) -> str:
        called.append(value)
        return "taken"

    log = MemoryEventLog(partitions=2)
    model = ScriptedProvider(
        [
            reply("", ToolCall(call_id="t", tool="take", args={"value": nested(MAX_DEPTH)})),
            reply("ok"),
        ]
    )
    runner = AgentRunner(provider=model, log=log)
    result = await runner.run(
        Agent(name="taker", instructions="take", tools=[take]), "go", tenant=TENANT, run_id="r"
    )
    assert result.status == "completed"
    assert called == []
    events = [s.event for s in await log.read_run("r")]
    (answered,) = [e for e in events if isinstance(e, ModelAnswered)][:1]
    assert answered.tool_calls[0].args == {
        TOO_DEEP_ARGUMENTS: answered.tool_calls[0].args[TOO_DEEP_ARGUMENTS]
    }
    (completed,) = [e for e in events if isinstance(e, ToolCompleted)]
    assert completed.error is not None
    assert completed.error.type == "PayloadTooDeep"


async def one_answer_server(body: bytes) -> tuple[asyncio.Server, str]:
    """A chat-completions server on a local socket answering every request with ``body``."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/v1"


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 5_000])
async def test_an_openai_answer_with_over_deep_arguments_keeps_them_unparsed(levels: int) -> None:
    """security review #18: tool arguments nested past MAX_DEPTH (or past what json.loads can
    parse at all) come back as the raw text under UNPARSED, never as a deep value, and never
    as a RecursionError out of the provider."""
    arguments = '{"a": ' + "[" * levels + "]" * levels + "}"
    completion = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "take", "arguments": arguments},
                        }
                    ],
                }
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1},
    }
    server, url = await one_answer_server(json.dumps(completion).encode())
    try:
        async with OpenAICompatibleProvider(base_url=url, api_key="k") as provider:
            answer = await provider.complete(
                Agent(name="a", instructions="be brief"), [Message(role="user", content="go")]
            )
    finally:
        server.close()
        await server.wait_closed()
    assert answer.tool_calls[0].args == {UNPARSED: arguments}


# -- model call ids outside Onward's namespace (#16) ----------------------------------------------


async def test_a_model_call_id_in_onwards_namespace_cannot_pass_for_a_checkpoint() -> None:
    """security review #16: in a collaborative run, a model answer whose call id equals the
    checkpoint's own request id (``onward.checkpoint:after_model_call:2``) no longer counts as
    approved when the person answers the checkpoint: the id is rewritten, and the tool that
    needs approval asks for it before it runs."""
    paid: list[int] = []

    @tool(requires_approval=True)
    async def pay(amount: int, *, idempotency_key: str) -> str:
        paid.append(amount)
        return "paid"

    forged = "onward.checkpoint:after_model_call:2"
    model = ScriptedProvider(
        [reply("", ToolCall(call_id=forged, tool="pay", args={"amount": 10_000})), reply("ok")]
    )
    runner = memory_runner()
    runner.provider = model
    options = Options(mode=ExecutionMode.COLLABORATIVE, checkpoints=CheckpointPolicy()).recorded()
    agent = Agent(name="payer", instructions="pay", tools=[pay])
    first = await runner.run(agent, "go", tenant=TENANT, run_id="r", options=options)
    assert first.waiting_on == forged  # the checkpoint after the model's answer
    await runner.approve("r", forged, tenant=TENANT, by="ann")
    after = await runner.resume(agent, "r", tenant=TENANT)
    assert paid == []
    assert after.status == "waiting"
    assert after.waiting_on is not None
    assert not after.waiting_on.startswith("onward.")
    frontier = await runner.inspect("r", tenant=TENANT)
    assert [c.call_id for c in frontier.calls] == [after.waiting_on]


@pytest.mark.parametrize("call_id", ["onward.anything", "c\x00", "c\nX", "c" * 201])
async def test_model_call_ids_out_of_bounds_are_rewritten(call_id: str) -> None:
    """security review #16/#12: a model's call id in Onward's namespace, with a control
    character or over 200 characters is recorded as ``call-<iteration>-<n>``; a tool name
    with a NUL is recorded escaped (and the call ends UnknownTool)."""
    log = MemoryEventLog(partitions=2)
    model = ScriptedProvider(
        [
            reply(
                "",
                ToolCall(call_id=call_id, tool="note", args={"n": 1}),
                ToolCall(call_id="ok", tool="no\x00te", args={"n": 2}),
            ),
            reply("done"),
        ]
    )
    runner = AgentRunner(provider=model, log=log)
    result = await runner.run(noter(), "go", tenant=TENANT, run_id="r")
    assert result.status == "completed"
    events = [s.event for s in await log.read_run("r")]
    (answered,) = [e for e in events if isinstance(e, ModelAnswered)][:1]
    assert [(c.call_id, c.tool) for c in answered.tool_calls] == [
        ("call-1-1", "note"),
        ("ok", "no\\x00te"),
    ]
    errors = {e.call_id: e.error for e in events if isinstance(e, ToolCompleted)}
    assert errors["call-1-1"] is None
    assert errors["ok"] is not None
    assert errors["ok"].type == "UnknownTool"


# -- the requests topic (#9a) ---------------------------------------------------------------------

SECRET = "Bearer abcdefghijklmnopqrstuvwxyz0123"


@pytest.mark.kafka
async def test_requests_reach_the_topic_masked_and_the_topic_keeps_them_seven_days(
    kafka_bootstrap: str,
) -> None:
    """security review #9(a): `Requests.submit` masks a start's input and options and an
    answer's value before they are sent, so the raw bytes of the requests topic hold no
    secret of a known shape; the topic it creates keeps records for 7 days, not forever."""
    topic = f"onward.test.requests.{uuid.uuid4().hex[:12]}"
    try:
        async with Requests(kafka_bootstrap, topic, partitions=2) as requests:
            await requests.submit(
                StartRun(
                    run_id="r",
                    tenant=TENANT,
                    agent="payer",
                    input={"note": f"call with {SECRET}"},
                    options={"user": f"Authorization: {SECRET}"},
                ),
                AnswerRequest(
                    run_id="r",
                    tenant=TENANT,
                    request_id="c1",
                    approve=True,
                    by="ann",
                    value=f"use {SECRET}",
                ),
            )
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest"
        )
        await consumer.start()
        try:
            values: list[bytes] = []
            deadline = asyncio.get_running_loop().time() + 30
            while len(values) < 2 and asyncio.get_running_loop().time() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                values.extend(r.value for records in batch.values() for r in records)
        finally:
            await consumer.stop()
        assert len(values) == 2
        assert all(b"abcdefghijklmnopqrstuvwxyz0123" not in value for value in values)
        assert b'"user":"Authorization: Bearer [REDACTED]"' in values[0]
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            (described,) = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic)]
            )
        finally:
            await admin.close()
        configs = {entry[0]: entry[1] for entry in described.resources[0][4]}
        assert configs["retention.ms"] == str(7 * 24 * 60 * 60 * 1000)
    finally:
        await delete_topic(kafka_bootstrap, topic)


class FailingModel(ScriptedProvider):
    """A model whose client raises an unexpected error carrying a secret and a value."""

    def __init__(self) -> None:
        super().__init__([])

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        raise RuntimeError(
            f"upstream said {SECRET} \x1b]0;OWNED\x07", {"card": "4111 1111 1111 1111"}
        )


async def test_an_unexpected_worker_error_is_logged_as_its_type_and_a_masked_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """security review #9(c), #15: an unexpected error out of a run a worker drives is logged
    as its type and one masked line of its message, not its repr with the values it holds, and
    its control characters are shown escaped."""
    settings = Settings.model_validate(
        {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "w.db")}
    )
    async with open_backends(settings) as backends:
        worker = Worker(backends, FailingModel(), {"noter": noter()})
        acted: list[bool] = []
        with caplog.at_level(logging.ERROR, logger="onward.worker"):
            worker.submit(StartRun(run_id="r", tenant=TENANT, agent="noter"), acted.append)
            await worker.drained()
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert line.startswith("run r: RuntimeError: upstream said")
    assert "abcdefghijklmnopqrstuvwxyz0123" not in line
    assert "4111" not in line
    assert "\n" not in line
    assert "\x1b" not in line
    assert "\\x1b]0;OWNED\\x07" in line


# -- recovery reads (#11) ----------------------------------------------------------------------


class ModelDownError(BackendUnavailableError):
    """The model failed (a backend error, so the worker logs it and goes on)."""


def down_after_first_answer() -> ScriptedProvider:
    """A model that asks for one ``note`` call, then is down for good."""

    def script(messages: Sequence[Message]) -> ModelReply:
        if any(m.role == "assistant" for m in messages):
            raise ModelDownError("the model is down")
        return reply("noting", ToolCall(call_id="n1", tool="note", args={"n": 1}))

    return ScriptedProvider(script)


async def test_resume_requests_for_an_old_run_never_reread_it_from_its_first_event(
    tmp_path: Path,
) -> None:
    """security review #11 (recovery): each ResumeRun for a run that lapsed counts its
    attempts from the fold (`Frontier.attempts`), not by reading the run from its first
    offset: through a wrapper of the real log, no read starts at the run's first event, and
    the attempts still end the run failed at max_attempts."""
    settings = Settings.model_validate(
        {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(tmp_path / "r.db")}
    )
    async with open_backends(settings) as opened:
        log = CountingLog(opened.log)
        backends = dataclasses.replace(opened, log=log)
        worker = Worker(
            backends, down_after_first_answer(), {"noter": noter()}, max_attempts=4, backoff_s=0
        )
        assert await worker.handle(StartRun(run_id="old", tenant=TENANT, agent="noter"))
        first = (await worker.runner.inspect("old", tenant=TENANT)).first_offset
        assert (await worker.runner.inspect("old", tenant=TENANT)).status == "running"
        log.starts.clear()
        for _ in range(6):
            assert await worker.handle(ResumeRun(run_id="old", tenant=TENANT))
        assert all(start is not None and start > first for start in log.starts), log.starts
        frontier = await worker.runner.inspect("old", tenant=TENANT)
        assert frontier.status == "failed"
        assert frontier.error is not None
        assert "4 attempts" in frontier.error


@pytest.mark.parametrize("name", ["pay\x00", "pay\nnow", "p" * 201])
def test_a_tool_whose_name_is_not_a_plain_name_is_refused_when_defined(name: str) -> None:
    """security review #12: a tool's name is recorded with every call to it, so one with a
    control character or over 200 characters is refused when the tool is defined."""

    async def act(*, idempotency_key: str) -> None:
        return None

    with pytest.raises(ConfigurationError, match="tool name"):
        tool(name=name)(act)


async def test_a_request_holding_a_value_json_would_change_is_refused_before_it_is_sent() -> None:
    """A fleet request's ``nan`` had reached the topic as ``null``: refused at submit, with
    the path, before the producer is even needed; a worker refuses it too."""
    client = Requests("127.0.0.1:1", partitions=1)
    start = StartRun(run_id="r", tenant=TENANT, agent="noter", input={"rows": [1.0, math.nan]})
    with pytest.raises(InvalidInputError, match=r"StartRun.input cannot be sent: .*\$\.rows\[1\]"):
        await client.submit(start)
    answer = AnswerRequest(
        run_id="r", tenant=TENANT, request_id="p", approve=True, by="ann", value=math.inf
    )
    with pytest.raises(InvalidInputError, match=r"AnswerRequest\.value"):
        check_request(answer)


@pytest.mark.parametrize("value", [[1, 2], "run-1", 5])
def test_options_that_are_not_a_mapping_are_refused_naming_options(value: object) -> None:
    """`app.query(prompt, [1, 2])` failed as a bare `TypeError` from ``dict(value)``."""
    with pytest.raises(InvalidInputError, match="options must be a mapping"):
        Options.of(value)  # type: ignore[arg-type]
