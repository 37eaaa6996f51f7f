"""Compaction on the embedded SQLite deployment and on Kafka + PostgreSQL + Redis.

One scenario per deployment: finished runs, then a long live run, tags on both; a pass with a
directory archive cuts the whole partition (no run holds it). Tagged events and the live run's
last resume points survive, the live run resumes with its whole conversation, archive plus log
folds to the frontiers and ``tool_calls`` rows of before, and the archive holds exactly what
was cut. A dry run changes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec
import pytest
import pytest_asyncio
import zstandard
from support.compaction_world import (
    AGENT,
    TENANT,
    Script,
    World,
    conversation,
    kafka_stores,
    log_sizes,
    refolded,
    rows,
    sqlite_world,
)
from support.servers import KafkaServers

from onward.errors import ArchiveError
from onward.eventlog import MemoryEventLog, TurnSettled, codec
from onward.eventlog.archive import DirectoryArchive
from onward.eventlog.archived import ArchivedEventLog
from onward.eventlog.base import EventLog
from onward.projections.compaction import MemoryCompactionStore
from onward.projections.frontier import Frontier, ToolCallRow
from onward.projections.memory import MemoryFrontierStore
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.rebuild import rebuild_frontiers
from onward.runtime.compaction import CheckpointCompactor
from onward.runtime.leases import MemoryLeaseStore
from onward.testing.archive import records

FINISHED = ["done-0", "done-1", "done-2"]
LIVE = "long"
RUNS = [*FINISHED, LIVE]


@pytest_asyncio.fixture
async def kafka_world(kafka_servers: KafkaServers) -> AsyncIterator[World]:
    async with kafka_stores(kafka_servers) as world:
        yield world


async def written(world: World) -> int:
    """Finished runs, then a long run that died mid-way; a tag on each. Returns the seq
    tagged on the live run (an early boundary, far below what compaction keeps)."""
    for n, run_id in enumerate(FINISHED):
        await world.finished_run(run_id, turns=n + 1)
    await world.live_run(LIVE, turns=20, done=12)
    settled = [
        s.event.seq for s in await world.log.read_run(LIVE) if isinstance(s.event, TurnSettled)
    ]
    tagger = world.runner(Script(0))
    tagged = await tagger.tag(LIVE, "milestone", tenant=TENANT, seq=settled[1])
    await tagger.tag(FINISHED[0], "answer", tenant=TENANT)
    await world.fold()
    return tagged


Rows = dict[str, tuple[Frontier | None, list[ToolCallRow]]]
Rebuild = Callable[[EventLog], Awaitable[Rows]]


async def compaction_keeps_what_readers_need(
    world: World, archive_dir: Path, rebuild: Rebuild
) -> None:
    tagged = await written(world)
    before = await rows(world.frontiers, RUNS)
    expected = await conversation(world.log, LIVE)
    archive = DirectoryArchive(archive_dir)
    compactor = CheckpointCompactor(
        world.log, world.frontiers, world.store, archive=archive, max_checkpoints=3
    )
    report = await compactor.compact()
    (part,) = report.partitions
    assert part.cut
    assert part.events_cut > 0
    assert (await world.log.bounds(0)).start == part.watermark
    # The archive holds exactly what was cut.
    assert sum(r.events for r in await archive.ranges()) == part.events_cut == part.archived
    # Every run had events below the watermark (the projectors' positions): every one has a
    # point past them, the live run included; no run held the partition.
    assert part.watermark == (await world.log.bounds(0)).end
    points = await world.store.truncations(RUNS)
    assert set(points) == set(RUNS)
    live_row = before[LIVE][0]
    assert live_row is not None
    assert points[LIVE].before_seq == live_row.last_seq + 1
    assert not any(p.whole for p in points.values())
    # The live run keeps its tagged event and its last 3 untagged resume points.
    kept = {r.seq: r for r in await world.store.retained(LIVE)}
    assert kept[tagged].kept_as == "tag"
    assert isinstance(kept[tagged].stored().event, TurnSettled)
    boundaries = sorted(seq for seq, r in kept.items() if r.kept_as == "checkpoint")
    assert len(boundaries) == 3
    assert boundaries[-1] == live_row.resume_seq
    assert [r.seq for r in await world.store.retained(FINISHED[0])]
    assert not await world.log.read_run(FINISHED[0])
    assert not await world.log.read_run(LIVE)
    # Archive plus log folds (and rebuilds) to the rows of before; the log alone no longer can.
    assert await refolded(ArchivedEventLog(world.log, archive), RUNS) == before
    assert await refolded(world.log, RUNS) != before
    assert await rebuild(ArchivedEventLog(world.log, archive)) == before
    # The live run carries on with its whole conversation, no hole.
    provider = Script(20)
    result = await world.runner(provider).resume(AGENT, LIVE, tenant=TENANT)
    assert result.status == "completed"
    assert provider.calls[0] == expected


async def a_dry_run_changes_nothing(world: World, archive_dir: Path) -> None:
    await written(world)
    sizes = await log_sizes(world.log)
    compactor = CheckpointCompactor(
        world.log,
        world.frontiers,
        world.store,
        archive=DirectoryArchive(archive_dir),
        max_checkpoints=3,
    )
    report = await compactor.dry_run()
    assert report.events_cut > 0
    assert not any(p.cut for p in report.partitions)
    assert await log_sizes(world.log) == sizes
    assert await world.store.truncations(RUNS) == {}
    assert not await asyncio.to_thread(archive_dir.exists)


async def test_sqlite_compaction_keeps_what_readers_need(tmp_path: Path) -> None:
    async def rebuild(log: EventLog) -> Rows:
        return await refolded(log, RUNS)

    async with sqlite_world(tmp_path) as world:
        await compaction_keeps_what_readers_need(world, tmp_path / "archive", rebuild)


async def test_sqlite_dry_run_changes_nothing(tmp_path: Path) -> None:
    async with sqlite_world(tmp_path) as world:
        await a_dry_run_changes_nothing(world, tmp_path / "archive")


@pytest.mark.kafka
async def test_kafka_compaction_keeps_what_readers_need(
    tmp_path: Path, kafka_world: World, pg_schema: str
) -> None:
    async def rebuild(log: EventLog) -> Rows:
        url = kafka_world.database_url
        report = await rebuild_frontiers(log, url, schema=pg_schema)
        assert report.previous == 1
        async with PostgresFrontierStore(url, schema=pg_schema) as rebuilt:
            assert rebuilt.build == report.build
            return await rows(rebuilt, RUNS)

    await compaction_keeps_what_readers_need(kafka_world, tmp_path / "archive", rebuild)


@pytest.mark.kafka
async def test_kafka_dry_run_changes_nothing(tmp_path: Path, kafka_world: World) -> None:
    await a_dry_run_changes_nothing(kafka_world, tmp_path / "archive")


async def test_on_a_schedule_the_first_pass_runs_at_once(tmp_path: Path) -> None:
    """Memory stores: `run` compacts, then waits out the interval until stopped."""
    log = MemoryEventLog(partitions=1)
    frontiers = MemoryFrontierStore()
    world = World(log, frontiers, MemoryCompactionStore(frontiers), MemoryLeaseStore(), False)
    await world.finished_run("done", turns=2)
    await world.fold()
    stop = asyncio.Event()
    steps: list[str] = []

    async def pause(step: str, partition: int) -> None:
        steps.append(step)
        if step == "cut":
            stop.set()

    compactor = CheckpointCompactor(
        log,
        frontiers,
        world.store,
        archive=DirectoryArchive(tmp_path / "archive"),
        compaction_interval_mins=60,
        pause=pause,
    )
    await compactor.run(stop)
    assert steps == ["planned", "archived", "cut"]
    assert compactor.last_error is None
    assert compactor.last_report is not None
    assert compactor.last_report.events_cut == (await log.bounds(0)).start > 0


async def test_on_a_schedule_a_pass_failing_with_any_error_is_logged_and_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A pass that fails with an error that is not Onward's (a bug, an OSError) must not end
    the schedule silently: it is logged with its cause and the next pass still runs."""
    log = MemoryEventLog(partitions=1)
    frontiers = MemoryFrontierStore()
    world = World(log, frontiers, MemoryCompactionStore(frontiers), MemoryLeaseStore(), False)
    await world.finished_run("done", turns=2)
    await world.fold()
    stop = asyncio.Event()
    passes: list[str] = []

    async def pause(step: str, partition: int) -> None:
        passes.append(step)
        if passes.count("planned") == 1 and step == "planned":
            raise RuntimeError("disk went away")
        if step == "cut":
            stop.set()

    compactor = CheckpointCompactor(
        log,
        frontiers,
        world.store,
        archive=DirectoryArchive(tmp_path / "archive"),
        compaction_interval_mins=0.001,
        pause=pause,
    )
    with caplog.at_level("WARNING", logger="onward"):
        await asyncio.wait_for(compactor.run(stop), 10)
    assert passes == ["planned", "planned", "archived", "cut"]
    assert "disk went away" in caplog.text
    assert compactor.last_error is None
    assert compactor.last_report is not None
    assert compactor.last_report.events_cut > 0


async def test_a_range_archived_above_the_log_start_is_no_reason_to_cut_unarchived(
    tmp_path: Path,
) -> None:
    """The archive directory already holds a range of the partition above the log's start
    (another deployment's, or a topic recreated since): what lies below it was never
    archived here, so it is archived now, not cut as if it had been."""
    log = MemoryEventLog(partitions=1)
    frontiers = MemoryFrontierStore()
    world = World(log, frontiers, MemoryCompactionStore(frontiers), MemoryLeaseStore(), False)
    await world.finished_run("done", turns=2)
    await world.fold()
    before = await rows(frontiers, ["done"])
    archive = DirectoryArchive(tmp_path / "archive")
    await archive.write(0, 10_000, 10_004, records(0, range(10_000, 10_004)))
    compactor = CheckpointCompactor(log, frontiers, world.store, archive=archive)
    report = await compactor.compact()
    (part,) = report.partitions
    assert part.cut
    assert part.archived == part.events_cut > 0
    assert await refolded(ArchivedEventLog(log, archive), ["done"]) == before


def _archived_lines(archive: DirectoryArchive) -> list[dict[str, object]]:
    """Every line of every file of the archive, as JSON: what an audit tool reads."""
    lines: list[dict[str, object]] = []
    for path in sorted(archive.path.glob("*.jsonl.zst")):
        body = zstandard.ZstdDecompressor().stream_reader(path.read_bytes()).read()
        lines.extend(msgspec.json.decode(line) for line in body.splitlines())
    return lines


async def test_a_field_a_newer_writer_added_is_archived_and_retained_as_written(
    tmp_path: Path,
) -> None:
    """A newer Onward adds a field to an event kind (a minor addition, read here by ignoring
    it): this older compactor must archive, and copy out, the record as written, or the audit
    replaying the archive (and a newer worker resuming from the copy) never sees the field."""
    written, folded = MemoryEventLog(partitions=1), MemoryFrontierStore()
    source = World(written, folded, MemoryCompactionStore(folded), MemoryLeaseStore(), False)
    await source.finished_run("done", turns=2)
    log = MemoryEventLog(partitions=1)
    newer = await written.read_run("done")
    for stored in newer:
        record = msgspec.json.decode(codec.encode(stored.event))
        record["reviewed_by"] = "a newer writer"
        log.write_raw("done", msgspec.json.encode(record))
    frontiers = MemoryFrontierStore()
    world = World(log, frontiers, MemoryCompactionStore(frontiers), MemoryLeaseStore(), False)
    await world.runner(Script(0)).tag("done", "answer", tenant=TENANT)
    await world.fold()
    archive = DirectoryArchive(tmp_path / "archive")
    report = await CheckpointCompactor(log, frontiers, world.store, archive=archive).compact()
    (part,) = report.partitions
    assert part.cut
    assert part.archived > 0
    archived = [line["event"] for line in _archived_lines(archive)]
    assert len(archived) == part.archived
    as_written = [e for e in archived if isinstance(e, dict) and "reviewed_by" in e]
    assert [e["seq"] for e in as_written] == [s.event.seq for s in newer]
    kept = [r for r in await world.store.retained("done") if r.seq <= newer[-1].event.seq]
    assert kept
    assert all(msgspec.json.decode(r.record).get("reviewed_by") for r in kept)


async def test_an_archive_holding_another_logs_records_at_the_offsets_is_not_taken_as_done(
    tmp_path: Path,
) -> None:
    """The archive directory holds the ranges of another log (one recreated since, a database
    started afresh): its records at those offsets are not this log's, so they are neither
    taken as this log's archived (and the log's cut unarchived) nor served in their place."""
    archive = DirectoryArchive(tmp_path / "archive")
    earlier, earlier_rows = MemoryEventLog(partitions=1), MemoryFrontierStore()
    before = World(
        earlier, earlier_rows, MemoryCompactionStore(earlier_rows), MemoryLeaseStore(), False
    )
    await before.finished_run("before", turns=4)
    await before.fold()
    await CheckpointCompactor(earlier, earlier_rows, before.store, archive=archive).compact()
    (archived,) = await archive.ranges()
    log, frontiers = MemoryEventLog(partitions=1), MemoryFrontierStore()
    world = World(log, frontiers, MemoryCompactionStore(frontiers), MemoryLeaseStore(), False)
    await world.finished_run("after", turns=1)
    await world.fold()
    assert (await log.bounds(0)).end < archived.end
    compactor = CheckpointCompactor(log, frontiers, world.store, archive=archive)
    with pytest.raises(ArchiveError):
        await compactor.compact()
    assert (await log.bounds(0)).start == 0
    assert {s.event.run_id for s in await log.read_partition(0, 0)} == {"after"}
