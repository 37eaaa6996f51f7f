"""Continuation: a long run carried into a new run, with nothing it was acting under dropped.

A run's log grows with every step, and so does what a resume or an audit of it reads.
`ContinuationPolicy(max_steps, max_history_bytes).due(frontier, ...)` says when a run has gone
on long enough; the runner then carries it into a new run, at a point where no call of the turn
in progress has been dispatched:

1. `continued(frontier)` builds the `Continuation`: the transcript handles the new run's
   conversation starts from (the old run's own, after those it was itself carried on from),
   the usage and iteration count so far, the calls of the turn in progress with their
   idempotency keys, and the approvals in force with who granted them. `Continuation.check`
   refuses one that dropped an approval or a grant (`ConfigurationError`): the new run would
   otherwise go on unapproved, or ask a person again for what they already allowed.
2. Under the new run's lease: its `RunStarted` names the old run (``continuation_of``),
   carries the continuation (``carried``) and records the options the old run is bound by
   (`carried_options`: its person, pauses, bound on model calls and budgets).
3. Under the old run's lease: `RunContinued` names the new run; the old run is finished.
4. The new run is resumed like any other: its conversation is the old transcripts, read where
   they are (never copied into the log twice), then its own.

A crash between 2 and 3 leaves the new run started and the old one running; the old run's next
resume finds its successor (the new run's id is derived from the old one's, `successor_ids`) and
only writes step 3.

Step 3 is what hands the turn over, not step 2: the old run's `RunContinued` is fenced like any
of its events, so a holder that lost the old run while starting the successor (paused past its
ttl, or a lease store that forgot it) has its `RunContinued` refused by every reader if another
worker claimed the old run first. The new run therefore acts only once the old run's log says it
was continued into it (`handed_over`): until then its resume finishes the carry in the old run
first, and a new run whose old run went on without it (`overtaken`) is ended without acting,
and is never taken for a carry again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Literal

from onward.errors import (
    BackendError,
    ConfigurationError,
    FencedError,
    HistoryUnavailableError,
    InvalidInputError,
    NothingToResumeError,
    PayloadTooLargeError,
    ResumeConflictError,
)
from onward.eventlog.events import (
    Carried,
    Grant,
    HistoryHandle,
    RunContinued,
    RunFinished,
    RunStarted,
    ToolCall,
    Usage,
)
from onward.projections.frontier import Frontier

from .conversation import Conversation
from .leases.base import CancelAsked, check_ask
from .leases.holder import Leaseholder
from .limits import MAX_NAME_LENGTH, check_name, check_stored_name
from .resumer import Resumer
from .writer import HeldRun, RunWriter

_log = logging.getLogger(__name__)

_SUFFIX = "~c"
_DIGEST = 16
"""Hex digits of the digest a successor id too long to fit carries in place of its cut."""
_NUMBER = 18
"""Most digits a successor's number has: more are taken for part of the run's name."""
_TAG = 8
"""Hex digits of the digest of the old run's id a successor id holds when its first is taken."""
_TRIES = 8
"""Ids a carry tries (`successor_ids`) before the run goes on uncarried."""
_ASKS = 8
"""Times a cancel asked during a carry is passed on (`_pass_on_ask`) while the new run is taken
up between the ask finding it free and the carrying holder taking it, or a store fails."""
_ASK_RETRY_S = 0.05
"""First wait before `_pass_on_ask` tries again after a store failed; doubled each try, to 1s."""


def successor_id(run_id: str) -> str:
    """The id of the run ``run_id`` is carried into: ``r`` becomes ``r~c1``, ``r~c1`` ``r~c2``.

    Derived, not drawn, so a carry interrupted by a crash finds the successor it started.
    Never longer than a run id may be (`MAX_NAME_LENGTH`), or no resume would take the run
    the old one was ended into: a base that would not fit is cut and its digest added.
    """
    return _fitted(*_numbered(run_id))


def successor_ids(run_id: str) -> tuple[str, ...]:
    """The ids a carry of ``run_id`` tries, in order: `successor_id`, then ids holding a digest
    of ``run_id`` itself. Another run may hold the first (``r~c01`` and ``r~c1`` both number
    theirs ``r~c2``; a person may name a run ``job~c1``), and the carry would otherwise be
    refused at every boundary; derived all the same, so a carry a crash cut short is found.
    """
    base, suffix = _numbered(run_id)
    tagged = (
        f"#{hashlib.sha256(f'{run_id}#{n}'.encode()).hexdigest()[:_TAG]}" for n in range(1, _TRIES)
    )
    return (_fitted(base, suffix), *(_fitted(base, suffix, tag) for tag in tagged))


def _numbered(run_id: str) -> tuple[str, str]:
    """The base of ``run_id`` and the suffix its successor adds to it (``r~c1``: ``r``, ``~c2``)."""
    base, _, number = run_id.rpartition(_SUFFIX)
    # ASCII digits only: `str.isdigit` also takes superscripts and other digits `int` refuses.
    # A number no chain reaches is part of the name: numbered on, it could leave no room for
    # the base, and the id would be longer than a run id may be.
    if not (base and number.isascii() and number.isdigit() and len(number) <= _NUMBER):
        base, number = run_id, "0"
    return base, f"{_SUFFIX}{int(number) + 1}"


def _fitted(base: str, suffix: str, tag: str = "") -> str:
    """``base``, ``tag`` and ``suffix`` as one id, the base cut and its digest added if that is
    longer than a run id may be."""
    if len(base) + len(tag) + len(suffix) > MAX_NAME_LENGTH:
        digest = hashlib.sha256(base.encode()).hexdigest()[:_DIGEST]
        base = f"{base[: MAX_NAME_LENGTH - len(tag) - len(suffix) - _DIGEST - 1]}#{digest}"
    return f"{base}{tag}{suffix}"


@dataclass(frozen=True, slots=True)
class ContinuationPolicy:
    """When a run should be carried into a new run.

    Attributes:
        max_steps: Carry a run on once its own log holds this many events (at least 2), and
            it has reached a boundary of its own.
        max_history_bytes: Carry it on once the messages of its own conversation (not those it
            was carried on from) encode to this many bytes.
    """

    max_steps: int | None = None
    max_history_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.max_steps is None and self.max_history_bytes is None:
            raise ConfigurationError("a ContinuationPolicy needs max_steps or max_history_bytes")
        if self.max_steps is not None and self.max_steps < 2:
            raise ConfigurationError(f"max_steps must be at least 2, got {self.max_steps}")
        if self.max_history_bytes is not None and self.max_history_bytes < 1:
            raise ConfigurationError(
                f"max_history_bytes must be positive, got {self.max_history_bytes}"
            )

    def due(self, frontier: Frontier, *, history_bytes: int = 0) -> bool:
        """Whether the run has gone on long enough to be carried into a new run.

        Args:
            frontier: The run as it stands.
            history_bytes: The bytes of the run's own messages (`Conversation.own_bytes`).
        """
        if frontier.resume_seq == 0:
            # No boundary of its own yet: a run just carried on goes at least one step first,
            # so a chain always moves forward.
            return False
        return (self.max_steps is not None and frontier.last_seq >= self.max_steps) or (
            self.max_history_bytes is not None and history_bytes >= self.max_history_bytes
        )

    def continued(self, frontier: Frontier) -> Continuation:
        """The continuation the runner writes; override to change what crosses over (it is
        checked against ``frontier`` before anything is written)."""
        return continued(frontier)


DEFAULT_CONTINUATION = ContinuationPolicy(max_steps=10_000, max_history_bytes=4_000_000)
"""A policy to start from: carry a run on at 10,000 events of its own (where a workflow engine
such as Temporal suggests continuing as new) or 4 MB of its own messages (about a million
tokens, past any model's context), whichever comes first. No runner uses it unless given it
(``AgentRunner(..., continuation=DEFAULT_CONTINUATION)``)."""


@dataclass(frozen=True, slots=True)
class Continuation:
    """What crosses from a run into the run it is carried into.

    Attributes:
        run_id: The run carried on.
        new_run_id: The run it is carried into.
        history: The transcripts the new run's conversation starts from, oldest first.
        iteration: Model calls so far, across the chain.
        usage: Tokens so far, across the chain.
        tools_done: Tool calls with an outcome so far, across the chain.
        calls: The turn in progress, none of it dispatched.
        approved: The calls a person approved, in force.
        grants: Who approved each, and with what value.
    """

    run_id: str
    new_run_id: str
    history: tuple[HistoryHandle, ...]
    iteration: int
    usage: Usage
    calls: tuple[ToolCall, ...] = ()
    approved: tuple[str, ...] = ()
    grants: tuple[Grant, ...] = ()
    tools_done: int = 0

    def check(self, frontier: Frontier) -> None:
        """Refuse a continuation that drops an approval or a grant the run is acting under, or
        names a new run no run may be (`check_name`; the run's derived successor, which keeps
        its name, `check_stored_name`) or the run itself: the old run would be ended into a run
        no resume takes, or never carried.

        Raises:
            ConfigurationError: An approval or grant in force is missing, or ``new_run_id``
                is no run id or the run's own.
        """
        # The run's derived successor keeps the run's own name, which a producer may have
        # stored out of a new name's bounds: a resume takes it as stored, as it takes the run.
        derived = self.new_run_id in successor_ids(frontier.run_id)
        check = check_stored_name if derived else check_name
        try:
            check("new_run_id", self.new_run_id, run_id=frontier.run_id)
        except InvalidInputError as exc:
            raise ConfigurationError(
                f"run {frontier.run_id!r}: the continuation names no run a resume can take: {exc}",
                run_id=frontier.run_id,
            ) from exc
        if self.new_run_id == frontier.run_id:
            # Carried into itself, the run's own lease refuses the new run at every boundary,
            # and the run goes on uncarried for ever.
            raise ConfigurationError(
                f"run {frontier.run_id!r}: the continuation names the run itself as its new run; "
                "name another id",
                run_id=frontier.run_id,
            )
        dropped = [a for a in frontier.approved if a not in self.approved]
        dropped += [
            f"grant of {g.request_id} by {g.by}" for g in frontier.grants if g not in self.grants
        ]
        if dropped:
            raise ConfigurationError(
                f"run {frontier.run_id!r}: the continuation into {self.new_run_id!r} drops what "
                f"the run acts under ({', '.join(dropped)}); carry every approval and grant over",
                run_id=frontier.run_id,
            )

    def carried(self) -> Carried:
        """The continuation as the new run's `RunStarted` carries it."""
        return Carried(
            history=list(self.history),
            iteration=self.iteration,
            usage=self.usage,
            calls=list(self.calls),
            approved=list(self.approved),
            grants=list(self.grants),
            tools_done=self.tools_done,
        )


def carriable(frontier: Frontier) -> bool:
    """Whether the run can be carried on now: it is running and no call of the turn in
    progress has been dispatched or has an outcome (an outcome cannot cross over, only a call
    not yet made: a call a person settled as completed before its dispatch would be made in
    the new run)."""
    return frontier.status == "running" and all(
        c.dispatched_seq is None and c.outcome in (None, "never_ran") for c in frontier.calls
    )


def carried_options(frontier: Frontier) -> dict[str, Any]:
    """The options the run is bound by, as its `RunStarted` records them for the fold to read
    (`run_options`, `run_budgets`, `named_checkpoints`, `checkpoint_frequency`): the run it is
    carried into starts with them, or it would no longer be the person's it was started for,
    pause where it was to, stream the checkpoints the application chose, nor stop at the run's
    bound on model calls (which spans the chain, as the iteration count does) or to its
    budgets (spend is counted per run: each run of the chain starts at zero against the run
    budget, while the tenant's total goes on)."""
    options: dict[str, Any] = {}
    if frontier.user_id is not None:
        options["user"] = frontier.user_id
    if frontier.checkpoints is not None:
        # An autonomous run's checkpoints too: they are the messages its stream shows.
        options["mode"] = "collaborative" if frontier.pause_at else "autonomous"
        options["checkpoints"] = list(frontier.checkpoints)
    elif frontier.pause_at:  # a row stored before the frontier kept the checkpoints
        options["mode"] = "collaborative"
        options["checkpoints"] = list(frontier.pause_at)
    if frontier.max_iterations is not None:
        options["max_iterations"] = frontier.max_iterations
    if frontier.checkpoint_frequency > 1:
        options["checkpoint_frequency"] = frontier.checkpoint_frequency
    if frontier.budget_micros is not None:
        options["budget_micros"] = frontier.budget_micros
    if frontier.tenant_budget_micros is not None:
        options["tenant_budget_micros"] = frontier.tenant_budget_micros
    return options


def continued(frontier: Frontier, *, new_run_id: str | None = None) -> Continuation:
    """The continuation of a run as it stands: everything in force crosses over.

    Raises:
        InvalidInputError: The run is not `carriable` now.
    """
    if not carriable(frontier):
        raise InvalidInputError(
            f"run {frontier.run_id!r} cannot be carried on now (status {frontier.status}, or a "
            "call of its turn in progress was dispatched); carry it on at a boundary",
            run_id=frontier.run_id,
        )
    own = HistoryHandle(
        run_id=frontier.run_id, through_seq=frontier.last_seq, messages=frontier.messages
    )
    return Continuation(
        run_id=frontier.run_id,
        new_run_id=new_run_id or successor_id(frontier.run_id),
        history=(*frontier.history, own),
        iteration=frontier.iteration,
        usage=Usage(input_tokens=frontier.input_tokens, output_tokens=frontier.output_tokens),
        calls=tuple(
            ToolCall(call_id=c.call_id, tool=c.tool, args=c.args, idempotency_key=c.idempotency_key)
            for c in frontier.calls
        ),
        approved=frontier.approved,
        grants=frontier.grants,
        tools_done=frontier.tools_done or 0,
    )


Holding = Callable[[str, str], AbstractAsyncContextManager[Leaseholder]]
"""Holds a run's lease (run id, tenant) for a block: the runner's own."""


async def carry_if_due(
    run: HeldRun,
    policy: ContinuationPolicy,
    *,
    writer: RunWriter,
    holding: Holding,
    resumer: Resumer,
) -> bool:
    """Carry the run into a new run if it can be and ``policy`` says it is due: start the new
    run, then end this one with `RunContinued`. Returns whether it did.

    Raises:
        ConfigurationError: The policy's continuation drops an approval or grant; nothing was
            written.
    """
    frontier = run.frontier
    if not (
        carriable(frontier) and policy.due(frontier, history_bytes=run.conversation.own_bytes())
    ):
        return False
    carry = policy.continued(frontier)
    new_id = await start_successor(run, carry, writer=writer, holding=holding, resumer=resumer)
    if new_id is None:
        return False
    await writer.append(run, [writer.event(run, RunContinued, new_run_id=new_id)])
    await _pass_on_ask(run, new_id, writer=writer, holding=holding, resumer=resumer)
    return True


async def _pass_on_ask(
    run: HeldRun, new_id: str, *, writer: RunWriter, holding: Holding, resumer: Resumer
) -> None:
    """End ``new_id``, the run ``run`` was just carried into, ``cancelled`` if someone asked
    ``run``'s holder to cancel it after the last look before the carry (`start_successor`):
    the ask goes with that holding, handed back next, so the new run would go on unasked
    while the person was told their ask was taken. The new run has done nothing yet.

    A worker may have taken the new run up already (it was handed over): the ask is then
    passed to that holding (`LeaseStore.ask_to_cancel`), whose holder ends the run at its
    next boundary, as a person's cancel of a run held elsewhere does. Only a new run nobody
    holds is ended here; the carry has succeeded either way, so taking its lease is no error,
    nor is a store that fails meanwhile: the pass is tried again a bounded number of times
    (the ask lives nowhere else), and one that never gets through is logged as an error
    naming the run to cancel again.
    """
    failed: BackendError | None = None
    for attempt in range(_ASKS):
        if failed is not None:
            await asyncio.sleep(min(_ASK_RETRY_S * 2**attempt, 1.0))
        try:
            passed = await _passed_on(run, new_id, writer=writer, holding=holding, resumer=resumer)
        except BackendError as exc:
            failed = exc
            continue
        if passed:
            return
        failed = None
    asked = run.held.cancel_asked
    if failed is not None:
        _log.error(
            "run %s: a cancel asked of it as it was carried into %s may not have been passed on "
            "(%s): if it was asked to, cancel %s",
            run.run_id,
            new_id,
            failed,
            new_id,
        )
    elif asked is not None:
        _log.warning(
            "run %s: the cancel asked by %s was not passed on to %s, taken up and let go each try",
            run.run_id,
            asked.by,
            new_id,
        )


async def _passed_on(
    run: HeldRun,
    new_id: str,
    *,
    writer: RunWriter,
    holding: Holding,
    resumer: Resumer,
) -> bool:
    """One try of `_pass_on_ask`: whether it is done (nothing asked, the ask passed on to the
    new run's holding, or the new run ended); False when the new run was taken up since the
    ask found it free, or taken over before its end was recorded.

    Raises:
        BackendError: A store failed; the ask may not have been passed on.
    """
    with contextlib.suppress(FencedError):
        await run.held.confirm()  # the ask is heard with a renewal
    asked = run.held.cancel_asked
    if asked is None:
        return True
    tenant = run.tenant
    by, why = _passable(asked, new_id)
    lease = await run.held.store.ask_to_cancel(new_id, tenant=tenant, by=by, why=why)
    if lease is not None:
        return True  # held elsewhere: its holder hears the ask
    async with contextlib.AsyncExitStack() as stack:
        try:
            held = await stack.enter_async_context(holding(new_id, tenant))
        except ResumeConflictError:
            return False  # taken up since the ask found it free: ask that holding
        frontier = await resumer.read(new_id, tenant=tenant)
        if frontier.finished:
            return True
        try:
            await held.raise_fence(frontier.fence)
            new = HeldRun(run.agent, held, frontier, Conversation(""))
            finished = writer.event(new, RunFinished, status="cancelled", error=asked.error)
            what = f"its end, cancelled by {asked.by}"
            await writer.append_while_held(new, [finished], what=what)
        except FencedError:
            return False  # taken over meanwhile: ask its new holding
        return True


def _passable(asked: CancelAsked, new_id: str) -> tuple[str, str]:
    """Who asked and why, as a store takes them (`check_ask`): an ask kept by an older Onward
    may name no asker, or one or a reason out of today's bounds; refused, the carry that
    succeeded would fail, and the ask be lost with the old run. What is refused is passed on
    as ``unknown`` (an asker) or left out (a reason)."""
    by, why = asked.by, asked.why
    try:
        check_name("by", by, run_id=new_id)
    except InvalidInputError:
        by = "unknown"
    try:
        check_ask(new_id, by, why)
    except InvalidInputError:
        why = ""
    return by, why


async def cut_carry(frontier: Frontier, *, resumer: Resumer, into: str | None = None) -> str | None:
    """The successor an earlier carry of the run started and died before ending the run
    `RunContinued` for, if there is one; only reads. The log is asked whatever the lease
    store says: a store wiped since (or an id its GC forgot) keeps no trace of the carry.

    Args:
        into: A run said to be such a successor (the run whose resume came here to end this
            one into it first, `hand_over`): looked at first, as a policy may have named it
            (`ContinuationPolicy.continued`) where no derived id (`successor_ids`) finds it.
    """
    if not carriable(frontier):
        return None  # a carry only ever starts where the run is carriable
    if into is not None:
        with contextlib.suppress(NothingToResumeError):
            if current(await resumer.read(into, tenant=frontier.tenant), frontier):
                return into
    for new_id in successor_ids(frontier.run_id):
        # As `start_successor` tries them: an id no run holds ends the search, one another
        # run holds (of any tenant), or a carry of this run it went on without, was passed
        # over, and one holding a current carry of this run is it.
        if not await resumer.exists(new_id):
            return None
        with contextlib.suppress(NothingToResumeError):
            found = await resumer.read(new_id, tenant=frontier.tenant)
            if current(found, frontier):
                return new_id
    return None


def current(successor: Frontier, frontier: Frontier) -> bool:
    """Whether ``successor`` is a carry of ``frontier``'s run as it stands now: started from it,
    not ended, and carrying its turn in progress. A carry whose old run went on past a boundary
    since (a holder that lost the run mid-carry, its successor started after another worker
    claimed it) carries a turn that was made in the old run: ending the old run into it would
    make those calls again.
    """
    if successor.continuation_of != frontier.run_id or successor.finished:
        return False
    own = successor.history[-1] if successor.history else None
    return (
        own is not None and own.run_id == frontier.run_id and own.through_seq >= frontier.resume_seq
    )


HandOver = Literal["handed_over", "unfinished", "overtaken"]
"""Where the run a carry started stands with the run it was carried on from (`hand_over`)."""


def awaits_hand_over(frontier: Frontier) -> bool:
    """Whether the run was started by a carry and has not acted yet: it must not until the
    old run's log says it was continued into it. Once it reaches a boundary of its own, it
    was handed over at an earlier claim (a run acts only under one)."""
    return (
        frontier.continuation_of is not None and frontier.resume_seq == 0 and not frontier.finished
    )


async def hand_over(frontier: Frontier, *, resumer: Resumer) -> HandOver:
    """Whether the run a carry started (``frontier``, `awaits_hand_over`) may act: the run it
    was carried on from ended `RunContinued` into it (``handed_over``); or stands where it
    was carried, that end not written (``unfinished``: the carry was cut short, or is being
    written); or went on without it (``overtaken``). Only reads.

    Raises:
        HistoryUnavailableError: The old run cannot be read.
    """
    old_id = frontier.continuation_of
    assert old_id is not None  # awaits_hand_over
    try:
        old = await resumer.read(old_id, tenant=frontier.tenant)
    except NothingToResumeError as exc:
        raise HistoryUnavailableError(
            f"run {frontier.run_id!r} was carried on from {old_id!r}, which cannot be read: {exc}",
            run_id=frontier.run_id,
        ) from exc
    if old.status == "continued":
        return "handed_over" if old.continued_to == frontier.run_id else "overtaken"
    return "unfinished" if carriable(old) and current(frontier, old) else "overtaken"


async def end_overtaken(run: HeldRun, *, writer: RunWriter, resumer: Resumer | None = None) -> None:
    """End a run a carry started whose old run went on without it: nothing it was handed was
    done in it, and it must never be (the old run made or will make those calls itself).

    With ``resumer``, an old run a person cancelled where it was carried (the carry cut short
    before its end was written) has this run end ``cancelled`` as they asked, saying by whom:
    the turn was handed to it, and the work they stopped is not a run that failed.
    """
    old_id = run.frontier.continuation_of
    if resumer is not None and old_id is not None:
        with contextlib.suppress(NothingToResumeError):
            old = await resumer.read(old_id, tenant=run.tenant)
            if old.status == "cancelled" and current(run.frontier, old):
                finished = writer.event(run, RunFinished, status="cancelled", error=old.error)
                await writer.append(run, [finished])
                return
    error = (
        f"run {run.run_id!r} was carried on from {old_id!r}, which went "
        "on without it (its holder lost that run while starting this one); nothing was done "
        "in this run"
    )
    await writer.append(run, [writer.event(run, RunFinished, status="failed", error=error)])


async def finish_cut_carry(
    run: HeldRun,
    successor: str | None,
    *,
    writer: RunWriter,
    holding: Holding,
    resumer: Resumer,
) -> bool:
    """End the run `RunContinued` into ``successor``, what `cut_carry` found for it: an earlier
    carry started that run and died before writing this end. Returns whether it did. Whatever
    the resuming runner's policy (a fleet worker has none): the turn in progress was handed
    over with the successor's start, so the run must not make its calls itself, or they would
    be made in both runs. A cancel ask this holding heard (one the dead carry's holder left
    with the lease) is passed on to the successor (`_pass_on_ask`), as a carry passes it on:
    the run is ended here, so the ask would otherwise be dropped with it.
    """
    if successor is None:
        return False
    await writer.append(run, [writer.event(run, RunContinued, new_run_id=successor)])
    await _pass_on_ask(run, successor, writer=writer, holding=holding, resumer=resumer)
    return True


async def start_successor(
    run: HeldRun,
    continuation: Continuation,
    *,
    writer: RunWriter,
    holding: Holding,
    resumer: Resumer,
) -> str | None:
    """Write the new run's `RunStarted` under its lease, unless an earlier carry did. Returns
    the new run's id: the continuation's, or when another run holds that one (of this tenant
    or another), or an earlier carry of the run that it went on without (`current`), the next
    of `successor_ids` no such run holds. Returns None, writing nothing, when every id it may
    take is taken so; when another worker holds the id's lease this moment; when the
    confirmation of the old run's lease hears that someone asked its holder to cancel it
    (`Leaseholder.cancel_asked`), which the runner then does; and when the new run's
    `RunStarted` is too large for the log (`PayloadTooLargeError`): the turn is made where
    it is.

    Raises:
        ConfigurationError: The continuation drops an approval or grant.
    """
    continuation.check(run.frontier)
    natural = continuation.new_run_id == successor_id(run.run_id)
    for new_id in successor_ids(run.run_id) if natural else (continuation.new_run_id,):
        try:
            started = await _started(
                run, continuation, new_id, writer=writer, holding=holding, resumer=resumer
            )
        except ResumeConflictError as held:
            # Held this moment (a run being started or driven under it): passed over, a carry
            # into the next id that a crash cut short would be hidden from `cut_carry`, which
            # stops at an id no run holds. The run goes on here, carried at a later boundary.
            _log.info("run %s goes on uncarried for now: %s", run.run_id, held)
            return None
        if started != "taken":
            return new_id if started else None
    _log.warning(
        "run %s goes on uncarried: the ids it may be carried into are other runs'", run.run_id
    )
    return None


async def _started(
    run: HeldRun,
    continuation: Continuation,
    new_id: str,
    *,
    writer: RunWriter,
    holding: Holding,
    resumer: Resumer,
) -> bool | Literal["taken"]:
    """`start_successor` under ``new_id``: whether the run is carried into it, or ``taken``
    when another run holds it."""
    tenant = run.tenant
    async with holding(new_id, tenant) as held:
        # The log is asked whatever the lease store says (as `cut_carry` asks it): a store
        # wiped since, or whose GC forgot the id of a successor ended as overtaken, hands out
        # a first fence for an id the log holds a carry of this run under.
        with contextlib.suppress(NothingToResumeError):
            found = await resumer.read(new_id, tenant=tenant)
            # Started by a carry that a crash cut short; or another run's, or a carry the run
            # went on without (`current`), which it must never end into: the id is passed
            # over, as `cut_carry` passes it, or the run would never be carried on again.
            return current(found, run.frontier) or "taken"
        try:
            # Any tenant's run under the id: this tenant's RunStarted must never land in it.
            await resumer.refuse_existing(new_id, held.lease)
        except InvalidInputError:
            return "taken"
        new = HeldRun(run.agent, held, Frontier.empty(new_id, tenant), Conversation(""))
        # The old run's lease, asked of the store right before the turn is handed over: a
        # holder that lost it unawares (paused, a store that forgot it) while another carried
        # the old run on would start a run making the same calls again.
        await run.held.confirm()
        if run.held.cancel_asked is not None:
            # Heard just now: the ask goes with the old run's holding, so the new run would
            # never hear it; the old run goes on uncarried and ends as asked instead.
            return False
        started = writer.event(
            new,
            RunStarted,
            agent=run.agent.name,
            revision=run.agent.revision,
            options=carried_options(run.frontier),
            continuation_of=run.run_id,
            carried=continuation.carried(),
        )
        try:
            await writer.append(new, [started])
        except PayloadTooLargeError as exc:
            # What the run acts under (a person's approvals with their values) fits no one
            # record: no carry could ever be written, so the run goes on where it is rather
            # than fail at every boundary the policy finds it due at.
            _log.warning("run %s goes on uncarried: %s", run.run_id, exc)
            return False
        return True


__all__ = [
    "DEFAULT_CONTINUATION",
    "Continuation",
    "ContinuationPolicy",
    "HandOver",
    "awaits_hand_over",
    "carriable",
    "carried_options",
    "carry_if_due",
    "continued",
    "current",
    "cut_carry",
    "end_overtaken",
    "finish_cut_carry",
    "hand_over",
    "start_successor",
    "successor_id",
    "successor_ids",
]
