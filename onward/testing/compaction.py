"""`CompactionStoreConformance`: the behaviour every `CompactionStore` backend must show.

Subclass it once per backend and implement :meth:`CompactionStoreConformance.open_stores`,
which returns a fresh, migrated, empty compaction store and the frontier store whose projector
positions it reads (the two share a database). Needs pytest and pytest-asyncio.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest
import pytest_asyncio

from onward.errors import InvalidInputError
from onward.eventlog.base import Position, StoredEvent
from onward.eventlog.events import Tagged
from onward.projections.base import FrontierStore
from onward.projections.compaction import (
    CompactionStore,
    KeptAs,
    LogCut,
    RetainedEvent,
    RunTruncation,
    TagPin,
)
from onward.projections.frontier import Frontier, RunTag

from .eventlog import new_run_id


def point(run_id: str, before_seq: int, *, offset: int = 0) -> RunTruncation:
    """A truncation point of ``run_id`` (partition 1) at ``before_seq``, under fence 2."""
    return RunTruncation(
        tenant="acme",
        run_id=run_id,
        partition=1,
        before_seq=before_seq,
        before_offset=offset or 10 * before_seq,
        at=1_000 + before_seq,
        fence=2,
    )


def kept(
    run_id: str, seq: int, label: str = "milestone", *, kept_as: KeptAs = "tag"
) -> RetainedEvent:
    """A retained copy of event ``seq`` of ``run_id``, as read at offset ``10 * seq``."""
    event = Tagged(run_id=run_id, tenant="acme", seq=seq, fence=1, target_seq=1, label=label)
    return RetainedEvent.of(StoredEvent(Position(1, 10 * seq), event), kept_as)


class CompactionStoreConformance:
    """The contract of `CompactionStore`. Subclass per backend; every test must pass unchanged."""

    async def open_stores(self) -> tuple[CompactionStore, FrontierStore]:
        """A fresh, migrated, empty compaction store and its frontier store."""
        raise NotImplementedError

    @pytest_asyncio.fixture
    async def stores(self) -> AsyncIterator[tuple[CompactionStore, FrontierStore]]:
        store, frontiers = await self.open_stores()
        try:
            yield store, frontiers
        finally:
            await store.close()
            await frontiers.close()

    async def test_a_point_reads_back_and_only_moves_forward(
        self, stores: tuple[CompactionStore, FrontierStore]
    ) -> None:
        store, _ = stores
        run_id, other = new_run_id(), new_run_id()
        await store.truncate([point(run_id, 5)], [])
        await store.truncate([point(run_id, 3), point(other, 2)], [])
        assert await store.truncations([run_id, other, new_run_id()]) == {
            run_id: point(run_id, 5),
            other: point(other, 2),
        }
        await store.truncate([point(run_id, 9)], [])
        assert (await store.truncations([run_id]))[run_id] == point(run_id, 9)

    async def test_retained_events_are_stored_once_and_decode_as_read(
        self, stores: tuple[CompactionStore, FrontierStore]
    ) -> None:
        store, _ = stores
        run_id = new_run_id()
        await store.truncate([point(run_id, 8)], [kept(run_id, 4), kept(run_id, 2)])
        await store.truncate([], [kept(run_id, 4, label="again")])
        found = await store.retained(run_id)
        assert found == [kept(run_id, 2), kept(run_id, 4)]
        assert found[1].stored() == StoredEvent(
            Position(1, 40),
            Tagged(run_id=run_id, tenant="acme", seq=4, fence=1, target_seq=1, label="milestone"),
        )
        assert await store.retained_seqs([run_id, new_run_id()]) == {run_id: {2, 4}}
        assert await store.retained(new_run_id()) == []

    async def test_positions_are_the_projectors_stored_ones(
        self, stores: tuple[CompactionStore, FrontierStore]
    ) -> None:
        store, frontiers = stores
        assert all(not p for p in (await store.positions()).values())
        await frontiers.write("frontiers", {0: 12, 1: 7}, [], [])
        found = await store.positions()
        assert list(found.values()) == [{0: 12, 1: 7}]

    async def test_a_cut_recorded_again_keeps_the_larger_end(
        self, stores: tuple[CompactionStore, FrontierStore]
    ) -> None:
        store, _ = stores

        def cut(partition: int, start: int, end: int) -> LogCut:
            return LogCut(
                partition=partition, start=start, end=end, events=end - start, archive="a", at=1
            )

        await store.record_cut(cut(1, 0, 50))
        await store.record_cut(cut(1, 0, 40))
        await store.record_cut(cut(1, 50, 90))
        await store.record_cut(cut(0, 0, 5))
        assert await store.cuts(1) == [cut(1, 0, 50), cut(1, 50, 90)]
        assert await store.cuts() == [cut(0, 0, 5), cut(1, 0, 50), cut(1, 50, 90)]
        await store.record_cut(cut(1, 0, 60))
        assert (await store.cuts(1))[0] == cut(1, 0, 60)

    async def test_a_point_keeps_whether_the_run_is_retained_whole(
        self, stores: tuple[CompactionStore, FrontierStore]
    ) -> None:
        store, _ = stores
        run_id = new_run_id()
        whole = msgspec.structs.replace(point(run_id, 4), whole=True)
        await store.truncate([whole], [kept(run_id, n, kept_as="history") for n in (1, 2, 3)])
        assert (await store.truncations([run_id]))[run_id] == whole
        assert [(e.seq, e.kept_as) for e in await store.retained(run_id)] == [
            (1, "history"),
            (2, "history"),
            (3, "history"),
        ]

    async def test_a_pin_is_refused_below_the_point_unless_retained(
        self, stores: tuple[CompactionStore, FrontierStore]
    ) -> None:
        store, _ = stores
        run_id = new_run_id()
        await store.pin(run_id, "acme", 3)  # nothing compacted yet
        await store.truncate([point(run_id, 8)], [kept(run_id, 3), kept(run_id, 5)])
        await store.pin(run_id, "acme", 5)  # retained: may take more tags
        await store.pin(run_id, "acme", 9)  # above the point
        with pytest.raises(InvalidInputError, match="below its truncation point 8"):
            await store.pin(run_id, "acme", 6)
        assert await store.pins([run_id, new_run_id()]) == {run_id: {3, 5, 9}}

    async def test_a_truncation_that_would_pass_an_unretained_pin_writes_nothing(
        self, stores: tuple[CompactionStore, FrontierStore]
    ) -> None:
        store, _ = stores
        run_id = new_run_id()
        await store.pin(run_id, "acme", 4)
        missing = await store.truncate([point(run_id, 6)], [kept(run_id, 2)])
        assert missing == [TagPin(run_id, 4)]
        assert await store.truncations([run_id]) == {}
        assert await store.retained(run_id) == []
        assert await store.truncate([point(run_id, 6)], [kept(run_id, 2), kept(run_id, 4)]) == []
        assert (await store.truncations([run_id]))[run_id] == point(run_id, 6)
        assert await store.retained_seqs([run_id]) == {run_id: {2, 4}}

    async def test_only_the_latest_checkpoint_copies_are_kept_and_tags_are_never_dropped(
        self, stores: tuple[CompactionStore, FrontierStore]
    ) -> None:
        store, _ = stores
        run_id = new_run_id()
        first = [kept(run_id, n, kept_as="checkpoint") for n in (2, 4, 6)]
        await store.truncate([point(run_id, 7)], [kept(run_id, 1), *first], checkpoints=2)
        assert await store.retained_seqs([run_id]) == {run_id: {1, 4, 6}}
        await store.pin(run_id, "acme", 4)  # a tag on a kept resume point: kept for good
        later = [kept(run_id, n, kept_as="checkpoint") for n in (8, 10)]
        await store.truncate([point(run_id, 11)], later, checkpoints=2)
        found = {e.seq: e.kept_as for e in await store.retained(run_id)}
        assert found == {1: "tag", 4: "tag", 8: "checkpoint", 10: "checkpoint"}

    async def test_a_frontier_over_the_rows_cap_is_kept_uncapped_and_only_moves_on(
        self, stores: tuple[CompactionStore, FrontierStore]
    ) -> None:
        store, _ = stores
        run_id = new_run_id()

        def at(offset: int) -> Frontier:
            tags = (RunTag(seq=1, label="x" * 2_000_000, tagged_seq=1),)
            return Frontier(
                run_id=run_id, tenant="acme", last_seq=offset, through_offset=offset, tags=tags
            )

        await store.put_snapshots([at(40)])
        await store.put_snapshots([at(30)])  # an older one never replaces a newer
        assert await store.snapshots([run_id, new_run_id()]) == {run_id: at(40)}
        await store.put_snapshots([at(50)])
        assert (await store.snapshots([run_id]))[run_id] == at(50)
