"""`SpendLedgerConformance`: the behaviour every `SpendLedger` backend must show.

Subclass it once per backend and implement :meth:`SpendLedgerConformance.open_ledger`, which
returns an open ledger. Runs and tenants are fresh per test, so the ledger need not be empty.
Override :meth:`SpendLedgerConformance.open_another` where a second ledger can be opened over
the same data (another worker's, or the same file after a restart): the suite then checks that
what one recorded the other counts, and that the two recording one key at once count it once.
Needs pytest and pytest-asyncio (``asyncio_mode = "auto"``).

The runner records each model call's cost before its answer is written, keyed by the run and
that answer's seq, and a worker that carries the run on after a crash may record the same key
again. So a record under a key already there must change nothing (neither the run's total nor
the tenant's), whatever it says. Budgets are decided on holds: before the call, its estimate
is held under the same key in one atomic step with the check, so holds made at once through
different ledgers over the same data (different workers) never pass a budget together.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest
import pytest_asyncio

from onward.errors import InvalidInputError
from onward.runtime.spend import Spend, SpendEntry, SpendLedger

from .eventlog import new_run_id

CONCURRENT_RECORDS = 8
"""How many ledgers record one key at once in the race test."""


def new_tenant() -> str:
    """A tenant no other test records under."""
    return f"tenant-{uuid.uuid4().hex[:12]}"


def entry(
    run_id: str,
    tenant: str,
    seq: int,
    micros: int,
    *,
    input_tokens: int = 0,
    output_tokens: int = 0,
) -> SpendEntry:
    """A call of model ``m`` costing ``micros``."""
    return SpendEntry(
        run_id=run_id,
        tenant=tenant,
        seq=seq,
        model="m",
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        micros=micros,
        at=1_700_000_000_000_000 + seq,
    )


class SpendLedgerConformance:
    """The contract of `SpendLedger`. Subclass per backend; every test must pass unchanged.

    Attributes:
        exit_stack: Unwound after each test, after the ledgers are closed: ``open_ledger`` may
            enter into it what its ledger needs for the test (a schema, a file).
    """

    exit_stack: AsyncExitStack

    async def open_ledger(self) -> SpendLedger:
        """An open ledger (runs and tenants are fresh per test, so it need not be empty)."""
        raise NotImplementedError

    async def open_another(self, ledger: SpendLedger) -> SpendLedger:
        """A second open ledger over ``ledger``'s data. By default ``ledger`` itself, right for
        one that lives in one process (memory); override it wherever spend outlives the object."""
        return ledger

    async def _opened(self, ledger: SpendLedger) -> SpendLedger:
        self.exit_stack.push_async_callback(ledger.close)
        return ledger

    @pytest_asyncio.fixture
    async def ledger(self) -> AsyncIterator[SpendLedger]:
        async with AsyncExitStack() as self.exit_stack:
            yield await self._opened(await self.open_ledger())

    async def another(self, ledger: SpendLedger) -> SpendLedger:
        """`open_another`, closed after the test."""
        other = await self.open_another(ledger)
        return other if other is ledger else await self._opened(other)

    # -- totals ------------------------------------------------------------------------------

    async def test_nothing_recorded_is_zero(self, ledger: SpendLedger) -> None:
        assert await ledger.run_total(new_run_id()) == Spend()
        assert await ledger.tenant_total(new_tenant()) == Spend()
        assert await ledger.entries(new_run_id()) == []
        assert await ledger.run_totals([new_run_id()]) == {}

    async def test_a_run_totals_its_calls(self, ledger: SpendLedger) -> None:
        run_id, tenant = new_run_id(), new_tenant()
        assert await ledger.record(entry(run_id, tenant, 2, 1200, input_tokens=100))
        assert await ledger.record(entry(run_id, tenant, 5, 300, output_tokens=7))
        assert await ledger.run_total(run_id) == Spend(
            micros=1500, input_tokens=100, output_tokens=7, calls=2
        )

    async def test_entries_read_back_as_recorded_by_seq(self, ledger: SpendLedger) -> None:
        run_id, tenant = new_run_id(), new_tenant()
        later = entry(run_id, tenant, 9, 40, input_tokens=3, output_tokens=4)
        earlier = entry(run_id, tenant, 3, 10, input_tokens=1, output_tokens=2)
        await ledger.record(later)
        await ledger.record(earlier)
        assert await ledger.entries(run_id) == [earlier, later]

    async def test_a_tenant_totals_every_run_of_its_own(self, ledger: SpendLedger) -> None:
        tenant, other = new_tenant(), new_tenant()
        first, second = new_run_id(), new_run_id()
        await ledger.record(entry(first, tenant, 1, 100, input_tokens=10))
        await ledger.record(entry(second, tenant, 1, 250, output_tokens=5))
        await ledger.record(entry(new_run_id(), other, 1, 999))
        assert await ledger.tenant_total(tenant) == Spend(
            micros=350, input_tokens=10, output_tokens=5, calls=2
        )
        assert (await ledger.tenant_total(other)).micros == 999

    async def test_run_totals_name_only_runs_with_spend(self, ledger: SpendLedger) -> None:
        tenant = new_tenant()
        spent, idle = new_run_id(), new_run_id()
        await ledger.record(entry(spent, tenant, 1, 70))
        await ledger.record(entry(spent, tenant, 2, 30))
        totals = await ledger.run_totals([spent, idle, spent])
        assert totals == {spent: Spend(micros=100, calls=2)}

    async def test_zero_cost_calls_count_as_calls(self, ledger: SpendLedger) -> None:
        run_id, tenant = new_run_id(), new_tenant()
        await ledger.record(entry(run_id, tenant, 1, 0, input_tokens=12))
        assert await ledger.run_total(run_id) == Spend(micros=0, input_tokens=12, calls=1)
        assert (await ledger.tenant_total(tenant)).calls == 1

    async def test_large_sums_are_exact(self, ledger: SpendLedger) -> None:
        run_id, tenant = new_run_id(), new_tenant()
        big = 2**52 + 1  # past what a double holds exactly
        await ledger.record(entry(run_id, tenant, 1, big))
        await ledger.record(entry(run_id, tenant, 2, big))
        assert (await ledger.run_total(run_id)).micros == 2 * big
        assert (await ledger.tenant_total(tenant)).micros == 2 * big

    # -- idempotency -------------------------------------------------------------------------

    async def test_a_replayed_record_changes_nothing(self, ledger: SpendLedger) -> None:
        run_id, tenant = new_run_id(), new_tenant()
        first = entry(run_id, tenant, 4, 500, input_tokens=50)
        assert await ledger.record(first) is True
        assert await ledger.record(first) is False
        assert await ledger.run_total(run_id) == Spend(micros=500, input_tokens=50, calls=1)
        assert await ledger.tenant_total(tenant) == Spend(micros=500, input_tokens=50, calls=1)

    async def test_the_first_record_of_a_key_stands(self, ledger: SpendLedger) -> None:
        run_id, tenant = new_run_id(), new_tenant()
        first = entry(run_id, tenant, 4, 500)
        await ledger.record(first)
        assert await ledger.record(entry(run_id, tenant, 4, 9_000, input_tokens=1)) is False
        assert await ledger.entries(run_id) == [first]
        assert (await ledger.tenant_total(tenant)).micros == 500

    async def test_one_key_recorded_at_once_counts_once(self, ledger: SpendLedger) -> None:
        ledgers = [ledger] + [await self.another(ledger) for _ in range(CONCURRENT_RECORDS - 1)]
        run_id, tenant = new_run_id(), new_tenant()
        record = entry(run_id, tenant, 1, 321)
        added = await asyncio.gather(*(one.record(record) for one in ledgers))
        assert sorted(added) == [False] * (CONCURRENT_RECORDS - 1) + [True]
        assert await ledger.run_total(run_id) == Spend(micros=321, calls=1)
        assert await ledger.tenant_total(tenant) == Spend(micros=321, calls=1)

    async def test_another_ledger_counts_what_one_recorded(self, ledger: SpendLedger) -> None:
        run_id, tenant = new_run_id(), new_tenant()
        await ledger.record(entry(run_id, tenant, 1, 10))
        other = await self.another(ledger)
        await other.record(entry(run_id, tenant, 2, 20))
        assert await other.record(entry(run_id, tenant, 1, 10)) is False
        for each in (ledger, other):
            assert (await each.run_total(run_id)).micros == 30
            assert (await each.tenant_total(tenant)).micros == 30

    # -- holds -------------------------------------------------------------------------------

    async def test_a_hold_counts_against_budgets_but_not_as_spent(
        self, ledger: SpendLedger
    ) -> None:
        run_id, tenant = new_run_id(), new_tenant()
        await ledger.record(entry(run_id, tenant, 1, 100))
        first = await ledger.hold(entry(run_id, tenant, 2, 40), tenant_budget=1_000)
        assert (first.held, first.run_micros, first.tenant_micros) == (True, 100, 100)
        second = await ledger.hold(entry(new_run_id(), tenant, 1, 7))
        assert (second.held, second.tenant_micros) == (True, 140)
        assert await ledger.run_total(run_id) == Spend(micros=100, calls=1)
        assert await ledger.tenant_total(tenant) == Spend(micros=100, calls=1)
        assert await ledger.entries(run_id) == [entry(run_id, tenant, 1, 100)]

    async def test_a_hold_that_would_pass_a_budget_holds_nothing(self, ledger: SpendLedger) -> None:
        run_id, tenant = new_run_id(), new_tenant()
        await ledger.record(entry(run_id, tenant, 1, 60))
        exact = await ledger.hold(entry(run_id, tenant, 2, 40), run_budget=100)
        assert exact.held
        over_run = await ledger.hold(entry(run_id, tenant, 3, 1), run_budget=100)
        assert (over_run.held, over_run.run_micros) == (False, 100)
        other = new_run_id()
        over_tenant = await ledger.hold(entry(other, tenant, 1, 1), tenant_budget=100)
        assert (over_tenant.held, over_tenant.tenant_micros) == (False, 100)
        # Nothing was held by the refusals: releasing the one hold frees the room.
        await ledger.release(run_id, 2)
        assert (await ledger.hold(entry(other, tenant, 1, 40), tenant_budget=100)).held

    async def test_a_record_replaces_its_hold(self, ledger: SpendLedger) -> None:
        run_id, tenant = new_run_id(), new_tenant()
        await ledger.hold(entry(run_id, tenant, 1, 500))
        assert await ledger.record(entry(run_id, tenant, 1, 120, output_tokens=3)) is True
        assert await ledger.run_total(run_id) == Spend(micros=120, output_tokens=3, calls=1)
        after = await ledger.hold(entry(run_id, tenant, 2, 0))
        assert (after.run_micros, after.tenant_micros) == (120, 120)

    async def test_holding_a_key_held_or_recorded_changes_nothing(
        self, ledger: SpendLedger
    ) -> None:
        run_id, tenant = new_run_id(), new_tenant()
        await ledger.hold(entry(run_id, tenant, 1, 50))
        again = await ledger.hold(entry(run_id, tenant, 1, 50), run_budget=60)
        assert (again.held, again.run_micros) == (True, 50)
        await ledger.record(entry(run_id, tenant, 1, 30))
        recorded = await ledger.hold(entry(run_id, tenant, 1, 999), run_budget=60)
        assert (recorded.held, recorded.run_micros) == (True, 30)
        await ledger.release(run_id, 1)  # nothing held there any more
        assert (await ledger.hold(entry(run_id, tenant, 2, 0))).tenant_micros == 30

    async def test_releasing_drops_the_hold_and_only_it(self, ledger: SpendLedger) -> None:
        run_id, tenant = new_run_id(), new_tenant()
        await ledger.hold(entry(run_id, tenant, 1, 10))
        await ledger.hold(entry(run_id, tenant, 2, 20))
        await ledger.release(run_id, 1)
        await ledger.release(run_id, 1)
        await ledger.release(new_run_id(), 1)
        after = await ledger.hold(entry(run_id, tenant, 3, 0))
        assert (after.run_micros, after.tenant_micros) == (20, 20)

    async def test_releasing_a_run_drops_every_hold_of_it_and_keeps_its_spend(
        self, ledger: SpendLedger
    ) -> None:
        run_id, other, tenant = new_run_id(), new_run_id(), new_tenant()
        await ledger.record(entry(run_id, tenant, 1, 5))
        await ledger.hold(entry(run_id, tenant, 2, 10))
        await ledger.hold(entry(run_id, tenant, 3, 20))
        await ledger.hold(entry(other, tenant, 1, 7))
        assert await ledger.release_run(run_id) == 30
        assert await ledger.release_run(run_id) == 0
        assert await ledger.release_run(new_run_id()) == 0
        assert await ledger.run_total(run_id) == Spend(micros=5, calls=1)
        assert await ledger.tenant_total(tenant) == Spend(micros=5, calls=1)
        after = await (await self.another(ledger)).hold(entry(run_id, tenant, 2, 0))
        assert (after.run_micros, after.tenant_micros) == (5, 12)
        # The key is free again: a hold there is decided afresh against the budget.
        assert not (await ledger.hold(entry(run_id, tenant, 3, 90), tenant_budget=100)).held

    async def test_holds_made_at_once_never_pass_the_tenants_budget_together(
        self, ledger: SpendLedger
    ) -> None:
        """Runs of one tenant checking at the same moment, each through its own ledger (its
        own worker): the room for three calls is held three times, never more."""
        ledgers = [ledger] + [await self.another(ledger) for _ in range(CONCURRENT_RECORDS - 1)]
        tenant = new_tenant()
        answers = await asyncio.gather(
            *(one.hold(entry(new_run_id(), tenant, 1, 100), tenant_budget=300) for one in ledgers)
        )
        assert sorted(a.held for a in answers) == [False] * (CONCURRENT_RECORDS - 3) + [True] * 3
        assert all(a.tenant_micros + 100 > 300 for a in answers if not a.held)
        last = await ledger.hold(entry(new_run_id(), tenant, 1, 0))
        assert last.tenant_micros == 300

    # -- refusals ----------------------------------------------------------------------------

    @pytest.mark.parametrize(
        "field", ["seq", "micros", "input_tokens", "output_tokens"], ids=lambda f: f
    )
    @pytest.mark.parametrize("end", ["low", "high"])
    async def test_an_entry_out_of_range_is_refused_and_changes_nothing(
        self, ledger: SpendLedger, field: str, end: str
    ) -> None:
        """Below its least, or over what a 64-bit count holds (a driver's own error, else)."""
        run_id, tenant = new_run_id(), new_tenant()
        fields = {"seq": 1, "micros": 5, "input_tokens": 1, "output_tokens": 1}
        fields[field] = 2**63 if end == "high" else 0 if field == "seq" else -1
        bad = SpendEntry(run_id=run_id, tenant=tenant, model="m", **fields)
        with pytest.raises(InvalidInputError, match=field):
            await ledger.record(bad)
        with pytest.raises(InvalidInputError, match=field):
            await ledger.hold(bad, tenant_budget=1_000)
        assert await ledger.run_total(run_id) == Spend()
        assert (await ledger.hold(entry(run_id, tenant, 1, 0))).tenant_micros == 0
        assert await ledger.tenant_total(tenant) == Spend()


__all__ = ["SpendLedgerConformance"]
