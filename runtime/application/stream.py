"""`RunStream`: one run's messages, read from the log in order, whoever drives the run.

The stream reads the run's events from the log (from the offset its opener gives it), counts
them with the sequence guard, and maps them to messages (`MessageMapper`). It is for one tenant
and never adopts another's: an event of another tenant (a start that lost the race for its run
id to another tenant's) ends it with an error that does not say whose the run is. Nothing about it
keeps the run going: a stream that is not read only falls behind, and reading it later (or
opening another one after a position) gives every message once, in order.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import NoReturn, Protocol

from onward.errors import (
    BackendUnavailableError,
    InvalidInputError,
    LogTruncatedError,
    NothingToResumeError,
    RunTimeoutError,
)
from onward.eventlog.base import (
    Refusal,
    SequenceGuard,
    StoredEvent,
    judge,
    partition_ends,
    partition_for,
)
from onward.eventlog.events import (
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    Event,
    ModelAnswered,
    RunContinued,
    RunFinished,
    RunStarted,
)
from onward.projections.frontier import Frontier, done_by
from onward.runtime.backends import Backends
from onward.runtime.leases.base import RunLease
from onward.runtime.resumer import Resumer
from onward.runtime.signing import MAX_CLOCK_SKEW_S

from .messages import Answers, MessageMapper, RunMessage

_log = logging.getLogger("onward.app")

DEAF_MOST_S = 0.5
"""The longest a stream ignores wakes after wakes in a row brought it nothing: a stream with a
slow poll (``poll_s=30``) is still woken within half a second."""

SAY_UNHELD_AFTER_S = 3.0
"""How long a stream waits in quiet on a run nobody holds before it says so, once: a worker
takes a run it was handed within milliseconds, so seconds of nothing mean none is taking it."""


SET_ASIDE_HINT = (
    "a worker sets a request aside when its signature does not check with the workers' "
    "ONWARD_REQUEST_KEY or it is older than ONWARD_REQUEST_MAX_AGE, and drops a start that a "
    'lease held by another never let it make: look for "set aside" and "refused for good" in '
    "the workers' logs"
)
"""Where the cause is when a request sent to a fleet comes to nothing: only the workers' logs
say it (a request that does not check proves nothing of its run, so nothing of the refusal is
written where the run's readers would take it for the run's)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Sent:
    """A request a stream's opener sent to a fleet, whose outcome the stream waits for."""

    what: str
    """What it is, for a message: "its start", "the answer to 'r1'"."""
    answers: str | None
    """The person's request it answers (None: a start)."""
    at: float
    """When it was sent (`time.monotonic`)."""
    max_age_s: float | None
    """How long after it was signed a worker still acts on it (None: unsigned, for ever)."""

    def left_s(self) -> float | None:
        """Seconds until no worker acts on it any more (the sender's clock may run behind a
        worker's by up to `MAX_CLOCK_SKEW_S`), or None."""
        if self.max_age_s is None:
            return None
        return self.at + self.max_age_s + MAX_CLOCK_SKEW_S - time.monotonic()


_SETTLING = frozenset({"result", "error", "needs_person"})
"""Message types after which the run's row must show what the message says (it ended, or waits
on a person to settle a call), like every message that waits on an answer."""


class StreamSource(Answers, Protocol):
    """What a stream needs from the application that opened it (`App` is one): where the
    log and leases are, how often to look again, how to put bodies back, what to do when
    nothing comes, and where a message's answers go."""

    @property
    def backends(self) -> Backends:
        """The stores the run is read from."""
        ...

    @property
    def poll_s(self) -> float:
        """How often a stream with nothing new looks at the log again."""
        ...

    async def restore(self, event: Event) -> Event:
        """The event with every body the claim check moved out of line put back."""
        ...

    async def quiet(self, stream: RunStream) -> None:
        """Called when a stream found nothing new: nudge the run on, or end the stream."""
        ...

    async def nap(
        self,
        stream: RunStream,
        seconds: float,
        *,
        most_s: float | None = None,
        heed_after_s: float = 0.0,
    ) -> None:
        """Wait up to ``seconds`` before ``stream`` looks at the log again: less if it is woken
        (`RunStream.wake`), but not before ``heed_after_s`` unless woken for its own run;
        longer when something watches the log for it; never longer than ``most_s``."""
        ...

    async def fold(self, partition: int) -> None:
        """Bring the frontier rows of the log's ``partition`` up to what it holds, where this
        process may fold them (embedded backends); elsewhere (a projector keeps them) nothing."""
        ...


Position = tuple[int, int]
"""A message's place in its run's stream: the seq of its event, and its part of that event."""


class RunStream:
    """The messages of one run, read from the log in order (an async iterator).

    It keeps its place: stop reading, come back later, and it goes on from the message after
    the last one it gave (``position``), the run having gone on meanwhile. Its ``result`` or
    ``error`` message says what the run's model calls cost, in ``metadata["spend_micros"]``,
    as the application's spend ledger has it (absent when the ledger did not answer).
    """

    def __init__(
        self,
        app: StreamSource,
        run_id: str,
        tenant: str,
        begin: Callable[[RunStream], Awaitable[None]],
        *,
        after: Position = (0, -1),
        follow_waits: bool = True,
        timeout: float | None = None,
        agent: str | None = None,
    ) -> None:
        self.app = app
        self.run_id = run_id
        self.tenant = tenant
        self.position: Position | None = None
        self.next_offset: int | None = None
        self.nudged = time.monotonic()
        self._after = after
        self._begin: Callable[[RunStream], Awaitable[None]] | None = begin
        self._follow_waits = follow_waits
        self._guard = SequenceGuard()
        self._mapper = MessageMapper(app)
        self._buffer: collections.deque[RunMessage] = collections.deque()
        self._ended = False
        self._waiting_on: str | None = None
        self._timeout = timeout
        self._said_held = False
        self._said_unheld = False
        self._seen = False
        self.agent = agent
        """The run's agent, when known: a wait for a worker names what it must carry."""
        self._partition: int | None = None
        self._fruitless = 0
        """Vague wakes in a row after which the stream found nothing new of its run."""
        self._woken_vaguely = False
        self.woken = asyncio.Event()
        """Set when the run is known to have been appended to since the stream last looked."""
        self.woken_for_its_run = asyncio.Event()
        """Set with `woken` when the wake was for this run, not only its partition: heeded at
        once, even while vague wakes are backed off."""
        self.answered: set[str] = set()
        """Requests this stream's opener answered (maybe not in the log yet): not waits."""
        self._start: str | None = None
        """The agent of the start this stream's opener sent, until the run's first event is
        read (`expect_start`)."""
        self._sent: _Sent | None = None
        """What the opener sent to a fleet and nothing of which is read yet (`sent_to_fleet`)."""
        self._let_go: _Sent | None = None
        """What the opener sent that the fleet no longer holds, nothing of it read (`let_go`)."""

    async def go_on_after_a_cut(self, frontier: Frontier, start: int) -> bool:
        """Go on from the run's events the log holds from offset ``start`` on, when it was cut
        past the events this stream counted (at its opening, or while it fell behind): counted
        as `counted_before_the_cut` says, and a run that ended with nothing of its end left to
        read ends with the message its end gave (`ended_in`). Whether anything was cut past
        the stream's count (the messages of what was cut are gone from the stream; the
        transcript keeps the conversation)."""
        backends = self.app.backends
        compaction = backends.compaction
        point = (
            None
            if compaction is None
            else (await compaction.truncations([frontier.run_id])).get(frontier.run_id)
        )
        kept = [
            item
            for item in await backends.log.read_run(frontier.run_id, start=start)
            if item.event.seq > self._guard.last_seq
        ]
        cut_through = max(
            (point.before_seq - 1) if point is not None else 0,
            (kept[0].event.seq - 1) if kept else frontier.last_seq,
        )
        if cut_through <= self._guard.last_seq:
            return False
        self.follow_from(cut_through)
        await self.counted_before_the_cut(frontier, kept)
        if frontier.finished and cut_through >= frontier.last_seq:
            await self.ended_in(frontier)  # nothing of it is left to read
        return True

    def follow_from(self, last_seq: int) -> None:
        """Count the run's events from seq ``last_seq + 1`` on: those before were compacted."""
        self._guard = SequenceGuard(last_seq)

    async def counted_before_the_cut(self, frontier: Frontier, kept: Sequence[StoredEvent]) -> None:
        """Take up the run where the log was cut below it (`follow_from`): its `RunStarted`
        and the events after it up to the cut are never read, so the messages after would
        count model calls and tool calls from 0 and follow no pause or iteration bound of the
        run, nor know that it waits on a person. Its row has them: its counts less what the
        events the log still holds add (``kept``, read after the row), the pauses, bound,
        checkpoints and their frequency its options named, and the request it waits on."""
        self._seen = True
        guard = SequenceGuard(self._guard.last_seq)
        model_calls = input_tokens = output_tokens = tools_after = 0
        done_after: set[str] = set()
        asked_after = False
        for item in kept:
            if guard.last_seq >= frontier.last_seq:
                break  # appended after the row was read: not in its counts
            if not guard.admit(item):
                continue
            event = item.event
            if isinstance(event, ApprovalRequested):
                asked_after = event.request_id == frontier.waiting_on
            elif isinstance(event, ModelAnswered):
                model_calls += 1
                input_tokens += event.usage.input_tokens
                output_tokens += event.usage.output_tokens
            elif done_by(event):
                tools_after += 1
                done_after.add(event.call_id)
        if frontier.tools_done is not None:
            # Across the chain, as the messages count them from the run's `RunStarted` on.
            tools_done = frontier.tools_done - tools_after
        else:
            # A row stored before it kept the count: its calls' audit rows have the run's
            # own, counted as the events are (a typed error is an outcome; a never run not).
            calls = await self.app.backends.frontiers.tool_calls(self.run_id)
            done = {c.call_id for c in calls if c.outcome in ("completed", "error")}
            tools_done = len(done - done_after)
        self._mapper.resume_counts(
            iteration=frontier.iteration - model_calls,
            tools_done=tools_done,
            input_tokens=frontier.input_tokens - input_tokens,
            output_tokens=frontier.output_tokens - output_tokens,
            pause_at=frontier.pause_at,
            max_iterations=frontier.max_iterations,
            checkpoints=frontier.checkpoints,
            every=frontier.checkpoint_frequency,
        )
        if not asked_after:
            # Waiting on a request asked before the cut (its message is gone with it): one
            # that does not follow waits ends, and the wait is said to be a person's, not one
            # for a worker nobody runs.
            self._waiting_on = frontier.waiting_on

    @property
    def waiting_on(self) -> str | None:
        """The request the run waited on as of the last event read, if any."""
        return self._waiting_on

    def __aiter__(self) -> RunStream:
        return self

    async def __anext__(self) -> RunMessage:
        if self._begin is not None:
            # Dropped only once done: an opening that failed (a store that did not answer) is
            # tried again at the next read, so a start is sent and an answer given.
            await self._begin(self)
            self._begin = None
        quiet = 0
        since = time.monotonic()
        while not self._buffer:
            if self._ended:
                raise StopAsyncIteration
            vaguely, self._woken_vaguely = self._woken_vaguely, False
            self.woken.clear()  # what is appended from here on wakes the next nap
            self.woken_for_its_run.clear()
            if await self._read():
                quiet, since, self._fruitless = 0, time.monotonic(), 0
                continue
            # Woken for a partition's appends, none of them this run's: the next such wake
            # is heeded a little later (precise wakes, for this run, always at once).
            self._fruitless = self._fruitless + 1 if vaguely else 0
            if self._caught_up_with_a_person_needed():
                continue
            if self._waiting_on not in (None, *self.answered) and not self._follow_waits:
                raise StopAsyncIteration
            if self._timeout is not None and time.monotonic() - since >= self._timeout:
                raise RunTimeoutError(await self._stalled(self._timeout), run_id=self.run_id)
            if self._sent is not None and (self._sent.left_s() or 0.0) < 0:
                raise RunTimeoutError(await self._expired(self._sent), run_id=self.run_id)
            if self._sent is not None and self._let_go is self._sent:
                raise RunTimeoutError(self._not_acted_on(self._sent), run_id=self.run_id)
            await self.app.quiet(self)
            await self._say_what_it_waits_on(time.monotonic() - since)
            await self.app.nap(
                self,
                self.app.poll_s * min(10, 2**quiet),
                most_s=self._left(since),
                heed_after_s=self._heed_after(),
            )
            quiet += 1
        message = self._buffer[0]
        if self._partition is not None and (message.waits or message.type in _SETTLING):
            # Handed out only once the run's row shows it too: what the reader does next
            # (`list_pending`, `get_session_state`, `status`) reads the row, not the log.
            # Taken from the buffer only after: a read cut short here gives it next time.
            await self.app.fold(self._partition)
        self._buffer.popleft()
        self.position = self._after = message.position
        return message

    def wake(self, *, vaguely: bool = False) -> None:
        """Have the stream look at the log now: its run was appended to, or (``vaguely``) its
        run's partition was, the runs appended to being unknown."""
        if vaguely:
            self._woken_vaguely = True
        else:
            self.woken_for_its_run.set()
        self.woken.set()

    @property
    def ended(self) -> bool:
        """Whether the stream has read its run's last message (or was refused)."""
        return self._ended

    def _heed_after(self) -> float:
        """How long the next nap ignores wakes: none after a look that found something for
        this run or a wake for this run; after vague wakes in a row that found nothing (a busy
        partition's other runs), doubling from the stream's poll up to `DEAF_MOST_S`, so it
        reads its run about as seldom as it would polling on its own."""
        if not self._fruitless:
            return 0.0
        return min(DEAF_MOST_S, self.app.poll_s * (1 << min(self._fruitless, 4)))

    def _left(self, since: float) -> float | None:
        """How long the stream may wait before it must look again whatever happens: until
        its timeout, or until it says that nobody holds the run (``None``: no such bound)."""
        quiet_s = time.monotonic() - since
        bounds = []
        if self._timeout is not None:
            bounds.append(self._timeout - quiet_s)
        if not (self._said_held or self._said_unheld) and quiet_s < SAY_UNHELD_AFTER_S:
            bounds.append(SAY_UNHELD_AFTER_S - quiet_s)
        expires_s = self._sent.left_s() if self._sent is not None else None
        if expires_s is not None:
            bounds.append(expires_s)
        return max(0.0, min(bounds)) if bounds else None

    async def _read(self) -> bool:
        """Read what the log has of the run past ``next_offset``; whether anything was new.

        The stream's place moves past an event only once that event is taken whole (counted,
        its body put back, its messages buffered): a read that fails part way (a blob store
        that did not answer) leaves the failed event and those after it to the next read.
        """
        log = self.app.backends.log
        partition = partition_for(self.run_id, log.partitions)
        # Read up to an end known first, then kept as the place: the partition's other runs'
        # records read past are not read again at every look (on Kafka, fetched again).
        end = (await partition_ends(log, [partition]))[partition]
        try:
            stored = await log.read_run(self.run_id, start=self.next_offset, end=end)
        except LogTruncatedError as exc:
            if exc.start is None:
                raise
            await self._behind_a_cut(exc.start, exc)
            return True
        if stored:
            self._partition = stored[-1].position.partition
        for item in stored:
            if not self._ended:
                await self._take(item)
            self.next_offset = item.position.offset + 1
        if self.next_offset is None or self.next_offset < end:
            self.next_offset = end
        return bool(stored)

    async def _behind_a_cut(self, start: int, cut: LogTruncatedError) -> None:
        """The log was cut past this stream's place while it was not looking (a reader that
        stopped, and compaction or retention meanwhile; the log's records now begin at
        ``start``): it goes on from the run's row and what the log still holds
        (`go_on_after_a_cut`), ending with how the run ended when nothing of its end is left,
        rather than fail reading.

        A start this stream sent whose `RunStarted` went with the cut unread is told by the
        row as by that event (`expect_start`): the run of this tenant, of the start's agent.
        With no row of this tenant's run to tell it by, the cut is raised (``cut``)."""
        backends = self.app.backends
        resumer = Resumer(backends.log, backends.leases, backends.frontiers)
        try:
            frontier = await resumer.read(self.run_id, tenant=self.tenant)
        except NothingToResumeError:
            if self._start is not None:
                raise cut from None
            raise
        if self._start is not None:
            if frontier.agent != self._start:
                self._lost_the_run_id()
            self._start = None
            if self._sent is not None and self._sent.answers is None:
                self._sent = None  # the start came to something: its run
        self.next_offset = start
        await self.go_on_after_a_cut(frontier, start)

    async def _take(self, item: StoredEvent) -> None:
        """Count one stored event of the run and buffer its messages (raises before taking
        anything of it when its body cannot be put back). Everything it awaits comes before
        the event is counted: a read cut short (cancelled) leaves the whole event to the next."""
        verdict = judge(self._guard.last_seq, self._guard.fence, item.event)
        if verdict is not None:
            if self._start is not None and verdict[0] is Refusal.SEQ_GAP:
                # A start whose first event of the run is not seq 1: the run was started
                # before this stream's start was sent, by another start.
                self._lost_the_run_id()
            self._guard.admit(item)  # refused: kept for audit, not counted
            return
        self._seen = True
        if self._sent is not None and self._sent.answers is None:
            self._sent = None  # the start came to something (its run, or another's start)
        if item.event.tenant != self.tenant:
            self._lost_the_run_id()
        event = await self.app.restore(item.event)
        spent = await self._spent_by_its_end(event)
        if self._start is not None:
            if not self._is_own_start(event):
                self._lost_the_run_id()
            self._start = None
        self._guard.admit(item)
        self._track(event)
        for message in self._mapper.messages(event):
            if message.position > self._after:
                self._buffer.append(_with_spend(message, spent))

    def expect_start(self, agent: str) -> None:
        """This stream's opener sent a start of the run with ``agent``: its first event must be
        that start (the run's `RunStarted`, seq 1, of that agent), else another start took the
        run id first and the stream ends saying so rather than follow that run. Two starts of
        one id with the same agent are not told apart (the input is compared nowhere: the log
        holds it with its secrets masked)."""
        self._start = agent

    def sent_to_fleet(self, what: str, *, answers: str | None, max_age_s: float | None) -> None:
        """This stream's opener sent a request to a fleet (its start, or its ``answers`` to a
        person's request) and the stream waits for what comes of it. A worker that sets it
        aside writes nothing of it to the run (a request that does not check proves nothing),
        so the stream's waits name where the cause is, and once no worker would act on it
        any more (``max_age_s`` after it was signed) the wait ends, saying so."""
        self._sent = _Sent(what, answers, time.monotonic(), max_age_s)

    @property
    def sent(self) -> bool:
        """Whether the opener sent a request to a fleet nothing of which is read yet."""
        return self._sent is not None

    @property
    def start_sent(self) -> bool:
        """Whether the opener sent the run's start to a fleet and nothing of it is read yet."""
        return self._sent is not None and self._sent.answers is None

    def let_go(self) -> None:
        """The fleet holds none of the run's requests any more (a worker deletes one only once
        what it wrote of it is durable, or once it set it aside or refused it): if the stream's
        next look at the log finds nothing of what its opener sent either, no worker acted on
        it, and the stream ends saying so rather than wait out the request's max age."""
        self._let_go = self._sent

    def _is_own_start(self, event: Event) -> bool:
        return isinstance(event, RunStarted) and event.seq == 1 and event.agent == self._start

    def _lost_the_run_id(self) -> NoReturn:
        self._ended = True
        self._buffer.clear()
        raise InvalidInputError(
            f"run {self.run_id!r} already exists; resume it instead", run_id=self.run_id
        )

    async def _spent_by_its_end(self, event: Event) -> int | None:
        """What the run spent (micros), as the spend ledger has it, when ``event`` ends the run
        with a message still to hand out: it has made its last model call by then. ``None``
        otherwise, or when the ledger did not answer (the end is handed out without it rather
        than dropped)."""
        spend = self.app.backends.spend
        ends = isinstance(event, RunFinished | RunContinued) and (event.seq, 0) > self._after
        if not ends:
            return None
        try:
            return (await spend.run_total(self.run_id)).micros
        except BackendUnavailableError as exc:
            _log.warning("run %s: its spend could not be read: %s", self.run_id, exc)
            return None

    async def ended_in(self, frontier: Frontier) -> None:
        """The run ended and compaction cut every event of it from the log (it keeps none of
        a finished run there): give the message its end gave, from how its row says it ended
        (counted as `counted_before_the_cut` says), and end, rather than wait for events that
        never come."""
        run_id, tenant, seq, fence = (
            frontier.run_id,
            frontier.tenant,
            frontier.last_seq,
            frontier.fence,
        )
        status = frontier.status
        end: Event
        if status == "continued" and frontier.continued_to is not None:
            end = RunContinued(
                run_id=run_id, tenant=tenant, seq=seq, fence=fence, new_run_id=frontier.continued_to
            )
        elif status in ("completed", "failed", "cancelled"):
            end = RunFinished(
                run_id=run_id,
                tenant=tenant,
                seq=seq,
                fence=fence,
                status=status,
                output=frontier.output,
                error=frontier.error,
            )
        else:
            return
        self._seen = True
        event = await self.app.restore(end)
        spent = await self._spent_by_its_end(event)
        self._track(event)
        for message in self._mapper.messages(event):
            if message.position > self._after:
                self._buffer.append(_with_spend(message, spent))

    def refused(self, cause: str) -> None:
        """End the stream with an ``error`` message: its run was refused for good before it
        started (nothing of it is in the log)."""
        self._buffer.append(
            RunMessage(
                type="error",
                run_id=self.run_id,
                tenant=self.tenant,
                seq=0,
                status="refused",
                content=f"the run could not be started: {cause}",
            )
        )
        self._ended = True

    def _caught_up_with_a_person_needed(self) -> bool:
        """Caught up, and a worker left the run for a person over calls still undecided: the
        stream ends with a ``needs_person`` message (nothing else would come)."""
        message = self._mapper.left_for_person()
        if message is None:
            return False
        if message.position > self._after:
            self._buffer.append(message)
        self._ended = True  # given before, to this reader or an earlier one: nothing comes
        return True

    async def _say_what_it_waits_on(self, quiet_s: float) -> None:
        """While the stream waits: once, who holds the run and until when (a holder that died
        keeps it until then); once, after `SAY_UNHELD_AFTER_S` of nothing, that nobody does."""
        if self._said_held or self._waits_on_a_person():
            return
        lease = await self.app.backends.leases.current(self.run_id)
        if lease is None:
            if not self._said_unheld and quiet_s >= SAY_UNHELD_AFTER_S:
                self._said_unheld = True
                _log.info("%s; waiting%s", self._unheld(quiet_s), self._waits_until())
            return
        if lease.tenant != self.tenant:
            return
        self._said_held = True
        until = datetime.fromtimestamp(lease.expires_at, UTC).isoformat(timespec="seconds")
        waits = self._waits_until()
        _log.info(
            "run %s: waiting; held by %s under fence %s until %s unless renewed%s",
            self.run_id,
            lease.holder,
            lease.fence,
            until,
            f"; waiting{waits}" if waits else "",
        )

    def _waits_until(self) -> str:
        """Until when the stream waits for what comes of a request its opener sent a fleet
        (a day by default: a topic tells nobody it set the request aside), said with why."""
        sent = self._sent
        left_s = sent.left_s() if sent is not None else None
        if sent is None or left_s is None:
            return ""
        until = datetime.fromtimestamp(time.time() + left_s, UTC).isoformat(timespec="seconds")
        return (
            f" until {until} for {sent.what} (no worker acts on it after: "
            f"ONWARD_REQUEST_MAX_AGE, {sent.max_age_s:g}s, and {MAX_CLOCK_SKEW_S:g}s a worker's "
            "clock may lag)"
        )

    async def _stalled(self, waited: float) -> str:
        lease = await self.app.backends.leases.current(self.run_id)
        if lease is None and not self._waits_on_a_person():
            return self._unheld(waited)
        held = self._held_by(lease)
        if self._waits_on_a_person():
            # What the wait is for: a person's answer (`respond`, `resume`), not a worker.
            held += f"; it waits on an answer to {self._waiting_on!r}"
        sent = self._sent
        hint = "" if sent is None else f"; nothing came of {sent.what} yet: {SET_ASIDE_HINT}"
        return f"run {self.run_id!r}: nothing new for {waited:g}s{held}{hint}"

    def _held_by(self, lease: RunLease | None) -> str:
        if lease is None or lease.tenant != self.tenant:
            return ""
        until = datetime.fromtimestamp(lease.expires_at, UTC).isoformat(timespec="seconds")
        return f"; held by {lease.holder} under fence {lease.fence} until {until}"

    async def _expired(self, sent: _Sent) -> str:
        """Why a stream stops waiting for what comes of a request its opener sent a fleet:
        no worker acts on it any more, and nothing of it came."""
        held = self._held_by(await self.app.backends.leases.current(self.run_id))
        waited = time.monotonic() - sent.at
        return (
            f"run {self.run_id!r}: nothing came of {sent.what}, sent {waited:.0f}s ago{held}; "
            f"no worker acts on it now (it is older than ONWARD_REQUEST_MAX_AGE, "
            f"{sent.max_age_s:g}s): {SET_ASIDE_HINT}; send it again if it still stands"
        )

    def _not_acted_on(self, sent: _Sent) -> str:
        """Why a stream stops waiting for what comes of a request a worker took and deleted
        with nothing of it in the log: it set the request aside or refused it."""
        return (
            f"run {self.run_id!r}: nothing came of {sent.what}: a worker took it and did not "
            f"act on it: {SET_ASIDE_HINT}; send it again once the cause is fixed"
        )

    def _unheld(self, waited: float) -> str:
        """What a wait on a run no worker holds is: one that has not started, or one that is
        not being carried on; either way no worker has taken it (none runs, or all are busy)."""
        what = (
            "nobody holds it"
            if self._seen
            else "nothing of it is in the log yet and nobody holds it"
        )
        # Only a worker that carries the run's agent takes its start or carries it on.
        worker = f"a worker carrying agent {self.agent!r}" if self.agent else "a worker"
        sent = "" if self._sent is None else f"; or nothing came of {self._sent.what}: "
        return (
            f"run {self.run_id!r}: nothing new for {waited:g}s; {what}: no worker has taken it "
            f"(is {worker} running, with room for it? `onward worker`)"
            + (sent and sent + SET_ASIDE_HINT)
        )

    def _waits_on_a_person(self) -> bool:
        """The run waits on a request nobody has answered (an answer this stream's opener
        gave is on its way to a worker: the wait is then for the worker)."""
        return self._waiting_on is not None and self._waiting_on not in self.answered

    def _track(self, event: Event) -> None:
        if isinstance(event, ApprovalRequested):
            self._waiting_on = event.request_id
        elif isinstance(event, ApprovalGranted | ApprovalDenied):
            self._waiting_on = None
            if self._sent is not None and self._sent.answers == event.request_id:
                self._sent = None
        elif isinstance(event, RunFinished | RunContinued):
            self._waiting_on = None
            self._sent = None
            self._ended = True

    async def collect(self) -> list[RunMessage]:
        """Every message until the stream ends."""
        return [message async for message in self]


def _with_spend(message: RunMessage, spent: int | None) -> RunMessage:
    """A result or error message with what the run spent (``metadata["spend_micros"]``)."""
    if message.type not in ("result", "error") or spent is None:
        return message
    return dataclasses.replace(message, metadata={**message.metadata, "spend_micros": spent})


__all__ = ["Position", "RunStream", "StreamSource"]
