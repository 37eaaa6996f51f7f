"""`RecordSweeperConformance`: the behaviour every `RecordSweeper` backend must show.

Subclass it once per backend and implement :meth:`RecordSweeperConformance.open_stores`, which
returns a frontier store, a lease store, a compaction store and the sweeper, open on one fresh,
migrated database. Rows are written through the stores' own protocols, and what the sweeper
removed is observed through them too: a lease row that is gone hands out fence 1 again.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Self

import msgspec
import pytest_asyncio

from onward.eventlog import codec
from onward.projections.base import FrontierStore, QuarantineEntry, Snapshot
from onward.projections.compaction import CompactionStore, RetainedEvent, RunTruncation
from onward.runtime.gc.base import KINDS, PIN_WAIT_US, RECORD_KINDS, RecordSweeper, SweepPlan
from onward.runtime.leases.base import LeaseStore

from .eventlog import new_run_id, step_events
from .frontiers import call_row, frontier, said

TENANT = "acme"
OLD = 1_000_000
"""When the old runs finished, in microseconds since the epoch."""
CUTOFF = 2_000_000
"""The ``before`` the tests ask for: old runs are before it, new ones after."""
NEW = 3_000_000


@dataclass
class Stores:
    """One database seen as a frontier store, a lease store, a compaction store and a sweeper."""

    frontiers: FrontierStore
    leases: LeaseStore
    compaction: CompactionStore
    sweeper: RecordSweeper

    async def seed(
        self,
        status: str,
        *,
        finished_at: int = OLD,
        continued_to: str | None = None,
        held: bool = False,
        agent: str = "booker",
    ) -> str:
        """A run with a frontier row, two transcript rows, two call rows, a lease row, and as
        compaction leaves it a truncation point and two retained (tagged) events. ``agent``
        empty: a LangGraph thread's row."""
        run_id = new_run_id()
        row = msgspec.structs.replace(
            frontier(run_id, through=5, status=status),
            agent=agent,
            updated_at=finished_at,
            continued_to=continued_to,
            messages=2,
        )
        calls = [call_row(run_id, c, through=5, outcome="completed") for c in ("c1", "c2")]
        # One message a store, as a projector keeping up with a run writes them: a row each on
        # every backend (PostgreSQL keeps the messages of one store in one row).
        first, last = said(run_id, 1, "go"), said(run_id, 3, "done")
        await self.frontiers.write("seed", {}, [], [], messages=[first])
        await self.frontiers.write("seed", {}, [Snapshot.of(row)], calls, messages=[last])
        point = RunTruncation(
            tenant=TENANT, run_id=run_id, partition=0, before_seq=4, before_offset=3, at=1
        )
        tagged = [
            RetainedEvent(
                tenant=TENANT,
                run_id=run_id,
                seq=event.seq,
                partition=0,
                offset=event.seq - 1,
                record=codec.encode(event),
            )
            for event in step_events(run_id, 2)
        ]
        await self.compaction.truncate([point], tagged)
        lease = await self.leases.acquire(run_id, tenant=TENANT, holder="w1", ttl_s=30)
        if not held:
            await self.leases.release(lease)
        return run_id

    async def rows(self, run_id: str) -> tuple[bool, int, int, bool, int]:
        """Whether the run has its frontier row, how many transcript and call rows, whether it
        has a truncation point, and how many retained events."""
        row = await self.frontiers.get(run_id)
        transcript = await self.frontiers.transcript(run_id, tenant=TENANT, through=99)
        calls = await self.frontiers.tool_calls(run_id)
        point = await self.compaction.truncations([run_id])
        retained = await self.compaction.retained(run_id)
        return row is not None, len(transcript), len(calls), run_id in point, len(retained)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Close the four stores."""
        for store in (self.sweeper, self.compaction, self.leases, self.frontiers):
            await store.close()

    async def lease_row_kept(self, run_id: str) -> bool:
        """Whether the run's lease row is still there: a new one would start at fence 1."""
        lease = await self.leases.acquire(run_id, tenant=TENANT, holder="probe", ttl_s=30)
        await self.leases.release(lease)
        return lease.fence > 1


class RecordSweeperConformance:
    """The contract of `RecordSweeper`. Subclass per backend; every test must pass unchanged."""

    async def open_stores(self) -> Stores:
        """A frontier store, a lease store, a compaction store and the sweeper, open on one
        migrated database."""
        raise NotImplementedError

    @pytest_asyncio.fixture
    async def stores(self) -> AsyncIterator[Stores]:
        async with await self.open_stores() as opened:
            yield opened

    async def test_finished_lists_the_finished_runs_before_the_cutoff(self, stores: Stores) -> None:
        done = await stores.seed("completed")
        failed = await stores.seed("failed")
        continued = await stores.seed("continued", continued_to="run-next")
        await stores.seed("completed", finished_at=NEW)
        await stores.seed("running")
        await stores.seed("waiting")
        found = {r.run_id: r for r in await stores.sweeper.finished(before=CUTOFF)}
        assert set(found) == {done, failed, continued}
        assert found[done].finished_at == OLD
        assert found[continued].continued
        assert found[continued].successor == "run-next"
        assert not found[done].continued

    async def test_a_count_deletes_nothing_and_a_delete_removes_what_was_counted(
        self, stores: Stores
    ) -> None:
        gone = [await stores.seed("completed"), await stores.seed("cancelled")]
        calls_only = await stores.seed("failed")
        kept = await stores.seed("completed")
        plan = SweepPlan(expired=tuple(gone), calls=(*gone, calls_only))
        counted = await stores.sweeper.sweep(plan, delete=False)
        assert counted == {
            "transcript": 4,
            "tool_calls": 6,
            "retained_events": 4,
            "truncations": 2,
            "lease_rows": 2,
            "frontiers": 2,
        }
        assert [await stores.rows(r) for r in gone] == [(True, 2, 2, True, 2)] * 2
        assert await stores.sweeper.sweep(plan, delete=True) == counted
        assert [await stores.rows(r) for r in gone] == [(False, 0, 0, False, 0)] * 2
        assert not any([await stores.lease_row_kept(r) for r in gone])
        assert await stores.rows(calls_only) == (True, 2, 0, True, 2)
        assert await stores.lease_row_kept(calls_only)
        assert await stores.rows(kept) == (True, 2, 2, True, 2)
        assert await stores.lease_row_kept(kept)
        assert await stores.sweeper.sweep(plan, delete=True) == dict.fromkeys(RECORD_KINDS, 0)

    async def test_a_run_that_has_not_finished_is_never_touched(self, stores: Stores) -> None:
        live = [
            await stores.seed("running"),
            await stores.seed("waiting"),
            await stores.seed("new"),
        ]
        plan = SweepPlan(expired=tuple(live), calls=tuple(live))
        assert await stores.sweeper.sweep(plan, delete=False) == dict.fromkeys(RECORD_KINDS, 0)
        assert await stores.sweeper.sweep(plan, delete=True) == dict.fromkeys(RECORD_KINDS, 0)
        assert [await stores.rows(r) for r in live] == [(True, 2, 2, True, 2)] * 3
        assert all([await stores.lease_row_kept(r) for r in live])

    async def test_a_run_tagged_since_its_row_was_folded_is_neither_listed_nor_swept(
        self, stores: Stores
    ) -> None:
        # A tag is pinned before its `Tagged` event is written, and the row ages from that
        # event only once a projector folds it: collected meanwhile, the tag would be lost.
        tagged = await stores.seed("completed")
        await stores.compaction.pin(tagged, TENANT, 4)
        assert {r.run_id for r in await stores.sweeper.finished(before=CUTOFF)} == set()
        plan = SweepPlan(expired=(tagged,), calls=(tagged,), keys=(tagged,))
        assert await stores.sweeper.sweep(plan, delete=True) == dict.fromkeys(RECORD_KINDS, 0)
        assert await stores.rows(tagged) == (True, 2, 2, True, 2)
        assert await stores.compaction.pins([tagged]) == {tagged: {4}}

    async def test_a_pin_whose_tag_never_came_holds_the_run_only_a_while(
        self, stores: Stores
    ) -> None:
        # Pinned, and then the `Tagged` event was never written (its append failed): the row
        # never ages past the pin. Once the pin is long past the cutoff, the run goes.
        tagged = await stores.seed("completed")
        await stores.compaction.pin(tagged, TENANT, 4)
        later = time.time_ns() // 1_000 + PIN_WAIT_US + 1_000_000
        assert await stores.sweeper.finished(before=later - 2_000_000) == []
        assert {r.run_id for r in await stores.sweeper.finished(before=later)} == {tagged}
        plan = SweepPlan(expired=(tagged,), calls=(tagged,), keys=(tagged,), before=later)
        counts = await stores.sweeper.sweep(plan, delete=True)
        assert counts["frontiers"] == 1
        assert await stores.rows(tagged) == (False, 0, 0, False, 0)
        assert await stores.compaction.pins([tagged]) == {}

    async def test_a_run_touched_since_the_plan_was_made_is_not_swept(self, stores: Stores) -> None:
        # Listed as finished before CUTOFF, then a tag folded into its row: it is not old now.
        touched = await stores.seed("completed")
        row = await stores.frontiers.get(touched)
        assert row is not None
        assert row.frontier is not None
        newer = msgspec.structs.replace(
            row.frontier, updated_at=NEW, through_offset=row.frontier.through_offset + 1
        )
        await stores.frontiers.write("seed", {}, [Snapshot.of(newer)], [])
        plan = SweepPlan(expired=(touched,), calls=(touched,), before=CUTOFF)
        assert await stores.sweeper.sweep(plan, delete=True) == dict.fromkeys(RECORD_KINDS, 0)
        assert await stores.rows(touched) == (True, 2, 2, True, 2)

    async def test_a_cancelled_thread_is_neither_listed_nor_swept(self, stores: Stores) -> None:
        # A cancel ends one invocation of a LangGraph thread, not the thread: its rows stay.
        thread = await stores.seed("cancelled", agent="")
        run = await stores.seed("cancelled")
        assert {r.run_id for r in await stores.sweeper.finished(before=CUTOFF)} == {run}
        plan = SweepPlan(expired=(thread,), calls=(thread,), keys=(thread,))
        assert await stores.sweeper.sweep(plan, delete=True) == dict.fromkeys(RECORD_KINDS, 0)
        assert await stores.rows(thread) == (True, 2, 2, True, 2)
        assert await stores.lease_row_kept(thread)

    async def test_a_run_held_in_quarantine_is_neither_listed_nor_swept(
        self, stores: Stores
    ) -> None:
        # Its row is not the run's whole story: a record past it could not be read, and a
        # person is yet to release the run. Collected, its held entry would name a run that is
        # gone, and a release would fold what is left of it into a row of its own.
        held = await stores.seed("completed")
        entry = QuarantineEntry(
            run_id=held, tenant=TENANT, partition=0, offset=9, kind=None, reason="not JSON"
        )
        await stores.frontiers.write("seed", {}, [], [], quarantine=[entry])
        run = await stores.seed("completed")
        assert {r.run_id for r in await stores.sweeper.finished(before=CUTOFF)} == {run}
        plan = SweepPlan(expired=(held,), calls=(held,), keys=(held,))
        assert await stores.sweeper.sweep(plan, delete=True) == dict.fromkeys(RECORD_KINDS, 0)
        assert await stores.rows(held) == (True, 2, 2, True, 2)
        assert await stores.lease_row_kept(held)
        assert await stores.compaction.tombstones([held]) == set()

    async def test_a_run_carried_into_a_run_already_collected_holds_nothing(
        self, stores: Stores
    ) -> None:
        # The run it was carried into went first (its row aged out while this one was held
        # back, say tagged late): nothing is left to keep this one for.
        successor = await stores.seed("completed")
        await stores.sweeper.sweep(SweepPlan(expired=(successor,)), delete=True)
        carried = await stores.seed("continued", continued_to=successor)
        found = {r.run_id: r for r in await stores.sweeper.finished(before=CUTOFF)}
        assert not found[carried].continued
        live = await stores.seed("running")
        waiting = await stores.seed("continued", continued_to=live)
        found = {r.run_id: r for r in await stores.sweeper.finished(before=CUTOFF)}
        assert found[waiting].continued
        assert found[waiting].successor == live

    async def test_a_lease_somebody_holds_is_kept(self, stores: Stores) -> None:
        run_id = await stores.seed("completed", held=True)
        counts = await stores.sweeper.sweep(SweepPlan(expired=(run_id,)), delete=True)
        assert counts["lease_rows"] == 0
        assert counts["frontiers"] == 1
        assert await stores.leases.current(run_id) is not None

    async def test_every_kind_is_counted(self, stores: Stores) -> None:
        counts = await stores.sweeper.sweep(SweepPlan(), delete=False)
        assert tuple(counts) == RECORD_KINDS
        assert set(RECORD_KINDS) <= set(KINDS)


__all__ = ["RecordSweeperConformance", "Stores"]
