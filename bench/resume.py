"""Resume latency: `AgentRunner.resume`, approve and inspect behind other runs' traffic, and
`Resumer.claim` by history length.

The runner scenario (``--scenario runner``, the default) times what a user waits for. Two sets of
runs of ``--turns`` settled turns each (the next step a model call), and as many runs waiting on
an approval as samples, are started in partition 1 (which holds no other run's events) and in
partition 0; then ``--others`` events of small other runs are written into partition 0, after the
runs started, and folded. Each sample, on one run of each partition in turn, times:

* ``AgentRunner.resume``: lease, read (frontier row, transcript, tail), claim, plan, record the
  plan, rebuild the conversation, until the provider is first called (which ends the timing and
  stops the run, so it can be resumed again);
* ``Resumer.claim`` (lease, read, claim, plan, without the conversation), the lease released;
* ``approve`` of one waiting run; ``inspect`` of the resumed run;

the projector settling between them (Kafka: the `KafkaProjector` of this process; SQLite: the
runner's inline checkpointer). Targets: ``AgentRunner.resume`` p50 under 10 ms on Kafka +
PostgreSQL + Redis, and every op's p50 behind ``--others`` events at most 1.2x its p50 behind none,
on both deployments. Develop with ``--others 20000``; the issue's size is 1,000,000.

    python bench/resume.py --others 20000 --samples 50

The lengths scenario (``--scenario lengths``) times `Resumer.claim` for runs of 10, 1,000 and
100,000 events:

One resume is what a worker does to carry on a run another worker left: take the run's lease,
read its frontier row, read the log's tail after that row, append `RunClaimed` and read back up
to it, and plan (`Resumer.claim`; its ``timings_ms`` give lease / frontier / tail / claim /
plan; the lease is taken with a `Leaseholder` first, as the runner does). Measured on two
deployments, each with the same workload:

* Kafka + PostgreSQL: `KafkaEventLog` on a fresh 12-partition topic, `PostgresFrontierStore`
  in a fresh migrated schema, `RedisLeaseStore` under a unique key prefix, and a
  `KafkaProjector` folding frontiers in the background of this same process
  (``asyncio.create_task(projector.run(stop))``).
* Embedded: `SqliteEventLog` + `SqliteFrontierStore` + `SqliteLeaseStore` on one file,
  folded with `LogProjector.catch_up()`.

The workload: one measured run per history length (``--lengths``), each a realistic history (run
started, model answers with one to three tool calls, their dispatches and results, settled
turns, now and then an approval asked and granted; a few hundred bytes per event) carrying the
fence of a real lease taken for it, written in appends of ``--batch`` events and ending on a
settled turn so the run is resumable. Meanwhile ``--background-runs`` small runs (8 to 40
events, in appends of ``--background-batch``) are written into the same partitions, three
quarters of them concurrently with the measured histories and the rest after them, so the
measured runs share their partitions with other runs' events, also after their last event, as a
crashed run's partition does.

Once the projector has caught up, each run is resumed ``--warmup`` + ``--samples`` times. Each
sample times taking the lease and ``resumer.claim(...)`` from the caller's side, then releases the
lease (not timed) and, unless ``--no-settle``, waits for the projector to fold the `RunClaimed`
that resume appended (polling the run's frontier row; with SQLite, ``catch_up()``), so every sample
starts from a current frontier row and a tail holding only its own claim. Every sample appends one
`RunClaimed`, so a run's history grows by one event per sample. The first resume of each run (the
first warm-up) is reported on its own: its tail read is the one that walks past other runs' events
written after the run's last event. Samples go round-robin over the runs (one resume of each in
turn), so drift on the machine affects every length alike; ``--sequential`` does one run at a time.

Absolute figures depend on the machine (and on whatever else runs on it: the load average is
recorded); the ratio of the longest history's p50 to the shortest's is the figure to compare.
The project's targets: p50 under 20 ms on Kafka + PostgreSQL, and the 100,000-event p50 at most
1.5x the 10-event p50. Quantiles interpolate between ranks: with 100 samples, p99 lies between
the two slowest.

    python bench/resume.py --scenario lengths     # both backends; bench/results/resume.json
    python bench/resume.py --scenario lengths --backends kafka --samples 200
    python bench/resume.py --scenario lengths --profile   # + cProfile of the longest run

The topic, the PostgreSQL schema, the Redis keys and the SQLite file are deleted at the end,
also on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import os
import pstats
import random
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import (
    add_server_options,
    code_version,
    create_schema,
    delete_redis_keys,
    delete_topics,
    drop_schemas,
    quantile,
    run_ending_on_sigterm,
    server_urls,
    text,
    throwaway_name,
    whole_numbers,
    write_results,
)
from _workload import FirstCall, RunHistory, Stopwatch, search
from rich.console import Console
from rich.table import Table

from onward.eventlog import (
    ApprovalGranted,
    ApprovalRequested,
    Event,
    KafkaEventLog,
    RunClaimed,
    RunStarted,
    SqliteEventLog,
    ToolCall,
    codec,
    partition_for,
)
from onward.eventlog.base import EventLog, Position, StoredEvent
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.kafka import KafkaProjector
from onward.projections.log_projector import LogProjector
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime.agent import Agent
from onward.runtime.blobs import PostgresBlobStore, SqliteBlobStore
from onward.runtime.leases import (
    Leaseholder,
    LeasePolicy,
    LeaseStore,
    RedisLeaseStore,
    SqliteLeaseStore,
)
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.resumer import CarriedRun, Resumer
from onward.runtime.runner import AgentRunner
from onward.runtime.tools import tool
from onward.testing.eventlog import WrappedEventLog

PARTITIONS = 12
TENANT = "bench"
PARTS = ("lease", "frontier", "tail", "claim", "plan")
P50_TARGET_MS = 20.0
RATIO_TARGET = 1.5
RUNNER_P50_TARGET_MS = 10.0
RUNNER_RATIO_TARGET = 1.2
AGENT = Agent(name="booker", instructions="Book the trip the user asks for.")


# --------------------------------------------------------------------------------------------
# The workload


class History(RunHistory):
    """One run's history of exactly ``length`` events, the last a settled turn.

    Args:
        rng: Where the content comes from.
        length: Events in the history, at least 3.
        fence: The fence of the lease it is written under.
        prefix: Put before the run id.
    """

    def __init__(self, rng: random.Random, length: int, *, fence: int = 1, prefix: str) -> None:
        if length < 3:
            raise ValueError(f"a resumable history needs at least 3 events, got {length}")
        super().__init__(rng, f"{prefix}-{rng.getrandbits(48):012x}", tenant=TENANT, fence=fence)
        self.length = length

    def steps(self) -> Iterator[list[Event]]:
        """The run's steps, each the batch a runner appends at once."""
        rng = self.rng
        yield [
            RunStarted(
                **self._env(),
                agent=AGENT.name,
                revision=AGENT.revision,
                input={"task": text(rng, 60, 240), "user": f"u{rng.randint(1, 9999)}"},
                options={"model": "m-large", "max_iterations": 10**6},
            )
        ]
        budget = self.length - 1
        if budget % 2:
            yield [RunClaimed(**self._env(), worker=f"worker-{rng.randint(1, 16)}")]
            budget -= 1
        iteration = 0
        while budget:
            if iteration and budget >= 6 and rng.random() < 0.05:
                request = f"a{iteration}"
                yield [ApprovalRequested(**self._env(), request_id=request, prompt="go ahead?")]
                yield [ApprovalGranted(**self._env(), request_id=request, by="ann", value=True)]
                budget -= 2
            iteration += 1
            for step in self.turn(iteration, budget):
                budget -= len(step)
                yield step

    def appends(self, batch: int) -> Iterator[list[Event]]:
        """The steps joined into appends of about ``batch`` events (never splitting a step)."""
        pending: list[Event] = []
        for step in self.steps():
            pending.extend(step)
            if len(pending) >= batch:
                yield pending
                pending = []
        if pending:
            yield pending


@dataclass
class Workload:
    """What was written: the measured runs by length, and how long writing took."""

    measured: dict[int, History]
    events: int = 0
    encoded_bytes: int = 0
    appends: int = 0
    seconds: float = 0.0
    after_last: dict[int, int] = field(default_factory=dict)


async def write_workload(
    log: EventLog, leases: LeaseStore, args: argparse.Namespace, prefix: str
) -> Workload:
    """Write the measured histories (each under a real lease) and the background runs."""
    rng = random.Random(args.seed)
    measured: dict[int, History] = {}
    for length in args.lengths:
        history = History(rng, length, prefix=f"{prefix}-h{length}")
        lease = await leases.acquire(
            history.run_id, tenant=TENANT, holder="bench-writer", ttl_s=3600
        )
        history.fence = lease.fence
        measured[length] = history
        await leases.release(lease)
    background = [
        History(rng, rng.randint(8, 40), prefix=f"{prefix}-bg") for _ in range(args.background_runs)
    ]
    split = len(background) * 3 // 4
    work = Workload(measured)

    last_offsets: dict[str, int] = {}

    async def write_run(history: History, batch: int) -> None:
        for events in history.appends(batch):
            positions = await log.append(events)
            last_offsets[history.run_id] = positions[-1].offset
            work.events += len(events)
            work.encoded_bytes += sum(len(codec.encode(e)) for e in events)
            work.appends += 1

    async def write_many(runs: list[History]) -> None:
        queue = list(reversed(runs))

        async def worker() -> None:
            while queue:
                await write_run(queue.pop(), args.background_batch)

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))

    started = time.perf_counter()
    await asyncio.gather(
        write_many(background[:split]), *(write_run(h, args.batch) for h in measured.values())
    )
    await write_many(background[split:])
    work.seconds = time.perf_counter() - started
    for length, history in measured.items():
        end = (await log.bounds(partition_for(history.run_id, log.partitions))).end
        work.after_last[length] = end - last_offsets[history.run_id] - 1
    return work


# --------------------------------------------------------------------------------------------
# Sampling


class TimedLog(WrappedEventLog):
    """An `EventLog` that times each `append` and `read_run` of the log it wraps.

    Used only for the ``--profile`` resumes, to split the resumer's ``tail`` and ``claim`` into
    the log calls they make: the tail read, the claim's append and the read back to the claim.
    """

    def __init__(self, inner: EventLog) -> None:
        super().__init__(inner)
        self.calls: list[tuple[str, float, int]] = []

    async def append(self, events: Sequence[Event]) -> list[Position]:
        mark = time.perf_counter()
        positions = await self.inner.append(events)
        self.calls.append(("append", (time.perf_counter() - mark) * 1000.0, len(events)))
        return positions

    async def read_run(
        self, run_id: str, *, start: int | None = None, end: int | None = None
    ) -> list[StoredEvent]:
        mark = time.perf_counter()
        events = await self.inner.read_run(run_id, start=start, end=end)
        self.calls.append(("read_run", (time.perf_counter() - mark) * 1000.0, len(events)))
        return events


@dataclass
class Sample:
    """One resume: the caller's wall time, the resumer's own breakdown, the tail it folded."""

    ms: float
    timings: dict[str, float]
    tail_events: int
    settle_ms: float


async def resume_once(
    resumer: Resumer,
    leases: LeaseStore,
    history: History,
    *,
    worker: str,
    settle: Callable[[CarriedRun], Awaitable[None]] | None,
    profiler: cProfile.Profile | None = None,
) -> Sample:
    """Resume ``history``'s run once (timed: take the lease, then read, claim and plan under
    it, as `AgentRunner.resume` does), then release the lease and settle (not timed)."""
    if profiler is not None:
        profiler.enable()
    mark = time.perf_counter()
    async with Leaseholder(
        leases, history.run_id, tenant=TENANT, holder=worker, policy=resumer.policy
    ) as held:
        lease_ms = (time.perf_counter() - mark) * 1000.0
        carried = await resumer.claim(AGENT, held, worker=worker)
        ms = (time.perf_counter() - mark) * 1000.0
        if profiler is not None:
            profiler.disable()
    carried.timings_ms["lease"] = lease_ms
    if not carried.claimed:
        raise RuntimeError(
            f"run {history.run_id} was not claimed (status {carried.frontier.status}); "
            "the history must leave it resumable"
        )
    settle_ms = 0.0
    if settle is not None:
        mark = time.perf_counter()
        await settle(carried)
        settle_ms = (time.perf_counter() - mark) * 1000.0
    return Sample(ms, dict(carried.timings_ms), carried.tail_events, settle_ms)


def summarize(
    length: int, warm: list[Sample], samples: list[Sample], last_seq: int, after_last: int
) -> dict[str, Any]:
    """p50 / p99 / mean of the wall time, the p50 of every part, the tail sizes."""
    times = [s.ms for s in samples]
    first = warm[0] if warm else samples[0]
    return {
        "history_events": length,
        "samples": len(samples),
        "p50_ms": quantile(times, 0.5),
        "p99_ms": quantile(times, 0.99),
        "mean_ms": statistics.fmean(times),
        "min_ms": min(times),
        "max_ms": max(times),
        "resumer_total_p50_ms": quantile([s.timings.get("total", 0.0) for s in samples], 0.5),
        "parts_p50_ms": {p: quantile([s.timings.get(p, 0.0) for s in samples], 0.5) for p in PARTS},
        "parts_p99_ms": {
            p: quantile([s.timings.get(p, 0.0) for s in samples], 0.99) for p in PARTS
        },
        "tail_events_p50": quantile([float(s.tail_events) for s in samples], 0.5),
        "tail_events_max": max(s.tail_events for s in samples),
        "settle_p50_ms": quantile([s.settle_ms for s in samples], 0.5),
        "first_resume": {
            "ms": first.ms,
            "parts_ms": {p: first.timings.get(p, 0.0) for p in PARTS},
            "tail_events": first.tail_events,
            "other_events_after_last_event": after_last,
        },
        "last_seq_after": last_seq,
        "all_ms": times,
    }


async def measure(
    name: str,
    resumer: Resumer,
    leases: LeaseStore,
    work: Workload,
    args: argparse.Namespace,
    settle: Callable[[CarriedRun], Awaitable[None]],
    settle_all: Callable[[], Awaitable[object]],
    console: Console,
) -> dict[str, Any]:
    """Sample every measured run, round-robin unless ``--sequential``; profile if asked."""
    runs = list(work.measured.items())
    warm: dict[int, list[Sample]] = {length: [] for length, _ in runs}
    timed: dict[int, list[Sample]] = {length: [] for length, _ in runs}
    timed_settle = None if args.no_settle else settle
    if args.sequential:
        order = [(n, length, h) for length, h in runs for n in range(args.warmup + args.samples)]
    else:
        order = [(n, length, h) for n in range(args.warmup + args.samples) for length, h in runs]
    for n, length, history in order:
        warming = n < args.warmup
        sample = await resume_once(
            resumer,
            leases,
            history,
            worker=f"bench-worker-{n % 4}",
            settle=settle if warming else timed_settle,
        )
        (warm if warming else timed)[length].append(sample)
    if args.no_settle:
        await settle_all()
    per_length: list[dict[str, Any]] = []
    warnings: list[str] = []
    for length, history in runs:
        row = await resumer.frontiers.get(history.run_id) if resumer.frontiers else None
        expected = length + args.warmup + args.samples
        last_seq = row.summary.last_seq if row is not None else -1
        if last_seq != expected:
            warnings.append(f"{name} {length}: frontier last_seq {last_seq}, expected {expected}")
        per_length.append(
            summarize(length, warm[length], timed[length], last_seq, work.after_last[length])
        )
        console.print(
            f"  {name}: {length:,} events: p50 {per_length[-1]['p50_ms']:.2f} ms "
            f"over {args.samples} samples"
        )
    result: dict[str, Any] = {"lengths": per_length, "warnings": warnings}
    p50s = {r["history_events"]: r["p50_ms"] for r in per_length}
    shortest, longest = min(p50s), max(p50s)
    result["ratio_longest_to_shortest_p50"] = p50s[longest] / p50s[shortest]
    if args.profile:
        result["profile"] = await profile_run(
            resumer, leases, work.measured[longest], args, timed_settle
        )
    for message in warnings:
        console.print(f"[red]{message}")
    return result


async def profile_run(
    resumer: Resumer,
    leases: LeaseStore,
    history: History,
    args: argparse.Namespace,
    settle: Callable[[CarriedRun], Awaitable[None]] | None,
) -> dict[str, Any]:
    """Where one run's resume time goes: its log calls timed, then a cProfile.

    First ``--profile-samples`` resumes through a `TimedLog` (no profiler, so the times are not
    inflated by it), then as many under cProfile. cProfile only sees the time a coroutine runs,
    not the time it waits on a socket, so the log calls timed from outside are what say where
    a resume's wall time goes.
    """
    timed = TimedLog(resumer.log)
    split_resumer = Resumer(timed, leases, resumer.frontiers, policy=resumer.policy)
    split: dict[str, list[float]] = {"tail read": [], "claim append": [], "claim read-back": []}
    bounds: list[float] = []
    partition = partition_for(history.run_id, timed.partitions)
    for n in range(args.profile_samples):
        timed.calls.clear()
        await resume_once(
            split_resumer, leases, history, worker=f"bench-worker-{n % 4}", settle=settle
        )
        kinds = [(kind, ms) for kind, ms, _ in timed.calls]
        if [k for k, _ in kinds] == ["read_run", "append", "read_run"]:
            for name, (_, ms) in zip(split, kinds, strict=True):
                split[name].append(ms)
        mark = time.perf_counter()
        await timed.bounds(partition)
        bounds.append((time.perf_counter() - mark) * 1000.0)
    profiler = cProfile.Profile()
    for n in range(args.profile_samples):
        await resume_once(
            resumer,
            leases,
            history,
            worker=f"bench-worker-{n % 4}",
            settle=settle,
            profiler=profiler,
        )
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(args.profile_top)
    return {
        "history_events": history.length,
        "resumes": args.profile_samples,
        "log_calls_p50_ms": {name: quantile(values, 0.5) for name, values in split.items()}
        | {"bounds alone (not part of resume)": quantile(bounds, 0.5)},
        "top_cumulative": out.getvalue(),
    }


# --------------------------------------------------------------------------------------------
# Kafka + PostgreSQL + Redis


@dataclass
class KafkaStack:
    """A throwaway topic, schema and Redis prefix, with a KafkaProjector folding in this process."""

    topic: str
    schema: str
    prefix: str
    log: KafkaEventLog
    leases: RedisLeaseStore
    store: PostgresFrontierStore
    projection: FrontierProjection
    folding: asyncio.Task[None]

    def check_folding(self) -> None:
        """Raise what stopped the projector, if it has stopped."""
        if self.folding.done():
            self.folding.result()
            raise RuntimeError("the projector stopped")


@contextlib.asynccontextmanager
async def kafka_stack(args: argparse.Namespace, console: Console) -> AsyncIterator[KafkaStack]:
    """Open the stack, then close everything, delete the topic, drop the schema, delete the keys."""
    topic = throwaway_name("resume")
    suffix = topic.rsplit(".", 1)[1]
    prefix = f"onward-bench-resume-{suffix}:"
    schema: str | None = None
    log: KafkaEventLog | None = None
    leases: RedisLeaseStore | None = None
    stores: list[PostgresFrontierStore] = []
    projector: KafkaProjector[FrontierProjection] | None = None
    stop = asyncio.Event()
    folding: asyncio.Task[None] | None = None
    try:
        schema = await create_schema(args.database_url, "resume")
        log = await KafkaEventLog.open(args.bootstrap, topic=topic, partitions=PARTITIONS)
        leases = await RedisLeaseStore.open(args.redis_url, prefix=prefix)
        projector_store = await PostgresFrontierStore.open(args.database_url, schema=schema)
        stores.append(projector_store)
        store = await PostgresFrontierStore.open(args.database_url, schema=schema)
        stores.append(store)
        projection = FrontierProjection(projector_store, log)
        projector = KafkaProjector(
            args.bootstrap,
            projection,
            topic=topic,
            partitions=PARTITIONS,
            group_id=f"onward-bench-resume-{suffix}",
        )
        await projector.start()
        folding = asyncio.create_task(projector.run(stop))
        yield KafkaStack(topic, schema, prefix, log, leases, store, projection, folding)
    finally:
        stop.set()
        if folding is not None:
            with contextlib.suppress(Exception):
                await folding
        if projector is not None:
            await projector.close()
        for opened in stores:
            with contextlib.suppress(Exception):
                await opened.close()
        if leases is not None:
            with contextlib.suppress(Exception):
                await leases.close()
        if log is not None:
            with contextlib.suppress(Exception):
                await log.close()
        await delete_topics(args.bootstrap, [topic], console)
        await drop_schemas(args.database_url, [schema] if schema else [], console)
        await delete_redis_keys(args.redis_url, prefix, console)


async def bench_kafka(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    async with kafka_stack(args, console) as stack:
        topic, schema, prefix = stack.topic, stack.schema, stack.prefix
        log, leases, store, projection = stack.log, stack.leases, stack.store, stack.projection

        async def caught_up() -> float:
            started = time.perf_counter()
            ends = {p: (await log.bounds(p)).end for p in range(PARTITIONS)}
            while True:
                stored = await projection.positions()
                if all(stored.get(p, 0) >= end for p, end in ends.items() if end > 0):
                    return time.perf_counter() - started
                stack.check_folding()
                await asyncio.sleep(0.05)

        async def settle(carried: CarriedRun) -> None:
            through = carried.frontier.through_offset
            deadline = time.monotonic() + 30.0
            while True:
                row = await store.get(carried.frontier.run_id)
                if row is not None and row.summary.through_offset >= through:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the projector did not fold offset {through} in 30 s")
                stack.check_folding()
                await asyncio.sleep(0.002)

        console.print(f"kafka: writing the workload into {topic} (projector folding) ...")
        work = await write_workload(log, leases, args, "run")
        console.print(
            f"kafka: {work.events:,} events in {work.appends:,} appends, {work.seconds:.1f}s"
        )
        catch_up_s = await caught_up()
        console.print(f"kafka: projector caught up {catch_up_s:.1f}s after the last append")
        resumer = Resumer(log, leases, store, policy=LeasePolicy())
        result = await measure("kafka", resumer, leases, work, args, settle, caught_up, console)
        result |= _workload_figures(work) | {
            "setup": f"topic {topic} ({PARTITIONS} partitions), schema {schema}, Redis prefix "
            f"{prefix!r}, KafkaProjector running in this process",
            "projector_catch_up_after_writes_s": catch_up_s,
            "projector_events_folded": projection.stats.events,
        }
        return result


# --------------------------------------------------------------------------------------------
# Embedded SQLite


async def bench_sqlite(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="onward-bench-resume-") as tmp:
        path = Path(tmp) / "onward.db"
        log = await SqliteEventLog.open(path, partitions=PARTITIONS)
        store: SqliteFrontierStore | None = None
        leases: SqliteLeaseStore | None = None
        try:
            store = await SqliteFrontierStore.open(path)
            leases = await SqliteLeaseStore.open(path)
            projector = LogProjector(log, FrontierProjection(store, log))
            console.print(f"sqlite: writing the workload into {path} ...")
            work = await write_workload(log, leases, args, "run")
            console.print(
                f"sqlite: {work.events:,} events in {work.appends:,} appends, {work.seconds:.1f}s"
            )
            mark = time.perf_counter()
            await projector.catch_up()
            catch_up_s = time.perf_counter() - mark

            async def settle(carried: CarriedRun) -> None:
                await projector.catch_up()

            resumer = Resumer(log, leases, store, policy=LeasePolicy())
            result = await measure(
                "sqlite", resumer, leases, work, args, settle, projector.catch_up, console
            )
            result |= _workload_figures(work) | {
                "setup": "SqliteEventLog + SqliteFrontierStore + SqliteLeaseStore on one file, "
                "LogProjector.catch_up() after the writes and between samples",
                "projector_catch_up_after_writes_s": catch_up_s,
                "file_bytes": path.stat().st_size,
            }
            return result
        finally:
            for closeable in (leases, store, log):
                if closeable is not None:
                    with contextlib.suppress(Exception):
                        await closeable.close()


def _workload_figures(work: Workload) -> dict[str, Any]:
    return {
        "written_events": work.events,
        "written_appends": work.appends,
        "mean_event_bytes": work.encoded_bytes / max(1, work.events),
        "write_s": work.seconds,
    }


# --------------------------------------------------------------------------------------------
# The runner scenario: what a user times (`AgentRunner.resume`, `approve`, `inspect`)


@tool(requires_approval=True)
async def pay(amount: int, *, idempotency_key: str) -> str:
    """A tool a person approves first."""
    return "paid"


RUNNER_AGENT = Agent(name="booker", instructions="Book the trip.", tools=[search, pay])
RUNNER_OPS = ("AgentRunner.resume", "Resumer.claim", "approve", "inspect")


def run_ids_in(partition: int, partitions: int, prefix: str, n: int) -> list[str]:
    """``n`` run ids whose partition is ``partition``."""
    found: list[str] = []
    k = 0
    while len(found) < n:
        run_id = f"{prefix}-{k}"
        k += 1
        if partition_for(run_id, partitions) == partition:
            found.append(run_id)
    return found


async def write_others(
    log: EventLog, partition: int, events: int, args: argparse.Namespace, prefix: str
) -> int:
    """Write about ``events`` events of small other runs into ``partition``; return how many."""
    rng = random.Random(args.seed)
    ids = iter(run_ids_in(partition, log.partitions, prefix, events // 8 + 1))
    written = 0

    async def writer() -> None:
        nonlocal written
        while written < events:
            history = History(rng, rng.randint(8, 40), prefix="x")
            history.run_id = next(ids)
            written += history.length
            for batch in history.appends(args.background_batch):
                await log.append(batch)

    await asyncio.gather(*(writer() for _ in range(args.concurrency)))
    return written


@dataclass
class RunnerPhase:
    """The runs one phase times: one resumable run, and waiting runs to approve (one each)."""

    resumable: str
    waiting: list[str]


async def prepare_runner_phase(
    runner: AgentRunner, partition: int, prefix: str, approvals: int, turns: int
) -> RunnerPhase:
    """A run of ``turns`` settled turns whose next step is a model call, and waiting runs."""
    partitions = runner.log.partitions
    resumable, *waiting = run_ids_in(partition, partitions, prefix, approvals + 1)
    runner.provider = Stopwatch(turns)
    with contextlib.suppress(FirstCall):
        await runner.run(RUNNER_AGENT, {"task": "book"}, tenant=TENANT, run_id=resumable)
    for run_id in waiting:
        runner.provider = ScriptedProvider(
            [reply("paying", ToolCall(call_id="p", tool="pay", args={"amount": 5}))]
        )
        result = await runner.run(RUNNER_AGENT, "pay", tenant=TENANT, run_id=run_id)
        if result.status != "waiting":
            raise RuntimeError(f"run {run_id} is {result.status}, not waiting on approval")
    return RunnerPhase(resumable, waiting)


async def time_runner_ops(
    runner: AgentRunner,
    phases: dict[str, RunnerPhase],
    args: argparse.Namespace,
    settle: Callable[[], Awaitable[object]],
) -> dict[str, dict[str, list[float]]]:
    """Each op ``--warmup`` + ``--samples`` times on each phase's runs, the phases taking turns
    (so drift on a shared machine affects both alike); the projector settles between ops."""
    times: dict[str, dict[str, list[float]]] = {
        name: {op: [] for op in RUNNER_OPS} for name in phases
    }
    waiting = {name: iter(phase.waiting) for name, phase in phases.items()}
    order = list(phases)
    for n in range(args.warmup + args.samples):
        for name in order if n % 2 else reversed(order):
            sample = await _time_ops(runner, phases[name].resumable, next(waiting[name]), settle)
            if n >= args.warmup:
                for op, ms in sample.items():
                    times[name][op].append(ms)
    return times


async def _time_ops(
    runner: AgentRunner, run_id: str, request_run: str, settle: Callable[[], Awaitable[object]]
) -> dict[str, float]:
    sample: dict[str, float] = {}
    watch = Stopwatch(0)
    runner.provider = watch
    mark = time.perf_counter()
    with contextlib.suppress(FirstCall):
        await runner.resume(RUNNER_AGENT, run_id, tenant=TENANT)
    if not watch.called_at:
        raise RuntimeError(f"resume of {run_id} did not call the model")
    sample["AgentRunner.resume"] = (watch.called_at - mark) * 1000.0
    await settle()
    mark = time.perf_counter()
    async with Leaseholder(
        runner.leases, run_id, tenant=TENANT, holder=runner.worker, policy=runner.lease_policy
    ) as held:
        await runner.resumer.claim(RUNNER_AGENT, held, worker=runner.worker)
        sample["Resumer.claim"] = (time.perf_counter() - mark) * 1000.0
    await settle()
    mark = time.perf_counter()
    await runner.approve(request_run, "p", tenant=TENANT, by="ann")
    sample["approve"] = (time.perf_counter() - mark) * 1000.0
    await settle()
    mark = time.perf_counter()
    await runner.inspect(run_id, tenant=TENANT)
    sample["inspect"] = (time.perf_counter() - mark) * 1000.0
    return sample


async def runner_scenario(
    name: str,
    runner: AgentRunner,
    args: argparse.Namespace,
    settle: Callable[[], Awaitable[object]],
    console: Console,
) -> dict[str, Any]:
    """Time the ops on runs of partition 1, which holds no other run's events, and of
    partition 0, into which ``--others`` events of other runs are written after the runs
    started (so they lie between each run's first event and its resume)."""
    approvals = args.warmup + args.samples
    phases = {
        "none": await prepare_runner_phase(runner, 1, "quiet", approvals, args.turns),
        "others": await prepare_runner_phase(runner, 0, "busy", approvals, args.turns),
    }
    console.print(f"{name}: writing {args.others:,} events of other runs into partition 0 ...")
    mark = time.perf_counter()
    written = await write_others(runner.log, 0, args.others, args, "other")
    write_s = time.perf_counter() - mark
    mark = time.perf_counter()
    await settle()
    fold_s = time.perf_counter() - mark
    console.print(f"{name}: {written:,} written in {write_s:.1f}s, folded {fold_s:.1f}s later")
    console.print(f"{name}: timing, the two partitions' runs taking turns ...")
    times = await time_runner_ops(runner, phases, args, settle)
    rows: dict[str, dict[str, Any]] = {}
    for op in RUNNER_OPS:
        none, others = times["none"][op], times["others"][op]
        rows[op] = {
            "none": {"p50_ms": quantile(none, 0.5), "p99_ms": quantile(none, 0.99)},
            "others": {"p50_ms": quantile(others, 0.5), "p99_ms": quantile(others, 0.99)},
            "ratio_p50": quantile(others, 0.5) / quantile(none, 0.5),
        }
    return {
        "ops": rows,
        "other_events": written,
        "others_write_s": write_s,
        "others_fold_s": fold_s,
        "turns": args.turns,
        "samples": args.samples,
        "all_ms": times,
    }


async def bench_runner_kafka(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    async with kafka_stack(args, console) as stack:
        topic, schema = stack.topic, stack.schema
        log, leases, store, projection = stack.log, stack.leases, stack.store, stack.projection
        blobs = await PostgresBlobStore.open(args.database_url, schema=schema)

        async def settle() -> None:
            ends = {p: (await log.bounds(p)).end for p in (0, 1)}
            deadline = time.monotonic() + 600.0
            while not _reached(await projection.positions(), ends):
                if time.monotonic() > deadline:
                    raise RuntimeError("the projector did not catch up in 600 s")
                stack.check_folding()
                await asyncio.sleep(0.002)

        runner = AgentRunner(
            provider=Stopwatch(), log=log, frontiers=store, leases=leases, blobs=blobs
        )
        try:
            result = await runner_scenario("kafka", runner, args, settle, console)
        finally:
            await blobs.close()
        return result | {
            "setup": f"topic {topic} ({PARTITIONS} partitions), schema {schema}, Redis leases, "
            "KafkaProjector running in this process; the runs and the others in partition 0"
        }


async def bench_runner_sqlite(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="onward-bench-resume-") as tmp:
        path = Path(tmp) / "onward.db"
        async with (
            SqliteEventLog(path, partitions=PARTITIONS) as log,
            SqliteFrontierStore(path) as store,
            SqliteLeaseStore(path) as leases,
            SqliteBlobStore(path) as blobs,
        ):
            runner = AgentRunner(
                provider=Stopwatch(),
                log=log,
                frontiers=store,
                checkpoint_inline=True,
                leases=leases,
                blobs=blobs,
            )
            checkpointer = runner.checkpointer
            assert checkpointer is not None

            async def settle() -> None:
                await checkpointer.catch_up([0, 1])

            result = await runner_scenario("sqlite", runner, args, settle, console)
            return result | {
                "setup": "SqliteEventLog + SqliteFrontierStore + SqliteLeaseStore on one file, "
                "the runner folding inline (embedded mode)"
            }


def _reached(positions: dict[int, int], ends: dict[int, int]) -> bool:
    return all(positions.get(p, 0) >= end for p, end in ends.items())


def _runner_table(name: str, result: dict[str, Any]) -> Table:
    table = Table(
        title=f"{name}: {result['samples']} samples per op, runs of {result['turns']} turns, "
        f"0 vs {result['other_events']:,} other runs' events in the partition; ms"
    )
    for column in ("op", "p50 (0)", "p99 (0)", "p50 (others)", "p99 (others)", "ratio p50"):
        table.add_column(column, justify="right")
    for op, row in result["ops"].items():
        table.add_row(
            op,
            f"{row['none']['p50_ms']:.2f}",
            f"{row['none']['p99_ms']:.2f}",
            f"{row['others']['p50_ms']:.2f}",
            f"{row['others']['p99_ms']:.2f}",
            f"{row['ratio_p50']:.2f}",
        )
    table.caption = (
        "AgentRunner.resume: lease, claim, plan, conversation (frontier + transcript + tail), "
        "until the model is called. Resumer.claim: lease, read, claim, plan (no conversation)."
    )
    return table


def _runner_targets(results: dict[str, Any]) -> dict[str, Any]:
    checks: dict[str, Any] = {}
    kafka = results.get("kafka")
    if kafka is not None:
        p50 = kafka["ops"]["AgentRunner.resume"]["none"]["p50_ms"]
        checks["kafka_runner_resume_p50_under_10ms"] = {
            "p50_ms": p50,
            "met": p50 < RUNNER_P50_TARGET_MS,
        }
    for name, result in results.items():
        for op in ("AgentRunner.resume", "approve", "inspect"):
            ratio = result["ops"][op]["ratio_p50"]
            checks[f"{name}_{op}_ratio_at_most_1.2"] = {
                "ratio": ratio,
                "met": ratio <= RUNNER_RATIO_TARGET,
            }
    return checks


# --------------------------------------------------------------------------------------------
# Output


def _table(name: str, result: dict[str, Any], args: argparse.Namespace) -> Table:
    settling = "projector settled between samples" if not args.no_settle else "no settling"
    table = Table(
        title=f"resume, {name}: {args.samples} samples per run after {args.warmup} warm-ups, "
        f"{settling}; ms"
    )
    table.add_column("history", justify="right")
    for column in ("p50", "p99", "mean", *(f"{p} p50" for p in PARTS)):
        table.add_column(column, justify="right")
    table.add_column("tail ev p50/max", justify="right")
    table.add_column("1st resume", justify="right")
    table.add_column("1st tail ev", justify="right")
    table.add_column("others after", justify="right")
    for row in result["lengths"]:
        parts = row["parts_p50_ms"]
        first = row["first_resume"]
        table.add_row(
            f"{row['history_events']:,}",
            f"{row['p50_ms']:.2f}",
            f"{row['p99_ms']:.2f}",
            f"{row['mean_ms']:.2f}",
            *(f"{parts[p]:.2f}" for p in PARTS),
            f"{row['tail_events_p50']:.0f}/{row['tail_events_max']}",
            f"{first['ms']:.1f}",
            f"{first['tail_events']}",
            f"{first['other_events_after_last_event']:,}",
        )
    lengths = [r["history_events"] for r in result["lengths"]]
    table.caption = (
        f"p50 at {max(lengths):,} events / p50 at {min(lengths):,} events = "
        f"{result['ratio_longest_to_shortest_p50']:.2f}x. Parts are each their own p50 (they "
        "need not add up to the p50). tail ev: events the resume folded after the frontier row, "
        "its own claim included. 1st resume: the run's first resume (a warm-up), whose tail "
        "read starts at the run's last event, with 'others after' other runs' events behind it "
        "in the partition."
    )
    return table


def _targets(results: dict[str, Any]) -> dict[str, Any]:
    checks: dict[str, Any] = {}
    kafka = results.get("kafka")
    if kafka is not None:
        worst = max(r["p50_ms"] for r in kafka["lengths"])
        checks["kafka_p50_under_20ms"] = {"worst_p50_ms": worst, "met": worst < P50_TARGET_MS}
    for name, result in results.items():
        ratio = result["ratio_longest_to_shortest_p50"]
        checks[f"{name}_ratio_at_most_1.5"] = {"ratio": ratio, "met": ratio <= RATIO_TARGET}
    return checks


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_server_options(parser, "bootstrap", "database_url", "redis_url")
    parser.add_argument("--backends", default="kafka,sqlite", help="kafka, sqlite or both")
    parser.add_argument(
        "--scenario",
        choices=("runner", "lengths"),
        default="runner",
        help="runner: AgentRunner.resume, Resumer.claim, approve and inspect with 0 and "
        "--others events of other runs in the run's partition; lengths: Resumer.claim by "
        "history length (--lengths)",
    )
    parser.add_argument(
        "--others",
        type=int,
        default=1_000_000,
        help="runner scenario: events of other runs written into the runs' partition",
    )
    parser.add_argument("--turns", type=int, default=10, help="runner scenario: turns per run")
    parser.add_argument(
        "--lengths",
        type=whole_numbers,
        default=[10, 1_000, 100_000],
        help="history lengths, comma-separated",
    )
    parser.add_argument("--samples", type=int, default=100, help="timed resumes per run")
    parser.add_argument("--warmup", type=int, default=5, help="untimed resumes per run first")
    parser.add_argument("--batch", type=int, default=250, help="events per measured append")
    parser.add_argument("--background-runs", type=int, default=3_000)
    parser.add_argument("--background-batch", type=int, default=8, help="events per append")
    parser.add_argument("--concurrency", type=int, default=32, help="background writers")
    parser.add_argument(
        "--no-settle",
        action="store_true",
        help="do not wait for the projector between samples (the tail grows one per sample)",
    )
    parser.add_argument(
        "--sequential",
        action="store_true",
        help="all samples of one run before the next (default: round-robin over the runs)",
    )
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--profile", action="store_true", help="cProfile the longest run's resumes")
    parser.add_argument("--profile-samples", type=int, default=50)
    parser.add_argument("--profile-top", type=int, default=20)
    parser.add_argument("--json", type=Path, default=Path("bench/results/resume.json"))
    return parser


async def bench(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    results: dict[str, Any] = {}
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    runner = args.scenario == "runner"
    for backend in backends:
        if backend == "kafka":
            run = bench_runner_kafka if runner else bench_kafka
            results["kafka"] = await run(args, console)
        elif backend == "sqlite":
            run = bench_runner_sqlite if runner else bench_sqlite
            results["sqlite"] = await run(args, console)
        else:
            raise SystemExit(f"unknown backend {backend!r}")
    return results


def main() -> None:
    args = _parser().parse_args()
    if min(args.lengths) < 3:
        raise SystemExit("--lengths: a resumable history needs at least 3 events")
    if "kafka" in args.backends:
        server_urls(args, "bootstrap", "database_url", "redis_url")
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    code = code_version()
    load_before = os.getloadavg()
    console.print(f"code at {code}; load average {load_before[0]:.2f} on {os.cpu_count()} CPUs")
    results = run_ending_on_sigterm(bench(args, console))
    load_after = os.getloadavg()
    names = {"kafka": "Kafka + PostgreSQL + Redis", "sqlite": "embedded SQLite"}
    for name, result in results.items():
        if args.scenario == "runner":
            console.print(_runner_table(names[name], result))
        else:
            console.print(_table(names[name], result, args))
    targets = _runner_targets(results) if args.scenario == "runner" else _targets(results)
    for check, outcome in targets.items():
        figure = outcome.get("worst_p50_ms", outcome.get("p50_ms", outcome.get("ratio")))
        verdict = "[green]met" if outcome["met"] else "[red]not met"
        console.print(f"target {check}: {figure:.2f} {verdict}")
    for name, result in results.items():
        if "profile" in result:
            console.print(
                f"cProfile, {name}: {result['profile']['resumes']} resumes of the "
                f"{result['profile']['history_events']:,}-event run (top cumulative):"
            )
            calls = ", ".join(
                f"{k} {v:.2f}" for k, v in result["profile"]["log_calls_p50_ms"].items()
            )
            console.print(f"log calls, p50 ms: {calls}")
            print(result["profile"]["top_cumulative"])
    console.print(
        f"load average {load_after[0]:.2f} at the end on {os.cpu_count()} CPUs; absolute "
        "figures depend on the machine, compare the ratio."
    )
    parameters = {
        k: v for k, v in vars(args).items() if k not in {"database_url", "redis_url", "bootstrap"}
    }
    write_results(
        args.json,
        {
            "benchmark": "resume",
            "code": code,
            "machine": {
                "cpus": os.cpu_count(),
                "load_average_before": load_before,
                "load_average_after": load_after,
            },
            "parameters": parameters | {"json": str(args.json), "partitions": PARTITIONS},
            "targets": targets,
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
