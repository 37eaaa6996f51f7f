"""Soak: a million events of long runs with compaction on a schedule.

Long runs (``--live-runs`` at a time, each ``--run-length`` events, one model turn per append,
a new run taking the place of each that finishes) are written into a fresh log. Every
``--compact-every`` events the projector catches up and a `CheckpointCompactor` pass runs
(``--max-checkpoints`` resume points kept per live run, a directory archive), and then:

* log size: the records between each partition's start and end, and bytes. Kafka: the bytes of
  the topic's segment files (``*.log``; index files are preallocated) in the broker's log
  directory (found with DescribeConfigs), on disk now and kept (the broker deletes a segment
  lying wholly below the partition's start at its retention check, every five minutes by
  default, so the bytes on disk drop in steps). SQLite: the bytes of the pages of the log's
  table and index (``dbstat``);
* resume p50: ``--probes`` runs of ``--probe-turns`` settled turns are written by an
  `AgentRunner`, and ``AgentRunner.resume`` of each is timed ``--samples`` times (after
  ``--warmup`` untimed ones), from the call to the model's first call (lease, frontier row,
  transcript, tail, claim, plan, conversation); the probes are then carried to completion, so
  they are compacted like every finished run;
* archive completeness: the records in the archive, against the records cut.

Targets (issue: the history lifecycle): the log's size plateaus instead of growing with the
events written; resume p50 at the end within 1.2x of the start; archive records = records cut.

    python bench/soak.py --events 100000          # quick
    python bench/soak.py                            # 1,000,000 events on Kafka
    python bench/soak.py --backend sqlite --events 200000

The topic, the schema, the Redis keys, the SQLite file and the archive are deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common
from _workload import FirstCall, RunHistory, Stopwatch, search
from rich.console import Console
from rich.table import Table

from onward.eventlog import (
    Event,
    KafkaEventLog,
    RunFinished,
    RunStarted,
    SqliteEventLog,
)
from onward.eventlog.archive import DirectoryArchive
from onward.eventlog.base import EventLog
from onward.projections.base import FrontierStore
from onward.projections.compaction import (
    CompactionStore,
    PostgresCompactionStore,
    SqliteCompactionStore,
)
from onward.projections.log_projector import LogProjector
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.projector import FrontierProjection
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime import Agent, AgentRunner, RedisLeaseStore, SqliteLeaseStore
from onward.runtime.compaction import CheckpointCompactor
from onward.runtime.leases.base import LeaseStore
from onward.runtime.providers import ScriptedProvider, reply

TENANT = "soak"
SEGMENT_BYTES = 1_048_576
"""The soak topic's segment size: small, so cut segments can be deleted soon after a cut."""


AGENT = Agent(name="prober", instructions="Find it.", tools=[search])


@dataclass
class Deployment:
    """The stores one soak runs on, and how to measure its log on disk."""

    log: EventLog
    frontiers: FrontierStore
    store: CompactionStore
    leases: LeaseStore
    inline: bool
    disk_bytes: Callable[[EventLog], Awaitable[tuple[int, int]]]
    """The log's bytes: kept (Kafka: in segments not wholly below the partition's start, which
    the broker deletes at its next retention check) and on disk now."""


class LongRuns:
    """``live`` long runs at a time, each ``length`` events, appended one turn per batch."""

    def __init__(self, rng: random.Random, live: int, length: int, prefix: str) -> None:
        self.rng = rng
        self.length = length
        self.prefix = prefix
        self.started = 0
        self.finished = 0
        self.runs: list[tuple[RunHistory, int]] = [self._new() for _ in range(live)]

    def _new(self) -> tuple[RunHistory, int]:
        self.started += 1
        return RunHistory(self.rng, f"{self.prefix}-{self.started}", tenant=TENANT), 0

    def next_batch(self, slot: int) -> list[Event]:
        """The next append of the run in ``slot``: its start, a turn, or its end."""
        history, iteration = self.runs[slot]
        env = history._env
        if history.seq == 0:
            self.runs[slot] = (history, iteration)
            return [RunStarted(**env(), agent="soak", revision="r1", input="go")]
        if history.seq >= self.length:
            self.finished += 1
            self.runs[slot] = self._new()
            return [RunFinished(**env(), status="completed", output="ok")]
        self.runs[slot] = (history, iteration + 1)
        return [e for step in history.turn(iteration + 1, 12) for e in step]


async def write_events(log: EventLog, runs: LongRuns, count: int, concurrency: int) -> int:
    """Append about ``count`` events, ``concurrency`` appends in flight; return how many."""
    written = 0
    slots = list(range(len(runs.runs)))

    async def writer(mine: list[int]) -> None:
        nonlocal written
        while written < count:
            for slot in mine:
                batch = runs.next_batch(slot)
                await log.append(batch)
                written += len(batch)

    await asyncio.gather(*(writer(slots[i::concurrency]) for i in range(concurrency)))
    return written


async def time_resumes(
    deployment: Deployment, projector: LogProjector, args: argparse.Namespace, round_: int
) -> list[float]:
    """Write the probes, time ``AgentRunner.resume`` of each ``--samples`` times, finish them."""
    runner = AgentRunner(
        provider=Stopwatch(),
        log=deployment.log,
        frontiers=deployment.frontiers,
        leases=deployment.leases,
        checkpoint_inline=deployment.inline,
    )
    probes = [f"probe-{round_}-{n}" for n in range(args.probes)]
    for run_id in probes:
        runner.provider = Stopwatch(args.probe_turns)
        with contextlib.suppress(FirstCall):
            await runner.run(AGENT, {"find": run_id}, tenant=TENANT, run_id=run_id)
    await projector.catch_up()
    times: list[float] = []
    for sample in range(args.warmup + args.samples):
        for run_id in probes:
            watch = Stopwatch()
            runner.provider = watch
            mark = time.perf_counter()
            with contextlib.suppress(FirstCall):
                await runner.resume(AGENT, run_id, tenant=TENANT)
            if sample >= args.warmup:
                times.append((watch.called_at - mark) * 1000.0)
            await projector.catch_up()
    runner.provider = ScriptedProvider(lambda messages: reply("found it"))
    for run_id in probes:
        await runner.resume(AGENT, run_id, tenant=TENANT)
    await projector.catch_up()
    return times


async def soak(
    deployment: Deployment, archive: Path, args: argparse.Namespace, console: Console
) -> dict[str, Any]:
    log = deployment.log
    projector = LogProjector(log, FrontierProjection(deployment.frontiers, log))
    compactor = CheckpointCompactor(
        log,
        deployment.frontiers,
        deployment.store,
        archive=DirectoryArchive(archive),
        max_checkpoints=args.max_checkpoints,
    )
    runs = LongRuns(random.Random(args.seed), args.live_runs, args.run_length, "long")
    timeline: list[dict[str, Any]] = []
    written = cut = archived = 0
    started = time.perf_counter()
    for round_ in range(1, -(-args.events // args.compact_every) + 1):
        mark = time.perf_counter()
        written += await write_events(log, runs, args.compact_every, args.concurrency)
        write_s = time.perf_counter() - mark
        mark = time.perf_counter()
        await projector.catch_up()
        fold_s = time.perf_counter() - mark
        mark = time.perf_counter()
        report = await compactor.compact()
        compact_s = time.perf_counter() - mark
        cut += report.events_cut
        archived += report.archived
        resumes = await time_resumes(deployment, projector, args, round_)
        bounds = [await log.bounds(p) for p in range(log.partitions)]
        kept_bytes, disk_bytes = await deployment.disk_bytes(log)
        row = {
            "events_written": written,
            "log_records": sum(b.end - b.start for b in bounds),
            "log_bytes": kept_bytes,
            "log_bytes_on_disk": disk_bytes,
            "resume_p50_ms": _common.quantile(resumes, 0.5),
            "resume_p99_ms": _common.quantile(resumes, 0.99),
            "records_cut": cut,
            "records_archived": archived,
            "runs_finished": runs.finished,
            "write_s": write_s,
            "fold_s": fold_s,
            "compact_s": compact_s,
            "elapsed_s": time.perf_counter() - started,
        }
        timeline.append(row)
        console.print(
            f"{written:>9,} written: log {row['log_records']:>8,} records, "
            f"{row['log_bytes'] / 1e6:8.1f} MB; resume p50 {row['resume_p50_ms']:6.2f} ms; "
            f"cut {cut:,}, archived {archived:,}; write {write_s:.1f}s fold {fold_s:.1f}s "
            f"compact {compact_s:.1f}s"
        )
    ranges = await DirectoryArchive(archive).ranges()
    in_archive = sum(r.events for r in ranges)
    starts = sum([(await log.bounds(p)).start for p in range(log.partitions)])
    return {
        "timeline": timeline,
        "archive": {
            "records": in_archive,
            "records_cut": cut,
            "partition_starts": starts,
            "files": len(ranges),
            "bytes": sum(r.size for r in ranges),
            "complete": in_archive == cut == starts,
        },
    }


@asynccontextmanager
async def kafka_deployment(args: argparse.Namespace, console: Console) -> AsyncIterator[Deployment]:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # noqa: PLC0415
    from aiokafka.admin.config_resource import (  # noqa: PLC0415
        ConfigResource,
        ConfigResourceType,
    )

    topic = _common.throwaway_name("soak")
    prefix = f"onward-bench-soak-{topic.rsplit('.', 1)[1]}:"
    admin = AIOKafkaAdminClient(bootstrap_servers=args.bootstrap)
    await admin.start()
    schema: str | None = None
    try:
        configs = {
            "cleanup.policy": "delete",
            "retention.ms": "-1",
            "segment.bytes": str(SEGMENT_BYTES),
        }
        await admin.create_topics([NewTopic(topic, args.partitions, 1, topic_configs=configs)])
        # The broker on this machine: where it keeps the topic's partition folders.
        (found,) = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.BROKER, "1", {"log.dirs": None})]
        )
        entries = found.resources[0][4]
        log_dir = Path(next(e[1] for e in entries if e[0] == "log.dirs").split(",")[0])

        async def disk_bytes(log: EventLog) -> tuple[int, int]:
            starts = [(await log.bounds(p)).start for p in range(args.partitions)]

            def walk() -> tuple[int, int]:
                kept = total = 0
                for p, start in enumerate(starts):
                    segments = sorted(
                        (int(f.stem), f.stat().st_size)
                        for f in (log_dir / f"{topic}-{p}").glob("*.log")
                    )
                    for (_, size), after in zip(segments, [*segments[1:], None], strict=True):
                        total += size
                        # Kept at the broker's next retention check: the next segment starts
                        # above the partition's start, or this is the last one.
                        kept += size if after is None or after[0] > start else 0
                return kept, total

            return await asyncio.to_thread(walk)

        schema = await _common.create_schema(args.database_url, "soak")
        async with (
            KafkaEventLog(
                args.bootstrap, topic=topic, partitions=args.partitions, create_topic=False
            ) as log,
            PostgresFrontierStore(args.database_url, schema=schema) as frontiers,
            PostgresCompactionStore(args.database_url, schema=schema) as store,
            RedisLeaseStore(args.redis_url, prefix=prefix) as leases,
        ):
            yield Deployment(log, frontiers, store, leases, False, disk_bytes)
    finally:
        await admin.close()
        await _common.delete_topics(args.bootstrap, [topic], console)
        if schema is not None:
            await _common.drop_schemas(args.database_url, [schema], console)
        await _common.delete_redis_keys(args.redis_url, prefix, console)


@asynccontextmanager
async def sqlite_deployment(folder: Path, args: argparse.Namespace) -> AsyncIterator[Deployment]:
    path = folder / "onward.db"
    async with (
        SqliteEventLog(path, partitions=args.partitions) as log,
        SqliteFrontierStore(path) as frontiers,
        SqliteCompactionStore(path, sharing=log) as store,
        SqliteLeaseStore(path) as leases,
    ):

        async def disk_bytes(log: EventLog) -> tuple[int, int]:
            import sqlite3  # noqa: PLC0415

            def pages() -> tuple[int, int]:
                # The log's own table and index, not the frontier rows and transcript beside
                # them in the file (the garbage collector's to remove).
                conn = sqlite3.connect(path)
                try:
                    (used,) = conn.execute(
                        "SELECT coalesce(sum(pgsize), 0) FROM dbstat "
                        "WHERE name IN ('onward_log', 'onward_log_by_run')"
                    ).fetchone()
                finally:
                    conn.close()
                return int(used), int(used)

            return await asyncio.to_thread(pages)

        yield Deployment(log, frontiers, store, leases, True, disk_bytes)


def _table(result: dict[str, Any]) -> Table:
    table = Table(title="soak: log size and resume over time", title_justify="left")
    for column in ("events written", "log records", "log MB", "resume p50 ms", "cut", "archived"):
        table.add_column(column, justify="right")
    for row in result["timeline"]:
        table.add_row(
            f"{row['events_written']:,}",
            f"{row['log_records']:,}",
            f"{row['log_bytes'] / 1e6:.1f}",
            f"{row['resume_p50_ms']:.2f}",
            f"{row['records_cut']:,}",
            f"{row['records_archived']:,}",
        )
    return table


def targets(result: dict[str, Any]) -> dict[str, Any]:
    """The issue's three checks on a soak's timeline."""
    rows = result["timeline"]
    half = rows[len(rows) // 2 :]
    records = [r["log_records"] for r in half]
    first, last = rows[0]["resume_p50_ms"], rows[-1]["resume_p50_ms"]
    return {
        "log_plateaus": {
            "second_half_records_min": min(records),
            "second_half_records_max": max(records),
            "events_written": rows[-1]["events_written"],
            "met": max(records) <= 1.5 * min(records)
            and max(records) < rows[-1]["events_written"] / 4,
        },
        "resume_p50_end_over_start": {"ratio": last / first, "met": last / first <= 1.2},
        "archive_complete": {"met": bool(result["archive"]["complete"])},
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", choices=["kafka", "sqlite"], default="kafka")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--compact-every", type=int, default=50_000)
    parser.add_argument("--max-checkpoints", type=int, default=50)
    parser.add_argument("--live-runs", type=int, default=200)
    parser.add_argument("--run-length", type=int, default=2_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--probes", type=int, default=3)
    parser.add_argument("--probe-turns", type=int, default=20)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, default=Path("bench/results/soak.json"))
    _common.add_server_options(parser, "bootstrap", "database_url", "redis_url")
    return parser


async def bench(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="onward-bench-soak-"))
    try:
        if args.backend == "kafka":
            async with kafka_deployment(args, console) as deployment:
                return await soak(deployment, folder / "archive", args, console)
        async with sqlite_deployment(folder, args) as deployment:
            return await soak(deployment, folder / "archive", args, console)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    args = _parser().parse_args()
    if args.backend == "kafka":
        _common.server_urls(args, "bootstrap", "database_url", "redis_url")
    console = Console()
    code = _common.code_version()
    load_before = os.getloadavg()
    console.print(f"code at {code}; load average {load_before[0]:.2f} on {os.cpu_count()} CPUs")
    result = asyncio.run(bench(args, console))
    console.print(_table(result))
    checks = targets(result)
    for check, outcome in checks.items():
        verdict = "[green]met" if outcome["met"] else "[red]not met"
        console.print(f"target {check}: {outcome} {verdict}")
    parameters = {
        k: v for k, v in vars(args).items() if k not in {"database_url", "redis_url", "bootstrap"}
    }
    _common.write_results(
        args.json,
        {
            "benchmark": "soak",
            "code": code,
            "machine": {"cpus": os.cpu_count(), "load_average_before": load_before},
            "parameters": parameters | {"json": str(args.json)},
            "targets": checks,
            "results": result,
        },
    )


if __name__ == "__main__":
    main()
