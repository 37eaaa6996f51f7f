"""Which boundaries become resume points, and the inline checkpointer of embedded mode.

Every fact is in the log, so a checkpoint is only a shortcut: a frontier row folded through some
offset, from which resume folds the rest. `CheckpointPolicy` says at which of the three
unambiguous boundaries the runner's inline checkpointer folds; a sparser policy writes fewer
rows and leaves a longer tail to fold on resume. It never repeats a tool call.

On PostgreSQL a step's checkpoints are folded beside the run's next step, not before it: the
fold is a shortcut, and a run waiting for it would wait for a dozen round trips a boundary for
nothing it needs. What a reader of the row must see at once (the run's start and end, a wait on
a person, a person's word) is folded before its append returns, and a run's holder waits for
the folds still under way before it lets the run go. SQLite's fold rides the log's group
commit in process and is not worth a task of its own.

A checkpoint that cannot be written (over the cap, or a store that is down) never fails the
live run: the run carries on and `Checkpointer.last_error` says what went wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from onward._storage import PostgresStore, SqliteStore
from onward.errors import InvalidInputError, OnwardError
from onward.eventlog.base import EventLog, Position
from onward.eventlog.events import (
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    Event,
    ModelAnswered,
    RunContinued,
    RunFinished,
    RunStarted,
    Tagged,
    ToolResolved,
    TurnSettled,
)
from onward.projections.base import DEFAULT_MAX_BYTES, FrontierStore
from onward.projections.compaction import CompactionStore
from onward.projections.frontier import counts_at
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.log_projector import LogProjector

from .observability.counts import COUNTS

log = logging.getLogger("onward.checkpoint")

_ALWAYS_FOLDED = (
    RunStarted,
    RunFinished,
    RunContinued,
    ApprovalGranted,
    ApprovalDenied,
    ToolResolved,
    Tagged,
)
"""Events folded into the row as soon as they are appended: the run's start (a run whose process
died before its first boundary must have a row, or no worker ever finds it), its end, and a
person's word (from `onward approve`, `deny`, `resolve` or `tag` in another process, often)."""


def shown_at_once(events: Sequence[Event]) -> bool:
    """Whether a batch must be in the row as soon as it is durable: it starts or ends the run,
    is a person's word (`_ALWAYS_FOLDED`), or makes the run wait on a person (`list_pending`
    and the application's ``waiting`` status read that from the row)."""
    return any(isinstance(e, _SHOWN_AT_ONCE) for e in events)


_SHOWN_AT_ONCE = (*_ALWAYS_FOLDED, ApprovalRequested)


MAX_CHECKPOINT_FREQUENCY = 1_000_000


def check_frequency(value: object, *, field: str = "checkpoint_frequency") -> int:
    """``value`` if it is a whole number from 1 to `MAX_CHECKPOINT_FREQUENCY`.

    Raises:
        InvalidInputError: Anything else (``True``, ``2.0`` and ``"2"`` too), naming ``field``.
    """
    if type(value) is not int or not 1 <= value <= MAX_CHECKPOINT_FREQUENCY:
        raise InvalidInputError(
            f"{field} must be a whole number of steps from 1 to {MAX_CHECKPOINT_FREQUENCY:,}, "
            f"got {value!r:.40}"
        )
    return value


@dataclass(frozen=True, slots=True)
class CheckpointPolicy:
    """The boundaries at which a checkpoint is written: all three by default, in every step.

    A step is one model call and the turn of tool calls it asked for; steps are counted from
    the run's first (across a chain of continued runs).

    Attributes:
        after_model_call: The model answered; what it asked for is known, none of it ran.
        after_tool_result: Every call of the turn has an outcome.
        before_approval: The run is about to wait on a person.
        checkpoint_frequency: A checkpoint every N steps: the ``after_model_call`` and
            ``after_tool_result`` boundaries (those chosen) of steps N, 2N, 3N, ... are
            checkpoints, those of the steps between are not; ``before_approval`` is one in
            every step (the run waits on a person there). 1, the default: every step. Fewer
            checkpoints write fewer frontier rows and leave a longer tail of the log to fold
            on resume; a tool call is never repeated either way.

    Raises:
        InvalidInputError: ``checkpoint_frequency`` is not a whole number of at least 1.
    """

    after_model_call: bool = True
    after_tool_result: bool = True
    before_approval: bool = True
    checkpoint_frequency: int = 1

    def __post_init__(self) -> None:
        check_frequency(self.checkpoint_frequency)

    def wants(self, events: Sequence[Event], *, step: int | None = None) -> bool:
        """Whether a batch ends at a boundary this policy checkpoints, starts or ends the run, or
        is a person's word (an answer, a settled call, a tag): what a worker and `list_pending`
        read from the row must show it at once, whatever the policy.

        Args:
            step: The step the batch belongs to (the run's model calls so far, its frontier's
                ``iteration``); ``None``: whatever step, as if every step were a checkpoint's.
        """
        in_step = step is None or counts_at("after_tool_result", step, self.checkpoint_frequency)
        for event in events:
            if isinstance(event, _ALWAYS_FOLDED):
                return True
            if isinstance(event, ModelAnswered) and self.after_model_call and in_step:
                return True
            if isinstance(event, TurnSettled) and self.after_tool_result and in_step:
                return True
            if isinstance(event, ApprovalRequested) and self.before_approval:
                return True
        return False


class Checkpointer:
    """Folds a run's appends into a local frontier store right after they are durable.

    Args:
        store: The frontier store (SQLite in embedded mode).
        log: The log the appends went to.
        policy: Which boundaries to fold at.
        max_bytes: The snapshot cap.
        steps_beside: Fold a step's boundaries beside the run's next step rather than before
            it (`after_append`); by default where a fold costs round trips (PostgreSQL).
        compaction: Where a frontier over ``max_bytes`` is kept uncapped beside its row, so
            the run's next fold and its resume go on from it rather than from the run's first
            event; an embedded SQLite log brings its own, any other log's must be named.
    """

    def __init__(
        self,
        store: FrontierStore,
        log: EventLog,
        *,
        policy: CheckpointPolicy | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        steps_beside: bool | None = None,
        compaction: CompactionStore | None = None,
    ) -> None:
        self.policy = policy or CheckpointPolicy()
        # A fold in PostgreSQL is a dozen round trips the run needs nothing from; SQLite's
        # rides the log's group commit in process, and memory's is a dictionary's.
        self.steps_beside = (
            isinstance(store, PostgresStore) if steps_beside is None else steps_beside
        )
        # Embedded mode folds every partition itself, so a run a person released from
        # quarantine is folded again on the next catch-up, wherever its partition stands.
        self.projection = FrontierProjection(
            store,
            log,
            max_bytes=max_bytes,
            release_poll=0.0,
            every_partition=True,
            compaction=compaction,
        )
        # Which runs' frontiers are over the cap, for `last_error`: a pass folds the runs of
        # every request merged into it, so its count of refused snapshots says not whose.
        self._over_cap: set[str] = set()
        self.projection.over_cap = self._over_cap
        self._projector = LogProjector(log, self.projection)
        # Other processes fold the same file or schema (two embedded workers, a worker and `onward
        # approve`): one catch-up at a time across them, or one could store rows folded onto
        # a row cached before the other's write, with a position past the events it skipped.
        self._across_processes: contextlib.AbstractAsyncContextManager[None]
        if isinstance(store, SqliteStore) and not store.readonly:
            self._across_processes = store.exclusive("fold")  # a lock file beside it
        elif isinstance(store, PostgresStore):
            self._across_processes = store.exclusive("fold")  # an advisory lock
        else:
            self._across_processes = contextlib.nullcontext()
        self._in_process = asyncio.Lock()
        # Group folding: the partitions asked for since the last catch-up began, and tickets
        # saying which requests a finished catch-up covered (it covers every request made
        # before it began, since those appends were durable by then).
        self._wanted: set[int] = set()
        self._requested = 0
        self._covered = 0
        self._folding: set[asyncio.Task[None]] = set()
        self._latest: asyncio.Task[None] | None = None
        self.last_error: str | None = None
        self.written = 0

    async def catch_up(self, partitions: Sequence[int] | None = None) -> int:
        """Fold whatever is in the log past the stored positions (every partition by default).

        What another process appended, or what a crash left unfolded, is folded here; returns
        how many events were read.
        """
        async with self._in_process, self._across_processes:
            return await self._projector.catch_up(partitions)

    async def after_append(
        self, events: Sequence[Event], positions: Sequence[Position], *, step: int | None = None
    ) -> None:
        """Fold the partition of a batch just appended, if the policy wants a checkpoint here
        (``step``: the run's model calls so far, for the policy's ``checkpoint_frequency``).

        A batch a reader of the row must see at once (`shown_at_once`: the run's start or
        end, a wait on a person, a person's word) is folded before this returns. With
        ``steps_beside``, any other checkpoint, a step's boundary, is folded in the background,
        so the run's next step does not wait for it; `settled` waits for those (a run's holder
        does before it lets go of the lease). Concurrent runs share catch-ups: one that waited
        while another catch-up ran is served by the next, which folds every partition asked
        for meanwhile in one pass (one store write) instead of one pass each.
        """
        if not self.policy.wants(events, step=step):
            return
        self._wanted.add(positions[0].partition)
        self._requested += 1
        checkpoint = self._checkpoint(self._requested, events[0].run_id)
        if not self.steps_beside or shown_at_once(events):
            await checkpoint
            return
        folding = asyncio.create_task(checkpoint, name=f"checkpoint of {events[0].run_id}")
        self._folding.add(folding)  # a reference until it is done
        folding.add_done_callback(self._folding.discard)
        self._latest = folding

    async def settled(self) -> None:
        """Until the checkpoints being folded in the background now are stored (or have
        failed, each saying so in the log and in `last_error`).

        The latest one is enough to wait for: folds take the in-process lock in the order they
        were asked for, and a fold covers every checkpoint asked for before it, so once the
        latest is done every earlier one is. Shielded: a waiter cancelled does not cancel it.
        """
        latest = self._latest
        if latest is not None and not latest.done():
            await asyncio.shield(latest)

    async def _checkpoint(self, ticket: int, run_id: str) -> None:
        """Fold through request ``ticket``; a failure is logged, never raised.

        Whatever the error, not only a store's: raised, it would fail the live run, or come
        out of `settled` in its holder and stand in for the run's own outcome."""
        try:
            # What another process on the same file folded since is noticed by the projector
            # (a position it did not store), which then folds onto the stored rows.
            await self._fold_through(ticket)
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            COUNTS.checkpoints_not_written += 1
            log.warning(
                "checkpoint not written, the run carries on: %s",
                self.last_error,
                exc_info=not isinstance(exc, OnwardError),
            )
            return
        if run_id in self._over_cap:
            self.last_error = (
                f"run {run_id!r}: frontier over the {self.projection.max_bytes}-byte "
                "cap; the row keeps its reason and resume folds from the log"
            )
        else:
            self.last_error = None
        self.written += 1

    async def _fold_through(self, ticket: int) -> None:
        """Return once a catch-up that began after request ``ticket`` was made has stored."""
        async with self._in_process:
            if self._covered >= ticket:
                return
            through = self._requested
            partitions, self._wanted = sorted(self._wanted), set()
            try:
                async with self._across_processes:
                    await self._projector.catch_up(partitions)
            except BaseException:
                self._wanted.update(partitions)  # still wanted: the next waiter tries again
                raise
            self._covered = through
