"""`MemoryCompactionStore`: compaction's rows in dicts, for unit tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Sequence

from msgspec.structs import replace

from onward._storage import Resource
from onward.projections.base import DEFAULT_CONSUMER, FrontierStore
from onward.projections.frontier import Frontier

from .base import LogCut, RetainedEvent, RunTruncation, TagPin, refuse_compacted


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
        self._pins: dict[tuple[str, int], int] = {}
        self._snapshots: dict[str, Frontier] = {}
        self.tombstoned: set[str] = set()
        """Runs garbage collection removed (a memory deployment's collector adds them)."""
        self._lock = asyncio.Lock()

    async def truncations(self, run_ids: Collection[str]) -> dict[str, RunTruncation]:
        return {r: self._truncations[r] for r in run_ids if r in self._truncations}

    async def truncate(
        self,
        truncations: Sequence[RunTruncation],
        retained: Sequence[RetainedEvent],
        *,
        checkpoints: int | None = None,
    ) -> list[TagPin]:
        async with self._lock:
            copies = {(e.run_id, e.seq) for e in retained} | set(self._retained)
            points = {t.run_id: t.before_seq for t in truncations}
            missing = [
                TagPin(run_id, seq)
                for run_id, seq in sorted(self._pins)
                if seq < points.get(run_id, 0) and (run_id, seq) not in copies
            ]
            if missing:
                return missing
            for event in retained:
                key = (event.run_id, event.seq)
                held = self._retained.get(key)
                if held is None:
                    self._retained[key] = event
                elif held.kept_as == "checkpoint" and event.kept_as != "checkpoint":
                    self._retained[key] = replace(held, kept_as=event.kept_as)
            for point in truncations:
                current = self._truncations.get(point.run_id)
                if current is None or current.before_seq < point.before_seq:
                    self._truncations[point.run_id] = point
            if checkpoints is not None:
                for run_id in points:
                    kept = sorted(
                        (
                            seq
                            for (run, seq), e in self._retained.items()
                            if run == run_id and e.kept_as == "checkpoint"
                        ),
                        reverse=True,
                    )
                    for seq in kept[checkpoints:]:
                        del self._retained[(run_id, seq)]
            return []

    async def pin(self, run_id: str, tenant: str, seq: int) -> None:
        async with self._lock:
            held = {s for (run, s) in self._retained if run == run_id}
            refuse_compacted(run_id, seq, self._truncations.get(run_id), held)
            self._pins.setdefault((run_id, seq), time.time_ns() // 1_000)
            copy = self._retained.get((run_id, seq))
            if copy is not None and copy.kept_as == "checkpoint":
                self._retained[(run_id, seq)] = replace(copy, kept_as="tag")

    async def pins(self, run_ids: Collection[str]) -> dict[str, set[int]]:
        wanted = set(run_ids)
        found: dict[str, set[int]] = {}
        for run_id, seq in self._pins:
            if run_id in wanted:
                found.setdefault(run_id, set()).add(seq)
        return found

    async def tombstones(self, run_ids: Collection[str]) -> set[str]:
        return self.tombstoned.intersection(run_ids)

    async def put_snapshots(self, frontiers: Sequence[Frontier]) -> None:
        for frontier in frontiers:
            held = self._snapshots.get(frontier.run_id)
            if held is None or held.through_offset < frontier.through_offset:
                self._snapshots[frontier.run_id] = frontier

    async def snapshots(self, run_ids: Collection[str]) -> dict[str, Frontier]:
        return {r: self._snapshots[r] for r in run_ids if r in self._snapshots}

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
