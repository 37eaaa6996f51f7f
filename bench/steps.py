"""Per-step cost of an agent loop: Onward (Kafka + PostgreSQL, PostgreSQL alone, and embedded
SQLite) vs LangGraph with `PostgresSaver` vs DBOS, all on this machine in one invocation.

The workload is the same everywhere: a scripted model (no network, no sleep) that asks for one
call of a no-op tool each step, the tool returning 1 KB (random hex, so nothing compresses it
away), ``--steps`` times, then a final answer. One step is a model answer, the tool's dispatch,
its result and the turn settled; a step's time is the interval between two model calls, so it
holds every write the system makes for that step.

* Onward on Kafka: `KafkaEventLog` on a fresh 12-partition topic (idempotent producer,
  ``acks="all"``), default `Redactor()` (redaction on), frontiers projected into a fresh
  PostgreSQL database by a `KafkaProjector` running concurrently in the same process.
* Onward embedded: `SqliteEventLog` + `SqliteFrontierStore` on one file, ``checkpoint_inline``.
* Onward on PostgreSQL alone (``ONWARD_BACKEND=postgres``): `PostgresEventLog`,
  `PostgresFrontierStore` folded inline (``checkpoint_inline``) and `PostgresLeaseStore`, all
  in a fresh database: the deployment DBOS is the fair peer of, on the same server.
* LangGraph: an "agent" node and a prebuilt `ToolNode` looping, `PostgresSaver` /
  `AsyncPostgresSaver` in a fresh database, ``durability="sync"``.
* DBOS: a workflow whose every iteration is a model `@DBOS.step` and a tool `@DBOS.step`, its
  system database a fresh PostgreSQL database.

LangGraph and DBOS run in their own venv (``bench/.venv-peers``, created from
``bench/requirements-peers.txt`` when missing) as ``steps.py --peer NAME`` child processes.

Measured per system: single-run per-step latency (``--latency-runs`` runs after a warm-up; mean
= run time / steps, p50/p99 over the individual steps); bytes written per step at two run
lengths (PostgreSQL database growth, Kafka log bytes on disk, SQLite file growth; about
``--bytes-steps`` steps in total per length, 2,000 by default: PostgreSQL grows each table and
index by whole 8 KiB pages, so over a few hundred steps the figure moves by 100-200 bytes a step
from one run to the next); aggregate steps/s with ``--concurrent-runs`` runs
(each level in turn, 100 and 1,000 by default) of ``--concurrent-steps`` steps started at once. A
level at which any run fails is reported as failed, with how many completed and the first error.
Each level's CPU seconds are recorded too, per step: the process (every thread) plus the servers
the system uses (Kafka, PostgreSQL and Redis for Onward on Kafka, PostgreSQL for the peers, none
embedded), read from ``/proc`` before and after (for Onward on Kafka, after the projector has
caught up), so a step's cost is compared beside its speed.
Topics and databases are dropped at the end, also on failure. Absolute figures depend on the
machine; the ratios, measured side by side in the same run, are the figures to compare.

The Onward code measured is whatever ``import onward`` finds: put a clean checkout first on
``PYTHONPATH`` to measure a commit; the JSON records the path, commit and local changes.

    python bench/steps.py                     # everything; writes bench/results/steps.json
    python bench/steps.py --profile           # adds cProfiles of Onward's concurrency levels
    python bench/steps.py --report bench/results/steps.json   # print a stored result again
    python bench/steps.py --systems onward-kafka,langgraph --concurrent-runs 200
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _common import (
    cpu_seconds,
    cpu_used,
    delete_redis_keys,
    delete_topics,
    drop_database,
    kafka_log_dirs,
    quantile,
    run_ending_on_sigterm,
    throwaway_database,
    throwaway_name,
    topic_bytes,
    with_database,
    write_results,
)

ROOT = Path(__file__).resolve().parent.parent
PEER_VENV = ROOT / "bench" / ".venv-peers"
PEER_REQUIREMENTS = ROOT / "bench" / "requirements-peers.txt"
PEER_STAMP = PEER_VENV / ".requirements.sha256"
PARTITIONS = 12
RESULT_CHARS = 1_000
TARGET_CONCURRENCY = 1_000
THROUGHPUT_TARGET = 3.0
LATENCY_TARGET = 2.0
SYSTEMS = ("onward-kafka", "onward-postgres", "onward-embedded", "langgraph", "dbos")

GUARANTEES = {
    "onward-kafka": "ToolDispatched acked by all ISR (acks=all, idempotent producer) before the "
    "tool runs, every event acked before the next step, the run's lease confirmed before tools; "
    "resume classifies every call. Here RF=1 "
    "and the broker acks from the page cache (no fsync), as Kafka does by default",
    "onward-postgres": "the same events, each append one committed PostgreSQL transaction "
    "(synchronous_commit on: WAL flushed) before the next step; the run's lease (PostgreSQL) "
    "confirmed before tools; frontier folded inline into the same database",
    "onward-embedded": "the same events, each append fsynced in SQLite (synchronous=FULL, "
    "group-committed across runs) before the run's next; frontier checkpointed inline into the "
    "same file",
    "langgraph": 'checkpoint after each super-step (durability="sync"); nothing is recorded '
    "before a tool runs",
    "dbos": "each step's result recorded in Postgres before the next step; a step cut short "
    "runs again",
}


@dataclasses.dataclass(frozen=True)
class Params:
    """The workload, shared with the peer child processes as JSON."""

    steps: int
    latency_runs: int
    lengths: tuple[int, ...]
    bytes_steps: int
    concurrency: tuple[int, ...]
    concurrent_steps: int
    pool_size: int
    database_url: str


def payloads(count: int = 512, seed: int = 7) -> list[str]:
    """Tool results: 1,000 random hex characters each, different every step of a run."""
    rng = random.Random(seed)
    return [rng.randbytes(RESULT_CHARS // 2).hex() for _ in range(count)]


PAYLOADS = payloads()


def result_for(step: int) -> str:
    return PAYLOADS[step % len(PAYLOADS)]


def latency_summary(totals: Sequence[float], marks: Sequence[Sequence[float]], steps: int) -> Any:
    """Mean per-step time (run time / steps) and percentiles of the individual steps, in ms."""
    each = sorted(b - a for run in marks for a, b in itertools.pairwise(run))
    return {
        "runs": len(totals),
        "steps": steps,
        "run_seconds": list(totals),
        "per_step_ms_mean": 1_000 * statistics.fmean(totals) / steps,
        "per_step_ms_p50": 1_000 * quantile(each, 0.5, interpolate=False) if each else None,
        "per_step_ms_p99": 1_000 * quantile(each, 0.99, interpolate=False) if each else None,
    }


def bytes_runs(params: Params, length: int) -> int:
    """Runs at one length: about ``bytes_steps`` steps in all, at least one run."""
    return max(1, params.bytes_steps // length)


def concurrency_outcome(
    runs: int,
    steps: int,
    seconds: float,
    results: Sequence[Any],
    completed: Callable[[Any], bool],
) -> dict[str, Any]:
    """One concurrency level: aggregate steps/s if every run completed, else what failed."""
    done = sum(1 for r in results if completed(r))
    out: dict[str, Any] = {
        "runs": runs,
        "steps_per_run": steps,
        "seconds": seconds,
        "completed_runs": done,
        "steps_per_s": runs * steps / seconds if done == runs else None,
        "completed_steps_per_s": done * steps / seconds,
    }
    failed = [r for r in results if not completed(r)]
    if failed:
        out["failed_runs"] = len(failed)
        out["first_failure"] = repr(failed[0])[:500]
    return out


# -- Onward (main venv) ---------------------------------------------------------------------


class _Looping:
    """The scripted model: one call of ``noop`` per turn, ``steps`` turns, then a final answer.

    Every call is timestamped in ``marks`` (when ``timed``), so a step's time is the interval
    between two calls.
    """

    def __init__(self, steps: int, *, timed: bool) -> None:
        self.steps = steps
        self.timed = timed
        self.marks: list[float] = []

    def __call__(self, messages: Sequence[Any]) -> Any:
        from onward.eventlog.events import ToolCall  # noqa: PLC0415
        from onward.runtime.providers import reply  # noqa: PLC0415

        if self.timed:
            self.marks.append(time.perf_counter())
        turn = sum(1 for m in messages if m.role == "assistant")
        if turn >= self.steps:
            return reply("done")
        return reply("", ToolCall(call_id=f"call-{turn + 1}", tool="noop", args={"step": turn}))


def _agent() -> Any:
    from onward.runtime.agent import Agent  # noqa: PLC0415
    from onward.runtime.tools import tool  # noqa: PLC0415

    @tool
    async def noop(step: int, *, idempotency_key: str) -> str:
        """Return 1 KB."""
        return result_for(step)

    return Agent(name="bench", instructions="Call noop.", tools=[noop], max_iterations=100_000)


class OnwardBench:
    """Runs the three phases against one log (and frontier store), for either Onward mode.

    Args:
        make_runner: An `AgentRunner` over the log for a scripted model.
        settle: Awaited after writing and before sizing (the projector catching up).
        size: Bytes stored so far, by component.
        servers: The servers this mode uses (`SERVER_COMMANDS` names), whose CPU time counts.
    """

    def __init__(
        self,
        make_runner: Callable[[Any], Any],
        settle: Callable[[], Awaitable[float]],
        size: Callable[[], Awaitable[dict[str, int]]],
        servers: Sequence[str] = (),
    ) -> None:
        self.make_runner = make_runner
        self.settle = settle
        self.size = size
        self.servers = servers
        self.agent = _agent()

    async def runs(
        self, count: int, steps: int, *, timed: bool = False, tolerate: bool = False
    ) -> tuple[float, list[float], list[Any]]:
        """Start ``count`` runs at once and wait for all; failures raise unless ``tolerate``."""
        from onward.runtime.providers import ScriptedProvider  # noqa: PLC0415

        script = _Looping(steps, timed=timed)
        runner = self.make_runner(ScriptedProvider(script))
        started = time.perf_counter()
        results = await asyncio.gather(
            *(
                runner.run(self.agent, {"task": "loop"}, tenant="bench", run_id=_run_id())
                for _ in range(count)
            ),
            return_exceptions=True,
        )
        seconds = time.perf_counter() - started
        failed = [r for r in results if not _onward_completed(r)]
        if failed and not tolerate:
            raise RuntimeError(f"{len(failed)} of {count} runs did not complete: {failed[0]!r}")
        return seconds, script.marks, results

    async def latency(self, params: Params) -> Any:
        await self.runs(1, params.steps)
        totals: list[float] = []
        marks: list[list[float]] = []
        for _ in range(params.latency_runs):
            seconds, run_marks, _ = await self.runs(1, params.steps, timed=True)
            totals.append(seconds)
            marks.append(run_marks)
        await self.settle()
        return latency_summary(totals, marks, params.steps)

    async def footprint(self, params: Params) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for length in params.lengths:
            count = bytes_runs(params, length)
            await self.settle()
            before = await self.size()
            for _ in range(count):
                await self.runs(1, length)
            await self.settle()
            after = await self.size()
            steps = count * length
            per = {k: (after[k] - before[k]) / steps for k in after}
            out[str(length)] = {"runs": count, "per_step": per, "total_per_step": sum(per.values())}
        return out

    async def concurrency(self, params: Params, *, profile: Path | None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for runs in params.concurrency:
            await self.settle()
            profiler = _start_profile() if profile else None
            cpu_before = cpu_seconds(self.servers)
            seconds, _, results = await self.runs(runs, params.concurrent_steps, tolerate=True)
            if profiler is not None and profile is not None:
                _stop_profile(profiler, profile.with_name(f"{profile.stem}-{runs}.prof"))
            level = concurrency_outcome(
                runs, params.concurrent_steps, seconds, results, _onward_completed
            )
            level["settle_seconds_after"] = await self.settle()
            level["cpu_s"] = cpu_used(cpu_before, cpu_seconds(self.servers))
            out.append(level)
        return out


def _onward_completed(result: Any) -> bool:
    return not isinstance(result, BaseException) and result.status == "completed"


def _run_id() -> str:
    return f"bench-{uuid.uuid4().hex}"


def _start_profile() -> Any:
    import cProfile  # noqa: PLC0415

    profiler = cProfile.Profile()
    profiler.enable()
    return profiler


def _stop_profile(profiler: Any, path: Path) -> None:
    import io  # noqa: PLC0415
    import pstats  # noqa: PLC0415

    profiler.disable()
    path.parent.mkdir(parents=True, exist_ok=True)
    profiler.dump_stats(str(path))
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(20)
    path.with_suffix(".txt").write_text(text.getvalue())
    print(text.getvalue())


async def onward_kafka(params: Params, bootstrap: str, *, profile: Path | None) -> dict[str, Any]:
    import asyncpg  # noqa: PLC0415

    from onward.eventlog import KafkaEventLog  # noqa: PLC0415
    from onward.projections.frontier_projection import FrontierProjection  # noqa: PLC0415
    from onward.projections.kafka import KafkaProjector  # noqa: PLC0415
    from onward.projections.postgres import PostgresFrontierStore  # noqa: PLC0415
    from onward.projections.projector_defaults import (  # noqa: PLC0415
        PROJECTOR_FLUSH_EVENTS,
        PROJECTOR_FLUSH_INTERVAL,
    )
    from onward.runtime.leases import RedisLeaseStore  # noqa: PLC0415
    from onward.runtime.redaction import Redactor  # noqa: PLC0415
    from onward.runtime.runner import AgentRunner  # noqa: PLC0415

    topic = throwaway_name("steps")
    log_dirs = await kafka_log_dirs(bootstrap)
    suffix = topic.rsplit(".", 1)[1]
    lease_prefix = f"onward-bench-{suffix}:"
    redis_url = os.environ["REDIS_URL"]
    log = None
    store = None
    leases = None
    projector = None
    stop = asyncio.Event()
    folding: asyncio.Task[None] | None = None
    async with throwaway_database(params.database_url, "steps") as (database, dsn):
        try:
            log = await KafkaEventLog.open(bootstrap, topic=topic, partitions=PARTITIONS)
            store = await PostgresFrontierStore.open(dsn)
            # As in production: every run is leased (Redis), renewed, and confirmed before tools.
            leases = await RedisLeaseStore.open(redis_url, prefix=lease_prefix)
            projector = KafkaProjector(
                bootstrap,
                FrontierProjection(
                    store,
                    log,
                    flush_events=PROJECTOR_FLUSH_EVENTS,
                    flush_interval=PROJECTOR_FLUSH_INTERVAL,
                    write_behind=True,
                ),
                topic=topic,
                partitions=PARTITIONS,
                group_id=f"onward-bench-{suffix}",
            )
            await projector.start()

            # Folding as `onward projector` does (its settings, its loop): stores batched while
            # behind, and at most every `CAUGHT_UP_STORE_S` once caught up.
            folding = asyncio.create_task(projector.run(stop))
            kafka_log = log

            async def settle() -> float:
                """Wait until the projector has folded everything written so far."""
                started = time.perf_counter()
                ends = {p: (await kafka_log.bounds(p)).end for p in range(PARTITIONS)}
                while True:
                    stored = await store.positions("frontiers")
                    if all(stored.get(p, 0) >= end for p, end in ends.items() if end > 0):
                        return time.perf_counter() - started
                    if folding is not None and folding.done():
                        folding.result()
                    await asyncio.sleep(0.05)

            async def size() -> dict[str, int]:
                pg = await asyncpg.connect(dsn)
                try:
                    db = int(await pg.fetchval("SELECT pg_database_size(current_database())"))
                finally:
                    await pg.close()
                return {"kafka_log": topic_bytes(log_dirs, topic), "postgres": db}

            bench = OnwardBench(
                lambda provider: AgentRunner(
                    provider=provider,
                    log=kafka_log,
                    frontiers=store,
                    redactor=Redactor(),
                    leases=leases,
                ),
                settle,
                size,
                servers=("kafka", "postgres", "redis"),
            )
            return {
                "system": "onward-kafka",
                "guarantee": GUARANTEES["onward-kafka"],
                "setup": f"topic {topic} ({PARTITIONS} partitions), database {database}, "
                "projector folding concurrently in the same process (as `onward projector` "
                "does), Redactor() on, Redis leases",
                "latency": await bench.latency(params),
                "bytes": await bench.footprint(params),
                "concurrency": await bench.concurrency(params, profile=profile),
            }
        finally:
            stop.set()
            if leases is not None:
                await leases.close()
                await delete_redis_keys(redis_url, lease_prefix)
            if folding is not None:
                await asyncio.gather(folding, return_exceptions=True)
            if projector is not None:
                await projector.close()
            if log is not None:
                await log.close()
                await delete_topics(bootstrap, [topic])
            if store is not None:
                await store.close()


async def onward_postgres(params: Params, *, profile: Path | None) -> dict[str, Any]:
    import asyncpg  # noqa: PLC0415

    from onward.eventlog import PostgresEventLog  # noqa: PLC0415
    from onward.projections.postgres import PostgresFrontierStore  # noqa: PLC0415
    from onward.runtime.leases import PostgresLeaseStore  # noqa: PLC0415
    from onward.runtime.redaction import Redactor  # noqa: PLC0415
    from onward.runtime.runner import AgentRunner  # noqa: PLC0415

    async def nothing_to_settle() -> float:
        return 0.0

    async with throwaway_database(params.database_url, "steps_pg") as (database, dsn):
        pool_size = params.pool_size
        async with (
            PostgresEventLog(dsn, partitions=PARTITIONS, max_size=pool_size) as log,
            PostgresFrontierStore(dsn, max_size=pool_size) as store,
            PostgresLeaseStore(dsn, max_size=pool_size) as leases,
        ):

            async def size() -> dict[str, int]:
                pg = await asyncpg.connect(dsn)
                try:
                    db = int(await pg.fetchval("SELECT pg_database_size(current_database())"))
                finally:
                    await pg.close()
                return {"postgres": db}

            bench = OnwardBench(
                lambda provider: AgentRunner(
                    provider=provider,
                    log=log,
                    frontiers=store,
                    checkpoint_inline=True,
                    redactor=Redactor(),
                    leases=leases,
                ),
                nothing_to_settle,
                size,
                servers=("postgres",),
            )
            return {
                "system": "onward-postgres",
                "guarantee": GUARANTEES["onward-postgres"],
                "setup": f"database {database}: PostgresEventLog ({PARTITIONS} partitions), "
                "PostgresFrontierStore checkpointed inline, PostgresLeaseStore, pools of "
                f"{params.pool_size} each (as the peers'), Redactor() on",
                "latency": await bench.latency(params),
                "bytes": await bench.footprint(params),
                "concurrency": await bench.concurrency(params, profile=profile),
            }


@contextmanager
def _scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="onward-bench-steps-") as tmp:
        yield Path(tmp)


def file_bytes(path: Path) -> int:
    """The SQLite file and its WAL, if any."""
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.exists())


async def onward_embedded(params: Params, *, profile: Path | None) -> dict[str, Any]:
    from onward.eventlog import SqliteEventLog  # noqa: PLC0415
    from onward.projections.sqlite import SqliteFrontierStore  # noqa: PLC0415
    from onward.runtime.redaction import Redactor  # noqa: PLC0415
    from onward.runtime.runner import AgentRunner  # noqa: PLC0415

    async def nothing_to_settle() -> float:
        return 0.0

    async def phase(path: Path, work: Callable[[OnwardBench], Awaitable[Any]]) -> Any:
        async with (
            SqliteEventLog(path, partitions=PARTITIONS) as log,
            SqliteFrontierStore(path, sharing=log) as store,  # as ONWARD_BACKEND=sqlite opens it
        ):

            async def size() -> dict[str, int]:
                return {"sqlite_file": file_bytes(path)}

            bench = OnwardBench(
                lambda provider: AgentRunner(
                    provider=provider,
                    log=log,
                    frontiers=store,
                    checkpoint_inline=True,
                    redactor=Redactor(),
                ),
                nothing_to_settle,
                size,
            )
            return await work(bench)

    with _scratch() as tmp:
        latency = await phase(tmp / "latency.db", lambda b: b.latency(params))
        footprint: dict[str, Any] = {}
        for length in params.lengths:
            # A fresh file per length, sized after closing (the WAL checkpointed into it).
            empty, used = tmp / f"empty-{length}.db", tmp / f"bytes-{length}.db"
            count = bytes_runs(params, length)

            async def write(bench: OnwardBench, count: int = count, length: int = length) -> None:
                for _ in range(count):
                    await bench.runs(1, length)

            async def idle(bench: OnwardBench) -> None:
                return None

            await phase(empty, idle)
            await phase(used, write)
            per = (file_bytes(used) - file_bytes(empty)) / (count * length)
            footprint[str(length)] = {
                "runs": count,
                "per_step": {"sqlite_file": per},
                "total_per_step": per,
            }
        concurrency = await phase(
            tmp / "concurrency.db", lambda b: b.concurrency(params, profile=profile)
        )
    return {
        "system": "onward-embedded",
        "guarantee": GUARANTEES["onward-embedded"],
        "setup": "one SQLite file for the log and the frontiers, checkpoint_inline, Redactor() on",
        "latency": latency,
        "bytes": footprint,
        "concurrency": concurrency,
    }


# -- peers (bench/.venv-peers) ---------------------------------------------------------------


@contextmanager
def peer_database(url: str, name: str) -> Iterator[str]:
    """A database created for a peer and dropped afterwards; yields its URL."""
    import psycopg  # noqa: PLC0415

    database = throwaway_name(name, "_")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}")
    try:
        yield with_database(url, database)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            drop_database(conn.execute, database)


def database_size(url: str) -> int:
    import psycopg  # noqa: PLC0415

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    assert row is not None
    return int(row[0])


async def peer_levels(
    params: Params, one: Callable[[int], Awaitable[float]], mechanism: str
) -> list[dict[str, Any]]:
    """Each concurrency level of a peer: that many runs started at once, awaited together.
    Every peer keeps its state in PostgreSQL, whose CPU time counts with the process's."""
    out: list[dict[str, Any]] = []
    for runs in params.concurrency:
        cpu_before = cpu_seconds(("postgres",))
        started = time.perf_counter()
        results = await asyncio.gather(
            *(one(params.concurrent_steps) for _ in range(runs)), return_exceptions=True
        )
        seconds = time.perf_counter() - started
        cpu = cpu_used(cpu_before, cpu_seconds(("postgres",)))
        level = concurrency_outcome(
            runs,
            params.concurrent_steps,
            seconds,
            results,
            lambda r: not isinstance(r, BaseException),
        )
        level["mechanism"] = mechanism
        level["cpu_s"] = cpu
        out.append(level)
    return out


def peer_sync_figures(
    params: Params, url: str, one: Callable[[int], float], marks: list[float]
) -> tuple[Any, dict[str, Any]]:
    """A peer's synchronous latency (after a warm-up run) and its bytes per step per length.

    ``one(steps)`` runs one run and returns its seconds; the model call appends to ``marks``.
    """
    one(params.steps)
    totals, all_marks = [], []
    for _ in range(params.latency_runs):
        marks.clear()
        totals.append(one(params.steps))
        all_marks.append(list(marks))
    latency = latency_summary(totals, all_marks, params.steps)
    footprint: dict[str, Any] = {}
    for length in params.lengths:
        count = bytes_runs(params, length)
        before = database_size(url)
        for _ in range(count):
            one(length)
        per = (database_size(url) - before) / (count * length)
        footprint[str(length)] = {
            "runs": count,
            "per_step": {"postgres": per},
            "total_per_step": per,
        }
    return latency, footprint


async def peer_async_latency(
    params: Params, one: Callable[[int], Awaitable[float]], marks: list[float]
) -> Any:
    """A peer's latency with its async API, after a warm-up run."""
    await one(params.steps)
    totals, all_marks = [], []
    for _ in range(params.latency_runs):
        marks.clear()
        totals.append(await one(params.steps))
        all_marks.append(list(marks))
    return latency_summary(totals, all_marks, params.steps)


def langgraph_loop(marks: list[float], *, asynchronous: bool) -> Any:
    """The graph LangGraph is measured on, not compiled: an "agent" node (the scripted model,
    appending the time of each call to ``marks``) and a prebuilt `ToolNode`, looping.

    ``asynchronous``: the agent node is a coroutine (for ``ainvoke``), else a function.
    """
    from langchain_core.messages import AIMessage  # noqa: PLC0415
    from langchain_core.tools import StructuredTool  # noqa: PLC0415
    from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: PLC0415
    from langgraph.prebuilt import ToolNode  # noqa: PLC0415

    class LoopState(MessagesState):
        steps: int

    # Nodes take ``Any``: LangGraph resolves their hints, and this class is local.

    def answer(state: Any) -> dict[str, Any]:
        marks.append(time.perf_counter())
        turn = sum(1 for m in state["messages"] if m.type == "ai")
        if turn >= state["steps"]:
            return {"messages": [AIMessage(content="done")]}
        call = {"name": "noop", "args": {"step": turn}, "id": f"call-{turn + 1}"}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}

    async def answer_async(state: Any) -> dict[str, Any]:
        return answer(state)

    def noop(step: int) -> str:
        """Return 1 KB."""
        return result_for(step)

    async def noop_async(step: int) -> str:
        return result_for(step)

    tools = ToolNode([StructuredTool.from_function(func=noop, coroutine=noop_async, name="noop")])

    def route(state: Any) -> str:
        return "tools" if state["messages"][-1].tool_calls else END

    graph = StateGraph(LoopState)
    graph.add_node("agent", answer_async if asynchronous else answer)
    graph.add_node("tools", tools)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph


def langgraph_peer(params: Params) -> dict[str, Any]:
    """LangGraph with `PostgresSaver` (sync, and `AsyncPostgresSaver` for concurrency)."""
    from importlib.metadata import version  # noqa: PLC0415

    from langchain_core.messages import HumanMessage  # noqa: PLC0415
    from langgraph.checkpoint.postgres import PostgresSaver  # noqa: PLC0415
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver  # noqa: PLC0415
    from psycopg.rows import dict_row  # noqa: PLC0415
    from psycopg_pool import AsyncConnectionPool  # noqa: PLC0415

    marks: list[float] = []

    def config(steps: int) -> dict[str, Any]:
        return {
            "configurable": {"thread_id": _run_id()},
            "recursion_limit": 2 * steps + 10,
        }

    def start(steps: int) -> dict[str, Any]:
        return {"messages": [HumanMessage(content='{"task": "loop"}')], "steps": steps}

    def check(out: dict[str, Any], steps: int) -> None:
        if out["messages"][-1].content != "done" or len(out["messages"]) != 2 * steps + 2:
            raise RuntimeError(f"langgraph run ended early: {len(out['messages'])} messages")

    with peer_database(params.database_url, "langgraph") as url:
        with PostgresSaver.from_conn_string(url) as saver:
            saver.setup()
            graph = langgraph_loop(marks, asynchronous=False).compile(checkpointer=saver)

            def one(steps: int) -> float:
                started = time.perf_counter()
                check(graph.invoke(start(steps), config(steps), durability="sync"), steps)
                return time.perf_counter() - started

            sync_latency, footprint = peer_sync_figures(params, url, one, marks)

        async def run_async() -> tuple[Any, list[dict[str, Any]]]:
            # Rows come back as dicts (``row_factory``), which the pool's type cannot say.
            pool: Any = AsyncConnectionPool(
                url,
                min_size=params.pool_size,
                max_size=params.pool_size,
                timeout=3_600,
                open=False,
                kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
            )
            await pool.open()
            try:
                saver = AsyncPostgresSaver(pool)
                graph = langgraph_loop(marks, asynchronous=True).compile(checkpointer=saver)

                async def one(steps: int) -> float:
                    started = time.perf_counter()
                    out = await graph.ainvoke(start(steps), config(steps), durability="sync")
                    check(out, steps)
                    return time.perf_counter() - started

                latency = await peer_async_latency(params, one, marks)
                levels = await peer_levels(
                    params,
                    one,
                    f"AsyncPostgresSaver over an AsyncConnectionPool of {params.pool_size}, "
                    "ainvoke(durability='sync') per run, asyncio.gather",
                )
            finally:
                await pool.close()
            return latency, levels

        async_latency, concurrency = asyncio.run(run_async())
    best = min((sync_latency, async_latency), key=lambda s: s["per_step_ms_mean"])
    return {
        "system": "langgraph",
        "guarantee": GUARANTEES["langgraph"],
        "setup": f"langgraph {version('langgraph')}, langgraph-checkpoint-postgres "
        f"{version('langgraph-checkpoint-postgres')}; graph agent -> ToolNode -> agent, "
        "MessagesState; invoke/ainvoke(..., durability='sync')",
        "latency": best,
        "latency_sync_postgres_saver": sync_latency,
        "latency_async_postgres_saver": async_latency,
        "latency_mechanism": "sync PostgresSaver + invoke"
        if best is sync_latency
        else "AsyncPostgresSaver + ainvoke",
        "bytes": footprint,
        "concurrency": concurrency,
    }


def dbos_peer(params: Params) -> dict[str, Any]:
    """DBOS: a workflow of model and tool steps, its system database in PostgreSQL."""
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415
    from importlib.metadata import version  # noqa: PLC0415

    from dbos import DBOS  # type: ignore[import-not-found]  # noqa: PLC0415

    marks: list[float] = []

    def model(messages: list[dict[str, Any]], steps: int) -> dict[str, Any]:
        turn = sum(1 for m in messages if m["role"] == "assistant")
        if turn >= steps:
            return {"role": "assistant", "content": "done", "tool_calls": []}
        call = {"id": f"call-{turn + 1}", "name": "noop", "args": {"step": turn}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}

    @DBOS.step()  # type: ignore[untyped-decorator]
    def model_step(messages: list[dict[str, Any]], steps: int) -> dict[str, Any]:
        return model(messages, steps)

    @DBOS.step()  # type: ignore[untyped-decorator]
    def tool_step(name: str, args: dict[str, Any]) -> str:
        return result_for(args["step"])

    @DBOS.workflow()  # type: ignore[untyped-decorator]
    def agent_loop(steps: int) -> str:
        messages: list[dict[str, Any]] = [{"role": "user", "content": '{"task": "loop"}'}]
        while True:
            marks.append(time.perf_counter())
            answer = model_step(messages, steps)
            messages.append(answer)
            if not answer["tool_calls"]:
                return str(answer["content"])
            for call in answer["tool_calls"]:
                result = tool_step(call["name"], call["args"])
                messages.append({"role": "tool", "content": result, "tool_call_id": call["id"]})

    @DBOS.step()  # type: ignore[untyped-decorator]
    async def model_step_async(messages: list[dict[str, Any]], steps: int) -> dict[str, Any]:
        return model(messages, steps)

    @DBOS.step()  # type: ignore[untyped-decorator]
    async def tool_step_async(name: str, args: dict[str, Any]) -> str:
        return result_for(args["step"])

    @DBOS.workflow()  # type: ignore[untyped-decorator]
    async def agent_loop_async(steps: int) -> str:
        messages: list[dict[str, Any]] = [{"role": "user", "content": '{"task": "loop"}'}]
        while True:
            marks.append(time.perf_counter())
            answer = await model_step_async(messages, steps)
            messages.append(answer)
            if not answer["tool_calls"]:
                return str(answer["content"])
            for call in answer["tool_calls"]:
                result = await tool_step_async(call["name"], call["args"])
                messages.append({"role": "tool", "content": result, "tool_call_id": call["id"]})

    def check(out: str) -> None:
        if out != "done":
            raise RuntimeError(f"dbos workflow returned {out!r}")

    with peer_database(params.database_url, "dbos") as url:
        DBOS(
            config={
                "name": "onward-bench-steps",
                "system_database_url": url,
                "sys_db_pool_size": params.pool_size,
                "log_level": "WARNING",
            }
        )
        DBOS.launch()
        try:

            def one(steps: int) -> float:
                started = time.perf_counter()
                check(agent_loop(steps))
                return time.perf_counter() - started

            sync_latency, footprint = peer_sync_figures(params, url, one, marks)

            async def run_async() -> tuple[Any, list[dict[str, Any]]]:
                # DBOS runs its database calls of async steps in the default executor: size it
                # to the connection pool, so the pool, not the thread count, is the limit.
                asyncio.get_running_loop().set_default_executor(
                    ThreadPoolExecutor(max_workers=params.pool_size)
                )

                async def one(steps: int) -> float:
                    started = time.perf_counter()
                    check(await agent_loop_async(steps))
                    return time.perf_counter() - started

                latency = await peer_async_latency(params, one, marks)
                levels = await peer_levels(
                    params,
                    one,
                    "async @DBOS.workflow awaited by one asyncio task per run; "
                    f"sys_db_pool_size={params.pool_size}, default executor {params.pool_size} "
                    "threads",
                )
                return latency, levels

            async_latency, concurrency = asyncio.run(run_async())
        finally:
            DBOS.destroy()
    best = min((sync_latency, async_latency), key=lambda s: s["per_step_ms_mean"])
    return {
        "system": "dbos",
        "guarantee": GUARANTEES["dbos"],
        "setup": f"dbos {version('dbos')}; per iteration a model @DBOS.step and a tool "
        "@DBOS.step; system database in its own PostgreSQL database",
        "latency": best,
        "latency_sync_workflow": sync_latency,
        "latency_async_workflow": async_latency,
        "latency_mechanism": "sync workflow" if best is sync_latency else "async workflow",
        "bytes": footprint,
        "concurrency": concurrency,
    }


PEERS: dict[str, Callable[[Params], dict[str, Any]]] = {
    "langgraph": langgraph_peer,
    "dbos": dbos_peer,
}


# -- driving -----------------------------------------------------------------------------------


def ensure_peer_venv() -> Path:
    """The peer venv's python, creating the venv (or reinstalling) when the pins changed."""
    python = PEER_VENV / "bin" / "python"
    wanted = hashlib.sha256(PEER_REQUIREMENTS.read_bytes()).hexdigest()
    if python.exists() and PEER_STAMP.exists() and PEER_STAMP.read_text() == wanted:
        return python
    if not python.exists():
        base = shutil.which("python3") or sys.executable
        subprocess.run([base, "-m", "venv", str(PEER_VENV)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "-r", str(PEER_REQUIREMENTS)], check=True
    )
    PEER_STAMP.write_text(wanted)
    return python


def run_peer(name: str, params: Params) -> dict[str, Any]:
    """Run one peer in the peer venv and return what it measured."""
    python = ensure_peer_venv()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        subprocess.run(
            [
                str(python),
                str(Path(__file__).resolve()),
                "--peer",
                name,
                "--peer-params",
                json.dumps(dataclasses.asdict(params)),
                "--peer-out",
                str(out),
            ],
            check=True,
            timeout=3_600,
        )
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def _ms(latency: Any) -> str:
    return (
        f"{latency['per_step_ms_mean']:.2f} "
        f"({latency['per_step_ms_p50']:.2f} / {latency['per_step_ms_p99']:.2f})"
    )


def _bytes(entry: Any) -> str:
    parts = entry["per_step"]
    if len(parts) == 1:
        return f"{entry['total_per_step']:,.0f}"
    detail = " + ".join(f"{k} {v:,.0f}" for k, v in parts.items())
    return f"{entry['total_per_step']:,.0f} ({detail})"


def _level(level: Any) -> str:
    if level["steps_per_s"] is not None:
        return f"{level['steps_per_s']:,.0f}"
    return (
        f"FAILED: {level['completed_runs']}/{level['runs']} runs completed in "
        f"{level['seconds']:.0f}s; {level['first_failure'][:90]}"
    )


def _cpu(level: Any) -> str:
    """CPU milliseconds per step of one concurrency level: the process and its servers."""
    cpu = level.get("cpu_s")
    if cpu is None:
        return "-"
    steps = level["runs"] * level["steps_per_run"]
    parts = " + ".join(f"{name} {cpu[name] / steps * 1000:.2f}" for name in cpu if name != "total")
    return f"{cpu['total'] / steps * 1000:.2f} ({parts})"


def _ratio(mine: float | None, theirs: float | None) -> float | None:
    return mine / theirs if mine is not None and theirs else None


def ratios(results: dict[str, Any], params: Params, system: str = "onward-kafka") -> dict[str, Any]:
    """One Onward system over each peer: steps/s at each concurrency level, single-run
    latency."""
    onward = results.get(system)
    out: dict[str, Any] = {}
    if onward is None:
        return out
    for peer in ("langgraph", "dbos"):
        if peer not in results:
            continue
        latency = _ratio(
            onward["latency"]["per_step_ms_mean"], results[peer]["latency"]["per_step_ms_mean"]
        )
        entry: dict[str, Any] = {"latency_ratio": latency, "steps_per_s_ratio": {}}
        if peer == "langgraph":
            entry["latency_target_met"] = latency is not None and latency <= LATENCY_TARGET
        entry["completed_steps_per_s_ratio"] = {}
        for mine, theirs in zip(onward["concurrency"], results[peer]["concurrency"], strict=True):
            ratio = _ratio(mine["steps_per_s"], theirs["steps_per_s"])
            entry["steps_per_s_ratio"][str(mine["runs"])] = ratio
            entry["completed_steps_per_s_ratio"][str(mine["runs"])] = _ratio(
                mine["completed_steps_per_s"], theirs["completed_steps_per_s"]
            )
            if mine["runs"] == TARGET_CONCURRENCY:
                entry["steps_per_s_target_met"] = ratio is not None and ratio >= THROUGHPUT_TARGET
        out[peer] = entry
    return out


def report(
    results: dict[str, Any],
    params: Params,
    found: dict[str, Any],
    *,
    found_postgres: dict[str, Any] | None = None,
) -> None:
    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    console = Console(width=220)
    lengths = [str(n) for n in params.lengths]
    table = Table(
        title=f"agent loop, one 1 KB tool call per step: latency over {params.latency_runs} runs "
        f"of {params.steps} steps after a warm-up; concurrency: runs of "
        f"{params.concurrent_steps} steps started at once",
        show_lines=True,
    )
    table.add_column("system")
    table.add_column("guarantee", max_width=44)
    table.add_column("ms/step mean (p50 / p99)", justify="right")
    for runs in params.concurrency:
        table.add_column(f"steps/s, {runs} concurrent runs", justify="right", max_width=30)
    for n in lengths:
        table.add_column(f"bytes/step, {n}-step runs", justify="right", max_width=26)
    most = max(params.concurrency)
    table.add_column(f"CPU ms/step, {most} runs (process + servers)", justify="right", max_width=30)
    for name, r in results.items():
        table.add_row(
            name,
            r["guarantee"],
            _ms(r["latency"]),
            *(_level(level) for level in r["concurrency"]),
            *(_bytes(r["bytes"][n]) for n in lengths),
            _cpu(next(level for level in r["concurrency"] if level["runs"] == most)),
        )
    console.print(table)
    for name, r in results.items():
        console.print(f"[bold]{name}[/]: {r['setup']}")
        if "latency_mechanism" in r:
            console.print(f"  latency figure from the faster of two: {r['latency_mechanism']}")
        for level in r["concurrency"]:
            if "mechanism" in level:
                console.print(f"  concurrency: {level['mechanism']}")
                break
        for level in r["concurrency"]:
            if "settle_seconds_after" in level and name == "onward-kafka":
                console.print(
                    f"  {level['runs']} runs: projector caught up "
                    f"{level['settle_seconds_after']:.1f}s after the runs finished (not counted)"
                )

    if found:
        _print_ratios(
            console,
            params,
            found,
            f"Onward on Kafka / peer (targets: >= {THROUGHPUT_TARGET:.0f}x steps/s at "
            f"{TARGET_CONCURRENCY} concurrent runs; latency <= {LATENCY_TARGET:.0f}x LangGraph's)",
        )
    if found_postgres:
        _print_ratios(
            console, params, found_postgres, "Onward on PostgreSQL alone / peer (same server)"
        )
    console.print("Absolute figures depend on the machine; compare the ratios.")


def _print_ratios(console: Any, params: Params, found: dict[str, Any], title: str) -> None:
    """One table of an Onward system's ratios over each peer."""
    from rich.table import Table  # noqa: PLC0415

    if found:
        ratio_table = Table(title=title)
        ratio_table.add_column("peer")
        for runs in params.concurrency:
            ratio_table.add_column(f"steps/s ratio, {runs} runs", justify="right")
        ratio_table.add_column("steps/s target met", justify="center")
        ratio_table.add_column("single-run latency ratio", justify="right")
        ratio_table.add_column("latency target met", justify="center")
        for peer, entry in found.items():
            cells = [
                f"{v:.2f}x"
                if v is not None
                else f"failed ({entry['completed_steps_per_s_ratio'][runs]:.2f}x on the runs that "
                "completed)"
                for runs, v in entry["steps_per_s_ratio"].items()
            ]
            ratio_table.add_row(
                peer,
                *cells,
                _yes(entry.get("steps_per_s_target_met")),
                "n/a" if entry["latency_ratio"] is None else f"{entry['latency_ratio']:.2f}x",
                _yes(entry.get("latency_target_met")),
            )
        console.print(ratio_table)


def _yes(met: bool | None) -> str:
    return "-" if met is None else ("yes" if met else "NO")


async def onward_all(
    params: Params, systems: Sequence[str], bootstrap: str, profiles: Path | None
) -> dict[str, Any]:
    """Both Onward systems; ``profiles`` is the folder their cProfiles go to, if wanted."""
    out: dict[str, Any] = {}
    if "onward-kafka" in systems:
        out["onward-kafka"] = await onward_kafka(
            params, bootstrap, profile=profiles / "steps-onward-kafka.prof" if profiles else None
        )
    if "onward-postgres" in systems:
        out["onward-postgres"] = await onward_postgres(
            params, profile=profiles / "steps-onward-postgres.prof" if profiles else None
        )
    if "onward-embedded" in systems:
        out["onward-embedded"] = await onward_embedded(
            params, profile=profiles / "steps-onward-embedded.prof" if profiles else None
        )
    return out


def code_under_test() -> dict[str, Any]:
    """Which Onward code ran: its path, the commit it is at, and whether it had local changes."""
    import onward  # noqa: PLC0415

    where = Path(onward.__file__).resolve().parent.parent

    def git(*argv: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(where), *argv], check=False, capture_output=True, text=True
        )
        return done.stdout.strip()

    changed = git("status", "--porcelain", "--", "eventlog", "projections", "runtime", "onward")
    return {"path": str(where), "commit": git("rev-parse", "HEAD"), "local_changes": changed}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--bootstrap", default=None, help="default: $KAFKA_BOOTSTRAP_SERVERS")
    parser.add_argument("--database-url", default=None, help="default: $DATABASE_URL")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--steps", type=int, default=100, help="steps of a latency run")
    parser.add_argument("--latency-runs", type=int, default=3)
    parser.add_argument("--lengths", default="50,400", help="run lengths for bytes/step")
    parser.add_argument(
        "--bytes-steps",
        type=int,
        default=2_000,
        help="steps per length, about (fewer: PostgreSQL's 8 KiB pages show in the figure)",
    )
    parser.add_argument(
        "--concurrent-runs",
        default="100,1000",
        help="concurrency levels: runs started at once, each measured in turn",
    )
    parser.add_argument("--concurrent-steps", type=int, default=20)
    parser.add_argument("--pool-size", type=int, default=20, help="peers' connection pools")
    parser.add_argument("--profile", action="store_true", help="cProfile Onward's concurrency")
    parser.add_argument("--report", type=Path, help="print the tables of a stored result, only")
    parser.add_argument("--json", type=Path, default=Path("bench/results/steps.json"))
    parser.add_argument("--peer", choices=sorted(PEERS), help=argparse.SUPPRESS)
    parser.add_argument("--peer-params", help=argparse.SUPPRESS)
    parser.add_argument("--peer-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.peer:
        raw = json.loads(args.peer_params)
        peer_params = Params(
            **(raw | {"lengths": tuple(raw["lengths"]), "concurrency": tuple(raw["concurrency"])})
        )
        args.peer_out.write_text(json.dumps(PEERS[args.peer](peer_params), indent=2))
        return

    if args.report:
        stored = json.loads(args.report.read_text())
        raw = stored["parameters"]
        shown = Params(
            **(raw | {"lengths": tuple(raw["lengths"]), "concurrency": tuple(raw["concurrency"])})
        )
        report(
            stored["results"],
            shown,
            ratios(stored["results"], shown),
            found_postgres=ratios(stored["results"], shown, "onward-postgres"),
        )
        return

    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    params = Params(
        steps=args.steps,
        latency_runs=args.latency_runs,
        lengths=tuple(int(n) for n in args.lengths.split(",")),
        bytes_steps=args.bytes_steps,
        concurrency=tuple(int(n) for n in args.concurrent_runs.split(",")),
        concurrent_steps=args.concurrent_steps,
        pool_size=args.pool_size,
        database_url=args.database_url or os.environ["DATABASE_URL"],
    )
    bootstrap = args.bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "")
    results = run_ending_on_sigterm(
        onward_all(params, systems, bootstrap, args.json.parent if args.profile else None)
    )
    for peer in PEERS:
        if peer in systems:
            results[peer] = run_peer(peer, params)
    found = ratios(results, params)
    found_postgres = ratios(results, params, "onward-postgres")
    report(results, params, found, found_postgres=found_postgres)
    write_results(
        args.json,
        {
            "benchmark": "steps",
            "parameters": dataclasses.asdict(params) | {"database_url": "(from env)"},
            "onward_code": code_under_test(),
            "results": results,
            "ratios_onward_kafka_to_peer": found,
            "ratios_onward_postgres_to_peer": found_postgres,
        },
    )


if __name__ == "__main__":
    main()
