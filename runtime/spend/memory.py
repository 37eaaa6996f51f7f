"""`MemorySpendLedger`: spend in this process, for tests and single-process embedding."""

from __future__ import annotations

from collections.abc import Sequence

from onward._storage import Resource

from .base import Spend, SpendEntry, check_entry


class MemorySpendLedger(Resource):
    """A `SpendLedger` held in dicts: nothing survives the process. Every method decides
    without awaiting, so on one event loop each call is atomic."""

    def __init__(self) -> None:
        self._entries: dict[str, dict[int, SpendEntry]] = {}
        self._tenants: dict[str, Spend] = {}

    async def record(self, entry: SpendEntry) -> bool:
        check_entry(entry)
        run = self._entries.setdefault(entry.run_id, {})
        if entry.seq in run:
            return False
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
