"""`onward compact`: one compaction pass over the configured log, or a dry run of one."""

from __future__ import annotations

from typing import Annotated

import typer

from onward.eventlog.archive import DirectoryArchive
from onward.runtime.backends import Backends
from onward.runtime.compaction import (
    CheckpointCompactor,
    CompactionReport,
    PartitionReport,
    compaction_store,
)

from ._common import ArchiveOption, out
from .runs import with_backends


def compact_command(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be cut and archived; change nothing.")
    ] = False,
    archive: ArchiveOption = None,
    max_checkpoints: Annotated[
        int, typer.Option(help="Untagged resume points a live run keeps in the log.", min=1)
    ] = 50,
    retention_mins: Annotated[
        float, typer.Option(help="Records younger than this are never cut.", min=0)
    ] = 0.0,
) -> None:
    """Compact the log: per run (tagged events retained), then cut each partition below what
    every reader still needs, after archiving what is cut when --archive is given.

    Exit 0: done (or, with --dry-run, reported). 2: bad command line, or the archive directory
    cannot be written. 5: a store failed, or the archive is corrupt; a rerun finishes the job.
    """

    async def work(backends: Backends) -> CompactionReport:
        async with compaction_store(backends) as store:
            compactor = CheckpointCompactor(
                backends.log,
                backends.frontiers,
                store,
                archive=DirectoryArchive(archive) if archive is not None else None,
                max_checkpoints=max_checkpoints,
                retention_mins=retention_mins,
            )
            return await compactor.compact(dry_run=dry_run)

    report = with_backends(work)
    for partition in report.partitions:
        out.print(describe(partition, report), soft_wrap=True)
    verb = "would cut" if report.dry_run else "cut"
    where = f", archived in {report.archive}" if report.archive else ", not archived"
    out.print(f"{verb} {report.events_cut} records in all{where}", soft_wrap=True)


def describe(part: PartitionReport, report: CompactionReport) -> str:
    """One line per partition: what was (or would be) cut and archived, and what holds it."""
    head = f"partition {part.partition} [{part.start}, {part.end})"
    runs = f"{part.runs_compacted} runs compacted, {part.retained} tagged events retained"
    if part.watermark <= part.start:
        return f"{head}: nothing to cut (held by {part.held_by}); {runs}"
    verb = "would cut" if report.dry_run else "cut"
    line = f"{head}: {verb} {part.events_cut} records [{part.start}, {part.watermark})"
    if report.archive is None:
        line += ", not archived"
    elif part.archive_start is None:
        line += f", already archived in {report.archive}"
    elif report.dry_run:
        line += f", would archive [{part.archive_start}, {part.watermark}) in {report.archive}"
    else:
        line += f", archived {part.archived} records in {report.archive}"
    return f"{line}; held at {part.watermark} by {part.held_by}; {runs}"
