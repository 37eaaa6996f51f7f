"""`MemoryFrontierStore`: frontier rows in dicts, for unit tests. Nothing outlives the process."""

from __future__ import annotations

import asyncio
from collections.abc import Collection

from .base import (
    FrontierStoreBackend,
    FrontierWrite,
    RunSummary,
    StoredFrontier,
    decode_payload,
)
from .frontier import RunStatus, ToolCallRow
from .transcript import TranscriptRow, decode_message


class MemoryFrontierStore(FrontierStoreBackend):
    """An in-process `FrontierStore` with the same guards as the durable ones."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[RunSummary, bytes | None, str | None]] = {}
        self._calls: dict[tuple[str, str], ToolCallRow] = {}
        self._positions: dict[tuple[str, int], int] = {}
        self._transcript: dict[tuple[str, str], dict[int, bytes]] = {}
        self._lock = asyncio.Lock()

    async def verify(self) -> None:
        return None

    def _stored(self, run_id: str) -> StoredFrontier | None:
        row = self._rows.get(run_id)
        if row is None:
            return None
        summary, payload, error = row
        frontier = decode_payload(payload, run_id=run_id) if payload is not None else None
        return StoredFrontier(summary, frontier, error)

    async def load(self, run_ids: Collection[str]) -> dict[str, StoredFrontier]:
        found = {run_id: self._stored(run_id) for run_id in run_ids}
        return {k: v for k, v in found.items() if v is not None}

    async def get(self, run_id: str) -> StoredFrontier | None:
        return self._stored(run_id)

    async def _write(self, batch: FrontierWrite) -> None:
        consumer, positions, snapshots, calls, _ = batch
        async with self._lock:
            for snap in snapshots:
                summary = RunSummary.of(snap.frontier)
                current = self._rows.get(summary.run_id)
                if current is None or current[0].through_offset < summary.through_offset:
                    self._rows[summary.run_id] = (summary, snap.payload, snap.error)
            for call in calls:
                key = (call.run_id, call.call_id)
                existing = self._calls.get(key)
                if existing is None or existing.through_offset < call.through_offset:
                    self._calls[key] = call
            for partition, offset in positions.items():
                key2 = (consumer, partition)
                self._positions[key2] = max(offset, self._positions.get(key2, 0))
            for said in batch.messages:
                run = self._transcript.setdefault((said.tenant, said.run_id), {})
                run.setdefault(said.seq, said.encoded())

    async def transcript(self, run_id: str, *, tenant: str, through: int) -> list[TranscriptRow]:
        run = self._transcript.get((tenant, run_id), {})
        return [
            TranscriptRow(tenant=tenant, run_id=run_id, seq=seq, message=decode_message(run[seq]))
            for seq in sorted(run)
            if seq <= through
        ]

    async def positions(self, consumer: str) -> dict[int, int]:
        return {p: o for (c, p), o in self._positions.items() if c == consumer}

    async def tool_calls(self, run_id: str) -> list[ToolCallRow]:
        rows = [row for (run, _), row in self._calls.items() if run == run_id]
        return sorted(rows, key=lambda r: (r.dispatched_at is None, r.dispatched_at, r.call_id))

    async def runs(
        self, *, tenant: str | None = None, statuses: Collection[RunStatus] | None = None
    ) -> list[RunSummary]:
        rows = [
            summary
            for summary, _, _ in self._rows.values()
            if (tenant is None or summary.tenant == tenant)
            and (statuses is None or summary.status in statuses)
        ]
        return sorted(rows, key=lambda s: s.run_id)
