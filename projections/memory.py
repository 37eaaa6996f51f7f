"""`MemoryFrontierStore`: frontier rows in dicts, for unit tests. Nothing outlives the process."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Collection

from .base import (
    FrontierStoreBackend,
    FrontierWrite,
    QuarantineEntry,
    QuarantineState,
    RunSummary,
    StoredFrontier,
    check_runs_limit,
    decode_payload,
    released_mark,
)
from .frontier import RunStatus, ToolCallRow
from .transcript import TranscriptRow, decode_message


class MemoryFrontierStore(FrontierStoreBackend):
    """An in-process `FrontierStore` with the same guards as the durable ones."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[RunSummary, bytes | None, str | None]] = {}
        self._calls: dict[tuple[str, str], ToolCallRow] = {}
        self._positions: dict[tuple[str, int], int] = {}
        self._quarantine: dict[tuple[str, int, int], QuarantineEntry] = {}
        self._marks: dict[str, str] = {}
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
        return StoredFrontier.of(summary, frontier, error, self._marks.get(run_id))

    async def load(self, run_ids: Collection[str]) -> dict[str, StoredFrontier]:
        found = {run_id: self._stored(run_id) for run_id in run_ids}
        return {k: v for k, v in found.items() if v is not None}

    async def get(self, run_id: str) -> StoredFrontier | None:
        return self._stored(run_id)

    async def _write(self, batch: FrontierWrite) -> None:
        """Read the whole batch before changing anything, so a batch that fails partway (an
        item that cannot be read) stores none of it, as a durable store's rolled-back
        transaction does."""
        consumer = batch.consumer
        rows = [(RunSummary.of(snap.frontier), snap) for snap in batch.snapshots]
        calls = list(batch.calls)
        cleared = list(batch.cleared)
        quarantine = [(entry, entry.mark) for entry in batch.quarantine]
        positions = list(batch.positions.items())
        messages = [(said.tenant, said.run_id, said.seq, said.encoded()) for said in batch.messages]
        restarted = list(batch.restarted)
        async with self._lock:
            self._forget_restarted(restarted)
            for summary, snap in rows:
                current = self._rows.get(summary.run_id)
                if current is None or current[0].through_offset < summary.through_offset:
                    self._rows[summary.run_id] = (summary, snap.payload, snap.error)
            for call in calls:
                key = (call.run_id, call.call_id)
                existing = self._calls.get(key)
                if existing is None or existing.through_offset < call.through_offset:
                    self._calls[key] = call
            for (held_by, _, _), entry in list(self._quarantine.items()):
                released = entry.run_id in cleared and entry.state == "released"
                if held_by == consumer and released:
                    self._replace_entry(consumer, entry, state="cleared")
            for run_id in cleared:
                self._marks.pop(run_id, None)
            for entry, mark in quarantine:
                self._hold(consumer, entry, mark, refolded=entry.run_id in cleared)
            for partition, offset in positions:
                key2 = (consumer, partition)
                self._positions[key2] = max(offset, self._positions.get(key2, 0))
            for tenant, run_id, seq, encoded in messages:
                self._transcript.setdefault((tenant, run_id), {}).setdefault(seq, encoded)

    def _forget_restarted(self, restarted: list[tuple[str, str, int]]) -> None:
        """Delete the call rows of collected runs whose ids began again, and their messages
        under the tenant given through the seq given (`FrontierStore.write`)."""
        for tenant, run_id, through in restarted:
            for key in [k for k in self._calls if k[0] == run_id]:
                del self._calls[key]
            said = self._transcript.get((tenant, run_id), {})
            for seq in [seq for seq in said if seq <= through]:
                del said[seq]

    async def transcript(self, run_id: str, *, tenant: str, through: int) -> list[TranscriptRow]:
        run = self._transcript.get((tenant, run_id), {})
        return [
            TranscriptRow(tenant=tenant, run_id=run_id, seq=seq, message=decode_message(run[seq]))
            for seq in sorted(run)
            if seq <= through
        ]

    def _hold(self, consumer: str, entry: QuarantineEntry, mark: str, *, refolded: bool) -> None:
        """Hold ``entry`` and mark its run's row; one already stored keeps who released the
        run last, and when. A released or cleared one is held again only if ``refolded``."""
        key = (consumer, entry.partition, entry.offset)
        stored = self._quarantine.get(key)
        if stored is not None:
            if stored.state != "held" and not refolded:
                return  # folded before a release and stored after it: the release stands
            entry = dataclasses.replace(
                entry, released_by=stored.released_by, released_at=stored.released_at
            )
        self._quarantine[key] = entry
        if entry.run_id is not None and entry.run_id in self._rows:
            self._marks[entry.run_id] = mark

    def _replace_entry(self, consumer: str, entry: QuarantineEntry, **changes: object) -> None:
        key = (consumer, entry.partition, entry.offset)
        self._quarantine[key] = dataclasses.replace(entry, **changes)  # type: ignore[arg-type]

    async def quarantined(
        self,
        consumer: str,
        *,
        run_id: str | None = None,
        states: Collection[QuarantineState] | None = None,
    ) -> list[QuarantineEntry]:
        return [
            entry
            for (held_by, _, _), entry in sorted(self._quarantine.items(), key=lambda kv: kv[0])
            if held_by == consumer
            and (run_id is None or entry.run_id == run_id)
            and (states is None or entry.state in states)
        ]

    async def release(self, consumer: str, run_id: str, *, by: str, at: int) -> int:
        async with self._lock:
            held = await self.quarantined(consumer, run_id=run_id, states={"held"})
            for entry in held:
                self._replace_entry(
                    consumer, entry, state="released", released_by=by, released_at=at
                )
            if held and run_id in self._rows:
                self._marks[run_id] = released_mark(by)
            return len(held)

    async def dismiss(self, consumer: str, partition: int, offset: int, *, by: str, at: int) -> int:
        async with self._lock:
            entry = self._quarantine.get((consumer, partition, offset))
            if entry is None or entry.run_id is not None or entry.state != "held":
                return 0
            self._replace_entry(consumer, entry, state="cleared", released_by=by, released_at=at)
            return 1

    async def positions(self, consumer: str) -> dict[int, int]:
        return {p: o for (c, p), o in self._positions.items() if c == consumer}

    async def tool_calls(self, run_id: str) -> list[ToolCallRow]:
        rows = [row for (run, _), row in self._calls.items() if run == run_id]
        return sorted(rows, key=lambda r: (r.dispatched_at is None, r.dispatched_at, r.call_id))

    async def runs(
        self,
        *,
        tenant: str | None = None,
        statuses: Collection[RunStatus] | None = None,
        user: str | None = None,
        agent: str | None = None,
        updated_before: int | None = None,
        after: str | None = None,
        limit: int | None = None,
    ) -> list[RunSummary]:
        check_runs_limit(limit)
        rows = [
            summary
            for summary, _, _ in self._rows.values()
            if (tenant is None or summary.tenant == tenant)
            and (statuses is None or summary.status in statuses)
            and (user is None or summary.user_id == user)
            and (agent is None or summary.agent == agent)
            and (updated_before is None or summary.updated_at < updated_before)
            and (after is None or summary.run_id > after)
        ]
        return sorted(rows, key=lambda s: s.run_id)[:limit]
