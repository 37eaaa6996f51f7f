"""A fleet of `onward worker` processes: steps/s at 1, 2 and 3 workers, and recovery from a kill.

For each fleet size (``--fleets``, default 1,2,3): a fresh events topic, requests topic,
migrated PostgreSQL schema and Redis key prefix; one `onward projector` process and that many
`onward worker` processes (``--max-runs`` each, leases in Redis with ``--lease-ttl``). Once every
worker holds its share of the partitions, ``--runs`` start requests (``booker`` runs of
``--steps`` steps: a scripted model call and one tool call each; the tool sleeps ``--tool-s``)
are submitted through the requests topic at once, and the clock runs until the projector shows
every run completed. steps/s = runs x steps / that time; also reported by the workers' clock: until
the last run's final event (its own time), which leaves the projector's lag out.

Then the same load on the largest fleet, with the first worker SIGKILLed once ``--kill-at`` of
the tool calls are done. Every run must still complete (the tool's status check settles calls
the dead worker left undecided). For each run claimed after the kill (an orphan), the time from
the kill to its first `RunClaimed` after it (the event's own clock) is the time until it moved
again; p50 and p99 are reported. That time is bounded below by the group's session timeout
(``--session-timeout-ms``: until then the dead worker keeps its partitions) and by the lease
ttl (until then its runs stay held).

Each fleet size is measured ``--repeat`` times (3; the median is the figure, the range beside
it), each with the share of the machine's CPUs that was busy and stolen. ``--model-s`` makes
each model call take that long, as a real model's does (0: it answers at once, so the fleet is
bound by the CPUs of this machine, which also runs the broker, PostgreSQL and Redis).

    python bench/fleet.py                          # 2,000 runs; bench/results/fleet.json
    python bench/fleet.py --runs 200 --fleets 1,3 --repeat 1   # small
    python bench/fleet.py --backend postgres       # bench/results/fleet-postgres.json

With ``--backend postgres`` the deployment is PostgreSQL alone: no projector (every worker folds
inline), leases in PostgreSQL, and the requests go through the ``onward_requests`` table, which
every worker serves (no partitions to balance: each is ready once it listens on the table).

The agent and model are `tests/support/fleet.py` (put on the workers' ``PYTHONPATH``); the
processes are started and stopped as the fleet tests do it (`tests/support/deployment.py`,
`tests/support/processes.py`). Topics, schemas and Redis keys are deleted at the end, also on
failure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _common import (
    add_server_options,
    code_version,
    create_schema,
    create_topic,
    delete_redis_keys,
    delete_topics,
    drop_schemas,
    quantile,
    run_ending_on_sigterm,
    server_urls,
    throwaway_name,
    whole_numbers,
    write_results,
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the fleet's agents and processes: tests/support
from support.deployment import balanced, worker_argv  # noqa: E402
from support.processes import spawn_onward, stop_children  # noqa: E402

if TYPE_CHECKING:
    from onward.projections.postgres import PostgresFrontierStore

TENANT = "bench"
REQUEST_KEY = secrets.token_hex(32)
"""This run's request key: the bench signs its requests with it and its workers check them."""


class Fleet:
    """One deployment's processes and stores for one measurement."""

    def __init__(self, args: argparse.Namespace, workers: int, tmp: Path) -> None:
        self.args = args
        self.workers = workers
        self.tmp = tmp
        self.topic = throwaway_name("fleet")
        self.requests = f"{self.topic}.requests"
        self.prefix = f"{throwaway_name('fleet', ':')}:"
        self.schema = ""
        self.children: dict[str, asyncio.subprocess.Process] = {}

    @property
    def on_kafka(self) -> bool:
        return bool(self.args.backend == "kafka")

    @property
    def env(self) -> dict[str, str]:
        kafka = {
            "KAFKA_BOOTSTRAP_SERVERS": self.args.bootstrap,
            "REDIS_URL": self.args.redis_url,
            "ONWARD_REDIS_PREFIX": self.prefix,
            "ONWARD_KAFKA_TOPIC": self.topic,
        }
        return {
            **os.environ,
            "PYTHONPATH": str(ROOT / "tests"),
            "ONWARD_BACKEND": self.args.backend,
            **(kafka if self.on_kafka else {}),
            "DATABASE_URL": self.args.database_url,
            "ONWARD_DATABASE_SCHEMA": self.schema,
            "ONWARD_PARTITIONS": str(self.args.partitions),
            "ONWARD_REQUEST_KEY": REQUEST_KEY,
            "FLEET_LEDGER": str(self.tmp / "ledger.jsonl"),
            "FLEET_STEPS": str(self.args.steps),
            "FLEET_TOOL_S": str(self.args.tool_s),
            "FLEET_MODEL_S": str(self.args.model_s),
        }

    async def spawn(self, name: str, *argv: str) -> None:
        self.children[name] = await spawn_onward(self.tmp / f"{name}.log", self.env, *argv)

    def output(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    async def start(self) -> None:
        self.schema = await create_schema(self.args.database_url, "fleet")
        if self.on_kafka:
            await create_topic(self.args.bootstrap, self.topic, self.args.partitions)
            await self.spawn("projector", "projector", "--session-timeout-ms", "6000")
        for n in range(self.workers):
            argv = worker_argv(
                "support.fleet",
                self.requests,
                f"w{n}",
                *("--max-runs", str(self.args.max_runs)),
                lease_ttl_s=self.args.lease_ttl,
                session_timeout_ms=self.args.session_timeout_ms,
            )
            await self.spawn(f"w{n}", *argv)
        deadline = time.monotonic() + 120
        workers = [f"w{n}" for n in range(self.workers)]
        while not self._ready(workers):
            if time.monotonic() > deadline:
                raise SystemExit(f"workers never balanced: {self._tails()}")
            await asyncio.sleep(0.25)

    def _ready(self, workers: list[str]) -> bool:
        """Kafka: every partition owned by one worker; PostgreSQL: every worker serving."""
        if self.on_kafka:
            return balanced(map(self.output, workers), self.args.partitions)
        return all("ready (postgres: requests table)" in self.output(w) for w in workers)

    def _tails(self) -> dict[str, str]:
        return {n: self.output(n)[-1500:] for n in self.children}

    async def stop(self) -> None:
        await stop_children(self.children.values(), within_s=60)
        if self.on_kafka:
            await delete_topics(self.args.bootstrap, [self.topic, self.requests])
            await delete_redis_keys(self.args.redis_url, self.prefix)
        if self.schema:
            await drop_schemas(self.args.database_url, [self.schema])


class MachineCpu:
    """The machine's CPU time over a measurement (``/proc/stat``): the share busy, and the share
    stolen by the hypervisor, so a figure says whether it was bound by the CPUs."""

    def __enter__(self) -> MachineCpu:
        self._start = _cpu_times()
        return self

    def __exit__(self, *exc: object) -> None:
        self._end = _cpu_times()

    def figures(self) -> dict[str, float]:
        spent = [b - a for a, b in zip(self._start, self._end, strict=True)]
        total = sum(spent) or 1
        idle = spent[3] + spent[4]  # idle, iowait
        steal = spent[7] if len(spent) > 7 else 0
        return {"cpu_busy": (total - idle) / total, "cpu_steal": steal / total}


def _cpu_times() -> list[int]:
    """The first line of ``/proc/stat`` (zeros where there is none)."""
    try:
        with open("/proc/stat") as stat:
            return [int(v) for v in stat.readline().split()[1:9]]
    except OSError:
        return [0] * 8


async def _submit(fleet: Fleet, runs: int) -> list[str]:
    from onward.runtime.fleet.requests import Requests, StartRun  # noqa: PLC0415
    from onward.runtime.fleet.requests_postgres import PostgresRequests  # noqa: PLC0415
    from onward.runtime.signing import RequestSigner  # noqa: PLC0415

    run_ids = [f"run-{uuid.uuid4().hex[:12]}" for _ in range(runs)]
    signer = RequestSigner(REQUEST_KEY)
    sender = (
        Requests(
            fleet.args.bootstrap, fleet.requests, partitions=fleet.args.partitions, signer=signer
        )
        if fleet.on_kafka
        else PostgresRequests(fleet.args.database_url, schema=fleet.schema, signer=signer)
    )
    async with sender as client:
        await client.submit_many(
            [StartRun(run_id=r, tenant=TENANT, agent="booker", input="go") for r in run_ids]
        )
    return run_ids


async def _wait_completed(fleet: Fleet, frontiers: Any, runs: int, within: float) -> float:
    """Until the projector shows every run completed; polled with a count, so the bench's own
    reads take next to nothing from the machine the fleet runs on."""
    import asyncpg  # noqa: PLC0415

    deadline = time.monotonic() + within
    conn = await asyncpg.connect(
        fleet.args.database_url, server_settings={"search_path": fleet.schema}
    )
    try:
        while True:
            done = await conn.fetchval(
                "SELECT count(*) FROM onward_frontiers WHERE tenant = $1 AND status = 'completed'",
                TENANT,
            )
            if done >= runs:
                return time.monotonic()
            if time.monotonic() > deadline:
                statuses = [s.status for s in await frontiers.runs(tenant=TENANT)]
                counts = {s: statuses.count(s) for s in set(statuses)}
                raise SystemExit(f"{done}/{runs} completed after {within}s: {counts}")
            await asyncio.sleep(0.2)
    finally:
        await conn.close()


async def _until_effects(fleet: Fleet, count: int) -> None:
    """Until the tools' ledger holds ``count`` effects (polled: it is a file other processes
    append to).
    """
    while _effects(fleet) < count:  # noqa: ASYNC110 - nothing to wait on but the file
        await asyncio.sleep(0.05)


def _effects(fleet: Fleet) -> int:
    path = fleet.tmp / "ledger.jsonl"
    if not path.exists():
        return 0
    with path.open("rb") as ledger:
        return sum(1 for _ in ledger)


@contextlib.asynccontextmanager
async def _running(
    args: argparse.Namespace, workers: int, tmp: Path
) -> AsyncIterator[tuple[Fleet, PostgresFrontierStore]]:
    """A started fleet and its frontier store; the fleet is stopped and cleaned up after."""
    from onward.projections.postgres import PostgresFrontierStore  # noqa: PLC0415

    fleet = Fleet(args, workers, tmp)
    try:
        await fleet.start()
        async with PostgresFrontierStore(args.database_url, schema=fleet.schema) as frontiers:
            yield fleet, frontiers
    finally:
        await fleet.stop()


async def throughput(args: argparse.Namespace, workers: int, tmp: Path) -> dict[str, Any]:
    async with _running(args, workers, tmp) as (fleet, frontiers):
        with MachineCpu() as cpu:  # from the submit until the last run shows completed
            started = time.monotonic()
            submitted_us = time.time_ns() // 1_000
            await _submit(fleet, args.runs)
            ended = await _wait_completed(fleet, frontiers, args.runs, args.timeout)
        rows = await frontiers.runs(tenant=TENANT, statuses={"completed"})
    seconds = ended - started
    # The workers' own time: until the last run's final event (its own clock), whatever the
    # projector's lag in showing it.
    worker_seconds = (max(r.updated_at for r in rows) - submitted_us) / 1e6
    steps = args.runs * args.steps
    return {
        "workers": workers,
        "seconds": seconds,
        "steps": steps,
        "steps_per_s": steps / seconds,
        "worker_seconds": worker_seconds,
        "worker_steps_per_s": steps / worker_seconds,
        **cpu.figures(),
    }


async def recovery(args: argparse.Namespace, workers: int, tmp: Path) -> dict[str, Any]:
    from onward.eventlog import EventLog, KafkaEventLog, PostgresEventLog, RunClaimed  # noqa: PLC0415

    async with _running(args, workers, tmp) as (fleet, frontiers):
        cpu = MachineCpu().__enter__()
        started = time.monotonic()
        run_ids = await _submit(fleet, args.runs)
        kill_at = int(args.runs * args.steps * args.kill_at)
        await _until_effects(fleet, kill_at)
        fleet.children["w0"].send_signal(signal.SIGKILL)
        killed_us = time.time_ns() // 1_000
        await fleet.children["w0"].wait()
        ended = await _wait_completed(fleet, frontiers, args.runs, args.timeout)
        cpu.__exit__()
        wanted = set(run_ids)
        moved: dict[str, int] = {}
        log: EventLog = (
            KafkaEventLog(
                args.bootstrap, topic=fleet.topic, partitions=args.partitions, create_topic=False
            )
            if fleet.on_kafka
            else PostgresEventLog(
                args.database_url, schema=fleet.schema, partitions=args.partitions
            )
        )
        async with log:
            for partition in range(args.partitions):
                end = (await log.bounds(partition)).end
                for stored in await log.read_partition(partition, 0, end):
                    event = stored.event
                    if (
                        isinstance(event, RunClaimed)
                        and event.run_id in wanted
                        and event.at > killed_us
                        and event.run_id not in moved
                    ):
                        moved[event.run_id] = event.at
        waits = sorted((at - killed_us) / 1e6 for at in moved.values())
        return {
            "workers": workers,
            "runs": args.runs,
            "completed": args.runs,
            "seconds": ended - started,
            "orphans": len(waits),
            "recovery_p50_s": quantile(waits, 0.5),
            "recovery_p99_s": quantile(waits, 0.99),
            "recovery_max_s": max(waits, default=float("nan")),
            **cpu.figures(),
        }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_server_options(parser, "bootstrap", "database_url", "redis_url")
    parser.add_argument(
        "--backend",
        choices=["kafka", "postgres"],
        default="kafka",
        help="kafka: topics, a projector, Redis leases; postgres: PostgreSQL alone",
    )
    parser.add_argument("--runs", type=int, default=2_000)
    parser.add_argument("--steps", type=int, default=10, help="tool calls per run")
    parser.add_argument("--tool-s", type=float, default=0.01, help="each tool call's sleep")
    parser.add_argument("--model-s", type=float, default=0.0, help="each model call's sleep")
    parser.add_argument(
        "--repeat", type=int, default=3, help="measurements per fleet size (median reported)"
    )
    parser.add_argument(
        "--fleets", type=whole_numbers, default=[1, 2, 3], help="worker counts, comma-separated"
    )
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--max-runs", type=int, default=32, help="runs in flight per worker")
    parser.add_argument("--lease-ttl", type=float, default=3.0)
    parser.add_argument("--session-timeout-ms", type=int, default=6_000)
    parser.add_argument("--kill-at", type=float, default=0.4, help="share of calls done at kill")
    parser.add_argument("--no-kill", action="store_true", help="skip the recovery measurement")
    parser.add_argument("--timeout", type=float, default=1_800, help="seconds per measurement")
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        help="where the figures go (bench/results/fleet.json, fleet-postgres.json for postgres)",
    )
    return parser


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    import tempfile  # noqa: PLC0415

    results: dict[str, Any] = {"throughput": [], "summary": []}
    for workers in args.fleets:
        measured = []
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as tmp:
                result = await throughput(args, workers, Path(tmp))
            print(
                f"{workers} worker(s): {result['steps']:,} steps in {result['seconds']:.1f}s, "
                f"{result['steps_per_s']:,.0f} steps/s as the frontier rows show them; the last "
                "run "
                f"finished after {result['worker_seconds']:.1f}s, "
                f"{result['worker_steps_per_s']:,.0f} steps/s by the workers' clock; the machine's "
                f"CPUs {result['cpu_busy']:.0%} busy ({result['cpu_steal']:.0%} stolen)"
            )
            measured.append(result)
        results["throughput"].extend(measured)
        rates = sorted(r["steps_per_s"] for r in measured)
        results["summary"].append(
            {
                "workers": workers,
                "steps_per_s_median": quantile(rates, 0.5),
                "steps_per_s_min": rates[0],
                "steps_per_s_max": rates[-1],
            }
        )
    base = results["summary"][0]["steps_per_s_median"] if results["summary"] else 0
    for row in results["summary"]:
        row["vs_first"] = row["steps_per_s_median"] / base if base else float("nan")
        print(
            f"{row['workers']} worker(s): median {row['steps_per_s_median']:,.0f} steps/s "
            f"(range {row['steps_per_s_min']:,.0f} to {row['steps_per_s_max']:,.0f}), "
            f"{row['vs_first']:.2f}x {args.fleets[0]} worker(s)"
        )
    if not args.no_kill:
        workers = max(*args.fleets, 2)
        with tempfile.TemporaryDirectory() as tmp:
            result = await recovery(args, workers, Path(tmp))
        print(
            f"{workers} workers, one SIGKILLed: all {result['completed']} runs completed; "
            f"{result['orphans']} orphans moved again after p50 {result['recovery_p50_s']:.2f}s, "
            f"p99 {result['recovery_p99_s']:.2f}s (max {result['recovery_max_s']:.2f}s)"
        )
        results["recovery"] = result
    return results


def main() -> None:
    args = _parser().parse_args()
    if args.json is None:
        name = "fleet.json" if args.backend == "kafka" else f"fleet-{args.backend}.json"
        args.json = Path("bench/results") / name
    kafka = args.backend == "kafka"
    server_urls(args, *(("bootstrap", "redis_url") if kafka else ()), "database_url")
    load = os.getloadavg()
    print(f"code at {code_version()}; load average {load[0]:.2f} on {os.cpu_count()} CPUs")
    results = run_ending_on_sigterm(bench(args))
    document = {
        "code": code_version(),
        "load_average": [load[0], os.getloadavg()[0]],
        "arguments": {k: str(v) for k, v in vars(args).items() if k not in ("database_url",)},
        **results,
    }
    write_results(args.json, document)


if __name__ == "__main__":
    main()
