"""Append throughput: `KafkaEventLog` against a raw aiokafka producer doing the same work.

Both sides append the same workload in the same run: ``--events`` events of about 1 KB, spread
over ``--runs`` runs keyed by run id, one step of ``--step`` events per append (one record batch
per step, awaited until acknowledged), ``--concurrency`` runs writing at once. The raw side uses
the same producer settings (idempotent, ``acks="all"``, ``linger_ms=0``), builds the same records
(JSON body, key, the same four headers) and skips only what Onward adds: typed events,
validation, seq checks. `SqliteEventLog` runs the same workload for the embedded figure.

Absolute figures depend on the machine; the ratio is the figure to compare.

    python bench/append.py --events 200000 --json bench/results/append.json
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
from _common import (
    add_server_options,
    create_topic,
    delete_topics,
    raw_producer,
    run_ending_on_sigterm,
    server_urls,
    throwaway_name,
    write_results,
)
from rich.console import Console
from rich.table import Table

from onward.eventlog import KafkaEventLog, SqliteEventLog, ToolCompleted, partition_for
from onward.eventlog.base import EventLog

PAYLOAD = "x" * 900  # with the envelope, about 1 KB per encoded event


def _steps(runs: int, events: int, step: int) -> list[tuple[str, int]]:
    """(run id, first seq) of every step, interleaved across runs as concurrent runs would be."""
    run_ids = [f"bench-{uuid.uuid4().hex[:10]}" for _ in range(runs)]
    steps_per_run = max(1, events // (runs * step))
    return [(r, 1 + s * step) for s in range(steps_per_run) for r in run_ids]


async def _drive(
    steps: list[tuple[str, int]], concurrency: int, append: Callable[[str, int], Awaitable[None]]
) -> float:
    queue: asyncio.Queue[tuple[str, int]] = asyncio.Queue()
    for item in steps:
        queue.put_nowait(item)

    async def worker() -> None:
        while not queue.empty():
            run_id, first = queue.get_nowait()
            await append(run_id, first)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started


def _events(run_id: str, first: int, step: int) -> list[ToolCompleted]:
    return [
        ToolCompleted(
            run_id=run_id, tenant="bench", seq=seq, fence=1, call_id=f"c{seq}", result=PAYLOAD
        )
        for seq in range(first, first + step)
    ]


async def bench_log(log: EventLog, steps: list[tuple[str, int]], step: int, conc: int) -> float:
    async def append(run_id: str, first: int) -> None:
        await log.append(_events(run_id, first, step))

    return await _drive(steps, conc, append)


async def bench_raw(
    bootstrap: str, topic: str, partitions: int, steps: list[tuple[str, int]], step: int, conc: int
) -> float:
    producer = raw_producer(bootstrap, linger_ms=0)
    await producer.start()

    async def append(run_id: str, first: int) -> None:
        key = run_id.encode()
        batch = producer.create_batch()
        for seq in range(first, first + step):
            body = {
                "kind": "tool.completed",
                "run_id": run_id,
                "tenant": "bench",
                "seq": seq,
                "fence": 1,
                "at": 0,
                "format": 1,
                "call_id": f"c{seq}",
                "result": PAYLOAD,
                "error": None,
            }
            headers = [
                ("onward.run_id", key),
                ("onward.kind", b"tool.completed"),
                ("onward.fence", b"1"),
                ("onward.format", b"1"),
            ]
            batch.append(timestamp=None, key=key, value=msgspec.json.encode(body), headers=headers)
        delivery = await producer.send_batch(
            batch, topic, partition=partition_for(run_id, partitions)
        )
        await delivery

    try:
        return await _drive(steps, conc, append)
    finally:
        await producer.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_server_options(parser, "bootstrap")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--sqlite-events", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=1_000)
    parser.add_argument("--step", type=int, default=4, help="events per append (one step)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--json", type=Path, default=Path("bench/results/append.json"))
    args = parser.parse_args()
    server_urls(args, "bootstrap")
    bootstrap = args.bootstrap
    console = Console()
    topic = throwaway_name("append")
    raw_topic = f"{topic}.raw"
    results: dict[str, float] = {}
    log = await KafkaEventLog.open(bootstrap, topic=topic, partitions=args.partitions)
    await create_topic(bootstrap, raw_topic, args.partitions)  # the raw side's, same layout
    try:
        warm = _steps(50, 50 * args.step * 4, args.step)
        await bench_log(log, warm, args.step, args.concurrency)
        await bench_raw(bootstrap, raw_topic, args.partitions, warm, args.step, args.concurrency)
        # Alternate the two sides so drift on the machine affects both alike.
        onward_s = raw_s = 0.0
        total = 0
        for _ in range(2):
            steps = _steps(args.runs, args.events // 2, args.step)
            total += len(steps) * args.step
            raw_s += await bench_raw(
                bootstrap, raw_topic, args.partitions, steps, args.step, args.concurrency
            )
            onward_s += await bench_log(log, steps, args.step, args.concurrency)
        results["kafka_event_log_events_per_s"] = total / onward_s
        results["raw_aiokafka_events_per_s"] = total / raw_s
    finally:
        await log.close()
        await delete_topics(bootstrap, [topic, raw_topic], console)
    with tempfile.TemporaryDirectory() as tmp:
        async with SqliteEventLog(Path(tmp) / "bench.db", partitions=args.partitions) as sqlite:
            steps = _steps(min(args.runs, 200), args.sqlite_events, args.step)
            seconds = await bench_log(sqlite, steps, args.step, 1)
            results["sqlite_event_log_events_per_s"] = len(steps) * args.step / seconds
    results["ratio_kafka_event_log_to_raw"] = (
        results["kafka_event_log_events_per_s"] / results["raw_aiokafka_events_per_s"]
    )

    table = Table(
        title=f"append: {total} events of ~1 KB, {args.step} per step, "
        f"{args.concurrency} concurrent runs"
    )
    table.add_column("writer")
    table.add_column("events/s", justify="right")
    table.add_row("raw aiokafka producer", f"{results['raw_aiokafka_events_per_s']:,.0f}")
    table.add_row("KafkaEventLog", f"{results['kafka_event_log_events_per_s']:,.0f}")
    table.add_row(
        "SqliteEventLog (fsync per append)", f"{results['sqlite_event_log_events_per_s']:,.0f}"
    )
    table.add_row("KafkaEventLog / raw", f"{results['ratio_kafka_event_log_to_raw']:.2f}")
    console.print(table)
    write_results(
        args.json,
        {
            "benchmark": "append",
            "parameters": {k: v for k, v in vars(args).items() if k != "bootstrap"}
            | {"json": str(args.json)},
            "results": results,
        },
    )


if __name__ == "__main__":
    run_ending_on_sigterm(main())
