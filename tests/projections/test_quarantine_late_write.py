"""A projector's store that lands after a person released the run it set aside.

Two projectors fold the same partition for a while after a rebalance: the one the partition
moved away from may be paused between its fold and its store. Its rows and positions are
guarded (older ones change nothing); its quarantine entry must be too, or it holds again a run
a person released and the live projector has since folded whole.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import msgspec
from support.histories import RunScript
from support.poison import newer_format, tolerant_direct_fold

from onward.eventlog import MemoryEventLog
from onward.projections.base import DEFAULT_CONSUMER, FrontierStore
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.log_projector import LogProjector
from onward.projections.memory import MemoryFrontierStore
from onward.projections.redis import RedisFrontierStore


def projection(store: FrontierStore, log: MemoryEventLog) -> FrontierProjection:
    return FrontierProjection(store, log, release_poll=0.0, every_partition=True)


async def test_a_store_landing_after_the_release_never_holds_the_run_again(
    rng: random.Random,
) -> None:
    await a_store_lands_after_the_release(MemoryFrontierStore(), rng)


async def test_a_redis_store_landing_after_the_release_never_holds_the_run_again(
    redis_url: str, redis_prefix: str, rng: random.Random
) -> None:
    async with RedisFrontierStore(redis_url, prefix=redis_prefix) as store:
        await a_store_lands_after_the_release(store, rng)


async def a_store_lands_after_the_release(store: FrontierStore, rng: random.Random) -> None:
    log = MemoryEventLog(partitions=1)
    script = RunScript(rng)
    steps = script.steps()
    run_id = script.run_id
    for step in steps[:-1]:
        await log.append(step)
    seq = steps[-1][0].seq
    position = log.write_raw(run_id, newer_format(run_id, seq))

    # The projector the partition moves away from folds the record and pauses before storing.
    paused = projection(store, log)
    folded, resumed = asyncio.Event(), asyncio.Event()
    write = paused._write

    async def stored_late(*args: Any, **kwargs: Any) -> int:
        folded.set()
        await resumed.wait()
        return await write(*args, **kwargs)

    paused._write = stored_late  # type: ignore[method-assign]
    late = asyncio.create_task(LogProjector(log, paused).catch_up())
    await folded.wait()

    # The live one sets the run aside; after an upgrade that reads the record, a person
    # releases it and the live projector folds it whole.
    live = LogProjector(log, projection(store, log))
    await live.catch_up()
    assert [e.state for e in await store.quarantined(DEFAULT_CONSUMER)] == ["held"]
    readable = {**msgspec.json.decode(newer_format(run_id, seq)), "format": 1}
    log._records[0][position.offset] = (run_id, msgspec.json.encode(readable))
    assert await store.release(DEFAULT_CONSUMER, run_id, by="ops", at=1) == 1
    await live.catch_up()
    assert [e.state for e in await store.quarantined(DEFAULT_CONSUMER)] == ["cleared"]

    resumed.set()
    await late
    (entry,) = await store.quarantined(DEFAULT_CONSUMER)
    assert entry.state == "cleared", "the paused projector's store held the released run again"
    row = await store.get(run_id)
    assert row is not None
    assert row.quarantined is None
    expected, _ = await tolerant_direct_fold(log, [run_id])
    assert row.frontier == expected[run_id]
