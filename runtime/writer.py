"""The write path of a held run: every append a worker makes goes through `RunWriter.append`.

In this order, for one batch of one run: confirm the lease is still this worker's; number the
events from the run's last seq; mask secrets (before anything is encoded or sized); move bodies
too large for one record to the blob store (claim check); append, durable on return; fold the
batch into the worker's frontier and stop with `FencedError` if the fold refused any of it
(another worker claimed the run); keep the conversation in step; fold into the local frontier
store where no projector does (embedded mode); tell the observer; once the run is finished,
drop its spend holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import msgspec

from onward.errors import BackendError, FencedError, OnwardError
from onward.eventlog.base import EventLog, StoredEvent
from onward.eventlog.events import Event, RunContinued, RunFinished, stamped
from onward.projections.frontier import Frontier, fold_all

from .agent import Agent
from .blobs import ClaimCheck, escape_bodies, unescape_bodies
from .checkpoint import Checkpointer
from .conversation import Conversation
from .leases.holder import Leaseholder
from .observability.counts import COUNTS
from .redaction import Redactor
from .spend import SpendEntry, SpendLedger

_E = TypeVar("_E", bound=Event)
_log = logging.getLogger(__name__)

APPEND_RETRY_FIRST_S = 0.2
"""How long `RunWriter.append_while_held` waits before it first reads the log back."""
APPEND_RETRY_MAX_S = 5.0
"""The longest wait between two read-backs of `RunWriter.append_while_held`."""


class RunObserver(Protocol):
    """Sees a run as it goes: for streaming to applications, and for fault injection in tests."""

    async def appended(self, events: Sequence[Event]) -> None:
        """A batch is durable in the log."""
        ...

    async def tool_returned(self, call_id: str) -> None:
        """A tool returned (its side effect is done); its `ToolCompleted` is not yet written."""
        ...

    async def before_model_call(self) -> None:
        """The model is about to be called."""
        ...


@dataclass
class HeldRun:
    """A run this worker holds under a lease: where it stands and what the model has seen."""

    agent: Agent
    held: Leaseholder
    frontier: Frontier
    conversation: Conversation
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def run_id(self) -> str:
        return self.frontier.run_id

    @property
    def tenant(self) -> str:
        return self.frontier.tenant

    @property
    def fence(self) -> int:
        """The fence every write of this holder carries."""
        return self.held.lease.fence


_ENDS = (RunFinished, RunContinued)
"""The events that end a run: nothing is written to it after, so none of its holds is
released by a call of its own."""


class RunWriter:
    """Appends to held runs: lease check, redaction, claim check, append, fold, fence check.

    Args:
        log: Where every event goes.
        redactor: Masks secrets before anything is encoded.
        claim_check: Moves bodies too large for one record out of line, if configured.
        checkpointer: Folds into the local frontier store after appends (embedded mode).
        observer: Sees each durable batch.
        spend: The spend ledger, if any: a batch that ends its run (`RunFinished`, or
            `RunContinued` into another) drops the run's holds (`SpendLedger.release_run`),
            whichever way the run ended; while the ledger does not answer, at a later end or
            held model call of this writer's (`drop_holds_left`).
    """

    def __init__(
        self,
        log: EventLog,
        *,
        redactor: Redactor,
        claim_check: ClaimCheck | None,
        checkpointer: Checkpointer | None,
        observer: RunObserver | None,
        spend: SpendLedger | None = None,
    ) -> None:
        self.log = log
        self.redactor = redactor
        self.claim_check = claim_check
        self.checkpointer = checkpointer
        self.observer = observer
        self.spend = spend
        self._holds_left: set[str] = set()
        """Runs that ended while the ledger did not answer: their holds are still to drop."""
        self._records_left: dict[tuple[str, int], SpendEntry] = {}
        """Answered calls the ledger did not answer the record of: still to record."""

    @staticmethod
    def next_seq(run: HeldRun, offset: int = 0) -> int:
        """The seq the run's next event takes (``offset`` counts within one batch)."""
        return run.frontier.last_seq + 1 + offset

    def event(self, run: HeldRun, kind: type[_E], offset: int = 0, **fields: Any) -> _E:
        """An event of ``run`` with its envelope; ``offset`` counts within one batch."""
        return stamped(
            kind,
            run_id=run.run_id,
            tenant=run.tenant,
            seq=self.next_seq(run, offset),
            fence=run.fence,
            **fields,
        )

    async def append(self, run: HeldRun, events: Sequence[Event]) -> None:
        """Write a batch of one run, in this run's order, and fold it into the run.

        Raises:
            FencedError: The lease is gone, or the log refused the batch because another worker
                claimed the run; nothing more may be written.
        """
        async with run.lock:
            try:
                await run.held.check()
            except FencedError:
                COUNTS.fenced_writes_refused += 1
                raise
            base = run.frontier.last_seq + 1
            batch = [
                msgspec.structs.replace(e, seq=base + i) if e.seq != base + i else e
                for i, e in enumerate(events)
            ]
            batch = [escape_bodies(self.redactor.redact_event(e)) for e in batch]
            if self.claim_check is not None:
                batch = [await self.claim_check.shrink(e) for e in batch]
            positions = await self.log.append(batch)
            stored = [
                StoredEvent(p, e)  # type: ignore[arg-type]  # every Event is of AnyEvent
                for e, p in zip(batch, positions, strict=True)
            ]
            await self._took(run, stored, [escape_bodies(e) for e in events])
        if self.spend is not None and any(isinstance(e, _ENDS) for e in batch):
            await self._release_holds(run.run_id)

    async def append_while_held(self, run: HeldRun, events: Sequence[Event], *, what: str) -> None:
        """`append`, kept trying through failures of the log for as long as the lease holds:
        for a batch that must not be given up on, such as the end a cancel ask wants (the ask
        goes with the holding, so the next holder would never hear it).

        After a failed append the log is read back (`read_back`: the batch may have landed
        and lost its answer) and the batch appended again only if it is not there; a log that
        cannot be read is looked at again. Each wait is logged, naming ``what`` waits, and
        doubles from `APPEND_RETRY_FIRST_S` to `APPEND_RETRY_MAX_S`.

        Raises:
            FencedError: The lease was lost first; nothing more may be written.
        """
        delay = APPEND_RETRY_FIRST_S
        while True:
            try:
                await self.append(run, events)
            except BackendError as exc:
                failure = exc
            else:
                return
            while True:
                _log.warning(
                    "run %s: %s may not be in the log (%s); reading the log back in %.1f s, "
                    "for as long as the lease holds",
                    run.run_id,
                    what,
                    failure,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(2 * delay, APPEND_RETRY_MAX_S)
                await run.held.check()
                try:
                    if await self.read_back(run):
                        return
                    break
                except BackendError as exc:
                    failure = exc

    async def read_back(self, run: HeldRun) -> bool:
        """After an append that raised `BackendError` (its outcome unknown: a broker may have
        stored the batch and lost the answer), take what of it the log holds, as `append` would
        have on success. Whether anything had landed; an append may be tried again only after
        this said no, or the run would hold the batch twice.

        Raises:
            FencedError: What landed was refused (another worker holds the run).
            BackendError: The log could not be read either; nothing is known still.
        """
        async with run.lock:
            tail = await self.log.read_run(run.run_id, start=run.frontier.through_offset + 1)
            landed = [s for s in tail if s.event.seq > run.frontier.last_seq]
            if not landed:
                return False
            restored = [escape_bodies(await self.restore(s.event)) for s in landed]
            await self._took(run, landed, restored)
        if self.spend is not None and any(isinstance(s.event, _ENDS) for s in landed):
            await self._release_holds(run.run_id)
        return True

    async def _took(
        self, run: HeldRun, stored: Sequence[StoredEvent], remembered: Sequence[Event]
    ) -> None:
        """Fold a durable batch into the run (stopping if the fold refused any of it), keep the
        conversation in step (``remembered``: the batch as the model is to see it), fold the
        local frontier store and tell the observer."""
        frontier = fold_all(run.frontier, stored)
        if frontier.refused > run.frontier.refused:
            COUNTS.fenced_writes_refused += 1
            raise FencedError(
                f"run {run.run_id!r}: this worker's writes under fence {run.fence} were "
                f"refused ({frontier.last_refusal}); another worker holds the run",
                run_id=run.run_id,
                fence=run.fence,
                holder=run.held.holder,
            )
        run.frontier = frontier
        for event in remembered:
            run.conversation.remember(event)
        batch = [s.event for s in stored]
        if self.checkpointer is not None:
            positions = [s.position for s in stored]
            await self.checkpointer.after_append(batch, positions, step=frontier.iteration)
        if self.observer is not None:
            await self.observer.appended(batch)

    async def _release_holds(self, run_id: str) -> None:
        """Drop the finished run's holds (`drop_holds_left`)."""
        self._holds_left.add(run_id)
        await self.drop_holds_left()

    async def record_spend(self, entry: SpendEntry) -> None:
        """Record a model call's cost. One the ledger does not take now (it does not answer)
        is kept, recorded later (`drop_holds_left`), and not raised: the provider was paid
        for the call, so its answer is still to be written, and the log then holds its usage
        under the entry's key, which a resume elsewhere records from if this process dies
        first (`AgentRunner.record_answers_left`). Raised, the answer would be lost with the
        entry, and the call made, and paid for, again."""
        if self.spend is None:
            return
        try:
            await self.spend.record(entry)
        except BackendError as exc:
            self._records_left[(entry.run_id, entry.seq)] = entry
            _log.warning("run %s: a call's spend is still to record (%s)", entry.run_id, exc)

    async def drop_holds_left(self) -> None:
        """Record the calls whose record found the ledger unreachable (`record_spend`), then
        drop the holds of the runs this writer ended, those left by an end that found the
        ledger unreachable too: nothing else would ever drop them (a run that ended is never
        claimed again), and they would count against the budgets for good. Called at each end
        and before each held model call (`AgentRunner.hold_model_call`). The run's end is
        durable already, so a ledger that cannot be reached is logged, not raised: the holds
        stay counted against the budgets (never as spent) until a later call finds it."""
        if self.spend is None:
            return
        for key, entry in list(self._records_left.items()):
            try:
                await asyncio.shield(self.spend.record(entry))
            except OnwardError as exc:
                _log.warning("run %s: a call's spend is still to record (%s)", key[0], exc)
                return
            del self._records_left[key]
        for run_id in list(self._holds_left):
            try:
                released = await asyncio.shield(self.spend.release_run(run_id))
            except OnwardError as exc:
                _log.warning("run %s finished; its held spend stays for now (%s)", run_id, exc)
                return
            self._holds_left.discard(run_id)
            if released:
                _log.info("run %s finished; %d held micros released", run_id, released)

    async def restore(self, event: Event) -> Event:
        """An event as it was before the claim check moved its body out of line."""
        if self.claim_check is None:
            return unescape_bodies(event)
        return await self.claim_check.restore(event)
