"""`MemorySpendLedger`: spend in this process, for tests and single-process embedding."""

from __future__ import annotations

from collections.abc import Sequence

from onward._storage import Resource

from .base import Hold, Spend, SpendEntry, check_entry, hold_decided


class MemorySpendLedger(Resource):
    """A `SpendLedger` held in dicts: nothing survives the process. Every method decides
    without awaiting, so on one event loop each call is atomic."""

    def __init__(self) -> None:
        self._entries: dict[str, dict[int, SpendEntry]] = {}
        self._tenants: dict[str, Spend] = {}
        self._holds: dict[str, dict[int, SpendEntry]] = {}
        self._tenant_holds: dict[str, int] = {}

    async def hold(
        self,
        entry: SpendEntry,
        *,
        run_budget: int | None = None,
        tenant_budget: int | None = None,
    ) -> Hold:
        check_entry(entry)
        held = self._holds.setdefault(entry.run_id, {})
        recorded = self._entries.get(entry.run_id, {})
        run_micros = sum(e.micros for e in (*recorded.values(), *held.values()))
        tenant_micros = self._tenants.get(entry.tenant, Spend()).micros
        tenant_micros += self._tenant_holds.get(entry.tenant, 0)
        if entry.seq in held or entry.seq in recorded:
            return Hold(held=True, run_micros=run_micros, tenant_micros=tenant_micros)
        answer = hold_decided(
            entry.micros,
            run_micros=run_micros,
            tenant_micros=tenant_micros,
            run_budget=run_budget,
            tenant_budget=tenant_budget,
        )
        if answer.held:
            held[entry.seq] = entry
            self._tenant_holds[entry.tenant] = (
                self._tenant_holds.get(entry.tenant, 0) + entry.micros
            )
        return answer

    async def release(self, run_id: str, seq: int) -> None:
        self._drop_hold(run_id, seq)

    async def release_run(self, run_id: str) -> int:
        released = 0
        for held in self._holds.pop(run_id, {}).values():
            self._tenant_holds[held.tenant] -= held.micros
            released += held.micros
        return released

    def _drop_hold(self, run_id: str, seq: int) -> None:
        held = self._holds.get(run_id, {}).pop(seq, None)
        if held is not None:
            self._tenant_holds[held.tenant] -= held.micros

    async def record(self, entry: SpendEntry) -> bool:
        check_entry(entry)
        run = self._entries.setdefault(entry.run_id, {})
        if entry.seq in run:
            return False
        self._drop_hold(entry.run_id, entry.seq)
        run[entry.seq] = entry
        self._tenants[entry.tenant] = self._tenants.get(entry.tenant, Spend()).plus(entry)
        return True

    async def run_total(self, run_id: str) -> Spend:
        total = Spend()
        for entry in self._entries.get(run_id, {}).values():
            total = total.plus(entry)
        return total

    async def run_totals(self, run_ids: Sequence[str]) -> dict[str, Spend]:
        return {
            run_id: await self.run_total(run_id)
            for run_id in dict.fromkeys(run_ids)
            if self._entries.get(run_id)
        }

    async def tenant_total(self, tenant: str) -> Spend:
        return self._tenants.get(tenant, Spend())

    async def entries(self, run_id: str) -> list[SpendEntry]:
        return sorted(self._entries.get(run_id, {}).values(), key=lambda e: e.seq)

    async def close(self) -> None:
        """Nothing to close; the entries stay for as long as the ledger object lives."""
