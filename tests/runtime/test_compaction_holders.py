"""No run holds its partition: each holder of the first compaction design is cut past.

Under the first design a run that might still be read from below the cut held the partition's
watermark: a run waiting on a person, a quarantined run, a frontier over the snapshot cap, a
LangGraph thread, a run whose frontier row GC removed. Each one here sits at the start of a
one-partition log with other runs' traffic after it; a pass with an archive cuts the log past
it, and the run still resumes, re-folds or loads. Embedded SQLite and Kafka + PostgreSQL.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaProducer
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)
from support.compaction_world import (
    AGENT,
    TENANT,
    Script,
    World,
    conversation,
    world_of,
)
from support.poison import BAD_RECORDS
from support.servers import KafkaServers

from onward.errors import (
    HistoryUnavailableError,
    InvalidInputError,
    NothingToResumeError,
    RunCancelledError,
)
from onward.eventlog import EVENT_FORMAT, Message, SqliteEventLog, Tagged, ToolCall, codec
from onward.eventlog.archive import DirectoryArchive
from onward.eventlog.archived import ArchivedEventLog
from onward.eventlog.base import EventLog, Position, SequenceGuard, partition_for
from onward.eventlog.events import format_of
from onward.integrations.langgraph import OnwardSaver
from onward.projections.base import DEFAULT_CONSUMER, StoredFrontier
from onward.projections.compaction import CompactionStore
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.log_projector import LogProjector
from onward.runtime import Agent, ModelReply, ScriptedProvider, reply, tool
from onward.runtime.compaction import CheckpointCompactor, CompactionReport
from onward.runtime.conversation import Conversation
from onward.runtime.gc import GarbageCollector
from onward.runtime.gc.postgres import PostgresRecordSweeper
from onward.runtime.gc.sqlite import SqliteRecordSweeper

OTHERS = 200


@pytest_asyncio.fixture
async def world(clustered: KafkaServers | None, tmp_path: Path) -> AsyncIterator[World]:
    async with world_of(clustered, tmp_path) as opened:
        yield opened


class Recording:
    """A scripted model that keeps every conversation it was sent."""

    def __init__(self, replies: Sequence[ModelReply]) -> None:
        self.inner = ScriptedProvider(list(replies))
        self.calls: list[list[Message]] = []

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        self.calls.append(list(messages))
        return await self.inner.complete(agent, messages)


@tool(requires_approval=True)
async def pay(amount: int, *, idempotency_key: str) -> str:
    """A payment a person approves first."""
    return f"paid {amount}"


PAYER = Agent(name="payer", instructions="pay when asked", tools=[pay])


def payer_model() -> Recording:
    return Recording(
        [
            reply("looking", ToolCall(call_id="p", tool="pay", args={"amount": 5})),
            reply("paid"),
        ]
    )


async def others(world: World, count: int = OTHERS, *, prefix: str = "other") -> None:
    """Other runs' traffic after the holder: runs of 5 model calls that finish."""
    for n in range(count):
        await world.finished_run(f"{prefix}-{n}", turns=4)


async def compact(world: World, archive: Path) -> CompactionReport:
    await world.fold()
    compactor = CheckpointCompactor(
        world.log, world.frontiers, world.store, archive=DirectoryArchive(archive)
    )
    return await compactor.compact()


async def log_records(log: EventLog) -> int:
    bounds = await log.bounds(0)
    return bounds.end - bounds.start


async def test_a_waiting_run_no_longer_holds_the_log(world: World, tmp_path: Path) -> None:
    """The first hour's example: one run waits on an approval at the start of the log, 200 runs
    finish after it; a pass cuts at least 95% of the log, and the waiting run, answered
    afterwards, goes on with its whole conversation."""
    model = payer_model()
    waiting = await world.runner(model).run(PAYER, "pay 5", tenant=TENANT, run_id="waiting")
    assert (waiting.status, waiting.waiting_on) == ("waiting", "p")
    await others(world)
    await world.fold()
    before = await log_records(world.log)
    counted = SequenceGuard().admit_all(await world.log.read_run("waiting"))
    said = Conversation.of(PAYER.instructions, [s.event for s in counted]).messages

    report = await compact(world, tmp_path / "archive")

    (part,) = report.partitions
    assert part.cut
    assert part.events_cut >= 0.95 * before, (part.events_cut, before)
    assert await log_records(world.log) <= 0.05 * before
    point = (await world.store.truncations(["waiting"]))["waiting"]
    assert not point.whole  # its row and transcript hold what resume needs
    await world.runner(model).approve("waiting", "p", tenant=TENANT, by="ann")
    done = await world.runner(model).resume(PAYER, "waiting", tenant=TENANT)
    assert done.status == "completed"
    # The model was sent the whole conversation of before the cut, then the payment's result.
    (after,) = model.calls[1:]
    assert after[: len(said)] == said
    assert len(after) > len(said)
    # Archive plus log still holds the whole history.
    whole = ArchivedEventLog(world.log, DirectoryArchive(tmp_path / "archive"))
    assert [s.event.seq for s in await whole.read_run("waiting")][:3] == [1, 2, 3]


async def test_a_frontier_over_the_cap_resumes_from_its_frontier_kept_uncapped(
    world: World, tmp_path: Path
) -> None:
    """A run whose snapshot the row refuses for size, first compacted while it still fitted:
    the projector keeps its frontier uncapped in the compaction store, so a later cut leaves
    it resumable from there (before, it was folded from its first event, which the first cut
    had taken), and the fold of its next events goes on from there too."""
    await world.live_run("big", turns=6, done=3)
    await others(world, 20)
    first = await compact(world, tmp_path / "archive")
    assert first.partitions[0].cut
    assert not (await world.store.truncations(["big"]))["big"].whole
    # Four labels of 300 KB, a frontier over the 1 MiB cap: written to the log as an older
    # Onward or another writer could have (the runner now caps a label at 200 characters),
    # each target pinned first as `tag` does.
    before = await world.runner(Script(0)).inspect("big", tenant=TENANT)
    for n in range(4):
        await world.store.pin("big", TENANT, before.resume_seq)
        label = f"{n}:" + "x" * 300_000
        await world.log.append(
            [
                Tagged(
                    run_id="big",
                    tenant=TENANT,
                    seq=before.last_seq + 1 + n,
                    fence=before.fence,
                    target_seq=before.resume_seq,
                    label=label,
                )
            ]
        )
    await others(world, 20, prefix="later")
    await world.fold()
    row = await world.frontiers.get("big")
    assert row is not None
    assert row.frontier is None
    kept = (await world.store.snapshots(["big"]))["big"]
    assert kept.last_seq == row.summary.last_seq
    # What the model must be sent: the whole history, from the archive of the first cut on.
    said = await conversation(
        ArchivedEventLog(world.log, DirectoryArchive(tmp_path / "archive")), "big"
    )

    report = await compact(world, tmp_path / "archive")

    assert report.partitions[0].cut
    assert not await world.log.read_run("big")
    assert not (await world.store.truncations(["big"]))["big"].whole
    model = Script(6)
    result = await world.runner(model).resume(AGENT, "big", tenant=TENANT)
    assert result.status == "completed"
    assert model.calls[0] == said
    await world.fold()  # a fresh projector folds the run's new events on from the kept frontier
    after = await world.store.snapshots(["big"])
    assert after["big"].status == "completed"


async def test_a_collected_run_leaves_a_tombstone_and_nothing_kept(
    world: World, tmp_path: Path
) -> None:
    """GC removed a finished run's row: its tombstone tells the compactor it finished, so its
    events are cut with nothing kept (before tombstones, a run without a row held the
    partition), and it reads as no such run."""
    await world.finished_run("old", turns=2)
    await world.fold()
    records = (
        SqliteRecordSweeper(world.log.path, sharing=world.log)
        if isinstance(world.log, SqliteEventLog)
        else PostgresRecordSweeper(world.database_url, schema=_servers(world).schema)
    )
    a_year_on = time.time() + 365 * 86_400
    async with records:
        collected = await GarbageCollector(records, clock=lambda: a_year_on).run()
    assert collected.count("frontiers") == 1
    assert await world.store.tombstones(["old", "other"]) == {"old"}
    await others(world, 20)

    report = await compact(world, tmp_path / "archive")

    assert report.partitions[0].cut
    assert "old" not in await world.store.truncations(["old"])
    assert await world.store.retained("old") == []
    with pytest.raises(NothingToResumeError):
        await world.runner(Script(0)).inspect("old", tenant=TENANT)


async def written_thread(world: World) -> CheckpointTuple:
    """Thread ``thread`` with five checkpoints, written by a saver that then lets it go; its
    latest checkpoint."""
    saver = OnwardSaver(
        world.log,
        world.leases,
        tenant=TENANT,
        frontiers=world.frontiers,
        checkpoint_inline=world.inline,
        compaction=world.store,
    )
    async with saver:
        config = generate_config("thread")
        for _ in range(5):
            config = await saver.aput(config, generate_checkpoint(), generate_metadata(), {})
        latest = await saver.aget_tuple(generate_config("thread"))
    assert latest is not None
    return latest


async def test_a_langgraph_thread_loads_its_latest_state_after_the_cut(
    world: World, tmp_path: Path
) -> None:
    """A thread is folded from its first event (each checkpoint event carries only the
    channels that changed): every event of it is retained, and a fresh saver loads its latest
    checkpoint, after the cut as before."""
    latest = await written_thread(world)
    await others(world, 40)

    report = await compact(world, tmp_path / "archive")

    assert report.partitions[0].cut
    assert (await world.store.truncations(["thread"]))["thread"].whole
    fresh = OnwardSaver(world.log, world.leases, tenant=TENANT, frontiers=world.frontiers)
    fresh.compaction = world.store
    async with fresh:
        loaded = await fresh.aget_tuple(generate_config("thread"))
        listed = [t async for t in fresh.alist(generate_config("thread"))]
    assert loaded is not None
    assert loaded.checkpoint == latest.checkpoint
    assert loaded.config == latest.config
    assert len(listed) == 5
    # Without the retained events the thread cannot be loaded, and says so.
    blind = OnwardSaver(world.log, world.leases, tenant=TENANT, frontiers=world.frontiers)
    blind.compaction = None
    async with blind:
        with pytest.raises(HistoryUnavailableError, match="thread 'thread' cannot be loaded"):
            await blind.aget_tuple(generate_config("thread"))


async def test_a_cancelled_langgraph_thread_is_kept_whole_and_carries_on_after_the_cut(
    world: World, tmp_path: Path
) -> None:
    """A cancel ends one invocation of a thread, not the thread: compaction still keeps every
    event of it, and the thread's next invocation writes on and opens its row again."""
    latest = await written_thread(world)
    writing = OnwardSaver(world.log, world.leases, tenant=TENANT, frontiers=world.frontiers)
    async with writing, writing.hold("thread"):
        assert await world.leases.ask_to_cancel("thread", tenant=TENANT, by="ops")
        # Its confirmation hears the ask; the graph run's next write ends it.
        await writing.aput_writes(latest.config, [("steps", [0])], "task")
        with pytest.raises(RunCancelledError, match="cancelled by ops"):
            await writing.aput(latest.config, generate_checkpoint(), generate_metadata(), {})
    cancelled = await world.runner(Script(0)).inspect("thread", tenant=TENANT)
    assert (cancelled.status, cancelled.error) == ("cancelled", "cancelled by ops")
    await others(world, 40)

    report = await compact(world, tmp_path / "archive")

    assert report.partitions[0].cut
    assert (await world.store.truncations(["thread"]))["thread"].whole
    fresh = OnwardSaver(world.log, world.leases, tenant=TENANT, frontiers=world.frontiers)
    fresh.compaction = world.store
    async with fresh:
        after_cut = await fresh.aget_tuple(generate_config("thread"))
        assert after_cut is not None
        await fresh.aput(after_cut.config, generate_checkpoint(), generate_metadata(), {})
        assert len([t async for t in fresh.alist(generate_config("thread"))]) == 6
    await world.fold()
    row = await world.frontiers.get("thread")
    assert row is not None
    assert row.frontier is not None
    assert (row.frontier.status, row.frontier.error) == ("new", None)


async def folded_after_release(world: World, run_id: str) -> StoredFrontier:
    """Release the run from quarantine and let a projector fold it again; its row after."""
    assert await world.frontiers.release(DEFAULT_CONSUMER, run_id, by="ops", at=1) == 1
    projection = FrontierProjection(
        world.frontiers, world.log, release_poll=0.0, every_partition=True, compaction=world.store
    )
    await LogProjector(world.log, projection).catch_up()
    assert projection.stats.released == 1
    row = await world.frontiers.get(run_id)
    assert row is not None
    return row


async def test_a_quarantined_run_is_folded_again_from_its_retained_events(
    world: World, tmp_path: Path
) -> None:
    """A run set aside for an unreadable record: the record itself is never cut (it cannot be
    archived as an event), but the run's events before it are, retained whole; a release folds
    the run again from them and holds it again on the same record."""
    await world.live_run("sick", turns=6, done=3)
    counted = len(await world.log.read_run("sick"))
    await others(world, 20)
    await _poison(world, "sick", seq=counted + 1)
    await others(world, 5, prefix="later")
    await world.fold()
    row = await world.frontiers.get("sick")
    assert row is not None
    assert row.quarantined is not None
    assert row.set_aside is not None
    assert row.set_aside.last_seq == counted

    report = await compact(world, tmp_path / "archive")

    (part,) = report.partitions
    assert part.cut
    assert part.held_by == "an unreadable record (never cut)"
    assert (await world.log.bounds(0)).start > row.set_aside.first_offset
    point = (await world.store.truncations(["sick"]))["sick"]
    assert point.whole
    assert len(await world.store.retained("sick")) == counted

    again = await folded_after_release(world, "sick")
    assert again.set_aside is not None
    assert again.set_aside.last_seq == counted  # folded from its first event, not the log's


async def test_a_run_quarantined_after_its_first_cut_is_folded_on_from_where_it_was_set_aside(
    world: World, tmp_path: Path
) -> None:
    """Cut once while it was healthy (its tags and resume points kept, not all of it), then
    set aside: a release folds it on from the frontier it had when set aside."""
    await world.live_run("sick", turns=6, done=3)
    counted = len(await world.log.read_run("sick"))
    await others(world, 10)
    assert (await compact(world, tmp_path / "archive")).partitions[0].cut
    await _poison(world, "sick", seq=counted + 1)
    await others(world, 5, prefix="later")
    await world.fold()
    row = await world.frontiers.get("sick")
    assert row is not None
    assert row.set_aside is not None
    assert row.set_aside.last_seq == counted

    again = await folded_after_release(world, "sick")
    assert again.quarantined is not None  # the record is still unreadable: held again
    assert again.set_aside is not None
    assert again.set_aside.last_seq == counted


def upgrade(monkeypatch: pytest.MonkeyPatch) -> None:
    """An upgrade of Onward: records written in the next event format read from now on."""
    newer = format_of
    monkeypatch.setattr(codec, "EVENT_FORMAT", EVENT_FORMAT + 1)
    monkeypatch.setattr(codec, "format_of", lambda tag: newer(tag) + 1)


async def test_a_run_set_aside_after_its_first_cut_keeps_what_it_held_once_it_reads(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cut once while healthy (not kept whole), then set aside for a record of a newer
    Onward, whose events the projector passes over while the run is held. After an upgrade the
    record reads and a pass cuts past it: what the held run's frontier lacks must be kept, or
    its release can never fold it again."""
    await world.live_run("sick", turns=6, done=3)
    counted = len(await world.log.read_run("sick"))
    await others(world, 10)
    assert (await compact(world, tmp_path / "archive")).partitions[0].cut
    assert not (await world.store.truncations(["sick"]))["sick"].whole
    await _poison(world, "sick", seq=counted + 1, kind="newer-format")
    await others(world, 5, prefix="later")
    await world.fold()
    held = await world.frontiers.get("sick")
    assert held is not None
    assert held.set_aside is not None
    assert held.set_aside.last_seq == counted

    upgrade(monkeypatch)
    report = await compact(world, tmp_path / "archive")

    assert report.partitions[0].cut
    assert not await world.log.read_run("sick")
    again = await folded_after_release(world, "sick")
    assert again.quarantined is None
    assert again.frontier is not None
    assert again.frontier.last_seq == counted + 1
    assert again.frontier.holder == "from-the-future"


async def _over_the_cap(world: World, run_id: str) -> int:
    """Four 300 KB labels on the run, a frontier over the 1 MiB cap (as
    `test_a_frontier_over_the_cap_resumes_from_its_frontier_kept_uncapped` writes them); the
    run's last seq after them."""
    before = await world.runner(Script(0)).inspect(run_id, tenant=TENANT)
    for n in range(4):
        await world.store.pin(run_id, TENANT, before.resume_seq)
        await world.log.append(
            [
                Tagged(
                    run_id=run_id,
                    tenant=TENANT,
                    seq=before.last_seq + 1 + n,
                    fence=before.fence,
                    target_seq=before.resume_seq,
                    label=f"{n}:" + "x" * 300_000,
                )
            ]
        )
    return before.last_seq + 4


async def test_a_quarantined_run_over_the_cap_is_released_after_a_cut(
    world: World, tmp_path: Path
) -> None:
    """A run over the snapshot cap, set aside: its row holds no frontier at all (neither a
    readable one nor the one it was set aside with), only the one kept uncapped beside it. Cut,
    then released, it is folded on from that kept frontier; before, the release read it from
    its first event, which the cut had taken, and the `LogTruncatedError` failed every batch
    of the projector, every other run's with it."""
    await world.live_run("sick", turns=6, done=3)
    counted = await _over_the_cap(world, "sick")
    await others(world, 20)
    await _poison(world, "sick", seq=counted + 1)
    await others(world, 5, prefix="later")
    await world.fold()
    row = await world.frontiers.get("sick")
    assert row is not None
    assert row.quarantined is not None
    assert (row.frontier, row.set_aside) == (None, None)  # over the cap
    held = (await world.store.snapshots(["sick"]))["sick"]
    assert held.last_seq == counted

    assert (await compact(world, tmp_path / "archive")).partitions[0].cut
    assert (await world.log.bounds(0)).start > held.first_offset

    again = await folded_after_release(world, "sick")
    assert again.quarantined is not None  # the record is still unreadable: held again
    kept = (await world.store.snapshots(["sick"]))["sick"]
    assert kept.last_seq == counted
    await world.finished_run("after", turns=1)
    await world.fold()  # the projector goes on with every other run
    assert (await world.runner(Script(0)).inspect("after", tenant=TENANT)).status == "completed"


async def test_without_retained_events_a_reader_is_told_where_they_went(
    world: World, tmp_path: Path
) -> None:
    """A reader that needs a run's whole history which compaction kept only in part (a live
    run's history, its resume points and tags kept) is refused with the archive named."""
    await world.live_run("long", turns=6, done=3)
    await others(world, 10)
    await compact(world, tmp_path / "archive")
    resumer = world.runner(Script(0)).resumer
    with pytest.raises(HistoryUnavailableError) as refused:
        await resumer._tail("long", 0, 0, (await world.log.bounds(0)).end)
    assert str(tmp_path / "archive") in str(refused.value)


def _servers(world: World) -> KafkaServers:
    assert world.servers is not None
    return world.servers


async def _poison(world: World, run_id: str, *, seq: int, kind: str = "not-json") -> Position:
    record = BAD_RECORDS[kind](run_id, seq)
    if isinstance(world.log, SqliteEventLog):
        return world.log.write_raw(run_id, record)
    servers = _servers(world)
    producer = AIOKafkaProducer(bootstrap_servers=servers.bootstrap, acks="all")
    await producer.start()
    try:
        partition = partition_for(run_id, world.log.partitions)
        sent = await producer.send_and_wait(
            servers.topic, record, key=run_id.encode(), partition=partition
        )
    finally:
        await producer.stop()
    return Position(partition, sent.offset)


class PinThenWait:
    """A compaction store whose `pin` stops, once pinned, until the test lets it go on: a tag
    caught between its pin and its `Tagged` event."""

    def __init__(self, inner: CompactionStore) -> None:
        self.inner = inner
        self.pinned = asyncio.Event()
        self.go_on = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def pin(self, run_id: str, tenant: str, seq: int) -> None:
        await self.inner.pin(run_id, tenant, seq)
        self.pinned.set()
        await self.go_on.wait()


async def a_finished_run_among_others(world: World) -> None:
    await world.finished_run("done", turns=2)
    await others(world, 10)
    await world.fold()


async def test_a_tag_on_a_finished_run_survives_a_pass(world: World, tmp_path: Path) -> None:
    await a_finished_run_among_others(world)
    assert await world.runner(Script(0)).tag("done", "answer", tenant=TENANT, seq=3) == 3
    await compact(world, tmp_path / "archive")
    kept = {r.seq: r for r in await world.store.retained("done")}
    assert kept[3].kept_as == "tag"
    assert kept[3].stored().event.seq == 3
    assert not await world.log.read_run("done")


async def test_a_pass_retains_a_target_pinned_while_the_tag_waits(
    world: World, tmp_path: Path
) -> None:
    """The tag stops between its pin and its `Tagged` event; a whole pass runs meanwhile."""
    await a_finished_run_among_others(world)
    store = PinThenWait(world.store)
    tagger = world.runner(Script(0))
    tagger.compaction = cast("CompactionStore", store)
    tagging = asyncio.create_task(tagger.tag("done", "late", tenant=TENANT, seq=2))
    await asyncio.wait_for(store.pinned.wait(), 10)
    report = await compact(world, tmp_path / "archive")
    assert report.partitions[0].cut
    store.go_on.set()
    assert await tagging == 2
    assert 2 in {r.seq for r in await world.store.retained("done")}


@dataclass
class PausedPass:
    """A compaction pass running in the background, stopped at one of its steps until
    `go_on` is set."""

    task: asyncio.Task[CompactionReport]
    go_on: asyncio.Event


async def pass_stopped_at(world: World, archive: Path, step: str) -> PausedPass:
    """Start a pass and return once it has reached ``step`` (see `Pause`)."""
    reached, go_on = asyncio.Event(), asyncio.Event()

    async def pause(at: str, partition: int) -> None:
        if at == step:
            reached.set()
            await go_on.wait()

    compactor = CheckpointCompactor(
        world.log, world.frontiers, world.store, archive=DirectoryArchive(archive), pause=pause
    )
    task = asyncio.create_task(compactor.compact())
    await asyncio.wait_for(reached.wait(), 10)
    return PausedPass(task, go_on)


async def test_a_tag_pinned_while_a_pass_plans_is_retained_before_the_cut(
    world: World, tmp_path: Path
) -> None:
    """The pass stops once it has planned (pins read); a whole tag runs meanwhile; the pass's
    transaction finds the new pin, copies its event and only then moves the point and cuts."""
    await a_finished_run_among_others(world)
    paused = await pass_stopped_at(world, tmp_path / "archive", "planned")
    assert await world.runner(Script(0)).tag("done", "late", tenant=TENANT, seq=2) == 2
    paused.go_on.set()
    report = await paused.task
    assert report.partitions[0].cut
    assert 2 in {r.seq for r in await world.store.retained("done")}
    # Only the Tagged event, written after the pass read the partition, is left in the log.
    assert [type(s.event) for s in await world.log.read_run("done")] == [Tagged]


async def test_a_tag_after_the_pass_moved_the_point_is_refused(
    world: World, tmp_path: Path
) -> None:
    """The pass stops between moving the points and the cut; a tag then is refused (its event
    is about to go and nothing kept it) and writes nothing."""
    await a_finished_run_among_others(world)
    paused = await pass_stopped_at(world, tmp_path / "archive", "archived")
    events = len(await world.log.read_run("done"))
    with pytest.raises(InvalidInputError, match="below its truncation point"):
        await world.runner(Script(0)).tag("done", "late", tenant=TENANT, seq=2)
    assert len(await world.log.read_run("done")) == events
    paused.go_on.set()
    await paused.task
    assert 2 not in {r.seq for r in await world.store.retained("done")}
