"""The Kafka projector against real Kafka and PostgreSQL, in this process."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from support.histories import (
    RunScript,
    append_all,
    assert_stored_is_the_direct_fold,
    assert_stored_is_what_the_scripts_wrote,
    direct_fold,
    run_ids_of,
    workload,
)

from onward.errors import BackendUnavailableError, InvalidInputError
from onward.eventlog import KafkaEventLog, ToolCompleted
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.kafka import KafkaProjector
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.rebuild import rebuild_frontiers

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
