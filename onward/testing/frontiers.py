"""`FrontierStoreConformance`: the behaviour every `FrontierStore` backend must show.

Subclass it once per backend and implement :meth:`FrontierStoreConformance.open_store`, which
returns a fresh, migrated, empty store. Needs pytest and pytest-asyncio.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import TypeVar

import msgspec
import pytest
import pytest_asyncio

from onward.errors import CheckpointFormatError, InvalidInputError, SchemaMismatchError
from onward.eventlog.events import Message
from onward.projections.base import (
    FrontierStore,
    FrontierWrite,
    QuarantineEntry,
    Snapshot,
    StoredFrontier,
    released_mark,
)
from onward.projections.frontier import FRONTIER_FORMAT, CallState, Frontier, ToolCallRow
from onward.projections.transcript import LoggedMessage, TranscriptRow

from .eventlog import new_run_id

CONSUMER = "frontiers"


def frontier(
    run_id: str,
    *,
    through: int,
    tenant: str = "acme",
    status: str = "running",
    iteration: int = 1,
    body: str = "",
) -> Frontier:
    """A plausible frontier folded through log offset ``through``."""
    return Frontier(
        run_id=run_id,
        tenant=tenant,
        agent="booker",
        revision="rev-1",
        status=status,  # type: ignore[arg-type]
        iteration=iteration,
        last_seq=through + 1,
        fence=2,
        resume_seq=through,
        last_boundary="after_model_call",
        calls=(CallState(call_id="c1", tool="search", args={"q": body}, requested_seq=through),),
        partition=1,
        through_offset=through,
        updated_at=1000 + through,
    )


def call_row(run_id: str, call_id: str, *, through: int, outcome: str | None) -> ToolCallRow:
    """An audit row of a call as of log offset ``through``."""
    return ToolCallRow(
        tenant="acme",
        run_id=run_id,
        call_id=call_id,
        tool="book",
        idempotency_key=f"{run_id}:{call_id}",
        fence=1,
        dispatched_at=100,
        completed_at=150 if outcome else None,
        outcome=outcome,  # type: ignore[arg-type]
        latency_us=50 if outcome else None,
        through_offset=through,
    )


def poison(run_id: str | None, *, offset: int, partition: int = 1) -> QuarantineEntry:
    """A quarantine entry for an unreadable record of ``run_id`` at ``offset``."""
    return QuarantineEntry(
        run_id=run_id,
        tenant="acme",
        partition=partition,
        offset=offset,
        kind="run.exploded",
        reason=f"run {run_id!r} seq 3: unreadable event record: Invalid value - at `$.kind`",
        quarantined_at=1_000 + offset,
    )


def said(run_id: str, seq: int, text: str, *, tenant: str = "acme") -> TranscriptRow:
    """A transcript row: the message event ``seq`` of a run added."""
    return TranscriptRow(
        tenant=tenant, run_id=run_id, seq=seq, message=Message(role="user", content=text)
    )


async def stored_row(store: FrontierStore, run_id: str) -> StoredFrontier:
    """The run's stored row, which the test expects to be there."""
    row = await store.get(run_id)
    assert row is not None, f"no row for run {run_id}"
    return row


async def poisoned_run(store: FrontierStore) -> tuple[str, QuarantineEntry]:
    """A new run folded through offset 7 and set aside for its record at offset 8 (partition
    1, stored as folded through offset 9)."""
    run_id = new_run_id()
    entry = poison(run_id, offset=8)
    await store.write(
        CONSUMER, {1: 9}, [Snapshot.of(frontier(run_id, through=7))], [], quarantine=[entry]
    )
    return run_id, entry


class UnreadableItemError(Exception):
    """Raised by a batch's poisoned item when the store reads it: the write fails partway."""


_Item = TypeVar("_Item")


class BreaksAt(list[_Item]):
    """The items of a batch, the one at ``at`` unreadable: a store that reads them in order
    has read (and possibly written) the ones before it when the write fails."""

    def __init__(self, items: Sequence[_Item], *, at: int) -> None:
        super().__init__(items)
        self._at = at

    def __iter__(self) -> Iterator[_Item]:
        for index, item in enumerate(super().__iter__()):
            if index == self._at:
                raise UnreadableItemError(f"item {index} of the batch cannot be read")
            yield item


class PositionsBreakAt(Mapping[int, int]):
    """Positions whose offset for ``partition`` cannot be read (the others can)."""

    def __init__(self, offsets: Mapping[int, int], *, partition: int) -> None:
        self._offsets = dict(offsets)
        self._partition = partition

    def __getitem__(self, partition: int) -> int:
        if partition == self._partition:
            raise UnreadableItemError(f"the offset of partition {partition} cannot be read")
        return self._offsets[partition]

    def __iter__(self) -> Iterator[int]:
        return iter(self._offsets)

    def __len__(self) -> int:
        return len(self._offsets)


def _breaking_calls(batch: FrontierWrite) -> FrontierWrite:
    return batch._replace(calls=BreaksAt(batch.calls, at=1))


def _breaking_quarantine(batch: FrontierWrite) -> FrontierWrite:
    return batch._replace(quarantine=BreaksAt(batch.quarantine, at=1))


def _breaking_messages(batch: FrontierWrite) -> FrontierWrite:
    return batch._replace(messages=BreaksAt(batch.messages, at=1))


def _breaking_positions(batch: FrontierWrite) -> FrontierWrite:
    return batch._replace(positions=PositionsBreakAt(batch.positions, partition=2))


BREAKING_ITEMS: dict[str, Callable[[FrontierWrite], FrontierWrite]] = {
    "call-row": _breaking_calls,
    "quarantine-entry": _breaking_quarantine,
    "transcript-row": _breaking_messages,
    "position": _breaking_positions,
}
"""Where a write fails partway: after frontier rows (a call row), after rows and calls (a
quarantine entry or a transcript row), after everything but the positions (a position)."""


async def write_batch(store: FrontierStore, batch: FrontierWrite) -> None:
    """Hand one `FrontierWrite` to :meth:`FrontierStore.write`."""
    await store.write(
        batch.consumer,
        batch.positions,
        batch.snapshots,
        batch.calls,
        quarantine=batch.quarantine,
        cleared=batch.cleared,
        messages=batch.messages,
        restarted=batch.restarted,
    )


class FrontierStoreConformance:
    """The contract of `FrontierStore`. Subclass per backend; every test must pass unchanged."""

    async def open_store(self) -> FrontierStore:
        """A fresh, migrated, empty store."""
        raise NotImplementedError

    @pytest_asyncio.fixture
    async def store(self) -> AsyncIterator[FrontierStore]:
        store = await self.open_store()
        try:
            yield store
        finally:
            await store.close()

    async def test_verify_passes_on_a_migrated_store(self, store: FrontierStore) -> None:
        await store.verify()

    async def test_unknown_run_has_no_row(self, store: FrontierStore) -> None:
        assert await store.get(new_run_id()) is None
        assert await store.load([new_run_id()]) == {}

    async def test_written_frontier_reads_back_exactly(self, store: FrontierStore) -> None:
        run_id = new_run_id()
        written = frontier(run_id, through=7, body="ünï ✓")
        await store.write(CONSUMER, {1: 8}, [Snapshot.of(written)], [])
        row = await stored_row(store, run_id)
        assert row.frontier == written
        assert row.snapshot_error is None
        assert (row.summary.status, row.summary.through_offset, row.summary.fence) == (
            "running",
            7,
            2,
        )

    async def test_a_row_of_a_newer_format_is_refused_as_one(self, store: FrontierStore) -> None:
        # A newer Onward wrote it: the run is left for a worker on that version (exit 4 on the
        # command line), not mistaken for a database schema to migrate (exit 2).
        run_id = new_run_id()
        newer = msgspec.structs.replace(frontier(run_id, through=3), format=FRONTIER_FORMAT + 1)
        await store.write(CONSUMER, {1: 4}, [Snapshot.of(newer)], [])
        for read in (store.get(run_id), store.load([run_id])):
            with pytest.raises(CheckpointFormatError, match="format 2 is newer") as caught:
                await read
            assert not isinstance(caught.value, SchemaMismatchError)
            assert (caught.value.run_id, caught.value.field) == (run_id, "$.format")

    async def test_load_returns_only_runs_that_have_rows(self, store: FrontierStore) -> None:
        a, b = new_run_id(), new_run_id()
        await store.write(CONSUMER, {}, [Snapshot.of(frontier(a, through=1))], [])
        loaded = await store.load([a, b])
        assert set(loaded) == {a}

    async def test_an_older_frontier_never_overwrites_a_newer_one(
        self, store: FrontierStore
    ) -> None:
        run_id = new_run_id()
        await store.write(CONSUMER, {}, [Snapshot.of(frontier(run_id, through=9, iteration=5))], [])
        await store.write(CONSUMER, {}, [Snapshot.of(frontier(run_id, through=4, iteration=2))], [])
        row = await stored_row(store, run_id)
        assert row.frontier is not None
        assert (row.frontier.iteration, row.summary.through_offset) == (5, 9)

    async def test_the_same_offset_folded_twice_changes_nothing(self, store: FrontierStore) -> None:
        run_id = new_run_id()
        await store.write(CONSUMER, {}, [Snapshot.of(frontier(run_id, through=9, iteration=5))], [])
        await store.write(CONSUMER, {}, [Snapshot.of(frontier(run_id, through=9, iteration=6))], [])
        row = await stored_row(store, run_id)
        assert row.frontier is not None
        assert row.frontier.iteration == 5

    async def test_a_newer_frontier_replaces_the_row(self, store: FrontierStore) -> None:
        run_id = new_run_id()
        await store.write(CONSUMER, {}, [Snapshot.of(frontier(run_id, through=3))], [])
        newer = frontier(run_id, through=8, status="completed", iteration=4)
        await store.write(CONSUMER, {}, [Snapshot.of(newer)], [])
        row = await stored_row(store, run_id)
        assert row.frontier == newer
        assert row.summary.status == "completed"

    async def test_positions_are_stored_per_consumer(self, store: FrontierStore) -> None:
        await store.write("a", {0: 10, 3: 4}, [], [])
        await store.write("b", {0: 2}, [], [])
        assert await store.positions("a") == {0: 10, 3: 4}
        assert await store.positions("b") == {0: 2}
        assert await store.positions("c") == {}

    async def test_positions_never_move_back(self, store: FrontierStore) -> None:
        await store.write(CONSUMER, {0: 10}, [], [])
        await store.write(CONSUMER, {0: 6, 1: 3}, [], [])
        assert await store.positions(CONSUMER) == {0: 10, 1: 3}

    async def test_rows_and_positions_are_written_together(self, store: FrontierStore) -> None:
        runs = [new_run_id() for _ in range(300)]
        snapshots = [Snapshot.of(frontier(r, through=i)) for i, r in enumerate(runs)]
        await store.write(CONSUMER, {1: 300}, snapshots, [])
        loaded = await store.load(runs)
        assert len(loaded) == 300
        assert all(
            row.frontier == snap.frontier
            for row, snap in zip((loaded[r] for r in runs), snapshots, strict=True)
        )
        assert await store.positions(CONSUMER) == {1: 300}

    @pytest.mark.parametrize("breaking", list(BREAKING_ITEMS.values()), ids=list(BREAKING_ITEMS))
    async def test_a_write_that_fails_partway_stores_none_of_it(
        self, store: FrontierStore, breaking: Callable[[FrontierWrite], FrontierWrite]
    ) -> None:
        """Exactly once rests on this: rows and positions commit together or not at all.
        Positions moved without their rows make the projector resume past a batch it never
        stored; rows kept without their positions are a part of a batch no fold produced."""
        run_id, fresh = new_run_id(), new_run_id()
        before = frontier(run_id, through=3, iteration=1)
        first_call = call_row(run_id, "c1", through=3, outcome=None)
        first_said = said(run_id, 1, "before")
        await store.write(
            CONSUMER, {1: 4}, [Snapshot.of(before)], [first_call], messages=[first_said]
        )
        batch = FrontierWrite(
            CONSUMER,
            {1: 10, 2: 10},
            [
                Snapshot.of(frontier(run_id, through=9, iteration=7)),
                Snapshot.of(frontier(fresh, through=8)),
            ],
            [
                call_row(run_id, "c1", through=9, outcome="completed"),
                call_row(run_id, "c2", through=9, outcome="completed"),
                call_row(fresh, "c1", through=8, outcome=None),
            ],
            quarantine=[poison(run_id, offset=10, partition=2), poison(None, offset=11)],
            messages=[said(run_id, 2, "after"), said(run_id, 3, "later"), said(fresh, 1, "x")],
        )

        async def stored() -> dict[str, object]:
            row = await store.get(run_id)
            return {
                "row": None if row is None else (row.frontier, row.quarantined),
                "fresh row": await store.get(fresh),
                "calls": [*await store.tool_calls(run_id), *await store.tool_calls(fresh)],
                "transcript": [
                    *await store.transcript(run_id, tenant="acme", through=99),
                    *await store.transcript(fresh, tenant="acme", through=99),
                ],
                "quarantine": await store.quarantined(CONSUMER),
                "positions": await store.positions(CONSUMER),
            }

        before_failure = await stored()
        assert before_failure == {
            "row": (before, None),
            "fresh row": None,
            "calls": [first_call],
            "transcript": [first_said],
            "quarantine": [],
            "positions": {1: 4},
        }
        with pytest.raises(UnreadableItemError):
            await write_batch(store, breaking(batch))
        after_failure = await stored()
        changed = [part for part, value in after_failure.items() if value != before_failure[part]]
        assert not changed, f"the failed write stored part of itself; changed: {changed}"
        # The same batch, readable, is stored whole: the failure was the unreadable item's.
        await write_batch(store, batch)
        assert (await stored_row(store, run_id)).summary.iteration == 7
        assert await store.get(fresh) is not None
        assert await store.positions(CONSUMER) == {1: 10, 2: 10}
        assert len(await store.quarantined(CONSUMER)) == 2

    async def test_call_rows_are_upserted_by_run_and_call(self, store: FrontierStore) -> None:
        run_id = new_run_id()
        await store.write(CONSUMER, {}, [], [call_row(run_id, "c1", through=3, outcome=None)])
        await store.write(
            CONSUMER, {}, [], [call_row(run_id, "c1", through=5, outcome="completed")]
        )
        await store.write(CONSUMER, {}, [], [call_row(run_id, "c1", through=4, outcome="error")])
        rows = await store.tool_calls(run_id)
        assert [(r.call_id, r.outcome, r.latency_us, r.through_offset) for r in rows] == [
            ("c1", "completed", 50, 5)
        ]

    async def test_call_rows_of_a_run_come_back_whole(self, store: FrontierStore) -> None:
        run_id = new_run_id()
        written = [call_row(run_id, f"c{i}", through=i, outcome="completed") for i in range(5)]
        await store.write(CONSUMER, {}, [], written)
        rows = await store.tool_calls(run_id)
        assert sorted(rows, key=lambda r: r.call_id) == written
        assert await store.tool_calls(new_run_id()) == []

    async def test_a_refused_snapshot_keeps_the_reason_and_the_scalars(
        self, store: FrontierStore
    ) -> None:
        run_id = new_run_id()
        big = frontier(run_id, through=12, body="x" * 5_000)
        refused = Snapshot.of(big, max_bytes=1_000)
        assert refused.payload is None
        await store.write(CONSUMER, {1: 13}, [refused], [])
        row = await stored_row(store, run_id)
        assert row.frontier is None
        assert row.snapshot_error is not None
        assert "cap" in row.snapshot_error
        assert (row.summary.through_offset, row.summary.iteration) == (12, 1)

    async def test_a_stored_snapshot_after_a_refused_one_clears_the_reason(
        self, store: FrontierStore
    ) -> None:
        run_id = new_run_id()
        refused = Snapshot.of(frontier(run_id, through=2, body="x" * 5_000), max_bytes=1_000)
        await store.write(CONSUMER, {}, [refused], [])
        await store.write(CONSUMER, {}, [Snapshot.of(frontier(run_id, through=3))], [])
        row = await stored_row(store, run_id)
        assert row.frontier is not None
        assert row.snapshot_error is None

    async def test_a_frontier_just_under_the_cap_is_kept_whole(self, store: FrontierStore) -> None:
        run_id = new_run_id()
        written = frontier(run_id, through=1, body="y" * 1_000_000)
        snapshot = Snapshot.of(written)
        assert snapshot.payload is not None
        await store.write(CONSUMER, {}, [snapshot], [])
        row = await stored_row(store, run_id)
        assert row.frontier == written

    async def test_runs_filter_by_tenant_and_status(self, store: FrontierStore) -> None:
        tenant = new_run_id("tenant")
        waiting, running, other = new_run_id("a"), new_run_id("b"), new_run_id("c")
        await store.write(
            CONSUMER,
            {},
            [
                Snapshot.of(frontier(waiting, through=1, tenant=tenant, status="waiting")),
                Snapshot.of(frontier(running, through=2, tenant=tenant, status="running")),
                Snapshot.of(frontier(other, through=3, status="waiting")),
            ],
            [],
        )
        assert [s.run_id for s in await store.runs(tenant=tenant)] == sorted([waiting, running])
        assert [s.run_id for s in await store.runs(tenant=tenant, statuses={"waiting"})] == [
            waiting
        ]

    async def test_runs_filter_by_user(self, store: FrontierStore) -> None:
        tenant = new_run_id("tenant")
        ann, bob, nobody = new_run_id("a"), new_run_id("b"), new_run_id("c")
        rows = [
            msgspec.structs.replace(frontier(ann, through=1, tenant=tenant), user_id="ann"),
            msgspec.structs.replace(frontier(bob, through=2, tenant=tenant), user_id="bob"),
            frontier(nobody, through=3, tenant=tenant),
        ]
        await store.write(CONSUMER, {}, [Snapshot.of(f) for f in rows], [])
        listed = await store.runs(tenant=tenant, user="ann", statuses={"running"})
        assert [(s.run_id, s.user_id) for s in listed] == [(ann, "ann")]
        everyone = await store.runs(tenant=tenant)
        assert {s.run_id: s.user_id for s in everyone} == {ann: "ann", bob: "bob", nobody: None}

    async def test_runs_filter_by_agent_and_last_update(self, store: FrontierStore) -> None:
        tenant = new_run_id("tenant")
        old, recent, other_agent = new_run_id("a"), new_run_id("b"), new_run_id("c")
        rows = [
            frontier(old, through=1, tenant=tenant),
            frontier(recent, through=50, tenant=tenant),
            msgspec.structs.replace(frontier(other_agent, through=2, tenant=tenant), agent="x"),
        ]
        await store.write(CONSUMER, {}, [Snapshot.of(f) for f in rows], [])
        booker = await store.runs(tenant=tenant, agent="booker")
        assert [s.run_id for s in booker] == sorted([old, recent])
        # `frontier` puts updated_at at 1000 + through: only the first is before 1010.
        stale = await store.runs(tenant=tenant, agent="booker", updated_before=1010)
        assert [s.run_id for s in stale] == [old]

    async def test_runs_pages_by_run_id_return_every_run_once(self, store: FrontierStore) -> None:
        tenant = new_run_id("tenant")
        ids = [new_run_id(f"r{i}") for i in range(7)]
        statuses = ["waiting", "completed", "failed", "running"]
        rows = [
            frontier(run_id, through=i, tenant=tenant, status=statuses[i % 4])
            for i, run_id in enumerate(ids)
        ]
        await store.write(CONSUMER, {}, [Snapshot.of(f) for f in rows], [])
        pages: list[list[str]] = []
        after: str | None = None
        while True:
            page = await store.runs(tenant=tenant, after=after, limit=3)
            if not page:
                break
            pages.append([s.run_id for s in page])
            after = page[-1].run_id
        assert [len(p) for p in pages] == [3, 3, 1]
        assert [run_id for page in pages for run_id in page] == sorted(ids)
        waiting = await store.runs(tenant=tenant, statuses={"waiting"}, limit=1)
        assert [s.run_id for s in waiting] == [min(ids[0], ids[4])]
        rest = await store.runs(tenant=tenant, statuses={"waiting"}, after=waiting[0].run_id)
        assert [s.run_id for s in rest] == [max(ids[0], ids[4])]

    async def test_a_page_of_no_runs_lists_none_and_a_negative_one_is_refused(
        self, store: FrontierStore
    ) -> None:
        tenant = new_run_id("tenant")
        ids = sorted(new_run_id(f"r{i}") for i in range(3))
        rows = [frontier(run_id, through=i, tenant=tenant) for i, run_id in enumerate(ids)]
        await store.write(CONSUMER, {}, [Snapshot.of(f) for f in rows], [])
        assert await store.runs(tenant=tenant, limit=0) == []
        with pytest.raises(InvalidInputError, match="got -1"):
            await store.runs(tenant=tenant, limit=-1)

    async def test_concurrent_writers_keep_the_newest(self, store: FrontierStore) -> None:
        run_id = new_run_id()
        snapshots = [Snapshot.of(frontier(run_id, through=i, iteration=i)) for i in range(20)]
        await asyncio.gather(
            *(store.write(f"w{i % 3}", {0: i}, [s], []) for i, s in enumerate(snapshots))
        )
        row = await stored_row(store, run_id)
        assert row.frontier is not None
        assert row.frontier.iteration == 19

    async def test_payload_is_msgspec_json(self, store: FrontierStore) -> None:
        run_id = new_run_id()
        written = frontier(run_id, through=1)
        snapshot = Snapshot.of(written)
        assert snapshot.payload is not None
        assert msgspec.json.decode(snapshot.payload)["run_id"] == run_id
        await store.write(CONSUMER, {}, [snapshot], [])
        row = await stored_row(store, run_id)
        assert row.frontier == written

    # -- quarantine ------------------------------------------------------------------------

    async def test_quarantine_entries_are_written_with_the_positions(
        self, store: FrontierStore
    ) -> None:
        run_id, entry = await poisoned_run(store)
        assert await store.quarantined(CONSUMER) == [entry]
        assert await store.positions(CONSUMER) == {1: 9}
        row = await stored_row(store, run_id)
        assert row.quarantined == entry.mark
        assert "offset 8" in entry.mark
        assert row.frontier is None  # not the run's whole story: readers fold the log
        assert row.set_aside == frontier(run_id, through=7)
        assert row.summary.through_offset == 7
        assert (await store.load([run_id]))[run_id] == row

    async def test_a_readable_run_has_no_mark(self, store: FrontierStore) -> None:
        run_id = new_run_id()
        await store.write(CONSUMER, {1: 2}, [Snapshot.of(frontier(run_id, through=1))], [])
        row = await stored_row(store, run_id)
        assert row.quarantined is None
        assert await store.quarantined(CONSUMER) == []

    async def test_a_newer_snapshot_keeps_the_mark(self, store: FrontierStore) -> None:
        run_id = new_run_id()
        entry = poison(run_id, offset=4)
        await store.write(
            CONSUMER, {}, [Snapshot.of(frontier(run_id, through=3))], [], quarantine=[entry]
        )
        await store.write(CONSUMER, {}, [Snapshot.of(frontier(run_id, through=5))], [])
        row = await stored_row(store, run_id)
        assert row.quarantined == entry.mark

    async def test_quarantine_lists_by_run_state_and_consumer(self, store: FrontierStore) -> None:
        a, b = new_run_id("a"), new_run_id("b")
        entries = [poison(a, offset=3), poison(b, offset=5), poison(None, offset=6)]
        await store.write(CONSUMER, {1: 7}, [], [], quarantine=entries)
        assert await store.quarantined(CONSUMER, run_id=b) == [entries[1]]
        assert await store.quarantined(CONSUMER, states={"released"}) == []
        assert [e.offset for e in await store.quarantined(CONSUMER, states={"held"})] == [3, 5, 6]
        assert await store.quarantined("another") == []

    async def test_release_marks_entries_released_and_says_so_on_the_row(
        self, store: FrontierStore
    ) -> None:
        run_id, _ = await poisoned_run(store)
        assert await store.release(CONSUMER, run_id, by="ops", at=5_000) == 1
        (released,) = await store.quarantined(CONSUMER, run_id=run_id)
        assert (released.state, released.released_by, released.released_at) == (
            "released",
            "ops",
            5_000,
        )
        row = await stored_row(store, run_id)
        assert row.quarantined == released_mark("ops")
        assert await store.release(CONSUMER, run_id, by="ops", at=6_000) == 0

    async def test_releasing_a_run_never_held_releases_nothing(self, store: FrontierStore) -> None:
        run_id = new_run_id()
        await store.write(CONSUMER, {}, [Snapshot.of(frontier(run_id, through=1))], [])
        assert await store.release(CONSUMER, run_id, by="ops", at=1) == 0
        row = await stored_row(store, run_id)
        assert row.quarantined is None

    async def test_a_cleared_run_loses_its_mark_with_the_write(self, store: FrontierStore) -> None:
        run_id, _ = await poisoned_run(store)
        await store.release(CONSUMER, run_id, by="ops", at=5_000)
        refolded = Snapshot.of(frontier(run_id, through=12, iteration=3))
        await store.write(CONSUMER, {1: 13}, [refolded], [], cleared=[run_id])
        (cleared,) = await store.quarantined(CONSUMER, run_id=run_id)
        assert cleared.state == "cleared"
        row = await stored_row(store, run_id)
        assert row.quarantined is None
        assert row.frontier == refolded.frontier
        assert await store.positions(CONSUMER) == {1: 13}

    async def test_a_record_still_unreadable_is_held_again(self, store: FrontierStore) -> None:
        """Held again, the entry still says who released the run last, and when."""
        run_id = new_run_id()
        entry = poison(run_id, offset=8)
        await store.write(
            CONSUMER, {}, [Snapshot.of(frontier(run_id, through=7))], [], quarantine=[entry]
        )
        await store.release(CONSUMER, run_id, by="ops", at=5_000)
        again = poison(run_id, offset=8)
        await store.write(CONSUMER, {}, [], [], quarantine=[again], cleared=[run_id])
        (held,) = await store.quarantined(CONSUMER, run_id=run_id)
        assert (held.state, held.released_by, held.released_at) == ("held", "ops", 5_000)
        row = await stored_row(store, run_id)
        assert row.quarantined == again.mark
        assert await store.release(CONSUMER, run_id, by="ops", at=7_000) == 1

    async def test_a_late_write_never_holds_a_released_run_again(
        self, store: FrontierStore
    ) -> None:
        """A write of a projector that folded the record before the release and stores it
        after (a group member the partition moved away from, paused between its fold and its
        store) leaves the released entry, and the entry folded again since, as they are."""
        run_id, _ = await poisoned_run(store)
        stale = [Snapshot.of(frontier(run_id, through=7))]
        assert await store.release(CONSUMER, run_id, by="ops", at=5_000) == 1
        await store.write(CONSUMER, {1: 9}, stale, [], quarantine=[poison(run_id, offset=8)])
        (released,) = await store.quarantined(CONSUMER, run_id=run_id)
        assert (released.state, released.released_by) == ("released", "ops")
        assert (await stored_row(store, run_id)).quarantined == released_mark("ops")

        refolded = Snapshot.of(frontier(run_id, through=12, iteration=3))
        await store.write(CONSUMER, {1: 13}, [refolded], [], cleared=[run_id])
        await store.write(CONSUMER, {1: 9}, stale, [], quarantine=[poison(run_id, offset=8)])
        (cleared,) = await store.quarantined(CONSUMER, run_id=run_id)
        assert cleared.state == "cleared"
        row = await stored_row(store, run_id)
        assert row.quarantined is None
        assert row.frontier == refolded.frontier
        assert await store.positions(CONSUMER) == {1: 13}

    async def test_dismiss_clears_an_entry_that_names_no_run(self, store: FrontierStore) -> None:
        """Nothing names the record's run, so no release can: a person dismisses it, and it
        leaves what is held, saying who dismissed it and when."""
        run_id = new_run_id()
        entries = [poison(run_id, offset=3), poison(None, offset=4)]
        await store.write(CONSUMER, {1: 5}, [], [], quarantine=entries)
        assert await store.dismiss(CONSUMER, 1, 4, by="ops", at=5_000) == 1
        assert await store.quarantined(CONSUMER, states={"held", "released"}) == [entries[0]]
        (_, dismissed) = await store.quarantined(CONSUMER)
        assert (dismissed.state, dismissed.released_by, dismissed.released_at) == (
            "cleared",
            "ops",
            5_000,
        )
        assert dismissed.reason == entries[1].reason
        assert await store.dismiss(CONSUMER, 1, 4, by="ann", at=6_000) == 0
        assert (await store.quarantined(CONSUMER))[1] == dismissed

    async def test_dismiss_leaves_an_entry_that_names_a_run_or_none_there(
        self, store: FrontierStore
    ) -> None:
        run_id, entry = await poisoned_run(store)
        await store.write(CONSUMER, {}, [], [], quarantine=[poison(None, offset=4)])
        assert await store.dismiss(CONSUMER, 1, 8, by="ops", at=5_000) == 0
        assert await store.dismiss(CONSUMER, 1, 5, by="ops", at=5_000) == 0
        assert await store.dismiss(CONSUMER, 2, 4, by="ops", at=5_000) == 0
        assert await store.dismiss("another", 1, 4, by="ops", at=5_000) == 0
        assert [e.state for e in await store.quarantined(CONSUMER)] == ["held", "held"]
        assert (await stored_row(store, run_id)).quarantined == entry.mark

    async def test_a_late_write_never_holds_a_dismissed_entry_again(
        self, store: FrontierStore
    ) -> None:
        """A projector that folded the record before the dismissal and stores it after leaves
        the dismissed entry as it is."""
        await store.write(CONSUMER, {1: 5}, [], [], quarantine=[poison(None, offset=4)])
        assert await store.dismiss(CONSUMER, 1, 4, by="ops", at=5_000) == 1
        await store.write(CONSUMER, {1: 5}, [], [], quarantine=[poison(None, offset=4)])
        (entry,) = await store.quarantined(CONSUMER)
        assert (entry.state, entry.released_by) == ("cleared", "ops")

    async def test_transcript_rows_read_back_by_seq_up_to_the_handle(
        self, store: FrontierStore
    ) -> None:
        run_id = new_run_id()
        rows = [said(run_id, seq, f"m{seq} ünï ✓") for seq in (1, 3, 4, 9)]
        await store.write(
            CONSUMER, {1: 10}, [Snapshot.of(frontier(run_id, through=9))], [], messages=rows
        )
        assert await store.transcript(run_id, tenant="acme", through=9) == rows
        assert await store.transcript(run_id, tenant="acme", through=4) == rows[:3]
        assert await store.transcript(run_id, tenant="other", through=9) == []
        assert await store.transcript(new_run_id(), tenant="acme", through=9) == []

    async def test_long_and_short_transcript_messages_read_back_as_written(
        self, store: FrontierStore
    ) -> None:
        """The SQL stores compress a long message; whatever a store keeps, every message comes
        back as it was written, random bytes (which compress to nothing) included."""
        run_id = new_run_id()
        texts = ["ok", "the 08:40 from Paris, seat 42; " * 200, os.urandom(700).hex(), "é" * 300]
        rows = [said(run_id, seq, text) for seq, text in enumerate(texts, start=1)]
        await store.write(
            CONSUMER, {}, [Snapshot.of(frontier(run_id, through=4))], [], messages=rows
        )
        assert await store.transcript(run_id, tenant="acme", through=4) == rows

    async def test_a_message_with_its_arguments_as_logged_reads_back_marked(
        self, store: FrontierStore
    ) -> None:
        """A model answer whose calls' arguments the transcript keeps as the log does (a
        reference, a wrapped look-alike) comes back marked so, beside messages that are not,
        and one merely naming the mark in its arguments does not."""
        run_id = new_run_id()
        calls = [
            {"id": "c-1", "name": "write", "arguments": {"$blob": "sha256:" + "1" * 64, "size": 9}},
            {"id": "c-2", "name": "keep", "arguments": {"$literal": {"$blob": "x", "size": 1}}},
        ]
        logged = LoggedMessage(
            role="assistant",
            content=[{"type": "tool_calls", "tool_calls": calls}],
            as_logged=True,
        )
        named = {"id": "c-3", "name": "keep", "arguments": {"as_logged": True}}
        plain = Message(role="assistant", content=[{"type": "tool_calls", "tool_calls": [named]}])
        rows = [
            said(run_id, 1, "go"),
            TranscriptRow(tenant="acme", run_id=run_id, seq=2, message=logged),
            TranscriptRow(tenant="acme", run_id=run_id, seq=3, message=plain),
        ]
        await store.write(
            CONSUMER, {}, [Snapshot.of(frontier(run_id, through=3))], [], messages=rows
        )
        got = await store.transcript(run_id, tenant="acme", through=3)
        assert got == rows
        assert [type(r.message) for r in got] == [Message, LoggedMessage, Message]

    async def test_a_transcript_row_is_stored_once_and_never_replaced(
        self, store: FrontierStore
    ) -> None:
        run_id = new_run_id()
        await store.write(CONSUMER, {}, [], [], messages=[said(run_id, 1, "first")])
        again = [said(run_id, 1, "again"), said(run_id, 2, "b")]
        await store.write(CONSUMER, {}, [], [], messages=again)
        got = await store.transcript(run_id, tenant="acme", through=5)
        assert [(r.seq, r.message.content) for r in got] == [(1, "first"), (2, "b")]

    async def test_a_restarted_run_loses_its_stored_call_and_transcript_rows(
        self, store: FrontierStore
    ) -> None:
        """A collected run whose id began again: its call rows, and its transcript under the
        tenant named through the seq named, go before the write's own rows are stored, in the
        same write; the rows past that seq (the new run's, stored first by another build),
        the run's under another tenant, and another run's stay."""
        run_id, other = new_run_id(), new_run_id()
        await store.write(
            CONSUMER,
            {1: 9},
            [Snapshot.of(frontier(run_id, through=8)), Snapshot.of(frontier(other, through=8))],
            [
                call_row(run_id, "c1", through=8, outcome="completed"),
                call_row(run_id, "c2", through=8, outcome="completed"),
                call_row(other, "c1", through=8, outcome="completed"),
            ],
            messages=[
                said(run_id, 1, "old"),
                said(run_id, 2, "old"),
                said(run_id, 3, "kept"),
                said(run_id, 1, "kept", tenant="else"),
                said(other, 1, "kept"),
            ],
        )
        await store.write(
            CONSUMER,
            {1: 12},
            [Snapshot.of(frontier(run_id, through=11))],
            [call_row(run_id, "c1", through=11, outcome=None)],
            messages=[said(run_id, 1, "new")],
            restarted=[("acme", run_id, 2)],
        )

        calls = await store.tool_calls(run_id)
        assert [(c.call_id, c.through_offset) for c in calls] == [("c1", 11)]
        got = await store.transcript(run_id, tenant="acme", through=99)
        assert [(r.seq, r.message.content) for r in got] == [(1, "new"), (3, "kept")]
        kept = await store.transcript(run_id, tenant="else", through=99)
        assert [r.message.content for r in kept] == ["kept"]
        assert [c.call_id for c in await store.tool_calls(other)] == ["c1"]
        assert len(await store.transcript(other, tenant="acme", through=99)) == 1
        assert await store.positions(CONSUMER) == {1: 12}

    async def test_transcript_rows_are_written_with_the_positions(
        self, store: FrontierStore
    ) -> None:
        run_id = new_run_id()
        await store.write("t", {2: 5}, [], [], messages=[said(run_id, 1, "x")])
        assert (await store.positions("t"))[2] == 5
        assert len(await store.transcript(run_id, tenant="acme", through=1)) == 1
