"""Projector throughput: `KafkaProjector` folding into PostgreSQL against a raw consumer.

One run pre-produces ``--events`` realistic events (run.started, run.claimed, model.answered
with tool calls, tool.dispatched, tool.completed, turn.settled, approvals, model.answered,
run.finished; a few hundred bytes each) over ``--runs`` runs into a fresh 12-partition topic,
every run's events in seq order on its own partition and all runs interleaved as concurrent
runs write. It then reads that same topic four ways and reports events/s for each:

* raw consume: a plain `AIOKafkaConsumer` (no group, all partitions assigned, from the start)
  counting records, and again decoding every value with the event codec;
* projector fold: `KafkaProjector` + `FrontierProjection` + `PostgresFrontierStore` in a fresh
  PostgreSQL schema, timed from ``start()`` until the stored positions reach every
  partition's end. It runs in a child process so its peak RSS and its CPU time (user +
  system, per event: the figure other processes on a shared machine move least) can be
  reported;
* projector fold in a group: ``--group-projectors`` such child processes (2 by default) in
  one consumer group, as a deployment runs one projector per core, timed from the first
  member's ``start()`` until every partition is stored through its end;
* rebuild: `rebuild_frontiers` over a `KafkaEventLog` of the same topic, into a new build.

Absolute figures depend on the machine; the ratios fold/raw consume are the figures to
compare, measured side by side in one run on the same data. The memory target is a projector
under 150 MB for 100,000 runs (it keeps frontiers within `FrontierProjection`'s
``cache_bytes``, not per run): measure it with ``--runs 100000``.

    python bench/project.py                                    # 1,000,000 events, 10,000 runs
    python bench/project.py --events 1000000 --runs 100000 --skip-rebuild   # the memory target
    python bench/project.py --events 200000 --profile  # adds cProfiles of the fold and rebuild

The topic and the PostgreSQL schema are deleted at the end, also on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import os
import pstats
import random
import resource
import sys
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
from _common import (
    add_server_options,
    code_version,
    cpu_seconds,
    cpu_used,
    create_schema,
    create_topic,
    delete_topics,
    drop_schemas,
    raw_producer,
    run_ending_on_sigterm,
    server_urls,
    text,
    throwaway_name,
    write_results,
)
from _workload import RunHistory
from aiokafka import AIOKafkaConsumer, TopicPartition
from rich.console import Console
from rich.table import Table

from onward.eventlog import (
    ApprovalGranted,
    ApprovalRequested,
    Event,
    KafkaEventLog,
    Message,
    ModelAnswered,
    RunClaimed,
    RunFinished,
    RunStarted,
    Usage,
    codec,
    partition_for,
)
from onward.eventlog.base import LogRecord
from onward.projections.base import StoredFrontier
from onward.projections.frontier_projection import DEFAULT_CACHE_BYTES, FrontierProjection
from onward.projections.kafka import KafkaProjector, fixed_mmap_threshold, quiet_garbage_collector
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.projector_defaults import (
    FOCUS_SLICE_S,
    PROJECTOR_FLUSH_EVENTS,
    PROJECTOR_FLUSH_INTERVAL,
)
from onward.projections.rebuild import rebuild_frontiers

PARTITIONS = 12
RESULT_MARK = "PROJECT-RESULT "
SCRIPT = str(Path(__file__).resolve())


# --------------------------------------------------------------------------------------------
# The workload


def _lengths(rng: random.Random, runs: int, events: int) -> list[int]:
    """Events per run: about ``events / runs`` each, +-50%, at least 4, summing to ``events``."""
    mean = events / runs
    low = max(4, round(mean * 0.5))
    high = max(low, round(mean * 1.5))
    lengths = [rng.randint(low, high) for _ in range(runs)]
    diff = events - sum(lengths)
    while diff:
        index = rng.randrange(runs)
        if diff > 0:
            lengths[index] += 1
            diff -= 1
        elif lengths[index] > 4:
            lengths[index] -= 1
            diff += 1
    return lengths


class _Run(RunHistory):
    """One run's history of exactly ``length`` events (at least 4), produced lazily in order."""

    def __init__(self, rng: random.Random, run_id: str, tenant: str, length: int) -> None:
        super().__init__(rng, run_id, tenant=tenant)
        self.length = length

    def events(self) -> Iterator[Event]:
        rng = self.rng
        yield RunStarted(
            **self._env(),
            agent="booker",
            revision="r7",
            input={"task": text(rng, 60, 240), "user": f"u{rng.randint(1, 9999)}"},
            options={"model": "m-large", "max_iterations": 20},
        )
        budget = self.length - 3  # started, the final answer and finished are fixed
        if budget % 2:
            yield RunClaimed(**self._env(), worker=f"worker-{rng.randint(1, 16)}")
            budget -= 1
        iteration = 0
        while budget >= 4:
            iteration += 1
            for step in self.turn(iteration, budget):
                budget -= len(step)
                yield from step
        if budget == 2:
            yield ApprovalRequested(**self._env(), request_id="a1", prompt=text(rng, 20, 80))
            yield ApprovalGranted(**self._env(), request_id="a1", by="ann")
        yield ModelAnswered(
            **self._env(),
            message=Message(role="assistant", content=text(rng, 40, 200)),
            usage=Usage(input_tokens=rng.randint(200, 4000), output_tokens=rng.randint(5, 300)),
        )
        yield RunFinished(**self._env(), status="completed", output=text(rng, 10, 60))


def interleaved(rng: random.Random, runs: int, events: int) -> Iterator[tuple[int, Event]]:
    """(partition, event) of every event, runs interleaved at random as concurrent runs write.

    Every run is live from the start; each next event comes from a run picked at random among
    those not finished, so each run's own events stay in seq order.
    """
    live: list[tuple[int, Iterator[Event]]] = []
    for length in _lengths(rng, runs, events):
        run_id = f"run-{rng.getrandbits(48):012x}"
        run = _Run(rng, run_id, f"tenant-{rng.randint(0, 9)}", length)
        live.append((partition_for(run_id, PARTITIONS), run.events()))
    while live:
        index = rng.randrange(len(live))
        partition, events_of_run = live[index]
        event = next(events_of_run, None)
        if event is None:
            live[index] = live[-1]
            live.pop()
            continue
        yield partition, event


async def produce(
    bootstrap: str, topic: str, runs: int, events: int, seed: int
) -> tuple[int, int, float]:
    """Produce the workload; return (events, encoded bytes, seconds).

    One record batch per partition is filled at a time and handed to that partition's sender
    task, which submits its batches in order, so each run's events keep their order.
    """
    producer = raw_producer(bootstrap, linger_ms=50)
    await producer.start()
    queues: list[asyncio.Queue[Any]] = [asyncio.Queue(maxsize=4) for _ in range(PARTITIONS)]
    deliveries: list[asyncio.Future[Any]] = []

    async def sender(partition: int) -> None:
        while (batch := await queues[partition].get()) is not None:
            deliveries.append(await producer.send_batch(batch, topic, partition=partition))

    count = size = 0
    started = time.perf_counter()
    try:
        senders = [asyncio.create_task(sender(p)) for p in range(PARTITIONS)]
        builders = [producer.create_batch() for _ in range(PARTITIONS)]
        for partition, event in interleaved(random.Random(seed), runs, events):
            value = codec.encode(event)
            key = event.run_id.encode()
            headers = codec.headers(event)
            builder = builders[partition]
            if builder.append(timestamp=None, key=key, value=value, headers=headers) is None:
                await queues[partition].put(builder)
                await asyncio.sleep(0)
                builder = builders[partition] = producer.create_batch()
                builder.append(timestamp=None, key=key, value=value, headers=headers)
            count += 1
            size += len(value)
        for partition, builder in enumerate(builders):
            if builder.record_count():
                await queues[partition].put(builder)
            await queues[partition].put(None)
        await asyncio.gather(*senders)
        await asyncio.gather(*deliveries)
        seconds = time.perf_counter() - started
    finally:
        await producer.stop()
    return count, size, seconds


# --------------------------------------------------------------------------------------------
# Raw consume


def _key(record: Any) -> str | None:
    return bytes(record.key).decode(errors="replace") if record.key is not None else None


async def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition's end offset."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        ends = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
    return {tp.partition: int(offset) for tp, offset in ends.items()}


async def raw_consume(
    bootstrap: str, topic: str, ends: Mapping[int, int], batch: int, *, decode: bool
) -> tuple[int, float]:
    """Read every record once, counting (and decoding, if asked); return (records, seconds)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        max_partition_fetch_bytes=4 * 1024 * 1024,  # as KafkaProjector
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        started = time.perf_counter()
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        remaining = {tp for tp in tps if ends[tp.partition] > 0}
        count = 0
        while remaining:
            fetched = await consumer.getmany(timeout_ms=500, max_records=batch)
            for tp, records in fetched.items():
                if not records:
                    continue
                if decode:
                    for record in records:
                        codec.decode(record.value, run_hint=_key(record))
                count += len(records)
                if records[-1].offset + 1 >= ends[tp.partition]:
                    remaining.discard(tp)
        seconds = time.perf_counter() - started
    finally:
        await consumer.stop()
    return count, seconds


# --------------------------------------------------------------------------------------------
# The projector, in a child process


class _TimedStore(PostgresFrontierStore):
    """The PostgreSQL store, adding up the wall time of its loads and writes."""

    load_s = 0.0
    write_s = 0.0
    runs_asked = 0
    """Runs a load asked for (each a miss of the projection's cache)."""
    rows_loaded = 0
    """Rows a load found: runs folded, stored, dropped from the cache and folded again."""
    writes = 0

    async def load(self, run_ids: Collection[str]) -> dict[str, StoredFrontier]:
        started = time.perf_counter()
        try:
            loaded = await super().load(run_ids)
        finally:
            self.load_s += time.perf_counter() - started
        self.runs_asked += len(run_ids)
        self.rows_loaded += len(loaded)
        return loaded

    async def write(self, *args: Any, **options: Any) -> None:  # passed on as they are
        started = time.perf_counter()
        try:
            await super().write(*args, **options)
        finally:
            self.write_s += time.perf_counter() - started
        self.writes += 1


class _TimedProjection(FrontierProjection):
    """The projection, adding up the wall time of `apply` (load + fold + encode, and waiting
    for the store before to land), and of that waiting alone."""

    apply_s = 0.0
    wait_in_apply_s = 0.0
    _applying = False

    async def apply(
        self, records: Mapping[int, Sequence[LogRecord]], next_offsets: Mapping[int, int]
    ) -> None:
        started = time.perf_counter()
        self._applying = True
        try:
            await super().apply(records, next_offsets)
        finally:
            self._applying = False
            self.apply_s += time.perf_counter() - started

    async def _written(self) -> None:
        started = time.perf_counter()
        try:
            await super()._written()
        finally:
            if self._applying:
                self.wait_in_apply_s += time.perf_counter() - started


def _cpu_s() -> float:
    """CPU seconds (user + system) this process has used: unlike wall time, barely moved by
    other processes sharing the machine."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _maxrss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _peak_rss_kib() -> int:
    """This process's peak RSS in KiB: ``VmHWM``, falling back to ``ru_maxrss``.

    ``VmHWM`` starts afresh at exec. On Linux ``ru_maxrss`` does not: it keeps the high-water
    mark of the memory the process had before exec, the forking parent's copy, so a child of a
    big parent would report at least the parent's RSS.
    """
    with contextlib.suppress(OSError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return _maxrss_kib()


async def child_project(args: argparse.Namespace) -> dict[str, Any]:
    """Fold the whole topic with `KafkaProjector` into the given schema; return the figures."""
    ends: dict[int, int] = {int(p): int(o) for p, o in json.loads(args.ends).items()}
    quiet_garbage_collector()  # as `onward projector` does in its process
    fixed_mmap_threshold()  # so does this
    baseline_kib = _peak_rss_kib()
    log = KafkaEventLog(args.bootstrap, topic=args.topic, partitions=PARTITIONS, create_topic=False)
    store = _TimedStore(args.database_url, schema=args.schema, synchronous_commit=False)
    await store.start()
    projection = _TimedProjection(
        store,
        log,
        flush_events=args.flush_events,
        flush_interval=args.flush_interval,
        cache_bytes=args.cache_mib * 1024 * 1024,
        write_behind=True,  # as `onward projector`
    )
    projector = KafkaProjector(
        args.bootstrap,
        projection,
        topic=args.topic,
        partitions=PARTITIONS,
        group_id=args.group or f"onward-bench-{uuid.uuid4().hex[:8]}",
        batch_records=args.batch,
        focus_slice_s=args.focus_slice_s or None,
    )
    profiler = cProfile.Profile() if args.profile else None
    step_s = check_s = 0.0
    first_batch_s: float | None = None
    try:
        started_at = time.time()
        started = time.perf_counter()
        cpu_started = _cpu_s()
        if profiler is not None:
            profiler.enable()
        await projector.start()
        stop = asyncio.Event()

        async def watch() -> None:
            # The projector's own loop (`run`) overlaps fetching with storing, as in production;
            # this watcher only notices when every partition is folded through its end.
            nonlocal first_batch_s, check_s
            while not stop.is_set():
                await asyncio.sleep(0.1)
                mark = time.perf_counter()
                if first_batch_s is None and projection.stats.batches:
                    first_batch_s = mark - started
                positions = await projector.projection.positions()
                check_s += time.perf_counter() - mark
                if all(positions.get(p, 0) >= end for p, end in ends.items()):
                    stop.set()

        watcher = asyncio.create_task(watch())
        mark = time.perf_counter()
        await projector.run(stop)
        await watcher
        step_s = time.perf_counter() - mark
        seconds = time.perf_counter() - started
        cpu_s = _cpu_s() - cpu_started
        finished_at = time.time()
        if profiler is not None:
            profiler.disable()
    finally:
        await projector.close()
        await store.close()
    result: dict[str, Any] = {
        "started_at": started_at,
        "finished_at": finished_at,
        "seconds": seconds,
        "cpu_s": cpu_s,
        "first_batch_s": first_batch_s or 0.0,
        "step_s": step_s,
        "apply_s": projection.apply_s,
        "wait_in_apply_s": projection.wait_in_apply_s,
        "load_s": store.load_s,
        "runs_asked": store.runs_asked,
        "rows_loaded": store.rows_loaded,
        "stores": store.writes,
        "write_s": store.write_s,
        "positions_check_s": check_s,
        "events": projection.stats.events,
        "batches": projection.stats.batches,
        "rows_written": projection.stats.rows_written,
        "refused_events": projection.stats.refused_events,
        "snapshots_refused": projection.stats.snapshots_refused,
        "baseline_peak_rss_kib": baseline_kib,
        "peak_rss_kib": _peak_rss_kib(),
        "ru_maxrss_kib": _maxrss_kib(),
    }
    if profiler is not None:
        result["profile"] = _profile_text(profiler, args.profile_top, args.profile_out)
    return result


def _profile_text(profiler: cProfile.Profile, top: int, dump: str | None) -> str:
    """The top functions by cumulative and by own time; the whole profile dumped to ``dump``."""
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    if dump:
        Path(dump).parent.mkdir(parents=True, exist_ok=True)
        stats.dump_stats(dump)
    return out.getvalue()


@dataclass
class ChildResult:
    figures: dict[str, Any]
    children_maxrss_kib: int


async def run_child(
    args: argparse.Namespace,
    topic: str,
    schema: str,
    ends: Mapping[int, int],
    *,
    profile: bool,
    group: str | None = None,
) -> ChildResult:
    """Run the projector in a child process (this script, ``--child-project``)."""
    argv = [
        sys.executable,
        SCRIPT,
        "--child-project",
        "--bootstrap",
        args.bootstrap,
        "--topic",
        topic,
        "--schema",
        schema,
        "--batch",
        str(args.batch),
        "--flush-events",
        str(args.flush_events),
        "--flush-interval",
        str(args.flush_interval),
        "--cache-mib",
        str(args.cache_mib),
        "--focus-slice-s",
        str(args.focus_slice_s),
        "--ends",
        json.dumps(ends),
        "--profile-top",
        str(args.profile_top),
    ]
    if profile:
        argv += ["--profile", "--profile-out", str(args.json.with_suffix(".prof"))]
    if group is not None:
        argv += ["--group", group]
    env = os.environ | {"DATABASE_URL": args.database_url}
    process = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, env=env)
    try:
        stdout, _ = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    if process.returncode != 0:
        raise RuntimeError(f"the projector child exited with {process.returncode}")
    lines = [ln for ln in stdout.decode().splitlines() if ln.startswith(RESULT_MARK)]
    if not lines:
        raise RuntimeError("the projector child printed no result")
    figures = json.loads(lines[-1][len(RESULT_MARK) :])
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return ChildResult(figures, children)


# --------------------------------------------------------------------------------------------
# PostgreSQL schemas and the frontier table check


async def frontier_counts(database_url: str, schema: str) -> tuple[int, int]:
    """(rows, completed rows) in the active build's frontiers."""
    conn = await asyncpg.connect(database_url, server_settings={"search_path": schema})
    try:
        row = await conn.fetchrow(
            "SELECT count(*) AS n, count(*) FILTER (WHERE status = 'completed') AS done "
            "FROM onward_frontiers"
        )
    finally:
        await conn.close()
    return int(row["n"]), int(row["done"])


# --------------------------------------------------------------------------------------------
# Main


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_server_options(parser, "bootstrap", "database_url")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=5_000, help="projector batch_records")
    parser.add_argument(
        "--flush-events",
        type=int,
        default=PROJECTOR_FLUSH_EVENTS,
        help="projector: store after folding this many events (as `onward projector`)",
    )
    parser.add_argument(
        "--flush-interval",
        type=float,
        default=PROJECTOR_FLUSH_INTERVAL,
        help="projector: store at least this often, in seconds (as `onward projector`)",
    )
    parser.add_argument(
        "--cache-mib",
        type=int,
        default=DEFAULT_CACHE_BYTES // (1024 * 1024),
        help="projector: the frontiers' memory budget in MiB (as `onward projector --cache-mib`)",
    )
    parser.add_argument(
        "--focus-slice-s",
        type=float,
        default=FOCUS_SLICE_S,
        help="projector: behind in several partitions, fold each in turn for up to this many "
        "seconds (as `KafkaProjector(focus_slice_s=...)`); 0 folds all as they arrive",
    )
    parser.add_argument(
        "--rebuild-batch", type=int, default=5_000, help="rebuild records per partition per step"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--skip-raw", action="store_true", help="skip the raw consume figures")
    parser.add_argument("--skip-rebuild", action="store_true", help="skip the rebuild figure")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also run a cProfiled projector (separately, so the timed run is not slowed) "
        "and a cProfiled rebuild; their stats are printed and dumped next to --json as .prof",
    )
    parser.add_argument("--profile-top", type=int, default=15)
    parser.add_argument("--profile-out", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=Path("bench/results/project.json"))
    parser.add_argument(
        "--group-projectors",
        type=int,
        default=2,
        help="also fold with this many projector processes in one consumer group, as a "
        "deployment runs one per core (0: skip)",
    )
    parser.add_argument("--child-project", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--group", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--schema", help=argparse.SUPPRESS)
    parser.add_argument("--ends", help=argparse.SUPPRESS)
    return parser


def _rate(events: int, seconds: float) -> float:
    return events / seconds if seconds else 0.0


def _mib(kib: int) -> float:
    return kib / 1024


async def bench(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    topic = throwaway_name("proj")
    schemas: list[str] = []
    warnings: list[str] = []
    results: dict[str, Any] = {"topic": topic, "warnings": warnings}

    def warn(message: str) -> None:
        warnings.append(message)
        console.print(f"[red]{message}")

    try:
        await create_topic(args.bootstrap, topic, PARTITIONS)
        console.print(f"producing {args.events:,} events over {args.runs:,} runs into {topic} ...")
        count, size, seconds = await produce(
            args.bootstrap, topic, args.runs, args.events, args.seed
        )
        ends = await end_offsets(args.bootstrap, topic)
        if sum(ends.values()) != count:
            warn(f"end offsets add up to {sum(ends.values())}, produced {count}")
        results |= {
            "events": count,
            "encoded_bytes": size,
            "mean_event_bytes": size / count,
            "produce_s": seconds,
            "produce_events_per_s": _rate(count, seconds),
            "end_offsets": ends,
        }
        console.print(
            f"produced {count:,} events ({size / count:.0f} B mean) in {seconds:.1f}s "
            f"({_rate(count, seconds):,.0f} events/s)"
        )

        if not args.skip_raw:
            for decode, name in ((False, "raw_consume"), (True, "raw_consume_decode")):
                before = cpu_seconds(SERVERS)
                read, seconds = await raw_consume(
                    args.bootstrap, topic, ends, args.batch, decode=decode
                )
                used = cpu_used(before, cpu_seconds(SERVERS))
                results[f"{name}_machine_cpu"] = machine_cpu(used, [used["process"]], seconds)
                results[f"{name}_events"] = read
                results[f"{name}_s"] = seconds
                results[f"{name}_events_per_s"] = _rate(read, seconds)
                console.print(f"{name}: {read:,} in {seconds:.1f}s")

        schema = await create_schema(args.database_url, "project")
        schemas.append(schema)
        console.print("projector fold (child process) ...")
        servers_before = cpu_seconds(SERVERS)
        child = await run_child(args, topic, schema, ends, profile=False)
        fig = child.figures
        results["fold_machine_cpu"] = machine_cpu(
            cpu_used(servers_before, cpu_seconds(SERVERS)), [fig["cpu_s"]], fig["seconds"]
        )
        rows, completed = await frontier_counts(args.database_url, schema)
        results |= {
            "fold_events": fig["events"],
            "fold_s": fig["seconds"],
            "fold_events_per_s": _rate(fig["events"], fig["seconds"]),
            "fold_after_first_batch_events_per_s": _rate(
                fig["events"], fig["seconds"] - fig["first_batch_s"]
            ),
            "fold_first_batch_s": fig["first_batch_s"],
            "fold_cpu_s": fig["cpu_s"],
            "fold_cpu_us_per_event": 1e6 * fig["cpu_s"] / max(1, fig["events"]),
            "fold_breakdown_s": {
                "step (getmany + decode + apply)": fig["step_s"],
                "apply (load + fold/encode + waiting for the store before)": fig["apply_s"],
                "store.load": fig["load_s"],
                "apply waiting for the store before to land": fig["wait_in_apply_s"],
                "fold + snapshot encode (apply - load - waiting)": fig["apply_s"]
                - fig["load_s"]
                - fig["wait_in_apply_s"],
                "store.write (in the background, overlapping the fold)": fig["write_s"],
                "getmany + decode (step - apply)": fig["step_s"] - fig["apply_s"],
                "positions checks (benchmark loop)": fig["positions_check_s"],
            },
            "fold_batches": fig["batches"],
            "fold_rows_written": fig["rows_written"],
            "fold_stores": fig["stores"],
            "fold_runs_loaded": fig["runs_asked"],
            "fold_rows_loaded": fig["rows_loaded"],
            "fold_refused_events": fig["refused_events"],
            "fold_snapshots_refused": fig["snapshots_refused"],
            "frontier_rows": rows,
            "frontier_rows_completed": completed,
            "projector_peak_rss_mib": _mib(fig["peak_rss_kib"]),
            "projector_baseline_rss_mib": _mib(fig["baseline_peak_rss_kib"]),
            # Both include the parent's RSS at fork (see _peak_rss_kib); kept for reference.
            "projector_ru_maxrss_mib": _mib(fig["ru_maxrss_kib"]),
            "children_ru_maxrss_mib": _mib(child.children_maxrss_kib),
            "memory_runs": args.runs,
        }
        console.print(f"fold: {fig['events']:,} in {fig['seconds']:.1f}s")
        if rows != args.runs or completed != args.runs:
            warn(f"projector: {rows:,} frontier rows, {completed:,} completed, {args.runs:,} runs")

        if args.group_projectors > 0:
            results |= await fold_in_a_group(args, topic, ends, schemas, console, warn)

        if "raw_consume_events_per_s" in results:
            for fold in ("fold", "group_fold"):
                if f"{fold}_events_per_s" not in results:
                    continue
                for key in ("raw_consume", "raw_consume_decode"):
                    results[f"ratio_{fold}_to_{key}"] = (
                        results[f"{fold}_events_per_s"] / results[f"{key}_events_per_s"]
                    )

        if not args.skip_rebuild:
            console.print("rebuild ...")
            async with KafkaEventLog(
                args.bootstrap, topic=topic, partitions=PARTITIONS, create_topic=False
            ) as source:
                report = await rebuild_frontiers(
                    source, args.database_url, schema=schema, batch_size=args.rebuild_batch
                )
            rows, completed = await frontier_counts(args.database_url, schema)
            results |= {
                "rebuild_events": report.events,
                "rebuild_s": report.seconds,
                "rebuild_events_per_s": report.events_per_second,
                "rebuild_frontier_rows": rows,
            }
            console.print(f"rebuild: {report.events:,} in {report.seconds:.1f}s")
            if rows != args.runs or completed != args.runs:
                warn(f"rebuild: {rows:,} frontier rows, {completed:,} completed")

        if args.profile:
            schema = await create_schema(args.database_url, "project")
            schemas.append(schema)
            console.print("profiled projector fold (child process) ...")
            profiled = await run_child(args, topic, schema, ends, profile=True)
            results["profiled_fold_events_per_s"] = _rate(
                profiled.figures["events"], profiled.figures["seconds"]
            )
            results["profile"] = profiled.figures["profile"]
            if not args.skip_rebuild:
                console.print("profiled rebuild ...")
                profiler = cProfile.Profile()
                async with KafkaEventLog(
                    args.bootstrap, topic=topic, partitions=PARTITIONS, create_topic=False
                ) as source:
                    profiler.enable()
                    report = await rebuild_frontiers(
                        source, args.database_url, schema=schema, batch_size=args.rebuild_batch
                    )
                    profiler.disable()
                results["profiled_rebuild_events_per_s"] = report.events_per_second
                dump = args.json.with_name(f"{args.json.stem}-rebuild.prof")
                results["rebuild_profile"] = _profile_text(profiler, args.profile_top, str(dump))
    finally:
        await delete_topics(args.bootstrap, [topic], console)
        await drop_schemas(args.database_url, schemas, console)
    return results


async def fold_in_a_group(
    args: argparse.Namespace,
    topic: str,
    ends: Mapping[int, int],
    schemas: list[str],
    console: Console,
    warn: Callable[[str], None],
) -> dict[str, Any]:
    """Fold the topic with ``--group-projectors`` processes sharing one consumer group.

    The rate is every record of the topic over the time from the first member's ``start()``
    to the last member seeing every partition stored through its end, so joining the group
    and the rebalances as members join are inside it.
    """
    count = args.group_projectors
    schema = await create_schema(args.database_url, "project")
    schemas.append(schema)
    group = f"onward-bench-{uuid.uuid4().hex[:8]}"
    console.print(f"projector fold ({count} child processes, one group) ...")
    servers_before = cpu_seconds(SERVERS)
    members = await asyncio.gather(
        *(run_child(args, topic, schema, ends, profile=False, group=group) for _ in range(count))
    )
    servers = cpu_used(servers_before, cpu_seconds(SERVERS))
    figures = [m.figures for m in members]
    seconds = max(f["finished_at"] for f in figures) - min(f["started_at"] for f in figures)
    events = sum(ends.values())
    rows, completed = await frontier_counts(args.database_url, schema)
    if rows != args.runs or completed != args.runs:
        warn(f"group: {rows:,} frontier rows, {completed:,} completed, {args.runs:,} runs")
    console.print(f"group fold: {events:,} in {seconds:.1f}s")
    return {
        "group_projectors": count,
        "group_fold_events": events,
        "group_fold_s": seconds,
        "group_fold_events_per_s": _rate(events, seconds),
        "group_fold_events_folded_per_member": [f["events"] for f in figures],
        "group_projector_peak_rss_mib": [_mib(f["peak_rss_kib"]) for f in figures],
        "group_member_seconds": [f["seconds"] for f in figures],
        "group_member_first_batch_s": [f["first_batch_s"] for f in figures],
        "group_member_apply_s": [f["apply_s"] for f in figures],
        "group_member_wait_for_store_s": [f["wait_in_apply_s"] for f in figures],
        "group_member_write_s": [f["write_s"] for f in figures],
        "group_member_cpu_s": [f["cpu_s"] for f in figures],
        "group_fold_machine_cpu": machine_cpu(servers, [f["cpu_s"] for f in figures], seconds),
    }


SERVERS = ("postgres", "kafka")
"""The servers a fold uses, whose CPU is counted beside the projectors'."""


def machine_cpu(
    servers: Mapping[str, float], readers: Sequence[float], seconds: float
) -> dict[str, float]:
    """CPU seconds a read of the topic used: its reading processes' (the raw consumer, the
    projectors) and its servers' (from `cpu_used` around it), and how busy that kept the
    machine's cores over its ``seconds``: near 100% a fold is bound by the machine's cores,
    and a faster one needs fewer CPU seconds an event, not more processes."""
    spent = {
        "readers_s": sum(readers),
        "postgres_s": servers["postgres"],
        "kafka_s": servers["kafka"],
    }
    total = sum(spent.values())
    cores = os.cpu_count() or 1
    return spent | {
        "total_s": total,
        "cores": cores,
        "busy_share": total / (seconds * cores) if seconds else 0.0,
    }


def _table(args: argparse.Namespace, results: dict[str, Any]) -> Table:
    table = Table(
        title=f"project: {results['events']:,} events (~{results['mean_event_bytes']:.0f} B) "
        f"over {args.runs:,} runs, {PARTITIONS} partitions, batch {args.batch:,}, "
        f"cache {args.cache_mib} MiB, "
        + (f"turns of {args.focus_slice_s:g} s" if args.focus_slice_s else "no turns")
    )
    table.add_column("measure")
    table.add_column("events/s", justify="right")
    table.add_column("seconds", justify="right")
    table.add_column("note")

    def row(name: str, key: str, note: str = "") -> None:
        if f"{key}_events_per_s" in results:
            table.add_row(
                name, f"{results[f'{key}_events_per_s']:,.0f}", f"{results[f'{key}_s']:.1f}", note
            )

    row("pre-produce (raw producer)", "produce", "generate + encode + send, acks=all")
    row("raw consume (count only)", "raw_consume")
    row("raw consume + decode", "raw_consume_decode", "codec.decode of every value")
    row(
        "projector fold -> PostgreSQL",
        "fold",
        f"from start(); first batch after {results['fold_first_batch_s']:.1f}s",
    )
    if "group_projectors" in results:
        row(
            f"projector fold, {results['group_projectors']} processes in one group",
            "group_fold",
            "from the first start() to the last partition stored",
        )
    row("rebuild (rebuild_frontiers)", "rebuild", "LogProjector over KafkaEventLog")
    for name, key in (
        ("fold / raw consume", "ratio_fold_to_raw_consume"),
        ("fold / raw consume + decode", "ratio_fold_to_raw_consume_decode"),
        ("group fold / raw consume", "ratio_group_fold_to_raw_consume"),
        ("group fold / raw consume + decode", "ratio_group_fold_to_raw_consume_decode"),
    ):
        if key in results:
            table.add_row(name, f"{results[key]:.3f}", "", "ratio")
    table.add_row(
        "projector peak RSS",
        f"{results['projector_peak_rss_mib']:,.0f} MiB",
        "",
        f"child process VmHWM, {args.runs:,} runs; "
        f"{results['projector_baseline_rss_mib']:,.0f} MiB after imports",
    )
    batches = results["fold_batches"]
    table.add_row(
        "projector batches / rows written",
        f"{batches:,} / {results['fold_rows_written']:,}",
        "",
        f"{results['fold_events'] / max(1, batches):,.0f} events, "
        f"{results['fold_rows_written'] / max(1, batches):,.0f} rows per batch",
    )
    stores = results["fold_stores"]
    table.add_row(
        "projector stores / rows written",
        f"{stores:,} / {results['fold_rows_written']:,}",
        "",
        f"{results['fold_rows_written'] / max(1, results['fold_events']):.2f} rows per event",
    )
    table.add_row(
        "runs loaded / found stored",
        f"{results['fold_runs_loaded']:,} / {results['fold_rows_loaded']:,}",
        "",
        f"{args.runs:,} runs: those found were folded, dropped from the cache and loaded again",
    )
    return table


def _breakdown(results: dict[str, Any]) -> Table:
    table = Table(title="where the projector's wall time went (child, timed run)")
    table.add_column("part")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    total = results["fold_s"]
    table.add_row("total, from start()", f"{total:.2f}", "100%")
    table.add_row(
        "CPU of the projector process (user + system)",
        f"{results['fold_cpu_s']:.2f}",
        f"{results['fold_cpu_us_per_event']:.1f} us/event",
    )
    table.add_row(
        "before the first batch (start, join)", f"{results['fold_first_batch_s']:.2f}", ""
    )
    for name, seconds in results["fold_breakdown_s"].items():
        table.add_row(name, f"{seconds:.2f}", f"{100 * seconds / total:.0f}%")
    return table


def _machine(results: dict[str, Any]) -> Table:
    table = Table(title="CPU each read of the topic took, machine-wide (us per event)")
    table.add_column("read")
    for column in ("reader process(es)", "PostgreSQL", "Kafka", "all", "cores busy"):
        table.add_column(column, justify="right")
    for name, key, events in (
        ("raw consume (count only)", "raw_consume_machine_cpu", results.get("raw_consume_events")),
        (
            "raw consume + decode",
            "raw_consume_decode_machine_cpu",
            results.get("raw_consume_decode_events"),
        ),
        ("one projector process", "fold_machine_cpu", results["fold_events"]),
        ("projectors in a group", "group_fold_machine_cpu", results.get("group_fold_events")),
    ):
        used = results.get(key)
        if used is None:
            continue
        per = 1e6 / max(1, events or 0)
        table.add_row(
            name,
            *(f"{used[part] * per:.1f}" for part in ("readers_s", "postgres_s", "kafka_s")),
            f"{used['total_s'] * per:.1f}",
            f"{100 * used['busy_share']:.0f}% of {used['cores']}",
        )
    return table


def main() -> None:
    args = _parser().parse_args()
    server_urls(args, "bootstrap", "database_url")
    if args.child_project:
        print(RESULT_MARK + json.dumps(asyncio.run(child_project(args))), flush=True)
        return
    if args.events < 4 * args.runs:
        raise SystemExit("--events must be at least 4 per run")
    console = Console()
    code = code_version()
    console.print(f"code at {code}")
    results = run_ending_on_sigterm(bench(args, console))
    console.print(_table(args, results))
    console.print(_breakdown(results))
    console.print(_machine(results))
    console.print("Absolute figures depend on the machine; compare the ratios.")
    if "profile" in results:
        console.print(
            f"cProfile of a separate projector run "
            f"({results['profiled_fold_events_per_s']:,.0f} events/s under the profiler):"
        )
        print(results["profile"])
    if "rebuild_profile" in results:
        console.print(
            f"cProfile of a separate rebuild "
            f"({results['profiled_rebuild_events_per_s']:,.0f} events/s under the profiler):"
        )
        print(results["rebuild_profile"])
    parameters = {
        k: v
        for k, v in vars(args).items()
        if k
        not in {"child_project", "topic", "schema", "ends", "database_url", "profile_out", "group"}
    }
    write_results(
        args.json,
        {
            "benchmark": "project",
            "code": code,
            "parameters": parameters | {"json": str(args.json), "partitions": PARTITIONS},
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
