"""`MemoryCompactionStore`: compaction's rows in dicts, for unit tests."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence

from onward._storage import Resource
from onward.projections.base import FrontierStore
from onward.projections.projector import DEFAULT_CONSUMER

from .base import LogCut, RetainedEvent, RunTruncation


class MemoryCompactionStore(Resource):
    """An in-process `CompactionStore` with the same guards as the durable ones.

    Args:
        frontiers: The frontier store whose projectors' positions bound what may be cut.
        consumers: The consumer names whose positions count (a memory store cannot list them).
    """

    def __init__(
        self, frontiers: FrontierStore, *, consumers: Sequence[str] = (DEFAULT_CONSUMER,)
    ) -> None:
        self._frontiers = frontiers
        self._consumers = tuple(consumers)
        self._truncations: dict[str, RunTruncation] = {}
        self._retained: dict[tuple[str, int], RetainedEvent] = {}
        self._cuts: dict[tuple[int, int], LogCut] = {}
        self._lock = asyncio.Lock()

    async def truncations(self, run_ids: Collection[str]) -> dict[str, RunTruncation]:
        return {r: self._truncations[r] for r in run_ids if r in self._truncations}

    async def truncate(
        self, truncations: Sequence[RunTruncation], retained: Sequence[RetainedEvent]
    ) -> None:
        async with self._lock:
            for event in retained:
                self._retained.setdefault((event.run_id, event.seq), event)
            for point in truncations:
                current = self._truncations.get(point.run_id)
                if current is None or current.before_seq < point.before_seq:
                    self._truncations[point.run_id] = point

    async def retained(self, run_id: str) -> list[RetainedEvent]:
        return sorted(
            (e for (run, _), e in self._retained.items() if run == run_id), key=lambda e: e.seq
        )

    async def retained_seqs(self, run_ids: Collection[str]) -> dict[str, set[int]]:
        wanted = set(run_ids)
        found: dict[str, set[int]] = {}
        for run_id, seq in self._retained:
            if run_id in wanted:
                found.setdefault(run_id, set()).add(seq)
        return found

    async def positions(self) -> dict[str, dict[int, int]]:
        return {c: await self._frontiers.positions(c) for c in self._consumers}

    async def record_cut(self, cut: LogCut) -> None:
        async with self._lock:
            key = (cut.partition, cut.start)
            current = self._cuts.get(key)
            if current is None or current.end < cut.end:
                self._cuts[key] = cut

    async def cuts(self, partition: int | None = None) -> list[LogCut]:
        return [
            cut
            for key, cut in sorted(self._cuts.items())
            if partition is None or key[0] == partition
        ]
