"""The Kafka projector against real Kafka and PostgreSQL, in this process."""

from __future__ import annotations

import asyncio
import gc
import random
import uuid
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.consumer import fetcher
from support.histories import (
    RunScript,
    append_all,
    assert_stored_is_the_direct_fold,
    assert_stored_is_what_the_scripts_wrote,
    direct_fold,
    run_ids_of,
    workload,
)
from support.kafka import group_members
from support.poison import newer_format

from onward.errors import BackendUnavailableError, InvalidInputError
from onward.eventlog import Event, KafkaEventLog, ToolCompleted
from onward.projections.base import released_mark
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.kafka import KafkaProjector, _Seeker, _Turns
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.rebuild import rebuild_frontiers
from onward.testing.eventlog import runs_in_partition

pytestmark = pytest.mark.kafka
PARTITIONS = 4


@dataclass
class Stack:
    log: KafkaEventLog
    store: PostgresFrontierStore
    schema: str
    topic: str
    bootstrap: str
    database_url: str

    def projector(self, **options: object) -> KafkaProjector[FrontierProjection]:
        return KafkaProjector(
            self.bootstrap,
            FrontierProjection(self.store, self.log, **options),  # type: ignore[arg-type]
            topic=self.topic,
            partitions=PARTITIONS,
            group_id=f"g-{uuid.uuid4().hex[:8]}",
        )

    async def fold_everything(self, **options: object) -> KafkaProjector[FrontierProjection]:
        """Run a new projector until it has stored every partition's end; return it closed."""
        projector = self.projector(**options)
        await projector.start()
        try:
            await drain(projector, self.log)
        finally:
            await projector.close()
        return projector


@pytest_asyncio.fixture
async def stack(
    kafka_bootstrap: str, kafka_topic: str, database_url: str, pg_schema: str
) -> AsyncIterator[Stack]:
    async with (
        KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=PARTITIONS) as log,
        PostgresFrontierStore(database_url, schema=pg_schema) as store,
    ):
        yield Stack(log, store, pg_schema, kafka_topic, kafka_bootstrap, database_url)


async def drain(
    projector: KafkaProjector[FrontierProjection], log: KafkaEventLog, *, within: float = 60
) -> None:
    """Fold until the stored positions reach every partition's end."""
    ends = {p: (await log.bounds(p)).end for p in range(PARTITIONS)}
    deadline = asyncio.get_running_loop().time() + within
    while True:
        stored = await projector.projection.positions()
        if all(stored.get(p, 0) >= end for p, end in ends.items()):
            return
        assert asyncio.get_running_loop().time() < deadline, f"stuck at {stored}, ends {ends}"
        await projector.step(timeout_ms=200)


async def test_frontiers_equal_the_direct_fold(stack: Stack, rng: random.Random) -> None:
    steps = workload(rng, 60)
    await append_all(stack.log, steps)
    await stack.fold_everything()
    await assert_stored_is_the_direct_fold(stack.store, stack.log, run_ids_of(steps))
    await assert_stored_is_what_the_scripts_wrote(stack.store, steps)


async def test_a_restarted_projector_carries_on_from_its_stored_offsets(
    stack: Stack, rng: random.Random
) -> None:
    first, second = workload(rng, 20), workload(rng, 20)
    await append_all(stack.log, first)
    folded_events = (await stack.fold_everything()).projection.stats.events
    await append_all(stack.log, second)
    again = await stack.fold_everything()
    assert folded_events == sum(len(s) for s in first)
    assert again.projection.stats.events == sum(len(s) for s in second)
    await assert_stored_is_the_direct_fold(stack.store, stack.log, run_ids_of(first + second))


async def test_superseded_fence_events_are_refused_counted_and_visible(
    stack: Stack, rng: random.Random
) -> None:
    script = RunScript(rng, zombie=True)
    steps = script.steps()
    await append_all(stack.log, steps)
    projector = await stack.fold_everything()
    row = await stack.store.get(script.run_id)
    assert row is not None
    assert row.frontier is not None
    assert row.summary.refused == 1
    assert row.frontier.fence == 2
    assert row.frontier.last_refusal is not None
    assert "fence 1 is below fence 2" in row.frontier.last_refusal
    assert "zombie-call" not in {r.call_id for r in await stack.store.tool_calls(script.run_id)}
    assert projector.projection.stats.refused_events == 1


async def test_an_oversized_frontier_is_refused_and_the_projector_goes_on(
    stack: Stack, rng: random.Random
) -> None:
    big = RunScript(rng)
    steps = big.steps()
    # A completed call with a result far over the cap, in the middle of a turn.
    answered = next(i for i, s in enumerate(steps) if s[0].__class__.__name__ == "ModelAnswered")
    others = workload(rng, 10)
    await append_all(stack.log, steps[: answered + 1] + others)
    huge = ToolCompleted(
        run_id=big.run_id,
        tenant="acme",
        seq=steps[answered][0].seq + 1,
        fence=1,
        call_id="huge",
        result="z" * 300_000,
    )
    await stack.log.append([huge])
    projector = stack.projector(max_bytes=100_000)
    await projector.start()
    try:
        await drain(projector, stack.log)
        row = await stack.store.get(big.run_id)
        assert row is not None
        assert row.frontier is None
        assert row.snapshot_error is not None
        assert "cap" in row.snapshot_error
        assert projector.projection.stats.snapshots_refused == 1
        others_ids = run_ids_of(others)
        expected, _ = await direct_fold(stack.log, others_ids)
        loaded = await stack.store.load(others_ids)
        assert {r: row.frontier for r, row in loaded.items()} == expected
    finally:
        await projector.close()


async def test_rebuild_while_the_projector_runs_ends_identical_and_switched(
    stack: Stack, rng: random.Random
) -> None:
    steps = workload(rng, 80)
    await append_all(stack.log, steps[: len(steps) // 2])
    live = stack.projector()
    await live.start()
    stop = asyncio.Event()
    running = asyncio.create_task(live.run(stop))
    try:
        writer = asyncio.create_task(append_all(stack.log, steps[len(steps) // 2 :]))
        report = await rebuild_frontiers(stack.log, stack.database_url, schema=stack.schema)
        await writer
        assert (report.build, report.previous) == (2, 1)
        conn = await asyncpg.connect(
            stack.database_url, server_settings={"search_path": stack.schema}
        )
        try:
            view = await conn.fetchval("SELECT pg_get_viewdef('onward_frontiers')")
            assert "onward_frontiers_2" in view
            for _ in range(300):
                stored = await stack.store.positions("frontiers")
                ends = {p: (await stack.log.bounds(p)).end for p in range(PARTITIONS)}
                if stack.store.build == 2 and all(stored.get(p, 0) >= e for p, e in ends.items()):
                    break
                await asyncio.sleep(0.1)
            run_ids = run_ids_of(steps)
            expected, _ = await direct_fold(stack.log, run_ids)
            old = await PostgresFrontierStore.open(stack.database_url, schema=stack.schema, build=1)
            try:
                old_rows = await old.load(run_ids)
            finally:
                await old.close()
            new_rows = await stack.store.load(run_ids)
            assert {r: row.frontier for r, row in new_rows.items()} == expected
            # The old build stays as it was when the live projector moved on: a prefix of the
            # log that the rebuild also covered, so it agrees on every run it finished.
            for run_id, row in old_rows.items():
                assert row.frontier is not None
                if row.frontier.status == "completed":
                    assert row.frontier == expected[run_id]
            assert await conn.fetchval("SELECT count(*) FROM onward_frontiers") == len(run_ids)
        finally:
            await conn.close()
    finally:
        stop.set()
        await running
        await live.close()


async def test_a_deferring_projector_stores_everything_once_it_has_caught_up(
    stack: Stack, rng: random.Random
) -> None:
    steps = workload(rng, 40)
    await append_all(stack.log, steps)
    projector = stack.projector(flush_events=10_000_000, flush_interval=3600)
    await projector.start()
    stop = asyncio.Event()
    running = asyncio.create_task(projector.run(stop))
    try:
        ends = {p: (await stack.log.bounds(p)).end for p in range(PARTITIONS)}
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            # The positions are visible once the store's transaction commits, a moment before
            # the projection hears its write came back; both must come.
            stored = await projector.projection.positions()
            if (
                all(stored.get(p, 0) >= end for p, end in ends.items())
                and projector.projection.pending_events == 0
            ):
                break
            assert asyncio.get_running_loop().time() < deadline, (
                f"caught up but never stored: stored {stored} of {ends}, "
                f"{projector.projection.pending_events} events pending"
            )
            assert not running.done(), running
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await running
        await projector.close()
    await assert_stored_is_the_direct_fold(stack.store, stack.log, run_ids_of(steps))


async def test_a_caught_up_projector_stores_a_trickle_at_most_once_per_interval(
    stack: Stack, rng: random.Random, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One PostgreSQL transaction per ``caught_up_store_s`` under a trickle, not one per
    fetch; and once the trickle stops, everything is stored within that interval."""
    steps = workload(rng, 6)
    projector = KafkaProjector(
        stack.bootstrap,
        FrontierProjection(stack.store, stack.log),
        topic=stack.topic,
        partitions=PARTITIONS,
        group_id=f"g-{uuid.uuid4().hex[:8]}",
        caught_up_store_s=0.5,
    )
    stores = 0
    write = stack.store.write

    async def counted(*args: Any, **kwargs: Any) -> None:
        nonlocal stores
        stores += 1
        await write(*args, **kwargs)

    monkeypatch.setattr(stack.store, "write", counted)
    await projector.start()
    stop = asyncio.Event()
    running = asyncio.create_task(projector.run(stop))
    try:
        started = asyncio.get_running_loop().time()
        for step in steps:  # one run's step at a time, each its own append and fetch
            await stack.log.append(step)
            await asyncio.sleep(0.02)
        trickled = asyncio.get_running_loop().time() - started
        ends = {p: (await stack.log.bounds(p)).end for p in range(PARTITIONS)}
        deadline = asyncio.get_running_loop().time() + 5
        while True:
            stored = await stack.store.positions("frontiers")
            if all(stored.get(p, 0) >= end for p, end in ends.items()):
                break
            assert asyncio.get_running_loop().time() < deadline, "never stored the trickle"
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await running
        await projector.close()
    assert len(steps) > 40
    assert stores <= trickled / 0.5 + 3, (stores, len(steps), trickled)
    await assert_stored_is_the_direct_fold(stack.store, stack.log, run_ids_of(steps))


async def test_a_batch_of_a_partition_revoked_since_its_fetch_is_judged_without_it(
    stack: Stack, rng: random.Random
) -> None:
    """A rebalance can revoke a partition between the fetch of its records and the check of
    whether the batch reached the log's end: the client knows no end for it then (aiokafka
    asserts), and a group member that asked crashed. The check passes over it."""
    await append_all(stack.log, workload(rng, 4))
    projector = stack.projector()
    await projector.start()
    try:
        await drain(projector, stack.log)
        ends = {p: (await stack.log.bounds(p)).end for p in range(PARTITIONS)}
        revoked = PARTITIONS + 1
        assert projector._caught_up({}, {**ends, revoked: 1})
        behind = {p: max(0, end - 3) for p, end in ends.items()}
        assert not projector._caught_up({}, {**behind, revoked: 1})
    finally:
        await projector.close()


async def test_a_negative_store_interval_is_refused(stack: Stack) -> None:
    with pytest.raises(InvalidInputError, match="caught_up_store_s"):
        KafkaProjector(
            stack.bootstrap,
            FrontierProjection(stack.store, stack.log),
            topic=stack.topic,
            caught_up_store_s=-1,
        )


async def test_a_store_failing_inside_a_rebalance_is_raised_by_the_next_call(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, rng: random.Random
) -> None:
    await append_all(stack.log, workload(rng, 10))
    projector = stack.projector(flush_events=10_000_000, flush_interval=3600)
    await projector.start()
    try:
        deadline = asyncio.get_running_loop().time() + 30
        while projector.projection.pending_events == 0:
            assert asyncio.get_running_loop().time() < deadline, "nothing was folded"
            await projector.step(timeout_ms=200)

        async def unavailable(*args: object, **options: object) -> None:
            raise BackendUnavailableError("PostgreSQL went away")

        monkeypatch.setattr(projector.projection.store, "write", unavailable)
        await projector._flush_before_rebalance()  # what the revocation listener runs
        assert projector.projection.pending_events == 0
        with pytest.raises(BackendUnavailableError, match="went away"):
            await projector.step(timeout_ms=200)
    finally:
        await projector.close()
    assert await stack.store.positions("frontiers") == {}


async def test_a_rebuild_fills_the_transcript_it_shares_with_every_build(
    stack: Stack, rng: random.Random
) -> None:
    steps = workload(rng, 20)
    await append_all(stack.log, steps)
    await stack.fold_everything()
    run_ids = run_ids_of(steps)
    expected, _ = await direct_fold(stack.log, run_ids)
    before = {
        run_id: await stack.store.transcript(run_id, tenant="acme", through=frontier.last_seq)
        for run_id, frontier in expected.items()
    }
    conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": stack.schema})
    try:
        await conn.execute("DELETE FROM onward_transcript")
        await rebuild_frontiers(stack.log, stack.database_url, schema=stack.schema)
        assert await conn.fetchval("SELECT count(*) FROM onward_transcript") > 0
    finally:
        await conn.close()
    for run_id, frontier in expected.items():
        rows = await stack.store.transcript(run_id, tenant="acme", through=frontier.last_seq)
        assert len(rows) == frontier.messages > 0
        assert rows == before[run_id]


class BatchLog:
    """Which partitions each batch a projector folded held, in order, and which the client had
    paused as it was folded; each fold slowed by ``delay_s`` so a backlog takes several turns."""

    def __init__(self, projector: KafkaProjector[FrontierProjection], delay_s: float = 0.0) -> None:
        self.partitions: list[set[int]] = []
        self.paused: list[set[int]] = []
        self._projector = projector
        self._apply = projector.projection.apply
        self._delay_s = delay_s
        projector.projection.apply = self.apply  # type: ignore[method-assign]

    async def apply(self, records: Any, next_offsets: Any) -> None:
        self.partitions.append({p for p, items in records.items() if items})
        self.paused.append({tp.partition for tp in self._projector._live().paused()})
        await asyncio.sleep(self._delay_s)
        await self._apply(records, next_offsets)

    def stretches(self) -> dict[int, int]:
        """Per partition, how many unbroken stretches of batches it was folded in."""
        counts: dict[int, int] = {}
        before: set[int] = set()
        for held in self.partitions:
            for partition in held - before:
                counts[partition] = counts.get(partition, 0) + 1
            before = held
        return counts

    def first_and_last(self) -> dict[int, tuple[int, int]]:
        """Per partition, the index of the first and the last batch that held it."""
        seen: dict[int, tuple[int, int]] = {}
        for index, held in enumerate(self.partitions):
            for partition in held:
                seen[partition] = (seen.get(partition, (index, index))[0], index)
        return seen


async def run_until_stored(
    projectors: list[KafkaProjector[FrontierProjection]], log: KafkaEventLog, *, within: float = 60
) -> None:
    """Run started projectors until their group stored every partition's end; then stop them."""
    stop = asyncio.Event()
    running = [asyncio.create_task(p.run(stop)) for p in projectors]
    try:
        ends = {p: (await log.bounds(p)).end for p in range(PARTITIONS)}
        deadline = asyncio.get_running_loop().time() + within
        while True:
            stored = await projectors[0].projection.positions()
            if all(stored.get(p, 0) >= end for p, end in ends.items()):
                break
            assert asyncio.get_running_loop().time() < deadline, f"stuck at {stored} of {ends}"
            assert not any(task.done() for task in running), running
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.gather(*running)


def taking_turns(
    stack: Stack, *, slice_s: float | None, group_id: str | None = None
) -> KafkaProjector[FrontierProjection]:
    return KafkaProjector(
        stack.bootstrap,
        FrontierProjection(stack.store, stack.log),
        topic=stack.topic,
        partitions=PARTITIONS,
        group_id=group_id or f"g-{uuid.uuid4().hex[:8]}",
        batch_records=10,
        focus_slice_s=slice_s,
    )


def turns_of(projector: KafkaProjector[FrontierProjection]) -> _Turns:
    turns = projector._turns
    assert turns is not None
    return turns


async def until_it_holds_every_partition(
    projector: KafkaProjector[FrontierProjection], who: str = "the projector"
) -> None:
    """Step a started ``projector`` until the group assigned it every partition."""
    deadline = asyncio.get_running_loop().time() + 30
    while len(projector._live().assignment()) < PARTITIONS:
        assert asyncio.get_running_loop().time() < deadline, f"{who} never joined"
        await projector.step(timeout_ms=100)


@dataclass
class HeldLook:
    """A projector whose consumer's first look at how far behind it is (`end_offsets`) waits
    until the test sets ``rebalanced``; ``looking`` is set once that look begins."""

    projector: KafkaProjector[FrontierProjection]
    consumer: AIOKafkaConsumer
    group_id: str
    looking: asyncio.Event
    rebalanced: asyncio.Event


@asynccontextmanager
async def a_projector_whose_first_look_is_held(
    stack: Stack, rng: random.Random
) -> AsyncIterator[HeldLook]:
    """A projector taking turns, alone in its group and holding every partition of a backlog,
    whose first look is held (`HeldLook`); closed after the block."""
    await append_all(stack.log, workload(rng, 12))
    group_id = f"g-{uuid.uuid4().hex[:8]}"
    projector = taking_turns(stack, slice_s=60, group_id=group_id)
    await projector.start()
    try:
        await until_it_holds_every_partition(projector)
        consumer = projector._live()
        end_offsets = consumer.end_offsets
        looking, rebalanced = asyncio.Event(), asyncio.Event()

        async def end_offsets_after_a_rebalance(partitions: list[TopicPartition]) -> Any:
            if not looking.is_set():
                looking.set()
                await rebalanced.wait()
            return await end_offsets(partitions)

        consumer.end_offsets = end_offsets_after_a_rebalance
        yield HeldLook(projector, consumer, group_id, looking, rebalanced)
    finally:
        await projector.close()


@asynccontextmanager
async def another_member(stack: Stack, group_id: str, topic: str) -> AsyncIterator[None]:
    """For the block, a member of ``group_id`` reading ``topic``, not the log's: the group
    rebalances, and the projector keeps its partitions, assigned anew (without positions)."""
    async with KafkaEventLog(stack.bootstrap, topic=topic, partitions=1):
        other = AIOKafkaConsumer(topic, bootstrap_servers=stack.bootstrap, group_id=group_id)
        await other.start()
        try:
            yield
        finally:
            await other.stop()


async def test_a_projector_behind_in_every_partition_folds_them_one_at_a_time(
    stack: Stack, rng: random.Random
) -> None:
    """Behind in every partition, all but one wait paused from the first fetch on; each is
    folded in one stretch (and at most the few records it was within a batch of when its turn
    passed on, in a second), not mixed with the others: the runs in play are one partition's."""
    steps = workload(rng, 40)
    await append_all(stack.log, steps)
    assert min([(await stack.log.bounds(p)).end for p in range(PARTITIONS)]) > 50
    projector = taking_turns(stack, slice_s=60)
    batches = BatchLog(projector)
    await projector.start()
    try:
        await run_until_stored([projector], stack.log)
        assert not turns_of(projector).waiting
    finally:
        await projector.close()
    assert len(batches.partitions) > 4 * PARTITIONS
    (first,) = batches.partitions[0]
    assert batches.paused[0] == set(range(PARTITIONS)) - {first}
    # A batch fetched just before a turn passed on is folded just after it: only those hold a
    # partition that is paused.
    pairs = list(zip(batches.partitions, batches.paused, strict=True))
    assert sum(not held.isdisjoint(paused) for held, paused in pairs) <= PARTITIONS, pairs
    assert set(batches.stretches()) == set(range(PARTITIONS))
    assert max(batches.stretches().values()) <= 2, batches.partitions
    assert sum(len(held) > 1 for held in batches.partitions) <= PARTITIONS, batches.partitions
    await assert_stored_is_the_direct_fold(stack.store, stack.log, run_ids_of(steps))


async def test_a_seek_the_fetcher_asks_for_waits_for_the_assignment_s_seek(
    stack: Stack, rng: random.Random
) -> None:
    """The fetcher asks for a seek (it found no offset) while the assignment's own seek is
    still reading the stored positions: the two seeks take turns. Interleaved, the assignment's
    seek, finishing last, moved a partition back under records already handed out (they were
    fetched twice) and paused every partition while they were folded."""
    await append_all(stack.log, workload(rng, 12))
    projector = taking_turns(stack, slice_s=60)
    projection = projector.projection
    positions = projection.positions
    reading, release = asyncio.Event(), asyncio.Event()

    async def slow_positions() -> dict[int, int]:
        if not reading.is_set():
            reading.set()
            await release.wait()
        return await positions()

    seeks_done = 0
    seek = projector._seek_to_stored

    async def counted_seek(assigned: list[TopicPartition]) -> None:
        nonlocal seeks_done
        await seek(assigned)
        seeks_done += 1

    projection.positions = slow_positions  # type: ignore[method-assign]
    projector._seek_to_stored = counted_seek  # type: ignore[method-assign]
    await projector.start()
    try:
        await asyncio.wait_for(reading.wait(), 30)
        asked = asyncio.create_task(projector._seek_to_stored(list(projector._live().assignment())))
        fetching = asyncio.create_task(projector._fetch(500))
        await asyncio.wait({asked, fetching}, timeout=1.0)
        release.set()
        await asked
        fetched = await fetching
        handed_out: list[tuple[int, int]] = []
        deadline = asyncio.get_running_loop().time() + 30
        while seeks_done < 2:
            assert asyncio.get_running_loop().time() < deadline, "the assignment's seek did not end"
            await asyncio.sleep(0.01)
        while len(handed_out) < 40:
            assert asyncio.get_running_loop().time() < deadline, handed_out
            for partition, batch in (fetched[0] if fetched is not None else {}).items():
                handed_out.extend((partition, record.position.offset) for record in batch)
            await projector._take_turns(fetched)  # as `step` does: a drained turn passes on
            fetched = await projector._fetch(500)
    finally:
        await projector.close()
    assert len(set(handed_out)) == len(handed_out), sorted(handed_out)


async def test_a_seek_asked_for_before_a_rebalance_seeks_only_what_the_member_still_has(
    stack: Stack, rng: random.Random
) -> None:
    """A seek asked for while another holds the turn waits for it, and a rebalance may come
    meanwhile: the partitions it was asked for are then partly another member's. It must not
    seek those (aiokafka raises IllegalStateError, which would end `run` with a client error);
    the assignment's own seek, next in line, seeks what the member has now."""
    steps = workload(rng, 30)
    await append_all(stack.log, steps)
    group_id = f"g-{uuid.uuid4().hex[:8]}"
    first = taking_turns(stack, slice_s=None, group_id=group_id)
    second = taking_turns(stack, slice_s=None, group_id=group_id)
    await first.start()
    try:
        await until_it_holds_every_partition(first, "the first member")
        held = list(first._live().assignment())
        await first._seeking.acquire()
        try:
            asked = asyncio.create_task(first._seek_to_stored(held))
            await second.start()
            deadline = asyncio.get_running_loop().time() + 30
            while len(first._live().assignment()) == PARTITIONS:
                assert asyncio.get_running_loop().time() < deadline, "no rebalance"
                await second.step(timeout_ms=100)
        finally:
            first._seeking.release()
        await asked
        await run_until_stored([first, second], stack.log)
    finally:
        await asyncio.gather(first.close(), second.close())
    await assert_stored_is_the_direct_fold(stack.store, stack.log, run_ids_of(steps))


async def test_a_seek_outside_a_rebalance_does_not_wait_for_the_positions_of_the_next(
    stack: Stack, rng: random.Random, requests_topic: str
) -> None:
    """A seek outside a rebalance (asked for by the fetcher, a recovery, a build switch) looks
    how far behind each partition is once it has sought them. A rebalance meanwhile leaves the
    partitions without positions until the assignment's own seek, which waits for this one to
    end: the look must give up rather than wait for them (it waited forever, and the
    projector folded nothing)."""
    async with a_projector_whose_first_look_is_held(stack, rng) as held:
        projector = held.projector
        asked = asyncio.create_task(projector._seek_to_stored(list(held.consumer.assignment())))
        await asyncio.wait_for(held.looking.wait(), 30)
        rebalances = projector._rebalances
        async with another_member(stack, held.group_id, requests_topic):
            deadline = asyncio.get_running_loop().time() + 30
            while projector._rebalances < rebalances + 2:
                assert asyncio.get_running_loop().time() < deadline, "no rebalance"
                await asyncio.sleep(0.02)
            held.rebalanced.set()
            await asyncio.wait_for(asked, 30)
            await drain(projector, stack.log, within=30)


async def test_a_look_does_not_wait_for_partitions_a_failed_assignment_left_unsought(
    stack: Stack, rng: random.Random, requests_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look after a full batch (outside any seek) reads how far behind each partition is. A
    rebalance meanwhile assigns the partitions anew, without positions, and a store lost then
    fails the assignment's seek: nothing seeks them until `run` recovers, which it does once
    the look returns. The look must not wait for their positions (it waited forever: the
    projector folded nothing and did not stop)."""

    async def lost() -> dict[int, int]:
        raise BackendUnavailableError("PostgreSQL went away")

    async with a_projector_whose_first_look_is_held(stack, rng) as held:
        projector = held.projector
        looked = asyncio.create_task(turns_of(projector).look(held.consumer))
        await asyncio.wait_for(held.looking.wait(), 30)
        positions = projector.projection.positions
        monkeypatch.setattr(projector.projection, "positions", lost)
        async with another_member(stack, held.group_id, requests_topic):
            deadline = asyncio.get_running_loop().time() + 30
            while projector._failure is None:
                assert asyncio.get_running_loop().time() < deadline, "no failed assignment"
                await asyncio.sleep(0.02)
            held.rebalanced.set()
            await asyncio.wait_for(looked, 10)
            monkeypatch.setattr(projector.projection, "positions", positions)
            with pytest.raises(BackendUnavailableError, match="went away"):
                await projector.step(timeout_ms=100)
            await projector._recover()
            await drain(projector, stack.log, within=30)


async def test_a_turn_passes_on_when_its_slice_is_over(stack: Stack, rng: random.Random) -> None:
    """A partition whose backlog outlasts its slice does not hold the others back: every
    partition is begun before any is finished."""
    steps = workload(rng, 40)
    await append_all(stack.log, steps)
    projector = taking_turns(stack, slice_s=0.2)
    batches = BatchLog(projector, delay_s=0.05)  # 200 records a second
    await projector.start()
    try:
        await run_until_stored([projector], stack.log)
    finally:
        await projector.close()
    spans = batches.first_and_last()
    assert set(spans) == set(range(PARTITIONS))
    assert max(first for first, _ in spans.values()) < min(last for _, last in spans.values()), (
        batches.partitions
    )
    await assert_stored_is_the_direct_fold(stack.store, stack.log, run_ids_of(steps))


async def test_records_fetched_for_a_partition_waiting_its_turn_are_freed_at_once(
    stack: Stack, rng: random.Random, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn passing on drops what the client fetched for the partition it pauses: that fetch
    response is freed then, not kept until a full garbage collection (which a projector's
    process makes rare), or a projector taking turns holds every dropped response meanwhile.
    With the collector off, what the client fetched and is alive after the fold is at most
    what it still holds, one response per partition."""
    steps = workload(rng, 40)
    await append_all(stack.log, steps)
    fetched: list[weakref.ref[Any]] = []
    made = fetcher.PartitionRecords.__init__

    def tracked(self: Any, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        fetched.append(weakref.ref(self))

    monkeypatch.setattr(fetcher.PartitionRecords, "__init__", tracked)
    projector = taking_turns(stack, slice_s=0.2)
    batches = BatchLog(projector, delay_s=0.05)
    gc.collect()
    gc.disable()
    try:
        await projector.start()
        try:
            await run_until_stored([projector], stack.log)
            alive = sum(ref() is not None for ref in fetched)
        finally:
            await projector.close()
    finally:
        gc.enable()
    assert max(batches.stretches().values()) > 1, "no turn passed on with records fetched"
    assert alive <= PARTITIONS, f"{alive} of {len(fetched)} fetch responses still in memory"
    await assert_stored_is_the_direct_fold(stack.store, stack.log, run_ids_of(steps))


async def test_a_member_joining_while_partitions_wait_their_turn_leaves_none_paused(
    stack: Stack, rng: random.Random
) -> None:
    steps = workload(rng, 60)
    await append_all(stack.log, steps)
    group_id = f"g-{uuid.uuid4().hex[:8]}"
    first = taking_turns(stack, slice_s=0.5, group_id=group_id)
    second = taking_turns(stack, slice_s=0.5, group_id=group_id)
    BatchLog(first, delay_s=0.05)
    BatchLog(second, delay_s=0.05)
    await first.start()
    try:
        stop = asyncio.Event()
        alone = asyncio.create_task(first.run(stop))
        deadline = asyncio.get_running_loop().time() + 30
        while not turns_of(first).waiting:
            assert asyncio.get_running_loop().time() < deadline, "never took turns"
            await asyncio.sleep(0.02)
        stop.set()
        await alone
        await second.start()
        await run_until_stored([first, second], stack.log)
        for member in (first, second):
            assert not turns_of(member).waiting
            assert not member._live().paused()
    finally:
        await asyncio.gather(first.close(), second.close())
    await assert_stored_is_the_direct_fold(stack.store, stack.log, run_ids_of(steps))


@pytest.mark.parametrize("slice_s", [0, -1.0])
async def test_a_turn_that_is_not_a_positive_number_of_seconds_is_refused(
    stack: Stack, slice_s: float
) -> None:
    with pytest.raises(InvalidInputError, match="focus_slice_s must be a positive number"):
        taking_turns(stack, slice_s=slice_s)


async def test_a_batch_in_hand_when_a_rebalance_store_fails_is_not_folded_past_the_loss(
    stack: Stack, rng: random.Random, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store failing inside a rebalance drops everything folded and not stored. A batch the
    run loop fetched before it (its fold waiting for the store to give the projection back)
    starts after what was dropped: folded and stored, the records in between are skipped for
    good. It must be dropped with the rest, and the partitions sought to the stored positions."""
    steps = workload(rng, 80)
    await append_all(stack.log, steps)
    group_id = f"g-{uuid.uuid4().hex[:8]}"

    def member(projection: FrontierProjection) -> KafkaProjector[FrontierProjection]:
        return KafkaProjector(
            stack.bootstrap,
            projection,
            topic=stack.topic,
            partitions=PARTITIONS,
            group_id=group_id,
            batch_records=10,
            focus_slice_s=None,
        )

    # Works through its backlog without storing, 200 records a second.
    first = member(
        FrontierProjection(stack.store, stack.log, flush_events=10**9, flush_interval=3600)
    )
    BatchLog(first, delay_s=0.05)
    second = member(FrontierProjection(stack.store, stack.log))

    armed, revoking, dropped = False, False, asyncio.Event()
    lost_events = 0
    revoke = _Seeker.on_partitions_revoked

    async def on_revoked(seeker: _Seeker, revoked: Any) -> None:
        nonlocal revoking
        revoking = seeker._projector is first
        try:
            await revoke(seeker, revoked)
        finally:
            revoking = False

    write = stack.store.write

    async def failing_in_the_revoke(*args: Any, **kwargs: Any) -> None:
        nonlocal armed, lost_events
        if armed and revoking:
            armed = False
            lost_events = first.projection.pending_events
            await asyncio.sleep(1.0)  # the run loop's next fold waits for the projection
            dropped.set()
            raise BackendUnavailableError("PostgreSQL went away")
        await write(*args, **kwargs)

    monkeypatch.setattr(_Seeker, "on_partitions_revoked", on_revoked)
    monkeypatch.setattr(stack.store, "write", failing_in_the_revoke)
    await first.start()
    stop = asyncio.Event()
    running = asyncio.create_task(first.run(stop))
    try:
        deadline = asyncio.get_running_loop().time() + 30
        while first.projection.pending_events == 0:
            assert asyncio.get_running_loop().time() < deadline, "nothing was folded"
            assert not running.done(), running
            await asyncio.sleep(0.01)
        armed = True
        await second.start()  # a rebalance: the first member's revoke stores, and fails
        await asyncio.wait_for(dropped.wait(), 30)
        await second.close()  # the first member gets every partition back
        ends = {p: (await stack.log.bounds(p)).end for p in range(PARTITIONS)}
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            stored = await stack.store.positions("frontiers")
            if all(stored.get(p, 0) >= end for p, end in ends.items()):
                break
            assert asyncio.get_running_loop().time() < deadline, f"stuck at {stored} of {ends}"
            assert not running.done(), running
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await running
        await asyncio.gather(first.close(), second.close())
    assert lost_events > 0
    await assert_stored_is_the_direct_fold(stack.store, stack.log, run_ids_of(steps))


async def test_a_rebalance_while_a_lost_store_is_recovered_does_not_stop_the_projector(
    stack: Stack, rng: random.Random, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a lost store answers, `run` seeks every partition it had to the stored positions,
    reading them first. A member joining meanwhile takes some of them: the seek must not be
    made on partitions this member no longer has (aiokafka raises IllegalStateError, which
    would end `run` with a client error a supervisor does not expect); the rebalance sought
    what the member has now."""
    steps = workload(rng, 60)
    await append_all(stack.log, steps)
    group_id = f"g-{uuid.uuid4().hex[:8]}"

    def member(store: PostgresFrontierStore) -> KafkaProjector[FrontierProjection]:
        return KafkaProjector(
            stack.bootstrap,
            FrontierProjection(store, stack.log),
            topic=stack.topic,
            partitions=PARTITIONS,
            group_id=group_id,
            batch_records=10,
        )

    first = member(stack.store)
    write, positions = stack.store.write, stack.store.positions
    # Reads are counted from the loss on only: counted before it too, the second member
    # could be started early, and again after the loss (two starts, two runs of one member).
    lose, lost, reads_since_loss = False, False, 0

    async def lost_once(*args: Any, **kwargs: Any) -> None:
        nonlocal lose, lost, reads_since_loss
        if lose:
            lose, lost, reads_since_loss = False, True, 0
            raise BackendUnavailableError("PostgreSQL went away")
        await write(*args, **kwargs)

    async with PostgresFrontierStore(stack.database_url, schema=stack.schema) as own_store:
        second = member(own_store)
        stop = asyncio.Event()
        running: list[asyncio.Task[None]] = []

        async def rebalanced_while_read(consumer: str) -> dict[int, int]:
            nonlocal reads_since_loss
            reads_since_loss += 1
            read = await positions(consumer)
            # The seek of the recovery (the first read checks the store).
            if lost and reads_since_loss == 2:
                await second.start()
                running.append(asyncio.create_task(second.run(stop)))
                deadline = asyncio.get_running_loop().time() + 30
                while len(first._live().assignment()) in (0, PARTITIONS):
                    assert asyncio.get_running_loop().time() < deadline, "no rebalance"
                    await asyncio.sleep(0.05)
            return read

        monkeypatch.setattr(stack.store, "write", lost_once)
        monkeypatch.setattr(stack.store, "positions", rebalanced_while_read)
        await first.start()
        running.append(asyncio.create_task(first.run(stop)))
        try:
            deadline = asyncio.get_running_loop().time() + 30
            while not await positions("frontiers"):
                assert asyncio.get_running_loop().time() < deadline, "nothing was stored"
                await asyncio.sleep(0.02)
            lose = True
            ends = {p: (await stack.log.bounds(p)).end for p in range(PARTITIONS)}
            deadline = asyncio.get_running_loop().time() + 60
            while True:
                stored = await positions("frontiers")
                if all(stored.get(p, 0) >= end for p, end in ends.items()):
                    break
                assert asyncio.get_running_loop().time() < deadline, f"stuck at {stored} of {ends}"
                for task in running:
                    if task.done():
                        task.result()  # raises what ended it
                        raise AssertionError("a member's run ended before stop")
                await asyncio.sleep(0.05)
            assert reads_since_loss >= 2
        finally:
            stop.set()
            await asyncio.gather(*running, return_exceptions=True)
            await asyncio.gather(first.close(), second.close())
    await assert_stored_is_the_direct_fold(stack.store, stack.log, run_ids_of(steps))


async def test_a_batch_of_a_partition_revoked_since_its_fetch_never_clears_a_release(
    stack: Stack, rng: random.Random
) -> None:
    """A batch fetched before a rebalance can be folded after it, its partition now another
    member's. The member it was revoked from must not then fold again a run that other member
    set aside and a person released there: it has folded the partition only up to its batch,
    short of the unreadable record, and would clear the run (every record it reads is fine)
    while the record still cannot be read. The run is left to the member that holds it."""
    scripts: dict[int, list[list[Event]]] = {}
    for partition in range(PARTITIONS):
        script = RunScript(rng)
        (script.run_id,) = runs_in_partition(partition, 1, PARTITIONS)
        scripts[partition] = script.steps()
        for step in scripts[partition][:2]:
            await stack.log.append(step)
    group_id = f"g-{uuid.uuid4().hex[:8]}"

    def member(release_poll: float) -> KafkaProjector[FrontierProjection]:
        return KafkaProjector(
            stack.bootstrap,
            FrontierProjection(stack.store, stack.log, release_poll=release_poll),
            topic=stack.topic,
            partitions=PARTITIONS,
            group_id=group_id,
            focus_slice_s=None,
        )

    first, second = member(release_poll=0.0), member(release_poll=3600.0)
    await first.start()
    try:
        # Fetched (as the run loop fetches the next batch while one is folded), not folded.
        records: dict[int, list[Any]] = {}
        deadline = asyncio.get_running_loop().time() + 30
        while len(records) < PARTITIONS:
            assert asyncio.get_running_loop().time() < deadline, "nothing was fetched"
            fetched = await first._fetch(200)
            for partition, batch in (fetched[0] if fetched is not None else {}).items():
                records.setdefault(partition, []).extend(batch)
        await second.start()
        deadline = asyncio.get_running_loop().time() + 30
        while not first.joined or len(first._live().assignment()) in (0, PARTITIONS):
            assert asyncio.get_running_loop().time() < deadline, "no rebalance"
            await asyncio.sleep(0.05)
        revoked = min(
            p
            for p in range(PARTITIONS)
            if TopicPartition(stack.topic, p) not in first._live().assignment()
        )
        await first._apply(records, {p: records[p][-1].position.offset + 1 for p in records})
        await first.flush()

        # The member that has the partition now sets the run aside at a record it cannot read.
        steps = scripts[revoked]
        run_id = steps[0][0].run_id
        headers = [("onward.run_id", run_id.encode())]
        producer = AIOKafkaProducer(bootstrap_servers=stack.bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(
                stack.topic,
                newer_format(run_id, steps[2][0].seq),
                key=run_id.encode(),
                partition=revoked,
                headers=headers,
            )
        finally:
            await producer.stop()
        for step in steps[2:]:
            await stack.log.append(step)
        end = (await stack.log.bounds(revoked)).end
        deadline = asyncio.get_running_loop().time() + 30
        while (await stack.store.positions("frontiers")).get(revoked, 0) < end:
            assert asyncio.get_running_loop().time() < deadline, "the partition was not folded"
            await second.step(timeout_ms=200)
        assert [e.state for e in await stack.store.quarantined("frontiers", run_id=run_id)] == [
            "held"
        ]

        assert await stack.store.release("frontiers", run_id, by="ops", at=1) == 1
        await first.step(timeout_ms=200)
        await first.flush()
        entries = await stack.store.quarantined("frontiers", run_id=run_id)
        assert [e.state for e in entries] == ["released"]
        row = await stack.store.get(run_id)
        assert row is not None
        assert row.quarantined == released_mark("ops")
    finally:
        await asyncio.gather(first.close(), second.close())


async def test_a_projector_started_twice_leaves_no_consumer_behind(stack: Stack) -> None:
    """A second start of a started projector (a supervisor or a test starting it again) does
    nothing: the consumer of the first is the one `close` stops, not one dropped connected
    (and warned about as unclosed when it is collected)."""
    projector = stack.projector()
    await projector.start()
    try:
        consumer = projector._live()
        await projector.start()
        assert projector._live() is consumer
    finally:
        await projector.close()
    assert consumer._closed, "the first start's consumer was never stopped"


async def test_a_projector_closed_while_it_starts_leaves_no_consumer_behind(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shutdown closing the projector while another task starts it: `close` finds no
    consumer yet, so the start stops the one it made and says the projector was closed,
    rather than leaving it connected where no later close reaches it."""
    starting, go = asyncio.Event(), asyncio.Event()
    made: list[AIOKafkaConsumer] = []
    start = AIOKafkaConsumer.start

    async def start_on_cue(consumer: AIOKafkaConsumer) -> None:
        made.append(consumer)
        starting.set()
        await go.wait()
        await start(consumer)

    monkeypatch.setattr(AIOKafkaConsumer, "start", start_on_cue)
    projector = stack.projector()
    opening = asyncio.create_task(projector.start())
    await asyncio.wait_for(starting.wait(), 30)
    await projector.close()
    go.set()
    with pytest.raises(InvalidInputError, match="closed while it started"):
        await asyncio.wait_for(opening, 30)
    assert made
    assert all(consumer._closed for consumer in made), "a consumer was never stopped"


async def test_a_projector_whose_close_is_cancelled_is_dropped_from_its_group(
    stack: Stack,
) -> None:
    """A close cancelled as it begins (a shutdown bounded by a timeout, an application's task
    cancelled) ends the consumer's tasks: aiokafka's cancelled stop left the heartbeat task
    beating, and the broker counted the projector in its group, holding its partitions, for
    as long as the process lived."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    projector = KafkaProjector(
        stack.bootstrap,
        FrontierProjection(stack.store, stack.log),
        topic=stack.topic,
        partitions=PARTITIONS,
        group_id=group,
        session_timeout_ms=6000,
    )
    await projector.start()
    consumer = projector._live()
    deadline = asyncio.get_running_loop().time() + 30
    while not consumer.assignment():
        assert asyncio.get_running_loop().time() < deadline, "the projector never joined"
        await projector.step(timeout_ms=200)
    assert await group_members(stack.bootstrap, group) == 1
    closing = asyncio.create_task(projector.close())
    await asyncio.sleep(0)  # the close has begun: the consumer's stop waits on its group
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    deadline = asyncio.get_running_loop().time() + 6 + 10  # the session timeout, and a margin
    while await group_members(stack.bootstrap, group):
        assert asyncio.get_running_loop().time() < deadline, "the projector is still a member"
        await asyncio.sleep(0.5)


async def test_a_projector_started_twice_at_once_leaves_no_consumer_behind(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two starts at the same moment (before either has a consumer): one consumer joins the
    group, the one `close` stops, not a second dropped connected in the group."""
    made: list[AIOKafkaConsumer] = []
    start = AIOKafkaConsumer.start

    async def counted(consumer: AIOKafkaConsumer) -> None:
        made.append(consumer)
        await start(consumer)

    monkeypatch.setattr(AIOKafkaConsumer, "start", counted)
    projector = stack.projector()
    await asyncio.gather(projector.start(), projector.start())
    await projector.close()
    left = [consumer for consumer in made if not consumer._closed]
    for consumer in left:
        await consumer.stop()
    assert left == [], "a consumer was never stopped"
