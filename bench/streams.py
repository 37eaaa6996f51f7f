"""A fleet application's streams: what many streams waiting on slow model calls cost the log.

One deployment (``--backend``: Kafka with a projector and Redis leases, or PostgreSQL alone)
with one `onward worker` process, and this process as the application in fleet mode: it starts
``--runs`` runs through `App.query` at once and follows every stream to its result. Each run
makes one model call that takes ``--model-s`` (a real model's seconds), so the streams spend
nearly all their time waiting on nothing. Measured twice on the same deployment:

* watcher: as shipped, one `LogWatcher` looks at the ends of the watched partitions once per
  ``poll_s`` and wakes the streams of partitions that moved;
* each stream polls: every stream reads its run itself, backing off to ten times ``poll_s``
  while quiet (how fleet streams worked before the watcher).

Reported for each: the application's calls to the log (reads of a run, reads of partition
ends) per second, the application process's CPU seconds, transactions PostgreSQL committed
meanwhile (every process's), and how long after a run's `RunFinished` was written its stream
handed out the result (p50, p99, max), the figure a user waiting on an answer feels.

    python bench/streams.py                                # Kafka, 500 runs, 10 s model calls
    python bench/streams.py --backend postgres --runs 1000
    python bench/streams.py --spread-s 10       # runs started over 10 s: partitions never rest
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
from _common import (
    add_server_options,
    code_version,
    quantile,
    run_ending_on_sigterm,
    server_urls,
    write_results,
)
from fleet import REQUEST_KEY, Fleet

import onward
from onward.eventlog import RunFinished
from onward.runtime.application.app import App
from onward.runtime.application.stream import RunStream
from onward.runtime.settings import Settings

RESULTS = Path(__file__).resolve().parent / "results"


async def _each_stream_polls(
    self: App,
    stream: RunStream,
    seconds: float,
    *,
    most_s: float | None = None,
    heed_after_s: float = 0.0,
) -> None:
    """`App.nap` as a fleet application's was before the watcher: a plain sleep."""
    await asyncio.sleep(seconds)


def _app_settings(fleet: Fleet) -> Settings:
    env = fleet.env
    names = [
        "ONWARD_BACKEND",
        "KAFKA_BOOTSTRAP_SERVERS",
        "REDIS_URL",
        "ONWARD_REDIS_PREFIX",
        "ONWARD_KAFKA_TOPIC",
        "DATABASE_URL",
        "ONWARD_DATABASE_SCHEMA",
        "ONWARD_PARTITIONS",
    ]
    values = {name: env[name] for name in names if name in env}
    values |= {
        "ONWARD_REQUEST_KEY": REQUEST_KEY,
        "ONWARD_APP_MODE": "fleet",
        "ONWARD_REQUESTS_TOPIC": fleet.requests,
    }
    return Settings.model_validate(values)


def _counted(calls: dict[str, int], name: str, call: Callable[..., Awaitable[Any]]) -> Any:
    async def counting(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return await call(*args, **kwargs)

    return counting


async def _commits(database_url: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        value = await conn.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        return int(value)
    finally:
        await conn.close()


async def measure(args: argparse.Namespace, fleet: Fleet, mode: str) -> dict[str, Any]:
    """Start ``--runs`` runs through a fleet app and follow each to its result."""
    calls = {"read_run": 0, "ends": 0}
    original_nap = App.nap
    if mode == "each stream polls":
        App.nap = _each_stream_polls  # type: ignore[method-assign]
    try:
        async with onward.open(_app_settings(fleet), tenant="bench") as app:
            log = app.backends.log
            log.read_run = _counted(calls, "read_run", log.read_run)  # type: ignore[method-assign]
            log.ends = _counted(calls, "ends", log.ends)  # type: ignore[attr-defined]
            prefix = f"streams-{uuid.uuid4().hex[:8]}"
            streams = [
                app.query("go", {"agent": "booker", "run_id": f"{prefix}-{n}"}, timeout=600)
                for n in range(args.runs)
            ]

            async def result_at(stream: RunStream, delay_s: float) -> float:
                await asyncio.sleep(delay_s)
                async for message in stream:
                    if message.type == "result":
                        return time.time()
                raise SystemExit(f"run {stream.run_id} ended without a result")

            commits = await _commits(args.database_url)
            cpu = resource.getrusage(resource.RUSAGE_SELF)
            started = time.monotonic()
            arrived = await asyncio.gather(
                *(result_at(s, n * args.spread_s / args.runs) for n, s in enumerate(streams))
            )
            seconds = time.monotonic() - started
            spent = resource.getrusage(resource.RUSAGE_SELF)
            commits = await _commits(args.database_url) - commits
            lateness = []
            for stream, at in zip(streams, arrived, strict=True):
                ended = (await log.read_run(stream.run_id))[-1].event
                assert isinstance(ended, RunFinished), ended
                lateness.append(at - ended.at / 1e6)
    finally:
        App.nap = original_nap  # type: ignore[method-assign]
    log_calls = calls["read_run"] + calls["ends"]
    return {
        "mode": mode,
        "runs": args.runs,
        "spread_s": args.spread_s,
        "model_s": args.model_s,
        "model_jitter_s": args.model_jitter_s,
        "seconds": seconds,
        "log_calls": log_calls,
        "log_calls_per_s": log_calls / seconds,
        "read_run_calls": calls["read_run"],
        "ends_calls": calls["ends"],
        "app_cpu_s": (spent.ru_utime + spent.ru_stime) - (cpu.ru_utime + cpu.ru_stime),
        "postgres_commits_per_s": commits / seconds,
        "result_after_end_p50_s": quantile(lateness, 0.5),
        "result_after_end_p99_s": quantile(lateness, 0.99),
        "result_after_end_max_s": max(lateness),
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_server_options(parser, "bootstrap", "database_url", "redis_url")
    parser.add_argument("--backend", choices=["kafka", "postgres"], default="kafka")
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--model-s", type=float, default=10.0, help="each model call's sleep")
    parser.add_argument(
        "--model-jitter-s",
        type=float,
        default=2.0,
        help="each model call takes up to this much longer, drawn at random: with one fixed "
        "time every stream would meet its run's end at the same point of its poll",
    )
    parser.add_argument(
        "--spread-s",
        type=float,
        default=0.0,
        help="start the runs evenly over this many seconds (0: all at once), so every "
        "partition keeps moving while streams wait",
    )
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--json", type=Path, default=None, help="where the figures go")
    return parser


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    os.environ["FLEET_MODEL_JITTER_S"] = str(args.model_jitter_s)  # the workers inherit it
    fleet_args = argparse.Namespace(
        **vars(args),
        max_runs=args.runs,
        lease_ttl=10.0,
        session_timeout_ms=6_000,
        steps=1,
        tool_s=0.01,
    )
    results: dict[str, Any] = {"version": code_version(), "backend": args.backend, "modes": []}
    with tempfile.TemporaryDirectory() as tmp:
        fleet = Fleet(fleet_args, 1, Path(tmp))
        try:
            await fleet.start()
            for mode in ("watcher", "each stream polls"):
                figures = await measure(args, fleet, mode)
                print(
                    f"{mode}: {args.runs} runs in {figures['seconds']:.1f}s; the app called the "
                    f"log {figures['log_calls']:,} times ({figures['log_calls_per_s']:,.0f}/s), "
                    f"used {figures['app_cpu_s']:.2f} CPU s; PostgreSQL committed "
                    f"{figures['postgres_commits_per_s']:,.0f} transactions/s; a result came "
                    f"{figures['result_after_end_p50_s'] * 1000:.0f} ms after its run's end "
                    f"(p99 {figures['result_after_end_p99_s'] * 1000:.0f} ms, max "
                    f"{figures['result_after_end_max_s'] * 1000:.0f} ms)"
                )
                results["modes"].append(figures)
        finally:
            await fleet.stop()
    return results


def main() -> None:
    args = _parser().parse_args()
    names = ["database_url"] + (["bootstrap", "redis_url"] if args.backend == "kafka" else [])
    server_urls(args, *names)
    results = run_ending_on_sigterm(bench(args))
    suffix = "" if args.backend == "kafka" else "-postgres"
    write_results(args.json or RESULTS / f"streams{suffix}.json", results)


if __name__ == "__main__":
    main()
