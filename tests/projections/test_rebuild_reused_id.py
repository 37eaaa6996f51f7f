"""A run id used again once garbage collection removed its first run and compaction cut that
run's events: a fold of the whole log (a rebuild read with the archive) gives the rows a live
projector gave, the new run's, not both runs folded into one row.

The first run comes back whole from the archive, finished; the new run then begins at seq 1
again, past the first one's end. Folded on from the first run's frontier, every event of the
new run was refused as a duplicate (same tenant: a row of the old run with 7 refusals), or
counted on from seq 8 into the old run (another tenant: the old tenant's finished row, and the
new tenant's run gone from its views). A projector that still cached the first run's frontier
(a runner's inline fold, a Kafka projector) folded the new run into it the same way, and a late
event of the collected run wrote its row back.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import msgspec
import pytest
from support.compaction_world import (
    AGENT,
    TENANT,
    Script,
    World,
    kafka_stores,
    record_sweeper,
    sqlite_world,
)
from support.servers import KafkaServers

from onward.eventlog import EVENT_FORMAT, Event, Position, RunFinished, RunStarted, Tagged, codec
from onward.eventlog.archive import DirectoryArchive
from onward.eventlog.archived import ArchivedEventLog
from onward.eventlog.memory import MemoryEventLog
from onward.projections.base import DEFAULT_CONSUMER, FrontierStore
from onward.projections.compaction.memory import MemoryCompactionStore
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.log_projector import LogProjector
from onward.projections.memory import MemoryFrontierStore
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.rebuild import rebuild_frontiers
from onward.runtime.compaction import CheckpointCompactor
from onward.runtime.gc import GarbageCollector
from onward.testing.eventlog import new_run_id

LATER_S = 40 * 86_400.0


async def _reuse(world: World, folder: Path, tenant: str) -> DirectoryArchive:
    """Run "x", collect it, cut its events into the archive, and run "x" again for ``tenant``."""
    archive = DirectoryArchive(folder / "archive")
    await world.finished_run("x", turns=3)
    await world.fold()
    async with record_sweeper(world, folder) as sweeper:
        later = time.time() + LATER_S
        assert "x" in (await GarbageCollector(sweeper, clock=lambda: later).run()).expired
    await CheckpointCompactor(world.log, world.frontiers, world.store, archive=archive).compact()
    await world.runner(Script(1)).run(AGENT, {"ask": "again"}, tenant=tenant, run_id="x")
    await world.fold()
    return archive


async def _reused(folder: Path, tenant: str) -> DirectoryArchive:
    async with sqlite_world(folder) as world:
        return await _reuse(world, folder, tenant)


async def _rebuilt(world: World, archive: DirectoryArchive, batch_size: int) -> FrontierStore:
    """The log read with the archive, folded from its start into a new store."""
    whole = ArchivedEventLog(world.log, archive)
    rebuilt = MemoryFrontierStore()
    projection = FrontierProjection(rebuilt, whole, compaction=world.store)
    await LogProjector(whole, projection, batch_size=batch_size, from_log_start=True).catch_up()
    return rebuilt


@pytest.mark.parametrize("tenant", [TENANT, "other"])
async def test_a_fold_from_the_archive_gives_the_reused_ids_new_run(
    tmp_path: Path, tenant: str
) -> None:
    archive = await _reused(tmp_path, tenant)
    async with sqlite_world(tmp_path) as world:
        live = await world.frontiers.get("x")
        assert live is not None
        assert live.frontier is not None
        through = live.frontier.last_seq
        rebuilt = await _rebuilt(world, archive, 5_000)

        row = await rebuilt.get("x")
        assert row is not None
        assert (row.summary.tenant, row.summary.status) == (tenant, "completed")
        assert row.frontier == live.frontier
        assert row.frontier.refused == 0
        assert await rebuilt.tool_calls("x") == await world.frontiers.tool_calls("x")
        said = await world.frontiers.transcript("x", tenant=tenant, through=through)
        assert await rebuilt.transcript("x", tenant=tenant, through=through) == said
        assert [r.run_id for r in await rebuilt.runs(tenant=tenant)] == ["x"]


@pytest.mark.parametrize("tenant", [TENANT, "other"])
async def test_a_fold_that_stored_the_collected_run_gives_the_new_runs_row(
    tmp_path: Path, tenant: str
) -> None:
    """Stored after every record: the collected run's row is stored, then replaced."""
    archive = await _reused(tmp_path, tenant)
    async with sqlite_world(tmp_path) as world:
        live = await world.frontiers.get("x")
        rebuilt = await _rebuilt(world, archive, 1)

        row = await rebuilt.get("x")
        assert row is not None
        assert live is not None
        assert row.frontier == live.frontier
        assert [r.run_id for r in await rebuilt.runs(tenant=tenant)] == ["x"]


@pytest.mark.parametrize(("collected", "ended"), [(False, True), (True, False)])
async def test_a_second_start_that_is_no_reuse_stays_refused(collected: bool, ended: bool) -> None:
    """Two starts of one run racing (both at seq 1): the second is refused as a duplicate, as
    before, whether the run was never collected (even once it ended) or it is a run under a
    collected id that has not ended."""
    log = MemoryEventLog(partitions=1)
    run_id = new_run_id()
    first: list[Event] = [
        RunStarted(run_id=run_id, tenant=TENANT, seq=1, fence=1, at=1, agent="a", revision="r")
    ]
    if ended:
        first.append(
            RunFinished(run_id=run_id, tenant=TENANT, seq=2, fence=1, at=2, status="completed")
        )
    await log.append(first)
    await log.append(
        [RunStarted(run_id=run_id, tenant="other", seq=1, fence=1, at=3, agent="b", revision="r")]
    )
    store = MemoryFrontierStore()
    compaction = MemoryCompactionStore(store)
    if collected:
        compaction.tombstoned.add(run_id)
    await LogProjector(log, FrontierProjection(store, log, compaction=compaction)).catch_up()

    row = await store.get(run_id)
    assert row is not None
    assert row.frontier is not None
    assert (row.summary.tenant, row.frontier.agent, row.frontier.refused) == (TENANT, "a", 1)


def _write_in_a_newer_format(log: MemoryEventLog, start: RunStarted) -> Position:
    """Write ``start`` as a newer Onward would, in a format this one cannot read."""
    newer = msgspec.json.decode(codec.encode(start)) | {"format": EVENT_FORMAT + 1}
    return log.write_raw(start.run_id, msgspec.json.encode(newer))


async def _fold_with_the_first_run_collected(
    log: MemoryEventLog, run_id: str
) -> tuple[MemoryFrontierStore, LogProjector]:
    """Fold ``log`` into a new store as a projector does once ``run_id``'s first run was
    collected, setting aside what it cannot read; the store and the projector."""
    store = MemoryFrontierStore()
    compaction = MemoryCompactionStore(store)
    compaction.tombstoned.add(run_id)
    projection = FrontierProjection(
        store, log, compaction=compaction, release_poll=0.0, every_partition=True
    )
    projector = LogProjector(log, projection)
    await projector.catch_up()
    return store, projector


async def _upgrade_and_release(
    log: MemoryEventLog,
    store: MemoryFrontierStore,
    projector: LogProjector,
    start: RunStarted,
    position: Position,
) -> None:
    """This Onward upgraded (``start``, written in a newer format, now reads), an operator
    releases the run set aside, and the projector folds on."""
    log._records[position.partition][position.offset] = (start.run_id, codec.encode(start))
    assert await store.release(DEFAULT_CONSUMER, start.run_id, by="ops", at=1) == 1
    await projector.catch_up()


async def test_a_release_under_a_reused_id_folds_the_new_run_alone() -> None:
    """A log read with the archive holds a collected run, then a new run under its id whose
    start no reader of this version could read (a newer format): the fold sets the run aside
    on the old run's frontier. Released once the start reads (an upgrade), the row is the new
    run's, not the old run's with every event of the new one refused as a duplicate."""
    log = MemoryEventLog(partitions=1)
    run_id = new_run_id()
    await log.append(
        [
            RunStarted(run_id=run_id, tenant=TENANT, seq=1, fence=1, at=1, agent="a", revision="r"),
            RunFinished(run_id=run_id, tenant=TENANT, seq=2, fence=1, at=2, status="completed"),
        ]
    )
    start = RunStarted(run_id=run_id, tenant="other", seq=1, fence=1, at=3, agent="b", revision="r")
    position = _write_in_a_newer_format(log, start)
    await log.append(
        [RunFinished(run_id=run_id, tenant="other", seq=2, fence=1, at=4, status="failed")]
    )
    store, projector = await _fold_with_the_first_run_collected(log, run_id)
    assert [e.state for e in await store.quarantined(DEFAULT_CONSUMER)] == ["held"]

    await _upgrade_and_release(log, store, projector, start, position)

    row = await store.get(run_id)
    assert row is not None
    assert row.quarantined is None
    assert row.frontier is not None
    got = (row.summary.tenant, row.frontier.agent, row.frontier.status, row.frontier.refused)
    assert got == ("other", "b", "failed", 0)
    assert row.frontier.first_offset == position.offset


async def test_a_new_run_under_a_collected_id_whose_start_cannot_be_read_is_set_aside() -> None:
    """The old run collected and cut, a newer Onward starts a run under its id in a format this
    projector cannot read: the run is set aside, listed for release once this Onward reads it,
    as a run under a fresh id is, not passed over as what is left of the collected run (its
    every later event dropped with it, for good, and nothing said)."""
    log = MemoryEventLog(partitions=1)
    run_id = new_run_id()
    start = RunStarted(run_id=run_id, tenant=TENANT, seq=1, fence=1, at=3, agent="b", revision="r")
    position = _write_in_a_newer_format(log, start)
    await log.append(
        [RunFinished(run_id=run_id, tenant=TENANT, seq=2, fence=1, at=4, status="completed")]
    )
    store, projector = await _fold_with_the_first_run_collected(log, run_id)

    (entry,) = await store.quarantined(DEFAULT_CONSUMER)
    assert (entry.run_id, entry.offset, entry.state) == (run_id, position.offset, "held")
    held = await store.get(run_id)
    assert held is not None
    assert held.quarantined == entry.mark

    await _upgrade_and_release(log, store, projector, start, position)
    row = await store.get(run_id)
    assert row is not None
    assert row.frontier is not None
    assert (row.frontier.agent, row.frontier.status, row.frontier.last_seq) == ("b", "completed", 2)


async def _fold_again_capped(
    tenant: str,
) -> tuple[str, MemoryFrontierStore, MemoryFrontierStore, FrontierProjection]:
    """A run under a reused id (the old run ``TENANT``'s, the new one ``tenant``'s) folded by
    a live projector, then by a rebuild read from the log's start that stores it over the
    snapshot cap, drops it from its cache, and meets its next event: the live projector's kept
    frontier of the run is past that event, so the rebuild folds the run again from the log,
    old run and all. The run id, the live store, the rebuilt store and the rebuild."""
    log = MemoryEventLog(partitions=1)
    run_id, other = new_run_id(), new_run_id()

    def started(run: str, tenant: str, at: int) -> RunStarted:
        return RunStarted(run_id=run, tenant=tenant, seq=1, fence=1, at=at, agent="a", revision="r")

    def tagged(run: str, tenant: str, seq: int) -> Tagged:
        return Tagged(run_id=run, tenant=tenant, seq=seq, fence=1, at=seq, target_seq=1, label="t")

    await log.append(
        [
            started(run_id, TENANT, 1),
            RunFinished(run_id=run_id, tenant=TENANT, seq=2, fence=1, at=2, status="completed"),
        ]
    )
    await log.append([started(other, TENANT, 3)])
    await log.append([started(run_id, tenant, 4)])
    for seq in (2, 3):
        await log.append([tagged(other, TENANT, seq)])
        await log.append([tagged(run_id, tenant, seq)])
    store, rebuilt = MemoryFrontierStore(), MemoryFrontierStore()
    compaction = MemoryCompactionStore(store)
    compaction.tombstoned.add(run_id)
    live = FrontierProjection(store, log, compaction=compaction, max_bytes=10)
    await LogProjector(log, live).catch_up()
    rebuild = FrontierProjection(rebuilt, log, compaction=compaction, max_bytes=10, cache_runs=1)
    await LogProjector(log, rebuild, batch_size=1, from_log_start=True).catch_up()
    return run_id, store, rebuilt, rebuild


async def test_a_fold_again_of_a_capped_run_under_a_reused_id_folds_the_new_run_alone() -> None:
    """A rebuild that folds a capped run under a reused id again from the log
    (`_fold_again_capped`) stores the new run's row, as the live projector, not the old run's
    with the new run's events refused as duplicates."""
    run_id, store, rebuilt, rebuild = await _fold_again_capped("other")

    assert rebuild.stats.refolded_from_log > 0
    live_row, row = await store.get(run_id), await rebuilt.get(run_id)
    assert live_row is not None
    assert row is not None
    assert (live_row.summary.status, live_row.summary.refused) == ("running", 0)
    assert row.summary == live_row.summary


@pytest.mark.parametrize("tenant", [TENANT, "other"])
async def test_a_fold_again_of_a_capped_run_under_a_reused_id_drops_the_old_runs_transcript(
    tenant: str,
) -> None:
    """Folded again from the log (`_fold_again_capped`), the old run is folded under its own
    tenant, not the tenant of the new run's event that set off the fold: the old run's
    transcript rows the rebuild stored are deleted under the old run's tenant, as the live
    projector deleted them, and the transcripts are the live projector's under both
    tenants."""
    run_id, store, rebuilt, rebuild = await _fold_again_capped(tenant)

    assert rebuild.stats.refolded_from_log > 0
    for reader in {TENANT, tenant}:
        said = await store.transcript(run_id, tenant=reader, through=1_000)
        assert await rebuilt.transcript(run_id, tenant=reader, through=1_000) == said, reader
    assert [r.seq for r in await rebuilt.transcript(run_id, tenant=tenant, through=1_000)] == [1]


@pytest.mark.parametrize("tenant", [TENANT, "other"])
async def test_a_runner_that_folded_the_collected_run_folds_the_new_one_afresh(
    tmp_path: Path, tenant: str
) -> None:
    """One runner (its inline fold keeps the frontiers it folded) runs a run, which is
    collected and cut, then a new run under the same id: the row is the new run's."""
    async with sqlite_world(tmp_path) as world:
        runner = world.runner(Script(3))
        await runner.run(AGENT, {"ask": "x"}, tenant=TENANT, run_id="x")
        async with record_sweeper(world, tmp_path) as sweeper:
            later = time.time() + LATER_S
            assert "x" in (await GarbageCollector(sweeper, clock=lambda: later).run()).expired
        archive = DirectoryArchive(tmp_path / "archive")
        await CheckpointCompactor(
            world.log, world.frontiers, world.store, archive=archive
        ).compact()
        runner.provider = Script(1)
        result = await runner.run(AGENT, {"ask": "again"}, tenant=tenant, run_id="x")
        assert result.status == "completed"

        row = await world.frontiers.get("x")
        assert row is not None
        assert row.frontier is not None
        assert (row.summary.tenant, row.frontier.refused) == (tenant, 0)
        assert [c.call_id for c in await world.frontiers.tool_calls("x")] == ["c0"]


@pytest.mark.kafka
async def test_a_postgres_rebuild_from_the_archive_gives_the_reused_ids_new_run(
    tmp_path: Path, kafka_servers: KafkaServers
) -> None:
    """`rebuild_frontiers` (``onward projections rebuild frontiers --archive``) reads the
    tombstones in PostgreSQL: the new build holds the new run's row."""
    async with kafka_stores(kafka_servers) as world:
        archive = await _reuse(world, tmp_path, "other")
        live = await world.frontiers.get("x")
        assert live is not None
        url, schema = world.database_url, kafka_servers.schema
        report = await rebuild_frontiers(ArchivedEventLog(world.log, archive), url, schema=schema)
        async with PostgresFrontierStore(url, schema=schema) as rebuilt:
            assert rebuilt.build == report.build
            row = await rebuilt.get("x")
            assert row is not None
            assert (row.summary.tenant, row.summary.status) == ("other", "completed")
            assert row.frontier == live.frontier
            assert [r.run_id for r in await rebuilt.runs(tenant="other")] == ["x"]


async def test_a_projector_that_cached_a_collected_run_brings_no_row_back(tmp_path: Path) -> None:
    """A projector that keeps the frontier of a run it folded (a Kafka projector's cache)
    meets a late event of the run once garbage collection removed it: no row comes back."""
    async with sqlite_world(tmp_path) as world:
        await world.finished_run("old", turns=1)
        projection = FrontierProjection(
            world.frontiers, world.log, compaction=world.store, consumer="cached"
        )
        projector = LogProjector(world.log, projection)
        await projector.catch_up()
        async with record_sweeper(world, tmp_path) as sweeper:
            later = time.time() + LATER_S
            assert "old" in (await GarbageCollector(sweeper, clock=lambda: later).run()).expired
        await world.tag_late("old")
        await projector.catch_up()

        assert await world.frontiers.get("old") is None


async def test_a_fold_that_stored_the_collected_run_keeps_none_of_its_call_or_transcript_rows(
    tmp_path: Path,
) -> None:
    """Stored after every record, the collected run's call and transcript rows are stored
    before the new run under its id begins: the new run's rows are its own, not the old run's
    calls beside them, nor the old run's messages at the seqs the new run has or lacks."""
    archive = await _reused(tmp_path, TENANT)
    async with sqlite_world(tmp_path) as world:
        live = await world.frontiers.get("x")
        assert live is not None
        rebuilt = await _rebuilt(world, archive, 1)

        assert await rebuilt.tool_calls("x") == await world.frontiers.tool_calls("x")
        whole = 1_000_000
        said = await world.frontiers.transcript("x", tenant=TENANT, through=whole)
        assert await rebuilt.transcript("x", tenant=TENANT, through=whole) == said


@pytest.mark.kafka
async def test_a_postgres_rebuild_that_stores_between_the_runs_keeps_the_new_runs_transcript(
    tmp_path: Path, kafka_servers: KafkaServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebuild that stores after every record stores the collected run's call rows in its
    build and its messages in the transcript every build shares, before the same tenant's new
    run under the id begins: the new build holds the new run's calls alone, and the
    transcript the new run's messages alone, as the live projector stored them."""
    monkeypatch.setattr(sys.modules[rebuild_frontiers.__module__], "REBUILD_FLUSH_EVENTS", 0)
    async with kafka_stores(kafka_servers) as world:
        archive = await _reuse(world, tmp_path, TENANT)
        said = await world.frontiers.transcript("x", tenant=TENANT, through=1_000_000)
        calls = await world.frontiers.tool_calls("x")
        url, schema = world.database_url, kafka_servers.schema
        whole = ArchivedEventLog(world.log, archive)
        await rebuild_frontiers(whole, url, schema=schema, batch_size=1)
        async with PostgresFrontierStore(url, schema=schema) as rebuilt:
            assert await rebuilt.tool_calls("x") == calls
            assert await rebuilt.transcript("x", tenant=TENANT, through=1_000_000) == said
