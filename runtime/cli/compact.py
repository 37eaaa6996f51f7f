"""`onward compact`: one compaction pass over the configured log, or a dry run of one."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from onward.eventlog.archive import DirectoryArchive
from onward.runtime.backends import Backends
from onward.runtime.compaction import (
    NO_ARCHIVE,
    CheckpointCompactor,
    CompactionReport,
    PartitionReport,
    compaction_store,
)
from onward.runtime.limits import check_stored_name

from ._common import ArchiveOption, JsonResultOption, echo_json, error, out
from .runs import with_backends
from .summary import shown

NO_ARCHIVE_FLAGS = "no archive (give --archive DIR, or --no-archive to cut without one)"
"""What holds a partition when neither flag was given, in the command line's words: the
compactor's own names the Python keyword (``no_archive``)."""


def compact_command(
    *,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be cut and archived; change nothing.")
    ] = False,
    archive: ArchiveOption = None,
    no_archive: Annotated[
        bool,
        typer.Option(
            "--no-archive",
            help="Cut without an archive: the audit history below each cut is gone for good.",
        ),
    ] = False,
    run: Annotated[
        str | None,
        typer.Option(
            "--run",
            help="Compact only this run, logically (what it needs copied out); nothing is cut.",
        ),
    ] = None,
    max_checkpoints: Annotated[
        int,
        typer.Option(
            help="Untagged resume points a live run keeps when its events are cut.", min=1
        ),
    ] = 50,
    retention_mins: Annotated[
        float, typer.Option(help="Records younger than this are never cut.", min=0)
    ] = 0.0,
    as_json: JsonResultOption = False,
) -> None:
    """Compact the log: copy out what each run still needs (tagged events, last resume points,
    the whole of runs read from their first event), then cut each partition below what its
    projectors have folded, after archiving what is cut. Without --archive nothing is cut
    unless --no-archive says so.

    Exit 0: done (or, with --dry-run, reported). 1: --run names no run. 2: bad command line,
    or the archive directory cannot be written. 5: a store failed, or the archive is corrupt; a
    rerun finishes the job.
    """
    if archive is not None and no_archive:
        error("give --archive DIR or --no-archive, not both")
        raise typer.Exit(2)
    if run is not None:
        check_stored_name("--run", run)

    async def work(backends: Backends) -> CompactionReport:
        async with compaction_store(backends) as store:
            compactor = CheckpointCompactor(
                backends.log,
                backends.frontiers,
                store,
                archive=DirectoryArchive(archive) if archive is not None else None,
                no_archive=no_archive,
                max_checkpoints=max_checkpoints,
                retention_mins=retention_mins,
            )
            return await compactor.compact(dry_run=dry_run, run_id=run)

    # A dry run changes nothing: the SQLite file is opened read-only, neither migrated nor
    # written to.
    report = in_flags(with_backends(work, readonly=dry_run))
    if as_json:
        echo_json({**dataclasses.asdict(report), "events_cut": report.events_cut})
        return
    for partition in report.partitions:
        out.print(shown(describe(partition, report)), soft_wrap=True)
    if run is not None:
        verb = "would compact" if report.dry_run else "compacted"
        compacted = sum(p.runs_compacted for p in report.partitions)
        kept = sum(p.retained for p in report.partitions)
        out.print(
            shown(
                f"run {run!r}: {verb} logically ({compacted} truncation point moved, {kept} "
                "events copied out); the next full pass cuts its partition"
            ),
            soft_wrap=True,
        )
        return
    verb = "would cut" if report.dry_run else "cut"
    where = f", archived in {report.archive}" if report.archive else ", not archived"
    freed = f", about {report.bytes_cut:,} bytes" if report.bytes_cut is not None else ""
    out.print(shown(f"{verb} {report.events_cut} records in all{freed}{where}"), soft_wrap=True)
    if archive is None and not no_archive:
        out.print(
            "nothing is cut without an archive: give --archive DIR, or --no-archive to cut "
            "without one (the audit history below each cut is then gone for good)",
            soft_wrap=True,
        )


def in_flags(report: CompactionReport) -> CompactionReport:
    """``report`` with what holds a partition for want of an archive said as the flags."""
    partitions = [
        dataclasses.replace(part, held_by=NO_ARCHIVE_FLAGS) if part.held_by == NO_ARCHIVE else part
        for part in report.partitions
    ]
    return dataclasses.replace(report, partitions=partitions)


def describe(part: PartitionReport, report: CompactionReport) -> str:
    """One line per partition: what was (or would be) cut and archived, and what holds it."""
    head = f"partition {part.partition} [{part.start}, {part.end})"
    runs = f"{part.runs_compacted} runs compacted, {part.retained} events retained"
    if part.watermark <= part.start:
        return f"{head}: nothing to cut (held by {part.held_by}); {runs}"
    verb = "would cut" if report.dry_run else "cut"
    line = f"{head}: {verb} {part.events_cut} records [{part.start}, {part.watermark})"
    if part.bytes_cut is not None:
        line += f" (about {part.bytes_cut:,} bytes)"
    if report.archive is None:
        line += ", not archived"
    elif part.archive_start is None:
        line += f", already archived in {report.archive}"
    elif report.dry_run:
        line += f", would archive [{part.archive_start}, {part.watermark}) in {report.archive}"
    else:
        line += f", archived {part.archived} records in {report.archive}"
    return f"{line}; held at {part.watermark} by {part.held_by}; {runs}"
