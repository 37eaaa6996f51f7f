"""Poison records: the runs a `FrontierProjection` sets aside, and their release.

A record that cannot be decoded (or is in a newer format, or of an unknown kind) never stops a
partition. The projection folds the run's events before it, sets the run aside with a
`QuarantineEntry` stored in the same transaction as the positions that move past the record,
marks the run's row, and skips (and counts) the run's later events while every other run is
folded on. A person releases the run (``onward quarantine release``); the projection's next
pass folds it again from its first offset up to where the partition is folded, and clears the
entries, or, if the record is still unreadable, holds it again once.
"""

from __future__ import annotations

import logging
import time

from onward.eventlog.base import UnreadableRecord

from .base import FrontierStore, QuarantineEntry

log = logging.getLogger("onward.projector")


class Quarantine:
    """What a projection knows of the runs it set aside, and what of that is not stored yet.

    Args:
        store: Read for the runs a person released.
        consumer: The projection's name in the store.
        release_poll: How often, in seconds, to look for released runs; 0 looks every time.
    """

    def __init__(self, store: FrontierStore, consumer: str, *, release_poll: float) -> None:
        self.store = store
        self.consumer = consumer
        self.held: dict[str, str] = {}
        """Runs set aside, with their row's mark (each has an entry in the projection's cache)."""
        self.entries: list[QuarantineEntry] = []
        """Records set aside and not stored yet."""
        self.cleared: set[str] = set()
        """Released runs folded again, whose entries are not cleared in the store yet."""
        self.folded_to: dict[int, int] = {}
        """How far each partition is folded (stored or not)."""
        self._release_poll = release_poll
        self._releases_checked = -float("inf")

    @property
    def unstored(self) -> bool:
        """Whether anything set aside or released waits to be stored."""
        return bool(self.entries or self.cleared)

    def set_aside(
        self, run_id: str | None, tenant: str | None, bad: UnreadableRecord
    ) -> QuarantineEntry:
        """File ``bad`` to be stored with the positions past it, and hold its run (if any).

        ``tenant`` is the run's, for a record that does not say its own. Nothing is logged
        until the entry is stored (:func:`say_quarantined`).
        """
        entry = QuarantineEntry(
            run_id=run_id,
            tenant=bad.tenant if bad.tenant is not None else tenant,
            partition=bad.position.partition,
            offset=bad.position.offset,
            kind=bad.kind,
            reason=bad.reason,
            quarantined_at=time.time_ns() // 1_000,
        )
        self.entries.append(entry)
        if run_id is not None:
            self.held[run_id] = entry.mark
        return entry

    def release_due(self) -> bool:
        """Whether to look for released runs now (then the next look waits a poll)."""
        now = time.monotonic()
        if now - self._releases_checked < self._release_poll or not self.folded_to:
            return False
        self._releases_checked = now
        return True

    async def released(self) -> dict[str, int]:
        """Released runs not folded again yet, in partitions this projection folds past their
        records: their partitions.

        A run with a record this projection has not folded past is left to one that has:
        folded again short of the record, it would be cleared while the record may still be
        unreadable. That happens to a projection that knows a partition only as far as another
        had folded it before setting the run aside there (an embedded process catching up its
        own partitions, a Kafka member folding a batch of one a rebalance gave away)."""
        runs: dict[str, int] = {}
        short: set[str] = set()
        for entry in await self.store.quarantined(self.consumer, states={"released"}):
            run_id = entry.run_id
            if run_id is None or run_id in self.cleared:
                continue
            folded = self.folded_to.get(entry.partition)
            if folded is None:
                continue
            if entry.offset >= folded:
                short.add(run_id)
            runs.setdefault(run_id, entry.partition)
        return {run_id: p for run_id, p in runs.items() if run_id not in short}

    def take(self) -> tuple[list[QuarantineEntry], set[str]]:
        """The entries and cleared runs to store now; they are no longer pending here."""
        entries, cleared = self.entries, self.cleared
        self.entries = []
        self.cleared = set()
        return entries, cleared

    def drop(self) -> None:
        """Forget everything: what is stored is all that is known now."""
        self.held.clear()
        self.entries = []
        self.cleared = set()
        self.folded_to.clear()


def say_quarantined(entry: QuarantineEntry) -> None:
    """Logged once the entry is stored, so the line never runs ahead of the store."""
    log.warning(
        "quarantined the record at partition %d offset %d (run %r, kind %s): %s; %s",
        entry.partition,
        entry.offset,
        entry.run_id,
        entry.kind or "unknown",
        entry.reason,
        "the run is set aside until `onward quarantine release` names it"
        if entry.run_id is not None
        else "it names no run",
    )
