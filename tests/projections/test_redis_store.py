"""`RedisFrontierStore` against a real Redis: the conformance suite, the value bound, the key
layout's format, and a Kafka projector folding into it."""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from support.histories import (
    append_all,
    assert_stored_is_the_direct_fold,
    assert_stored_is_what_the_scripts_wrote,
    run_ids_of,
    workload,
)
from support.redis import delete_prefix

from onward.errors import (
    BackendError,
    BackendUnavailableError,
    InvalidInputError,
    PayloadTooLargeError,
    SchemaMismatchError,
)
from onward.eventlog import KafkaEventLog, MemoryEventLog
from onward.projections.base import FrontierStore, Snapshot
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.kafka import KafkaProjector
from onward.projections.redis import RedisFrontierStore
from onward.runtime import settings
from onward.runtime.leases import RedisLeaseStore
from onward.testing import FrontierStoreConformance
from onward.testing.eventlog import new_run_id
from onward.testing.frontiers import CONSUMER, call_row, frontier, poison, poisoned_run, said

PARTITIONS = 4


class TestRedisFrontierStore(FrontierStoreConformance):
    redis_url: str
    prefixes: list[str]

    @pytest_asyncio.fixture(autouse=True)
    async def _prefixes(self, redis_url: str) -> AsyncIterator[None]:
        self.redis_url = redis_url
        self.prefixes = []
        yield
        for prefix in self.prefixes:
            await delete_prefix(redis_url, prefix)

    async def open_store(self) -> FrontierStore:
        prefix = f"onward-test-{uuid.uuid4().hex}:"
        self.prefixes.append(prefix)
        return await RedisFrontierStore.open(self.redis_url, prefix=prefix)


@pytest_asyncio.fixture
async def small_store(redis_url: str, redis_prefix: str) -> AsyncIterator[RedisFrontierStore]:
    async with RedisFrontierStore(redis_url, prefix=redis_prefix, max_value_bytes=4_000) as store:
        yield store


async def test_an_oversized_frontier_is_refused_before_anything_is_written(
    small_store: RedisFrontierStore,
) -> None:
    small, big = new_run_id(), new_run_id()
    batch = [
        Snapshot.of(frontier(small, through=1)),
        Snapshot.of(frontier(big, through=2, body="x" * 5_000)),
    ]
    with pytest.raises(PayloadTooLargeError) as refused:
        await small_store.write(
            CONSUMER, {1: 3}, batch, [call_row(small, "c1", through=1, outcome=None)]
        )
    assert (refused.value.size, refused.value.limit, refused.value.run_id) == (
        len(batch[1].payload or b""),
        4_000,
        big,
    )
    assert "max_value_bytes of 4000" in str(refused.value)
    assert await small_store.load([small, big]) == {}
    assert await small_store.tool_calls(small) == []
    assert await small_store.positions(CONSUMER) == {}


async def test_an_oversized_transcript_message_is_refused_before_anything_is_written(
    small_store: RedisFrontierStore,
) -> None:
    run_id = new_run_id()
    messages = [said(run_id, 1, "short"), said(run_id, 2, "y" * 5_000)]
    with pytest.raises(PayloadTooLargeError, match="seq 2"):
        await small_store.write(
            CONSUMER, {0: 9}, [Snapshot.of(frontier(run_id, through=8))], [], messages=messages
        )
    assert await small_store.get(run_id) is None
    assert await small_store.transcript(run_id, tenant="acme", through=9) == []
    assert await small_store.positions(CONSUMER) == {}


async def test_a_store_not_open_says_so(redis_url: str, redis_prefix: str) -> None:
    store = RedisFrontierStore(redis_url, prefix=redis_prefix)
    run_id = new_run_id()
    with pytest.raises(InvalidInputError, match="not open"):
        await store.write(CONSUMER, {0: 1}, [Snapshot.of(frontier(run_id, through=0))], [])
    with pytest.raises(InvalidInputError, match="not open"):
        await store.release(CONSUMER, run_id, by="ops", at=1)


async def test_keys_written_by_a_newer_layout_are_refused(
    redis_url: str, redis_prefix: str
) -> None:
    async with RedisFrontierStore(redis_url, prefix=redis_prefix) as store:
        await store.write(CONSUMER, {0: 1}, [Snapshot.of(frontier(new_run_id(), through=0))], [])
        await store.verify()
        client = aioredis.Redis.from_url(redis_url)
        try:
            await client.set(f"{redis_prefix}frontier-format", "2")
        finally:
            await client.aclose()
        with pytest.raises(SchemaMismatchError, match="format 2"):
            await store.verify()
    with pytest.raises(SchemaMismatchError, match="upgrade Onward"):
        await RedisFrontierStore.open(redis_url, prefix=redis_prefix)


async def test_a_format_key_that_is_no_number_is_refused_naming_it(
    redis_url: str, redis_prefix: str
) -> None:
    """A ``frontier-format`` key another program wrote (not a number) is refused as an Onward
    error naming the key and what it holds, not a bare ValueError from ``int()``."""
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.set(f"{redis_prefix}frontier-format", "v2")
    finally:
        await client.aclose()
    with pytest.raises(SchemaMismatchError) as refused:
        await RedisFrontierStore.open(redis_url, prefix=redis_prefix)
    assert f"{redis_prefix}frontier-format" in str(refused.value)
    assert "'v2'" in str(refused.value)


async def test_every_key_is_under_the_prefix(redis_url: str, redis_prefix: str) -> None:
    run_id = new_run_id()
    async with RedisFrontierStore(redis_url, prefix=redis_prefix) as store:
        await store.write(
            CONSUMER,
            {0: 4},
            [Snapshot.of(frontier(run_id, through=3))],
            [call_row(run_id, "c1", through=3, outcome=None)],
            messages=[said(run_id, 1, "hi")],
        )
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        keys = {key async for key in client.scan_iter(match=f"*{run_id}*")}
    finally:
        await client.aclose()
    assert keys
    assert all(key.startswith(redis_prefix) for key in keys)
    assert f"{redis_prefix}frontier:{run_id}" in keys


@pytest.mark.kafka
async def test_a_kafka_projector_folds_into_redis_as_the_direct_fold(
    kafka_bootstrap: str, kafka_topic: str, redis_url: str, redis_prefix: str, rng: random.Random
) -> None:
    async with (
        KafkaEventLog(kafka_bootstrap, topic=kafka_topic, partitions=PARTITIONS) as log,
        RedisFrontierStore(redis_url, prefix=redis_prefix) as store,
    ):
        steps = workload(rng, 40)
        await append_all(log, steps)
        projector = KafkaProjector(
            kafka_bootstrap,
            FrontierProjection(store, log),
            topic=kafka_topic,
            partitions=PARTITIONS,
            group_id=f"g-{uuid.uuid4().hex[:8]}",
        )
        await projector.start()
        try:
            ends = {p: (await log.bounds(p)).end for p in range(PARTITIONS)}
            for _ in range(300):
                stored = await projector.projection.positions()
                if all(stored.get(p, 0) >= end for p, end in ends.items()):
                    break
                await projector.step(timeout_ms=200)
            else:
                pytest.fail(f"the projector is stuck at {stored}, ends {ends}")
        finally:
            await projector.close()
        await assert_stored_is_the_direct_fold(store, log, run_ids_of(steps))
        await assert_stored_is_what_the_scripts_wrote(store, steps)
        assert {s.run_id for s in await store.runs()} == set(run_ids_of(steps))


async def test_a_write_over_positions_redis_lost_is_refused_whole(
    redis_url: str, redis_prefix: str
) -> None:
    """Redis forgot a batch it acknowledged (a restart without it): the next batch, folded on
    from what the store saw stored, writes nothing, so its positions never cover the forgotten
    rows; once the positions Redis holds are read again, a batch folded from them is stored."""
    first, second = new_run_id(), new_run_id()
    async with RedisFrontierStore(redis_url, prefix=redis_prefix) as store:
        await store.write(CONSUMER, {0: 5, 1: 3}, [Snapshot.of(frontier(first, through=4))], [])
        client = aioredis.Redis.from_url(redis_url)
        try:
            await client.delete(f"{redis_prefix}frontier:{first}")
            await client.hset(f"{redis_prefix}positions:{CONSUMER}", "0", "0")
        finally:
            await client.aclose()
        with pytest.raises(BackendUnavailableError, match="partition 0, below the 5 stored"):
            await store.write(
                CONSUMER,
                {0: 9},
                [Snapshot.of(frontier(second, through=8))],
                [call_row(second, "c1", through=8, outcome=None)],
                messages=[said(second, 1, "hi")],
            )
        assert await store.load([first, second]) == {}
        assert await store.tool_calls(second) == []
        assert await store.transcript(second, tenant="acme", through=9) == []
        assert await store.positions(CONSUMER) == {0: 0, 1: 3}
        await store.write(CONSUMER, {0: 9}, [Snapshot.of(frontier(first, through=8))], [])
        assert await store.positions(CONSUMER) == {0: 9, 1: 3}
        assert (await store.load([first]))[first].summary.through_offset == 8


async def test_the_release_poll_reads_only_the_released_entries(
    redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each projector looks for released runs every second: the look brings over the entries
    waiting to be folded again, not every entry the quarantine ever held (4,000 hashes took
    half a second a look)."""
    old, new = new_run_id("old"), new_run_id("new")
    many = 2_000
    async with RedisFrontierStore(redis_url, prefix=redis_prefix) as store:
        entries = [poison(old, offset=n) for n in range(many)]
        entries += [poison(None, offset=many + n) for n in range(many)]
        await store.write(CONSUMER, {1: 2 * many}, [], [], quarantine=entries)
        assert await store.release(CONSUMER, old, by="ops", at=1) == many
        await store.write(CONSUMER, {}, [], [], cleared=[old])
        await store.write(CONSUMER, {}, [], [], quarantine=[poison(new, offset=2 * many)])
        assert await store.release(CONSUMER, new, by="ops", at=2) == 1

        read: list[str] = []
        queue = Pipeline.pipeline_execute_command

        def counted(self: Pipeline, *args: Any, **options: Any) -> Any:
            if str(args[0]).upper() in {"HGETALL", "HMGET", "HGET"}:
                read.append(str(args[1]))
            return queue(self, *args, **options)  # type: ignore[no-untyped-call]

        monkeypatch.setattr(Pipeline, "pipeline_execute_command", counted)
        (released,) = await store.quarantined(CONSUMER, states={"released"})
        monkeypatch.undo()
        assert released.run_id == new
        assert len(read) <= 1
        listed = await store.quarantined(CONSUMER)
        assert len(listed) == 2 * many + 1
        assert [e.offset for e in listed] == list(range(2 * many + 1))
        assert [e.offset for e in await store.quarantined(CONSUMER, run_id=new)] == [2 * many]
        assert await store.quarantined(CONSUMER, states=set()) == []


async def test_a_consumer_named_like_another_consumers_quarantine_entry_is_refused(
    redis_url: str, redis_prefix: str
) -> None:
    """``quarantine:<consumer>`` is a consumer's set of entries and ``quarantine:<consumer>:
    <partition>:<offset>`` each entry's hash: a consumer named ``<c>:<p>:<o>`` would make its
    set the hash of consumer ``c``'s entry, and a write holding a record half written (the
    script failing on the other type, after the rows) for good. It is refused, before anything
    is written, and the other consumer's quarantine is left as it was."""
    async with RedisFrontierStore(redis_url, prefix=redis_prefix) as store:
        held, entry = await poisoned_run(store)
        clashing = f"{CONSUMER}:{entry.partition}:{entry.offset}"
        other = new_run_id()
        with pytest.raises(InvalidInputError, match="consumer"):
            await store.write(
                clashing,
                {1: 4},
                [Snapshot.of(frontier(other, through=2))],
                [],
                quarantine=[poison(other, offset=3)],
            )
        assert await store.load([other]) == {}
        with pytest.raises(InvalidInputError, match="consumer"):
            await store.quarantined(clashing)
        with pytest.raises(InvalidInputError, match="consumer"):
            await store.release(clashing, held, by="ops", at=1)
        assert [e.run_id for e in await store.quarantined(CONSUMER)] == [held]
        assert await store.release(CONSUMER, held, by="ops", at=1) == 1


async def test_a_key_of_another_type_under_the_prefix_is_named(
    redis_url: str, redis_prefix: str
) -> None:
    """Redis's WRONGTYPE names the script's line alone: the operator is told it is a key
    under the store's prefix that another program (or deployment) wrote."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        await client.set(f"{redis_prefix}runs", "another program's")
    finally:
        await client.aclose()
    async with RedisFrontierStore(redis_url, prefix=redis_prefix) as store:
        with pytest.raises(BackendError, match="WRONGTYPE") as failed:
            await store.write(
                CONSUMER, {0: 1}, [Snapshot.of(frontier(new_run_id(), through=0))], []
            )
    assert "frontier_write.lua" in str(failed.value)
    assert repr(redis_prefix) in str(failed.value)


@pytest.mark.parametrize("kind", ["calls", "transcript", "positions", "format"])
async def test_a_key_of_another_type_met_by_a_single_read_is_named(
    redis_url: str, redis_prefix: str, kind: str
) -> None:
    """A read of one key (a run's call rows, its transcript, a consumer's positions, the
    format checked at open) meeting a key of another type failed with Redis's bare
    WRONGTYPE, naming neither the key nor the run: the operator had nothing to look for."""
    run_id = new_run_id()
    key = {
        "calls": f"{redis_prefix}calls:{run_id}",
        "transcript": f"{redis_prefix}transcript:{len('t1')}:t1:{run_id}",
        "positions": f"{redis_prefix}positions:{CONSUMER}",
        "format": f"{redis_prefix}frontier-format",
    }[kind]
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        if kind == "format":
            await client.hset(key, "field", "another program's")
        else:
            await client.set(key, "another program's")
    finally:
        await client.aclose()
    with pytest.raises(BackendError, match="WRONGTYPE") as failed:
        await _read_one(redis_url, redis_prefix, kind, run_id)
    assert repr(key) in str(failed.value)
    assert "ONWARD_REDIS_PREFIX" in str(failed.value)
    if kind in ("calls", "transcript"):
        assert failed.value.run_id == run_id


async def _read_one(redis_url: str, prefix: str, kind: str, run_id: str) -> None:
    """Open a store (which reads the format) and read one key of ``kind`` through it."""
    async with RedisFrontierStore(redis_url, prefix=prefix) as store:
        if kind == "calls":
            await store.tool_calls(run_id)
        elif kind == "transcript":
            await store.transcript(run_id, tenant="t1", through=10)
        elif kind == "positions":
            await store.positions(CONSUMER)


async def test_a_key_of_another_type_met_indexing_by_status_is_named(
    redis_url: str, redis_prefix: str
) -> None:
    """The first listing by status of a store written before the status index indexes it in
    Redis: a key of another type under the prefix failed that listing with Redis's WRONGTYPE
    naming a script's digest and line alone."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        await client.set(f"{redis_prefix}frontier-format", "1")
        await client.set(f"{redis_prefix}runs", "another program's")
    finally:
        await client.aclose()
    async with RedisFrontierStore(redis_url, prefix=redis_prefix) as store:
        with pytest.raises(BackendError, match="WRONGTYPE") as failed:
            await store.runs(statuses=["running"])
    assert "frontier_index.lua" in str(failed.value)
    assert repr(redis_prefix) in str(failed.value)
    assert "ONWARD_REDIS_PREFIX" in str(failed.value)


async def test_a_projection_under_a_clashing_consumer_is_refused_at_start(
    redis_url: str, redis_prefix: str
) -> None:
    """A projector reads its positions first: under a consumer named like another's quarantine
    entry it started and folded, and failed only when it first stored a batch."""
    async with RedisFrontierStore(redis_url, prefix=redis_prefix) as store:
        projection = FrontierProjection(store, MemoryEventLog(), consumer=f"{CONSUMER}:1:2")
        with pytest.raises(InvalidInputError, match="consumer"):
            await projection.positions()


async def test_every_key_begins_with_a_name_the_settings_keep_the_schema_cache_from(
    redis_url: str, redis_prefix: str
) -> None:
    """`Settings` refuses an MCP schema cache prefix whose keys could be those of leases or
    frontiers by the names those keys begin with: a key of another name would escape it."""
    run_id = new_run_id()
    async with RedisFrontierStore(redis_url, prefix=redis_prefix) as store:
        await store.write(
            CONSUMER,
            {1: 9},
            [Snapshot.of(frontier(run_id, through=3))],
            [call_row(run_id, "c1", through=3, outcome=None)],
            messages=[said(run_id, 1, "hi")],
            quarantine=[poison(run_id, offset=8)],
        )
        await store.runs(statuses=["running"])
    async with RedisLeaseStore(redis_url, prefix=redis_prefix) as leases:
        await leases.acquire(run_id, tenant="acme", holder="w1", ttl_s=30)
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        keys = {
            key.removeprefix(redis_prefix) async for key in client.scan_iter(f"{redis_prefix}*")
        }
    finally:
        await client.aclose()
    assert {"lease:", "fence:", "quarantine:", "transcript:"} <= {
        k[: k.find(":") + 1] for k in keys
    }
    for key in keys:
        assert key in settings._REDIS_KEYS or key.startswith(settings._REDIS_KEY_NAMES), key
