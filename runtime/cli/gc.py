"""`onward gc [--dry-run]`: remove what finished runs left behind once past their ttls.

The stores follow ``ONWARD_BACKEND``: the SQLite file (``sqlite``), or PostgreSQL
(``kafka``); with ``REDIS_URL`` set, the Redis keys of leases, fences and the MCP schema cache
too. A dry run opens the SQLite file read-only and deletes nothing anywhere.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Annotated

import msgspec
import typer
from rich.table import Table

from onward.errors import InvalidInputError
from onward.runtime.gc import KINDS, GarbageCollector, GcReport
from onward.runtime.gc.configured import key_sweeper, record_sweeper
from onward.runtime.settings import load_settings

from ._common import echo, out, run_until_terminated, within

_WHAT: dict[str, str] = {
    "frontiers": "frontier rows",
    "transcript": "transcript rows",
    "tool_calls": "tool_calls rows",
    "retained_events": "retained (tagged) events",
    "truncations": "compaction truncation points",
    "lease_rows": "lease rows",
    "redis_leases": "Redis lease hashes",
    "redis_fences": "Redis fence counters",
    "schema_cache": "MCP schema cache entries",
}


DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Count what would go; delete nothing.")
]
CheckpointTtlOption = Annotated[
    float,
    typer.Option(
        help="After this, a finished run's frontier, transcript, compaction and lease rows go."
    ),
]
RedisKeyTtlOption = Annotated[
    float, typer.Option(help="After this, a finished run's Redis keys (lease, fence, schemas) go.")
]
TaskResultTtlOption = Annotated[
    float, typer.Option(help="After this, a finished run's tool_calls rows go.")
]
JsonOption = Annotated[bool, typer.Option("--json", help="One JSON object: the counts per kind.")]


def _table(report: GcReport) -> Table:
    verb = "would delete" if report.dry_run else "deleted"
    title = f"{verb} {report.total} row(s) and key(s) of finished runs"
    if report.kept:
        title += f"; {len(report.kept)} expired run(s) kept for the runs they were carried into"
    table = Table(title=title, title_justify="left")
    table.add_column("what")
    table.add_column("count", justify="right")
    for kind in KINDS:
        table.add_row(_WHAT[kind], str(report.count(kind)))
    return table


def gc_command(
    dry_run: DryRunOption = False,
    checkpoint_ttl_days: CheckpointTtlOption = 30,
    redis_key_ttl_hours: RedisKeyTtlOption = 48,
    task_result_ttl_days: TaskResultTtlOption = 7,
    as_json: JsonOption = False,
) -> None:
    """Remove the rows and keys of runs finished longer ago than the ttls; running and waiting
    runs, and LangGraph threads, are never touched.

    Exit 0: done (or counted, with --dry-run). 2: bad configuration or ttl. 5: a store failed.
    """
    ttls = {
        "--checkpoint-ttl-days": checkpoint_ttl_days,
        "--redis-key-ttl-hours": redis_key_ttl_hours,
        "--task-result-ttl-days": task_result_ttl_days,
    }
    bad = [f"{option}={value:g}" for option, value in ttls.items() if not value > 0]
    if bad:
        # Named as typed: the collector's own check names its fields, not the options.
        raise InvalidInputError(f"ttls must be positive: {', '.join(bad)}")
    config = load_settings()

    records, keys = record_sweeper(config, readonly=dry_run), key_sweeper(config)
    collector = GarbageCollector(
        records,
        keys,
        checkpoint_ttl_days=checkpoint_ttl_days,
        redis_key_ttl_hours=redis_key_ttl_hours,
        task_result_ttl_days=task_result_ttl_days,
    )

    async def collect() -> GcReport:
        async with AsyncExitStack() as stack:
            await within(stack.enter_async_context(records), f"the {config.backend} store")
            if keys is not None:
                await within(stack.enter_async_context(keys), "Redis")
            return await (collector.dry_run() if dry_run else collector.run())

    report = run_until_terminated(collect())
    if as_json:
        summary = {"dry_run": report.dry_run, "counts": dict(report.counts), "kept": report.kept}
        echo(msgspec.json.encode(summary).decode())
        return
    out.print(_table(report))
