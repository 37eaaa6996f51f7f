"""`OnwardSaver` against LangGraph's `AsyncPostgresSaver` on the same graph, one thread per
length (100, 400 and 2,000 steps by default), in one run.

The graph is the one ``steps.py`` measures LangGraph on (``langgraph_loop``): an "agent" node
(a scripted model, no network) asking for one call of a no-op tool each step, a prebuilt
`ToolNode` whose tool returns 1 KB of random hex, ``--steps`` times, then a final answer;
``ainvoke(..., durability="sync")``, so every checkpoint is stored before the next step. Each
saver runs a short warm-up thread, then one measured thread per length. `AsyncPostgresSaver`
runs only the lengths up to ``--peer-max-steps`` (it stores the whole conversation at every
step: 2,000 steps would be gigabytes).

After each thread, ``aget_tuple`` of its latest checkpoint is timed twice over: on the saver
that wrote it (the median of ``--reads`` reads) and on savers opened afresh on the same
stores (the first read of each, which folds or queries the thread from storage: the median of
``--fresh-reads`` savers). The garbage the
thread's run left is collected before (else the first read pays for a full collection of it,
as a reader in another process would not). Beside them, "values load" is how long the saver's
own serializer takes to load that checkpoint's channel values from their bytes, with no store
at all: the least any fresh read of the checkpoint costs, growing with the conversation it
returns.

* ``onward-kafka``: `OnwardSaver` on a fresh topic (``--partitions``), Redis leases, frontier
  rows and the saver's thread summaries in a fresh PostgreSQL database (no projector runs during
  the thread; the saver does not need one). Bytes = the topic's log segments on the broker's
  disk (its ``log.dirs``, asked of the broker) + the growth of Onward's tables (summaries
  included) once a projector has folded the thread.
* ``onward-sqlite``: `OnwardSaver` embedded (log, leases, frontier rows and thread summaries in
  one SQLite file, ``checkpoint_inline``). Bytes = the file's growth (after a WAL checkpoint).
* ``postgres-saver``: `AsyncPostgresSaver` (psycopg) in a fresh database on the same server.
  Bytes = ``pg_total_relation_size`` of its tables (with indexes and TOAST), before and after.

ms/step is the measured thread's time / steps; p50 and p99 are over the intervals between two
model calls. Absolute figures depend on the machine; compare the ratios of one run.

    python bench/saver.py                      # all three, 100, 400 and 2,000 steps
    python bench/saver.py --steps 50 --systems onward-sqlite,postgres-saver

Writes ``bench/results/saver.json``. Topic, databases and Redis keys are removed afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

from _common import (
    add_server_options,
    code_version,
    delete_redis_keys,
    delete_topics,
    kafka_log_dirs,
    run_ending_on_sigterm,
    server_urls,
    throwaway_database,
    throwaway_name,
    topic_bytes,
    write_results,
)
from rich.console import Console
from rich.table import Table
from steps import langgraph_loop, latency_summary

ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = ("onward-kafka", "onward-sqlite", "postgres-saver")
WARM_UP_STEPS = 20
LENGTHS = (100, 400, 2_000)
TENANT = "bench"
POSTGRES_SAVER_TABLES = (
    "checkpoints",
    "checkpoint_blobs",
    "checkpoint_writes",
    "checkpoint_migrations",
)

Sizer = Callable[[], Awaitable[dict[str, int]]]
"""What a system has written so far, in bytes, by where it went."""

Reopen = Callable[[], AbstractAsyncContextManager[Any]]
"""A new checkpointer on the same stores, as another process would open it."""


# -- the graph ------------------------------------------------------------------------------


async def run_thread(graph: Any, steps: int) -> tuple[float, dict[str, Any]]:
    """One thread of ``steps`` steps; its seconds and its config."""
    from langchain_core.messages import HumanMessage  # noqa: PLC0415

    config = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": 2 * steps + 10}
    started = time.perf_counter()
    out = await graph.ainvoke(
        {"messages": [HumanMessage(content='{"task": "loop"}')], "steps": steps},
        config,
        durability="sync",
    )
    seconds = time.perf_counter() - started
    if out["messages"][-1].content != "done" or len(out["messages"]) != 2 * steps + 2:
        raise RuntimeError(f"the thread ended early: {len(out['messages'])} messages")
    return seconds, config


async def read_latest(
    checkpointer: Any, config: dict[str, Any], steps: int
) -> tuple[float, dict[str, Any]]:
    """``aget_tuple`` of the thread's latest checkpoint, checked whole; its milliseconds and
    the checkpoint."""
    latest = {"configurable": {"thread_id": config["configurable"]["thread_id"]}}
    started = time.perf_counter()
    found = await checkpointer.aget_tuple(latest)
    ms = 1_000 * (time.perf_counter() - started)
    if found is None or len(found.checkpoint["channel_values"]["messages"]) != 2 * steps + 2:
        raise RuntimeError("aget_tuple did not return the thread's whole conversation")
    return ms, found.checkpoint


def values_load_ms(serde: Any, checkpoint: dict[str, Any], reads: int) -> float:
    """The milliseconds the saver's serializer takes to load ``checkpoint``'s channel values
    from their bytes (the median of ``reads``): what any saver that returns the checkpoint
    from storage pays at least, since the values grow with the thread (the whole
    conversation, here)."""
    dumped = [serde.dumps_typed(value) for value in checkpoint["channel_values"].values()]
    times = []
    for _ in range(reads):
        started = time.perf_counter()
        for typed in dumped:
            serde.loads_typed(typed)
        times.append(1_000 * (time.perf_counter() - started))
    return statistics.median(times)


async def measure(
    checkpointer: Any,
    args: argparse.Namespace,
    size: Sizer,
    settle: Callable[[], Awaitable[None]],
    reopen: Reopen,
    *,
    lengths: list[int],
) -> dict[str, Any]:
    """Warm up, then one measured thread per length: its latency, the bytes it added per
    step, and how long reading its latest checkpoint takes."""
    marks: list[float] = []
    graph = langgraph_loop(marks, asynchronous=True).compile(checkpointer=checkpointer)
    await run_thread(graph, WARM_UP_STEPS)
    await settle()
    figures: dict[str, Any] = {}
    for steps in lengths:
        before = await size()
        marks.clear()
        seconds, config = await run_thread(graph, steps)
        await settle()
        after = await size()
        added = {where: after[where] - before.get(where, 0) for where in after}
        # The thread's run left garbage behind: collected now, not in the first read timed
        # (a reader in another process would not pay for this one's graph run).
        gc.collect()
        writer_reads = [
            (await read_latest(checkpointer, config, steps))[0] for _ in range(args.reads)
        ]
        # Each fresh read on a saver of its own (a first read is a single cold figure, noisy
        # on a shared machine): their median is the figure compared, the first kept beside.
        fresh_reads: list[float] = []
        for _ in range(args.fresh_reads):
            gc.collect()  # what the saver read before left, as another process would not
            async with reopen() as fresh:
                ms, checkpoint = await read_latest(fresh, config, steps)
                fresh_reads.append(ms)
                serde = fresh.serde
        floor = values_load_ms(serde, checkpoint, args.reads)
        figures[str(steps)] = {
            "latency": latency_summary([seconds], [marks], steps),
            "bytes_per_step": {where: grown / steps for where, grown in added.items()},
            "total_bytes_per_step": sum(added.values()) / steps,
            "get_tuple_ms": {
                "writer_p50": statistics.median(writer_reads),
                "fresh_first": fresh_reads[0],
                "fresh_p50": statistics.median(fresh_reads),
                "values_load": floor,
            },
        }
    return {"lengths": figures}


# -- sizes ----------------------------------------------------------------------------------


async def relation_bytes(dsn: str, tables: tuple[str, ...] | None = None) -> int:
    """``pg_total_relation_size`` of ``tables`` (every table of the database's ``public``
    schema when None), indexes and TOAST included."""
    import asyncpg  # noqa: PLC0415

    conn = await asyncpg.connect(dsn)
    try:
        names = (
            list(tables)
            if tables is not None
            else [
                r["tablename"]
                for r in await conn.fetch(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
                )
            ]
        )
        total = await conn.fetchval(
            "SELECT coalesce(sum(pg_total_relation_size(to_regclass(n))), 0) "
            "FROM unnest($1::text[]) n",
            names,
        )
    finally:
        await conn.close()
    return int(total)


def sqlite_bytes(path: Path) -> int:
    """The SQLite file's size once its WAL is checkpointed into it."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path.stat().st_size


async def nothing() -> None:
    return None


# -- the systems ----------------------------------------------------------------------------


async def onward_kafka(args: argparse.Namespace) -> dict[str, Any]:
    from onward.eventlog import KafkaEventLog  # noqa: PLC0415
    from onward.integrations.langgraph import OnwardSaver, PostgresThreadSummaries  # noqa: PLC0415
    from onward.projections.frontier_projection import FrontierProjection  # noqa: PLC0415
    from onward.projections.log_projector import LogProjector  # noqa: PLC0415
    from onward.projections.postgres import PostgresFrontierStore  # noqa: PLC0415
    from onward.runtime.leases import RedisLeaseStore  # noqa: PLC0415

    topic = throwaway_name("saver")
    prefix = f"onward-bench-{topic.rsplit('.', 1)[1]}:"
    dirs = await kafka_log_dirs(args.bootstrap)
    async with (
        throwaway_database(args.database_url, "saver") as (database, dsn),
        _cleanup(args, topic, prefix),
        KafkaEventLog(
            args.bootstrap, topic=topic, partitions=args.partitions, create_topic=True
        ) as log,
        RedisLeaseStore(args.redis_url, prefix=prefix) as leases,
        PostgresFrontierStore(dsn) as frontiers,
        PostgresThreadSummaries(dsn) as summaries,
        OnwardSaver(log, leases, tenant=TENANT, frontiers=frontiers, summaries=summaries) as saver,
    ):
        projector = LogProjector(log, FrontierProjection(frontiers, log))

        async def settle() -> None:
            await projector.catch_up()

        async def size() -> dict[str, int]:
            return {
                "kafka_log": topic_bytes(dirs, topic),
                "postgres_projection": await relation_bytes(dsn),
            }

        def reopen() -> OnwardSaver:
            return OnwardSaver(log, leases, tenant=TENANT, frontiers=frontiers, summaries=summaries)

        figures = await measure(saver, args, size, settle, reopen, lengths=args.steps)
    return {
        "system": "onward-kafka",
        "setup": f"OnwardSaver, topic {topic} ({args.partitions} partitions), Redis leases, "
        f"frontier rows and thread summaries in database {database} (rows folded by a "
        "projector after each thread)",
        **figures,
    }


@asynccontextmanager
async def _cleanup(args: argparse.Namespace, topic: str, prefix: str) -> AsyncIterator[None]:
    try:
        yield
    finally:
        await delete_topics(args.bootstrap, [topic])
        await delete_redis_keys(args.redis_url, prefix)


async def onward_sqlite(args: argparse.Namespace) -> dict[str, Any]:
    from onward.eventlog import SqliteEventLog  # noqa: PLC0415
    from onward.integrations.langgraph import OnwardSaver  # noqa: PLC0415
    from onward.projections.sqlite import SqliteFrontierStore  # noqa: PLC0415
    from onward.runtime.leases import SqliteLeaseStore  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "onward.db"
        async with (
            SqliteEventLog(path, partitions=args.partitions) as log,
            SqliteLeaseStore(path) as leases,
            SqliteFrontierStore(path) as frontiers,
            OnwardSaver(
                log, leases, tenant=TENANT, frontiers=frontiers, checkpoint_inline=True
            ) as saver,
        ):

            async def size() -> dict[str, int]:
                return {"sqlite_file": sqlite_bytes(path)}

            def reopen() -> OnwardSaver:
                return OnwardSaver(log, leases, tenant=TENANT, frontiers=frontiers)

            figures = await measure(saver, args, size, nothing, reopen, lengths=args.steps)
    return {
        "system": "onward-sqlite",
        "setup": "OnwardSaver embedded: log, leases and frontier rows in one SQLite file, "
        "checkpoint_inline",
        **figures,
    }


async def postgres_saver(args: argparse.Namespace) -> dict[str, Any]:
    from importlib.metadata import version  # noqa: PLC0415

    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver  # noqa: PLC0415

    async with (
        throwaway_database(args.database_url, "pgsaver") as (database, dsn),
        AsyncPostgresSaver.from_conn_string(dsn) as saver,
    ):
        await saver.setup()

        async def size() -> dict[str, int]:
            return {"postgres": await relation_bytes(dsn, POSTGRES_SAVER_TABLES)}

        def reopen() -> AbstractAsyncContextManager[Any]:
            return AsyncPostgresSaver.from_conn_string(dsn)

        lengths = [n for n in args.steps if n <= args.peer_max_steps]
        figures = await measure(saver, args, size, nothing, reopen, lengths=lengths)
    return {
        "system": "postgres-saver",
        "setup": f"AsyncPostgresSaver (langgraph-checkpoint-postgres "
        f"{version('langgraph-checkpoint-postgres')}) in database {database}",
        **figures,
    }


RUNNERS: dict[str, Callable[[argparse.Namespace], Awaitable[dict[str, Any]]]] = {
    "onward-kafka": onward_kafka,
    "onward-sqlite": onward_sqlite,
    "postgres-saver": postgres_saver,
}


# -- report ---------------------------------------------------------------------------------


def report(results: list[dict[str, Any]]) -> None:
    table = Table(title="LangGraph savers, one thread per length (durability='sync')")
    columns = ("system", "steps", "ms/step mean", "p50", "p99", "bytes/step", "where")
    reads = ("get_tuple ms (writer)", "get_tuple ms (fresh)", "values load ms", "fresh / load")
    for column in (*columns, *reads):
        table.add_column(column, justify="left" if column in ("system", "where") else "right")
    for r in results:
        for steps, f in r["lengths"].items():
            lat = f["latency"]
            table.add_row(
                r["system"],
                steps,
                f"{lat['per_step_ms_mean']:.2f}",
                f"{lat['per_step_ms_p50']:.2f}",
                f"{lat['per_step_ms_p99']:.2f}",
                f"{f['total_bytes_per_step']:,.0f}",
                ", ".join(f"{k} {v:,.0f}" for k, v in f["bytes_per_step"].items()),
                f"{f['get_tuple_ms']['writer_p50']:.2f}",
                f"{f['get_tuple_ms']['fresh_p50']:.2f}",
                f"{f['get_tuple_ms']['values_load']:.2f}",
                f"{f['get_tuple_ms']['fresh_p50'] / f['get_tuple_ms']['values_load']:.2f}x",
            )
    Console().print(table)
    peer = next((r for r in results if r["system"] == "postgres-saver"), None)
    for r in results:
        if r is peer:
            continue
        lengths = r["lengths"]
        shortest, longest = lengths[min(lengths, key=int)], lengths[max(lengths, key=int)]
        if shortest is not longest:
            growth = longest["total_bytes_per_step"] / shortest["total_bytes_per_step"]
            print(
                f"{r['system']}: {max(lengths, key=int)} steps / {min(lengths, key=int)} steps: "
                f"bytes/step {growth:.2f}x, "
                f"get_tuple (writer) {_ratio(longest, shortest, 'writer_p50'):.2f}x, "
                f"get_tuple (fresh) {_ratio(longest, shortest, 'fresh_p50'):.2f}x, "
                f"values load (the floor of a fresh read) "
                f"{_ratio(longest, shortest, 'values_load'):.2f}x"
            )
        for steps, theirs in (peer or {}).get("lengths", {}).items():
            ours = lengths.get(steps)
            if ours is None:
                continue
            time_ratio = ours["latency"]["per_step_ms_mean"] / theirs["latency"]["per_step_ms_mean"]
            bytes_ratio = ours["total_bytes_per_step"] / theirs["total_bytes_per_step"]
            print(
                f"{r['system']} / postgres-saver at {steps} steps: time {time_ratio:.2f}x, "
                f"bytes {bytes_ratio:.3f}x"
            )


def _ratio(longer: dict[str, Any], shorter: dict[str, Any], read: str) -> float:
    return float(longer["get_tuple_ms"][read] / shorter["get_tuple_ms"][read])


async def amain(args: argparse.Namespace) -> None:
    results = [await RUNNERS[name](args) for name in args.systems]
    report(results)
    write_results(
        ROOT / "bench" / "results" / "saver.json",
        {"code": code_version(), "steps": args.steps, "results": results},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument(
        "--steps",
        default=",".join(str(n) for n in LENGTHS),
        help="comma-separated thread lengths, one measured thread each",
    )
    parser.add_argument(
        "--peer-max-steps",
        type=int,
        default=400,
        help="the longest thread AsyncPostgresSaver runs (it stores every step whole)",
    )
    parser.add_argument(
        "--reads", type=int, default=20, help="aget_tuple reads timed on the writing saver"
    )
    parser.add_argument(
        "--fresh-reads",
        type=int,
        default=5,
        help="aget_tuple reads timed each on a saver opened afresh (their median is reported)",
    )
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {', '.join(SYSTEMS)}"
    )
    add_server_options(parser, *("bootstrap", "database_url", "redis_url"))
    args = parser.parse_args()
    args.systems = [s for s in args.systems.split(",") if s]
    try:
        args.steps = sorted({int(n) for n in args.steps.split(",") if n})
    except ValueError:
        parser.error(f"--steps takes comma-separated numbers, got {args.steps!r}")
    if not args.steps or min(args.steps) < 1:
        parser.error("--steps needs at least one length of at least 1")
    if args.reads < 1 or args.fresh_reads < 1:
        parser.error("--reads and --fresh-reads take at least 1")
    unknown = [s for s in args.systems if s not in RUNNERS]
    if unknown:
        parser.error(f"unknown systems {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
    server_urls(args, "database_url")
    if "onward-kafka" in args.systems:
        server_urls(args, "bootstrap", "redis_url")
    run_ending_on_sigterm(amain(args))


if __name__ == "__main__":
    main()
