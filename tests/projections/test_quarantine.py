"""Poison records in the projector: the run is set aside, every other run is folded, a person
releases it. In memory here; the same path runs in the Kafka projector and the embedded fold
(tests/faults/)."""

from __future__ import annotations

import logging
import random

import msgspec
import pytest
from support.histories import RunScript, append_all, fold_each, workload
from support.poison import BAD_RECORDS, REASONS, newer_format, tolerant_direct_fold

from onward.errors import EventDecodeError
from onward.eventlog import Event, MemoryEventLog, Position, UnreadableRecord, codec
from onward.eventlog.base import StoredEvent, partition_for
from onward.projections.base import DEFAULT_CONSUMER, released_mark
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.log_projector import LogProjector
from onward.projections.memory import MemoryFrontierStore
from onward.testing.eventlog import runs_in_partition


class World:
    """One partition: other runs, and run A with a poison record after its first steps."""

    def __init__(self, rng: random.Random) -> None:
        self.log = MemoryEventLog(partitions=1)
        self.store = MemoryFrontierStore()
        self.rng = rng
        self.a = RunScript(rng)
        self.a_steps = self.a.steps()
        self.others = workload(rng, 20)

    def projection(self) -> FrontierProjection:
        return FrontierProjection(self.store, self.log, release_poll=0.0, every_partition=True)

    async def write(self, bad: str, *, before: int = 2, after: bool = True) -> Position:
        half = len(self.others) // 2
        await append_all(self.log, self.others[:half], concurrency=1)
        for step in self.a_steps[:before]:
            await self.log.append(step)
        seq = self.a_steps[before][0].seq if before < len(self.a_steps) else 99
        position = self.log.write_raw(self.a.run_id, BAD_RECORDS[bad](self.a.run_id, seq))
        await append_all(self.log, self.others[half:], concurrency=1)
        if after:
            for step in self.a_steps[before:]:
                await self.log.append(step)
        return position

    def events_of_a(self, steps: list[list[Event]]) -> int:
        return sum(len(step) for step in steps)

    def other_ids(self) -> list[str]:
        return list(dict.fromkeys(step[0].run_id for step in self.others))


@pytest.mark.parametrize("bad", sorted(BAD_RECORDS))
async def test_a_poison_record_sets_its_run_aside_and_every_other_run_is_folded(
    bad: str, rng: random.Random, caplog: pytest.LogCaptureFixture
) -> None:
    world = World(rng)
    position = await world.write(bad)
    projection = world.projection()
    with caplog.at_level(logging.WARNING, logger="onward.projector"):
        await LogProjector(world.log, projection).catch_up()

    expected, _ = await tolerant_direct_fold(world.log, world.other_ids())
    loaded = await world.store.load(world.other_ids())
    assert {r: row.frontier for r, row in loaded.items()} == expected
    assert all(row.quarantined is None for row in loaded.values())

    (entry,) = await world.store.quarantined(DEFAULT_CONSUMER)
    assert (entry.run_id, entry.partition, entry.offset, entry.state) == (
        world.a.run_id,
        0,
        position.offset,
        "held",
    )
    assert REASONS[bad] in entry.reason
    assert "hunter2" not in entry.reason
    row = await world.store.get(world.a.run_id)
    assert row is not None
    assert row.quarantined == entry.mark
    assert row.frontier is None
    assert row.summary.last_seq == world.events_of_a(world.a_steps[:2])
    assert row.summary.through_offset < position.offset

    stats = projection.stats
    assert stats.quarantined == 1
    assert stats.quarantine_skipped == world.events_of_a(world.a_steps[2:])
    (line,) = [r for r in caplog.records if "quarantined" in r.getMessage()]
    assert f"offset {position.offset}" in line.getMessage()
    assert line.exc_info is None
    assert await world.store.positions(DEFAULT_CONSUMER) == {0: (await world.log.bounds(0)).end}


async def test_a_restarted_projector_keeps_the_run_aside(rng: random.Random) -> None:
    world = World(rng)
    await world.write("unknown-kind", after=False)
    await LogProjector(world.log, world.projection()).catch_up()
    before = await world.store.get(world.a.run_id)
    for step in world.a_steps[2:]:
        await world.log.append(step)
    again = world.projection()
    await LogProjector(world.log, again).catch_up()
    assert await world.store.get(world.a.run_id) == before
    assert again.stats.quarantine_skipped == world.events_of_a(world.a_steps[2:])
    assert world.a.run_id in again.held


async def test_a_release_of_a_still_unreadable_run_holds_it_again_once(
    rng: random.Random, caplog: pytest.LogCaptureFixture
) -> None:
    world = World(rng)
    await world.write("not-json")
    projection = world.projection()
    projector = LogProjector(world.log, projection)
    await projector.catch_up()
    assert await world.store.release(DEFAULT_CONSUMER, world.a.run_id, by="ops", at=1) == 1
    row = await world.store.get(world.a.run_id)
    assert row is not None
    assert row.quarantined == released_mark("ops")
    assert row.set_aside is not None
    first = row.set_aside.first_offset
    assert first >= 0

    with caplog.at_level(logging.INFO, logger="onward.projector"):
        await projector.catch_up()
        await projector.catch_up()
    assert f"folded again from offset {first} " in caplog.text
    assert projection.stats.released == 1
    assert projection.stats.quarantined == 2
    (entry,) = await world.store.quarantined(DEFAULT_CONSUMER)
    assert entry.state == "held"
    row = await world.store.get(world.a.run_id)
    assert row is not None
    assert row.quarantined == entry.mark
    assert row.summary.last_seq == world.events_of_a(world.a_steps[:2])


async def test_a_release_once_the_record_reads_folds_the_whole_run(rng: random.Random) -> None:
    world = World(rng)
    position = await world.write("newer-format", before=len(world.a_steps) - 1, after=False)
    projection = world.projection()
    projector = LogProjector(world.log, projection)
    await projector.catch_up()
    run_id = world.a.run_id
    assert [e.state for e in await world.store.quarantined(DEFAULT_CONSUMER)] == ["held"]
    # An upgrade: the record now reads (here: the same claim, in this code's format).
    claim = msgspec.json.decode(newer_format(run_id, 0))
    seq = world.a_steps[-1][0].seq
    readable = msgspec.json.encode({**claim, "seq": seq, "format": 1})
    world.log._records[0][position.offset] = (run_id, readable)
    await world.store.release(DEFAULT_CONSUMER, run_id, by="ops", at=1)

    await projector.catch_up()
    (entry,) = await world.store.quarantined(DEFAULT_CONSUMER, states=None)
    assert entry.state == "cleared"
    row = await world.store.get(run_id)
    assert row is not None
    assert row.quarantined is None
    expected, _ = await tolerant_direct_fold(world.log, [run_id])
    assert row.frontier == expected[run_id]
    assert row.frontier.holder == "from-the-future"
    assert projection.held == {}


async def test_a_record_that_names_no_run_is_listed_and_passed_over() -> None:
    store = MemoryFrontierStore()
    projection = FrontierProjection(store, MemoryEventLog(partitions=1))
    nameless = UnreadableRecord(
        Position(0, 0), None, None, None, EventDecodeError("unreadable event record: malformed")
    )
    await projection.apply({0: [nameless]}, {0: 1})
    await projection.flush()
    (entry,) = await store.quarantined(DEFAULT_CONSUMER)
    assert (entry.run_id, entry.offset) == (None, 0)
    assert await store.positions(DEFAULT_CONSUMER) == {0: 1}
    assert projection.held == {}


async def test_a_release_is_never_cleared_short_of_the_unreadable_record(
    rng: random.Random,
) -> None:
    """Two processes fold one store (embedded workers sharing a file), each catching up the
    partitions of its own runs. One last learned where another's partition stood before the
    other set a run aside there; released, the run must not be folded again only that far:
    every record read is fine, and the run would be cleared while the record is still
    unreadable. It is held again, by whichever process folds it past the record."""
    log = MemoryEventLog(partitions=2)
    store = MemoryFrontierStore()
    a = RunScript(rng)
    (a.run_id,) = runs_in_partition(1, 1, partitions=2)
    steps = a.steps()
    other = RunScript(rng)
    (other.run_id,) = runs_in_partition(0, 1, partitions=2)
    for step in steps[:2] + other.steps()[:1]:
        await log.append(step)

    def projector() -> LogProjector:
        return LogProjector(
            log, FrontierProjection(store, log, release_poll=0.0, every_partition=True)
        )

    ahead, behind = projector(), projector()
    await ahead.catch_up()
    await behind.catch_up([0])
    log.write_raw(a.run_id, BAD_RECORDS["not-json"](a.run_id, steps[2][0].seq))
    for step in steps[2:]:
        await log.append(step)
    await ahead.catch_up([1])
    assert [e.state for e in await store.quarantined(DEFAULT_CONSUMER)] == ["held"]

    assert await store.release(DEFAULT_CONSUMER, a.run_id, by="ops", at=1) == 1
    await behind.catch_up([0])
    (entry,) = await store.quarantined(DEFAULT_CONSUMER)
    assert entry.state != "cleared"
    row = await store.get(a.run_id)
    assert row is not None
    assert row.quarantined is not None

    await ahead.catch_up([1])
    (entry,) = await store.quarantined(DEFAULT_CONSUMER)
    assert entry.state == "held"
    row = await store.get(a.run_id)
    assert row is not None
    assert row.quarantined == entry.mark


async def test_a_run_another_projector_folded_again_is_folded_on_not_skipped(
    rng: random.Random,
) -> None:
    """Two processes fold one store (embedded workers sharing a file). One set a run aside and
    keeps it as set aside; once the record reads (an upgrade), a person releases the run and
    the other process, catching up with nothing new to fold, folds it again. The run's later
    events must then be folded by whichever process reads them, not skipped as set aside."""
    world = World(rng)
    last = world.a_steps[-1]
    position = await world.write("newer-format", before=len(world.a_steps) - 1, after=False)
    run_id = world.a.run_id
    first = LogProjector(world.log, world.projection())
    await first.catch_up()
    assert [e.state for e in await world.store.quarantined(DEFAULT_CONSUMER)] == ["held"]
    second = LogProjector(world.log, world.projection())
    await second.catch_up()

    claim = msgspec.json.decode(newer_format(run_id, 0))
    readable = msgspec.json.encode({**claim, "seq": last[0].seq, "format": 1})
    world.log._records[0][position.offset] = (run_id, readable)
    assert await world.store.release(DEFAULT_CONSUMER, run_id, by="ops", at=1) == 1
    await second.catch_up()
    assert [e.state for e in await world.store.quarantined(DEFAULT_CONSUMER)] == ["cleared"]

    await world.log.append([msgspec.structs.replace(e, seq=e.seq + 1) for e in last])
    await first.catch_up()
    row = await world.store.get(run_id)
    assert row is not None
    assert row.summary.last_seq == last[-1].seq + 1
    expected, _ = await tolerant_direct_fold(world.log, [run_id])
    assert row.frontier == expected[run_id]


async def test_a_release_folded_again_elsewhere_reads_the_run_up_to_the_stored_position(
    rng: random.Random,
) -> None:
    """Two processes fold one store (embedded workers sharing a file), each catching up the
    partitions of its own runs. One set a run aside and skipped its later events; once the
    record reads (an upgrade), a person releases the run, and the other process folds it
    again. It must fold the run up to where the partition is stored, not only as far as it
    last read the positions: the events skipped past that are never read again otherwise."""
    log = MemoryEventLog(partitions=2)
    store = MemoryFrontierStore()
    a = RunScript(rng)
    (a.run_id,) = runs_in_partition(1, 1, partitions=2)
    steps = a.steps()
    other = RunScript(rng)
    (other.run_id,) = runs_in_partition(0, 1, partitions=2)
    for step in steps[:-1] + other.steps()[:1]:
        await log.append(step)
    last = steps[-1]
    position = log.write_raw(a.run_id, newer_format(a.run_id, last[0].seq))

    def projector() -> LogProjector:
        return LogProjector(
            log, FrontierProjection(store, log, release_poll=0.0, every_partition=True)
        )

    ahead, behind = projector(), projector()
    await ahead.catch_up()
    await behind.catch_up([0])
    await log.append([msgspec.structs.replace(e, seq=e.seq + 1) for e in last])
    await ahead.catch_up([1])
    assert [e.state for e in await store.quarantined(DEFAULT_CONSUMER)] == ["held"]

    claim = msgspec.json.decode(newer_format(a.run_id, 0))
    readable = msgspec.json.encode({**claim, "seq": last[0].seq, "format": 1})
    log._records[1][position.offset] = (a.run_id, readable)
    assert await store.release(DEFAULT_CONSUMER, a.run_id, by="ops", at=1) == 1
    await behind.catch_up([0])
    assert [e.state for e in await store.quarantined(DEFAULT_CONSUMER)] == ["cleared"]
    row = await store.get(a.run_id)
    assert row is not None
    assert row.summary.last_seq == last[-1].seq + 1
    expected, _ = await tolerant_direct_fold(log, [a.run_id])
    assert row.frontier == expected[a.run_id]


async def test_a_misfiled_record_is_not_filed_under_the_tenant_of_the_run_it_names() -> None:
    """An event of another tenant's run filed under run r1 (a foreign producer's key) set r1
    aside under that other tenant: r1's row was listed to it, and its quarantine entry named
    it. The record's tenant is that of the run it names, not of the run it was filed under."""
    log, store = MemoryEventLog(partitions=1), MemoryFrontierStore()
    foreign = {"kind": "run.claimed", "run_id": "theirs", "tenant": "globex", "seq": 1}
    log.write_raw("r1", msgspec.json.encode(foreign | {"fence": 1, "worker": "misfiled"}))
    await LogProjector(log, FrontierProjection(store, log, release_poll=0.0)).catch_up()
    assert [s.run_id for s in await store.runs(tenant="globex")] == []
    (entry,) = await store.quarantined(DEFAULT_CONSUMER)
    assert entry.run_id == "r1"
    assert not entry.tenant  # unknown: nothing readable of r1 names its tenant


async def test_a_record_in_another_partition_than_its_run_s_leaves_the_run_folded_on(
    rng: random.Random,
) -> None:
    """A copy of a run's event produced into another partition (a tool that partitions keys
    otherwise, a mirror) was folded as the run's: the row took that partition's offset as how
    far the run was folded, and skipped the run's own later events, stuck at its first. The
    run's history is its own partition's (what a resume reads); the stray record is listed
    under no run, naming the run and both partitions, and the run is folded on."""
    log, store = MemoryEventLog(partitions=2), MemoryFrontierStore()
    a = RunScript(rng)
    steps = a.steps()
    home = partition_for(a.run_id, 2)
    other = RunScript(random.Random(7))
    while partition_for(other.run_id, 2) == home:
        other = RunScript(random.Random(rng.getrandbits(32)))
    for step in other.steps():
        await log.append(step)  # the other partition's offsets run ahead of the run's own
    await log.append(steps[0])
    (first,) = await log.read_records(home, run_id=a.run_id)
    assert isinstance(first, StoredEvent)
    log._records[1 - home].append((a.run_id, codec.encode(first.event)))  # foreign producer
    projection = FrontierProjection(store, log, release_poll=0.0)
    await LogProjector(log, projection).catch_up()
    for step in steps[1:]:
        await log.append(step)
    await LogProjector(log, projection).catch_up()

    own = [r for r in await log.read_records(home, run_id=a.run_id) if isinstance(r, StoredEvent)]
    expected, _ = fold_each({a.run_id: own}, [a.run_id])
    row = (await store.load([a.run_id]))[a.run_id]
    assert row.frontier is not None
    assert row.frontier.last_seq == own[-1].event.seq
    assert row.frontier == expected[a.run_id]
    assert (row.summary.partition, row.quarantined) == (home, None)
    (entry,) = await store.quarantined(DEFAULT_CONSUMER)
    assert (entry.run_id, entry.partition) == (None, 1 - home)
    assert f"run {a.run_id!r}" in entry.reason
    assert f"partition {home}" in entry.reason
