"""`OnwardSaver`: LangGraph's checkpointer on Onward's log, one writer per thread.

A thread is a run (``thread_id`` is the run id; the tenant is the saver's). Every ``put`` and
``put_writes`` is an event (`GraphCheckpointed`, `GraphWritesSaved`) appended under the thread's
lease and carrying its fence, so the rules of every other run hold: one writer at a time, and
whatever a superseded writer appends after another one claimed the thread is refused by every
reader (the fold and `SequenceGuard`). An ``INTERRUPT`` write is also an `ApprovalRequested`,
so Onward's ``list_pending`` sees the thread waiting; the ``RESUME`` write that answers it is
an `ApprovalGranted`, and a checkpoint the graph goes on to without one saved (a new input, an
update of the state, a resume under ``durability="exit"``) closes it as an `ApprovalDenied`.

Writing. The first write of a thread takes its lease (or ``async with saver.hold(thread_id)``
takes it explicitly), reads the thread, raises the store's fence above the log's if need be,
and appends `RunClaimed`. The lease is renewed in the background until ``release`` /
``hold``'s end / ``aclose``. After each append the saver confirms the lease with the store: if
it still holds it, nobody has claimed the thread since, so the write counts; if not, the call
raises `FencedError` and the graph run must end (LangGraph ends it: the error propagates).
Every later write of that thread raises `FencedError` too, rather than claim the thread again
and carry on from a state another writer has moved past, until the thread is read afresh
(``aget_tuple`` of its latest checkpoint, which is how a new invocation starts) or released.
A read counts for the invocation that made it (its context, which its tasks copy): another
task reading the thread meanwhile (``aget_state``) does not let a lost invocation write on, nor
one the saver ended (cancelled, over a budget).

Reading, with read-your-writes. A thread this saver holds is served from what it folded while
writing (the same fold a reader applies to the log). Any other thread is folded on from its
stored summary (`.summary`: the holder keeps one beside the log, at most as many bytes as it
appended since the last) through the log's tail; without a usable summary, from the run's first
event where a frontier row says where that is, else from the start of its partition. The fold
is kept, so reading the thread again reads only the log's new tail. A fold from a summary holds
the newest checkpoints; asking for an older one, or for the list, folds the thread whole.

Spending. Given a spend ledger, the usage each AI message a node writes reports is recorded
under the seq of the writes it came in, before they are appended; a budget is checked before
each step's writes and ends the graph run, as a cancel does, once the thread (or its tenant)
has reached it. A record the ledger did not take is kept by this saver and tried again at its
next write. The writes carry their calls' tokens (`GraphWritesSaved.usage`), so should the
saver's process end first, the next saver to claim the thread records from the log the calls
the ledger lacks, under the same keys (as the runner's resume does); writes `acopy_thread`
copied into a thread carry none: their calls were made, and paid for, by the thread copied.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import operator
import os
import random
import socket
import time
from collections import OrderedDict
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Sequence,
)
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, cast

import msgspec
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.serde.types import INTERRUPT, RESUME
from langgraph.types import Interrupt

from onward._storage import Resource
from onward.errors import (
    BackendError,
    BackendUnavailableError,
    BudgetExceededError,
    ConfigurationError,
    FencedError,
    HistoryUnavailableError,
    InvalidInputError,
    LogTruncatedError,
    OnwardError,
    ResumeConflictError,
    RunCancelledError,
)
from onward.eventlog import (
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    ChannelValue,
    Event,
    EventLog,
    GraphCheckpointed,
    GraphCheckpointRef,
    GraphCheckpointsRemoved,
    GraphThreadDeleted,
    GraphWrite,
    GraphWritesSaved,
    Position,
    RunClaimed,
    RunFinished,
    SequenceGuard,
    Serialized,
    StoredEvent,
    ToolCompleted,
    ToolResolved,
    Usage,
    partition_for,
)
from onward.eventlog.events import stamped
from onward.projections import FrontierStore
from onward.projections.compaction import CompactionStore, embedded_compaction
from onward.projections.compaction.history import read_whole_run
from onward.runtime.leases import CancelAsked, Leaseholder, LeasePolicy, LeaseStore, RunLease
from onward.runtime.limits import check_name, check_stored_name
from onward.runtime.redaction import Redactor
from onward.runtime.spend.base import PriceTable, SpendEntry, SpendLedger

from . import pruning
from .summary import (
    ThreadSummary,
    ThreadSummaryStore,
    decode,
    embedded_summaries,
    encode,
    restored,
    summarize,
)
from .thread import SNAPSHOT_EVERY, ChannelNode, DecodedList, ThreadState

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

FOLLOWED_THREADS = 1024
"""How many threads the saver does not hold it keeps folded, so a reread reads only the tail."""

_msgpack = msgspec.msgpack.Encoder()

_OUTCOMES: frozenset[type[Event]] = frozenset({ToolCompleted, ToolResolved})
"""What records the outcome of a tool call that ran: written even once a cancel is asked."""

_Batch = list[tuple[type[Event], dict[str, Any]]]
"""The events a write makes: each kind with its fields, the envelope to be added."""


@dataclass(slots=True)
class _Held:
    """A thread this saver holds: its lease, its fold, and the lock its writes take."""

    holder: Leaseholder
    state: ThreadState
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    stale: bool = False
    """An append failed without saying whether it landed: fold the thread from the log again."""
    appended: int = 0
    """Bytes appended since the thread's last summary (an estimate: the events' msgpack)."""
    summary_size: int = 0
    """The size of the last summary stored; the next is stored once ``appended`` exceeds it."""
    summarizing: asyncio.Task[None] | None = None
    """The summary being stored, if one is (see `OnwardSaver._summarize`)."""
    spent_at: int = 0
    """The highest seq a model call's spend was recorded under (`OnwardSaver._record_spend`):
    the key of its ledger entry, which no later writes of the thread may take."""
    calls_unchecked: bool = False
    """The claim could not check the thread's model calls against the ledger
    (`OnwardSaver._record_calls_left`): checked again before a budget is weighed."""


@dataclass(slots=True)
class _Taking:
    """The lock that serializes taking one thread, and how many callers are using it: it is
    dropped when none is, so a saver that wrote many threads keeps nothing of each."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


@dataclass(slots=True)
class _CallTurn:
    """The lock one tool call's handlings take in turn, and how many hold or wait for it."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class OnwardSaver(BaseCheckpointSaver[str], Resource):
    """LangGraph's `BaseCheckpointSaver` on an Onward event log.

    The async methods are the real ones. The sync ones (``put``, ``get_tuple``, ``list``, …)
    run the async ones on the event loop the saver was opened on, and so may only be called
    from another thread (LangGraph's sync ``invoke`` run in a worker thread, say); from the
    loop's own thread they raise `InvalidInputError` rather than deadlock.

    Args:
        log: The event log every write is appended to.
        leases: The lease store that decides which process writes a thread.
        tenant: The tenant of every thread this saver writes and reads.
        frontiers: Frontier rows, if a projector (or ``checkpoint_inline``) keeps them: they say
            where a run's first event is, so a read starts there instead of at the partition's
            start.
        checkpoint_inline: Fold the frontier row right after an interrupt or its answer is
            appended (embedded mode, where no projector runs), so ``list_pending`` sees it.
        holder: This process's name as other writers see it in `ResumeConflictError`.
        policy: The lease's ttl and renewal margin.
        serde: LangGraph's serializer. By default ``JsonPlusSerializer`` in its strict mode
            (``allowed_msgpack_modules=None``): a record naming any other type is read as
            its plain data and nothing it names is imported or called, since anyone who can
            write the log could otherwise run code in every reader. LangGraph adds a compiled
            graph's own state types (`with_allowlist`); name further types with
            ``JsonPlusSerializer(allowed_msgpack_modules=[("my.module", "MyType")])``.
        compaction: Where compaction keeps what it cut of the threads (every event of a
            thread is retained before its partition is cut): a thread is read from those
            copies, then the log. With ``checkpoint_inline``, a thread's frontier over the
            snapshot cap is kept there too, so its next fold goes on from it. An embedded
            SQLite log brings its own; on Kafka or PostgreSQL alone, pass the deployment's
            `PostgresCompactionStore` before compaction runs.
        redactor: Masks secrets in every event this saver appends before it is encoded, as a
            runner's does: the tool results and error text `OnwardToolMiddleware` records, an
            interrupt's value and its answer. The default is `Redactor()` (with
            ``ONWARD_REDACT_KEYS``); ``Redactor(enabled=False)`` only where every store is
            trusted with the secrets. Graph checkpoints and writes are the serializer's bytes,
            kept exactly as LangGraph wrote them (binary values are never masked): the state a
            graph keeps, a tool's message among it, is stored as the graph holds it.
        snapshot_every: A list channel (a conversation's messages) whose new value extends its
            previous one is stored as the appended items only; reading a version rebuilds the
            list from those appends, and the fold holds the list whole again every this many
            appends, so reading any checkpoint walks at most this many appends per channel.
            Nothing is stored twice for it: every reader folds a thread from its first event,
            so the appends are all in memory already.
        summaries: Where the holder of a thread keeps its summary (`.summary`), so a reader
            that has not folded the thread reads only the log after it. An embedded SQLite
            log keeps them in its file; on Kafka, pass a `PostgresThreadSummaries` (without
            one, every reader folds a thread from its first event).
        spend: Where what the graph's model calls cost is recorded (`SpendLedger`; the
            deployment's, so `onward inspect` and `onward runs` show a thread's spend): each AI
            message a node writes that reports its usage (``usage_metadata``) counts, priced by
            its model's name (``response_metadata["model_name"]``) in ``prices``, keyed by
            the thread and the seq of the writes it came in, recorded before they are
            appended. ``None``: nothing is recorded.
        prices: Micros per token by model name, for ``spend``; a model it does not name
            costs 0 (its tokens are still recorded).
        budget_micros: Most a thread may spend, in micros, as ``spend`` has it. The saver
            sees a model call only once its answer is written, so a budget stops a graph run
            after the call that passes it: the writes carrying that answer are appended, and
            the thread's next write records the run's end (``failed``, naming the budget),
            lets the thread go and raises `BudgetExceededError` out of ``ainvoke``. Every
            later invocation of the thread ends so at its first write while the thread is
            over the budget the saver is given. With LangGraph's default ``durability="async"``
            the next step's nodes may run beside that write; their calls are made, and counted
            only if their writes reach the saver before the end.
        tenant_budget_micros: The same for everything the saver's tenant spent.
    """

    def __init__(  # noqa: PLR0915 - one statement per store and setting, each documented
        self,
        log: EventLog,
        leases: LeaseStore,
        *,
        tenant: str,
        frontiers: FrontierStore | None = None,
        checkpoint_inline: bool = False,
        holder: str | None = None,
        policy: LeasePolicy | None = None,
        serde: SerializerProtocol | None = None,
        compaction: CompactionStore | None = None,
        redactor: Redactor | None = None,
        snapshot_every: int = SNAPSHOT_EVERY,
        summaries: ThreadSummaryStore | None = None,
        spend: SpendLedger | None = None,
        prices: PriceTable | None = None,
        budget_micros: int | None = None,
        tenant_budget_micros: int | None = None,
    ) -> None:
        super().__init__(serde=serde or JsonPlusSerializer(allowed_msgpack_modules=None))
        if snapshot_every < 1:
            raise InvalidInputError(f"snapshot_every must be at least 1, got {snapshot_every}")
        self.snapshot_every = snapshot_every
        self.redactor = redactor or Redactor()
        if not tenant:
            raise InvalidInputError("OnwardSaver needs a tenant")
        # Its threads may be stored already under it: a new thread is held to `check_name`.
        check_stored_name("tenant", tenant)
        if checkpoint_inline and frontiers is None:
            raise InvalidInputError("checkpoint_inline needs a frontier store (frontiers=...)")
        self.log = log
        self.leases = leases
        self.tenant = tenant
        self.frontiers = frontiers
        self.compaction = compaction or embedded_compaction(log)
        self.summaries = summaries or embedded_summaries(log)
        self.holder = holder or f"langgraph@{socket.gethostname()}:{os.getpid()}"
        self.policy = policy or LeasePolicy()
        self.spend = spend
        self.prices = prices or PriceTable()
        self.budgets = {
            "run": _budget(budget_micros, "budget_micros"),
            "tenant": _budget(tenant_budget_micros, "tenant_budget_micros"),
        }
        if spend is None and any(b is not None for b in self.budgets.values()):
            raise ConfigurationError(
                "a budget needs the spend ledger the graph's model calls are counted in "
                "(OnwardSaver(..., spend=ledger, prices=PriceTable(...)))"
            )
        self._checkpointer: Any = None
        if checkpoint_inline and frontiers is not None:
            from onward.runtime.checkpoint import Checkpointer  # noqa: PLC0415

            self._checkpointer = Checkpointer(frontiers, log, compaction=self.compaction)
        self._held: dict[str, _Held] = {}
        self._lost: dict[str, None] = {}
        """Threads this saver lost while writing them, not read afresh nor let go since: every
        write of them raises (`_kept`, as ``_losses``)."""
        self._losses: dict[str, int] = {}
        """When this saver last lost each thread's lease to another writer since it last let
        the thread go (every write may go on then), as the ``_started`` count then. It keeps
        the latest `FOLLOWED_THREADS` threads lost (`_kept`), as each map below of what this
        saver heard or did to a thread: a long-lived saver would keep one per thread."""
        self._read_at: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar(
            "onward_saver_read_at", default=None
        )
        """In a graph invocation's context (its tasks copy it): which of the ``_started`` the
        invocation's read of each thread's latest checkpoint was, so a read by anyone else (a
        UI's ``aget_state``) does not let an invocation that lost the thread, or that this
        saver ended, write on (the loss or the end came at that count or after). It keeps the
        latest `FOLLOWED_THREADS` threads read (`_remembered`): a context that runs invocation
        after invocation, of one thread after another, would keep and copy one per thread."""
        self._read_under: contextvars.ContextVar[dict[str, asyncio.Event | None] | None] = (
            contextvars.ContextVar("onward_saver_read_under", default=None)
        )
        """In a graph invocation's context, beside ``_read_at``: the ``fenced`` event of the
        holding the invocation writes each thread under (held at its read, or claimed by its
        first write). Set, the invocation lost the thread to another writer and must stop
        (`_lost_by_context`), whatever this saver still remembers of that loss (``_losses``
        keeps only the latest threads lost): it lives and goes with the invocation."""
        self._started = 0
        """How many reads of a thread's latest checkpoint (invocation starts) there were, of
        every thread: one count, so nothing is kept per thread a long-lived saver started."""
        self._asked: dict[str, tuple[int, CancelAsked, Leaseholder]] = {}
        """A cancel ask of each thread this saver heard and no end answered yet, with how many
        ``_started`` there were when it was heard, and the holding that heard it: it ends an
        invocation that started by then, not a later one (a cancel ends one invocation, not
        the thread)."""
        self._stopped: dict[str, Callable[[], OnwardError]] = {}
        """Threads whose graph run this saver ended (cancelled, over a budget): what every
        later write of that run raises, until the thread is read afresh."""
        self._stops: dict[str, tuple[int, Callable[[], OnwardError]]] = {}
        """When this saver last ended a graph run of each thread since it last let the thread
        go, as the ``_started`` count then, and what that run's later writes raise."""
        self._followed: OrderedDict[str, ThreadState] = OrderedDict()
        self._calling: dict[str, int] = {}
        """How many tool calls of each thread `OnwardToolMiddleware` is running (dispatched,
        outcome not yet recorded): a cancel heard meanwhile ends the graph run only at a write
        made once none is, so each outcome is recorded first."""
        self._call_turns: dict[tuple[str, str], _CallTurn] = {}
        """By thread and tool call id: the turn `OnwardToolMiddleware` takes to handle a call
        (see `_call_turn`)."""
        self._taking: dict[str, _Taking] = {}
        self._holds: dict[str, int] = {}
        """How many ``hold`` blocks of each thread are open: the last to end lets it go."""
        self._answering: set[asyncio.Task[None]] = set()
        """Asks heard by a renewal being answered (`_answer_at_interrupt`)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        """Whether ``close`` ran since the saver was last entered: it takes no thread then,
        as nothing would renew the lease for a purpose or hand it back."""
        self._records_left: dict[tuple[str, int], SpendEntry] = {}
        """Model calls whose record found the spend ledger down: still to record."""

    # -- lifecycle -------------------------------------------------------------------------

    async def _connect(self) -> None:
        """Remember the loop ``async with`` ran on, where the sync methods send their calls."""
        self._loop = asyncio.get_running_loop()
        self._closed = False

    async def close(self) -> None:
        """Release every thread this saver holds, and record the model calls still to record
        (`_record_spend`). The log and stores stay open (not ours). From here on the saver
        takes no thread (`_hold`) until it is entered again."""
        self._closed = True
        await asyncio.gather(*self._answering, return_exceptions=True)
        for thread_id in list(self._held):
            await self.arelease(thread_id)
        await self._record_left()

    aclose = close

    async def arelease(self, thread_id: str) -> None:
        """Hand a thread's lease back, so another process may write it without waiting.

        A write of the thread on its way to the log finishes first (the lease is handed back
        under the thread's lock): released under it, the write would land with no lease and
        be told it was fenced, though every reader counts it.

        A cancel ask the holding has not heard yet (made after its last renewal) is heard
        first and answered by the release: it was for the graph run that wrote the thread,
        which is done, and a cancel ends one invocation, not the thread, so the store must not
        keep it for the thread's next invocation. An invocation stopped at an interrupt is not
        done (it waits on a person, as a run waiting does): the ask ends it ``cancelled``, and
        a node of it still running beside the interrupt stops at its next write. An
        invocation still writing (the saver closed under it) is not done either: the ask is
        kept in `_asked` for the invocations started by now, so that one's next write, which
        claims the thread again, ends it ``cancelled`` rather than carrying on.
        """
        ended = await self._let_go(thread_id)
        self._lost.pop(thread_id, None)
        self._losses.pop(thread_id, None)
        if not ended:
            self._stopped.pop(thread_id, None)
            self._stops.pop(thread_id, None)

    async def _let_go(self, thread_id: str) -> bool:
        """Hand the thread's lease back as `arelease` does, still refusing the writes of a
        graph run this saver ended or lost: a copy, prune or deletion lets go of a thread it
        took for itself, which says nothing of that run. Returns whether it ended the run
        ``cancelled`` at an interrupt (a node still running beside it is stopped)."""
        held = self._held.get(thread_id)
        ended = False
        if held is not None:
            async with held.lock:
                if self._held.get(thread_id) is held:
                    del self._held[thread_id]
                await self._settle(held)
                with contextlib.suppress(OnwardError):  # lost or unreachable: the release says
                    await held.holder.confirm()
                asked = held.holder.cancel_asked
                if asked is not None and not held.holder.fenced.is_set():
                    self._heard(thread_id, held)
                    try:
                        if (await self._fresh(thread_id, held)).waiting_on is not None:
                            await self._record_end(thread_id, held, "cancelled", asked.error)
                            ended = True
                    except OnwardError:
                        held.holder.keep_ask()  # not ended: the thread's next holder hears it
                    if ended:
                        # As `_answer_at_interrupt`: a node of the ended invocation still
                        # running beside the interrupt must not claim the thread again and
                        # end it a second time.
                        self._asked.pop(thread_id, None)
                        self._stop(thread_id, functools.partial(_cancelled_error, thread_id, asked))
                await held.holder.__aexit__(None, None, None)
        return ended

    @asynccontextmanager
    async def _let_go_after(self, thread_id: str, *, held_before: bool) -> AsyncIterator[None]:
        """Let go, at the end of the block, of a thread a copy, prune or deletion took for its
        own write (the saver did not hold it before): when the block fails too, or the saver
        would renew the lease until it closed, and every other process be refused the thread.
        """
        if held_before:
            yield
            return
        try:
            yield
        except BaseException:
            try:
                await self._let_go(thread_id)
            except OnwardError as exc:  # the block's error is the one to raise
                logger.warning("thread %r: lease not handed back yet: %s", thread_id, exc)
            raise
        await self._let_go(thread_id)

    @asynccontextmanager
    async def hold(self, thread_id: str) -> AsyncIterator[None]:
        """Hold a thread's lease for a block (a graph run), releasing it at the end.

        Raises:
            ResumeConflictError: Another process holds the thread.
        """
        await self._hold(thread_id, graph_run=False)
        self._holds[thread_id] = self._holds.get(thread_id, 0) + 1
        try:
            yield
        finally:
            left = self._holds[thread_id] - 1
            if left:
                self._holds[thread_id] = left
            else:
                del self._holds[thread_id]
                # Whichever holding the thread has now: an invocation of the block may have
                # claimed it again after another was ended (cancelled, lost) and let it go.
                if thread_id in self._held:
                    await self.arelease(thread_id)

    def lease(self, thread_id: str) -> RunLease | None:
        """The lease this saver holds on a thread (its fence is on every write), if any."""
        held = self._held.get(thread_id)
        if held is None or held.holder.fenced.is_set():
            return None
        return held.holder.lease

    def holds(self, thread_id: str) -> bool:
        """Whether this saver holds the thread's lease (and has not learnt it lost it)."""
        held = self._held.get(thread_id)
        return held is not None and not held.holder.fenced.is_set()

    # -- reads -----------------------------------------------------------------------------

    async def aread_thread(self, thread_id: str) -> ThreadState:
        """The thread folded from the log now, with what every reader refused (for audit).

        Takes no lease and writes nothing.
        """
        return await self._read(thread_id)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id = _thread_id(config)
        ns: str = config["configurable"].get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config)
        held = self._held.get(thread_id)
        if checkpoint_id is None and held is not None and held.holder.fenced.is_set():
            # Lost while no write of it heard (the renewal did): let the holding go now, as
            # the read below starts afresh, or the next write would count it as lost again.
            # A loss all the same for an invocation that read the thread before.
            _kept(self._losses, thread_id, self._started)
            await self._drop(thread_id, held, lost=False)
        state = await self._state(thread_id)
        if checkpoint_id is None:
            # A graph invocation starts by loading the latest checkpoint: from here on it
            # builds on what the log says, so a saver that lost the thread (or ended its last
            # invocation, cancelled) may write again.
            self._lost.pop(thread_id, None)
            self._stopped.pop(thread_id, None)
            if await self._hear_ask_before_start(thread_id):
                state = await self._state(thread_id)
            self._started += 1
            read = _remembered(self._read_at.get(), thread_id, self._started)
            self._read_at.set(read)
            holding = self._held.get(thread_id)
            fenced = holding.holder.fenced if holding is not None else None
            self._read_under.set(_remembered(self._read_under.get(), thread_id, fenced))
        saved = state.checkpoints.get(ns, {})
        latest = checkpoint_id is None
        if checkpoint_id is None:
            checkpoint_id = state.newest.get(ns)
            if checkpoint_id is None:
                return None
        cancelled = bool(state.cancelled_as) and state.waiting_at == (ns, checkpoint_id)
        if latest:
            key = (id(self), thread_id)
            if cancelled:
                at = (ns, checkpoint_id, state.cancelled_as)
                _CANCELLED_READ.set(_remembered(_CANCELLED_READ.get(), key, at))
            elif key in (refused := _CANCELLED_READ.get() or {}):
                _CANCELLED_READ.set({k: v for k, v in refused.items() if k != key})
        event = saved.get(checkpoint_id)
        if state.partial and (event is None or not self._holds_values(state, event)):
            # Folded from a summary, which holds the newest checkpoints only, and the versions
            # they refer to: a checkpoint saved since may refer to an older one's (a fork).
            state = await self._state(thread_id, whole=True)
            event = state.checkpoints.get(ns, {}).get(checkpoint_id)
        if event is None:
            return None
        return self._tuple(state, thread_id, event, cancelled=cancelled)

    async def _hear_ask_before_start(self, thread_id: str) -> bool:
        """At an invocation's start read of a thread this saver holds: a cancel ask its holding
        heard already (a renewal, between invocations) was made before this invocation
        started, so it is for an earlier one, or for none. It is kept for an earlier invocation
        still writing (`_asked`), and the holding that carries it is let go, which answers it
        in the store: so it does not swallow a later ask of this invocation, and an asker
        waiting finds the thread no graph run is writing. This invocation's first write takes
        the thread again. A thread stopped at an interrupt is ended ``cancelled`` first, as
        `arelease` ends it: returns whether it was (the thread is then read again)."""
        held = self._held.get(thread_id)
        if held is None or held.holder.fenced.is_set() or held.holder.cancel_asked is None:
            return False
        ended = False
        async with held.lock:
            asked = self._heard(thread_id, held) if self._held.get(thread_id) is held else None
            if asked is not None:
                try:
                    if (await self._fresh(thread_id, held)).waiting_on is not None:
                        # Stopped at an interrupt, its invocation is not over (as `arelease`).
                        await self._record_end(thread_id, held, "cancelled", asked.error)
                        ended = True
                except OnwardError:
                    held.holder.keep_ask()  # not ended: the thread's next holder hears it
                await self._drop(thread_id, held, lost=False)
        if ended and asked is not None:
            # As `_answer_at_interrupt`: a node of the ended invocation still running beside
            # the interrupt must not claim the thread again and end it a second time. This
            # read's invocation starts after the end (`_started` is counted after it).
            self._asked.pop(thread_id, None)
            self._stop(thread_id, functools.partial(_cancelled_error, thread_id, asked))
            self._stopped.pop(thread_id, None)
        return ended

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        if config is None:
            raise InvalidInputError(
                "OnwardSaver lists one thread at a time: pass a config with a thread_id "
                "(listing every thread needs a projection of threads, which is not built yet)"
            )
        thread_id = _thread_id(config)
        wanted_ns: str | None = config["configurable"].get("checkpoint_ns")
        wanted_id = get_checkpoint_id(config)
        before_id = get_checkpoint_id(before) if before else None
        state = await self._state(thread_id, whole=True)
        found: list[tuple[str, GraphCheckpointed]] = [
            (checkpoint_id, event)
            for ns, saved in state.checkpoints.items()
            if wanted_ns is None or ns == wanted_ns
            for checkpoint_id, event in saved.items()
        ]
        found.sort(key=lambda item: item[0], reverse=True)
        left = limit
        listing: dict[tuple[str, str], DecodedList] = {}
        for checkpoint_id, event in found:
            if wanted_id and checkpoint_id != wanted_id:
                continue
            if before_id and checkpoint_id >= before_id:
                continue
            if filter:
                metadata = self.serde.loads_typed(_typed(event.metadata))
                if not all(metadata.get(k) == v for k, v in filter.items()):
                    continue
            if left is not None:
                if left <= 0:
                    return
                left -= 1
            yield self._tuple(state, thread_id, event, listing)

    # -- writes ----------------------------------------------------------------------------

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        thread_id = _thread_id(config)
        ns: str = config["configurable"].get("checkpoint_ns", "")
        bare: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = bare.pop("channel_values", {})
        changed = {channel: values[channel] for channel in new_versions if channel in values}
        # Lists are serialized under the thread's lock, where what the version before holds
        # is known (often only the appended items need serializing); the rest here, outside.
        lists = {channel: v for channel, v in changed.items() if type(v) is list}
        whole = {
            channel: _serialized(self.serde.dumps_typed(v))
            for channel, v in changed.items()
            if channel not in lists
        }
        saved: dict[str, Any] = {
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint["id"],
            "parent_checkpoint_id": config["configurable"].get("checkpoint_id"),
            "checkpoint": _serialized(self.serde.dumps_typed(bare)),
            "metadata": _serialized(
                self.serde.dumps_typed(get_checkpoint_metadata(config, metadata))
            ),
        }
        decoded: dict[tuple[str, str], list[Any] | None] = {}

        def events(state: ThreadState) -> _Batch:
            out: list[ChannelValue] = []
            for channel, version in new_versions.items():
                key = (channel, _version_key(version))
                if channel in lists:
                    item, decoded[key] = self._saved_list(state, ns, *key, lists[channel])
                else:
                    item = ChannelValue(channel=channel, version=key[1], value=whole.get(channel))
                out.append(item)
            batch: _Batch = []
            left = state.left_unanswered(ns, checkpoint["id"])
            if left is not None:
                # Else the thread would look waiting on a person (list_pending) for good.
                why = f"the graph went on to checkpoint {checkpoint['id']}; no answer was saved"
                batch.append(
                    (ApprovalDenied, {"request_id": left, "by": self.holder, "value": why})
                )
            batch.append((GraphCheckpointed, {**saved, "values": out}))
            return batch

        def remember(state: ThreadState) -> None:
            for (channel, version), items in decoded.items():
                node = state.values.get((ns, channel, version))
                if items is None or node is None or node.length != len(items):
                    state.decoded.pop((ns, channel), None)
                else:
                    state.decoded[(ns, channel)] = DecodedList(node, items)

        await self._write(thread_id, events, after=remember, step=True)
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        thread_id = _thread_id(config)
        ns: str = config["configurable"].get("checkpoint_ns", "")
        checkpoint_id = _checkpoint_id(config)
        refused = (_CANCELLED_READ.get() or {}).get((id(self), thread_id))
        answers = any(channel == RESUME for channel, _ in writes)
        if refused is not None and refused[:2] == (ns, checkpoint_id) and answers:
            raise _answer_refused(thread_id, refused[2])
        indexed = [
            (WRITES_IDX_MAP.get(channel, idx), channel, value)
            for idx, (channel, value) in enumerate(writes)
        ]

        def events(state: ThreadState) -> _Batch:
            new = [
                GraphWrite(
                    channel=channel, idx=idx, value=_serialized(self.serde.dumps_typed(value))
                )
                for idx, channel, value in indexed
                if state.is_new_write(ns, checkpoint_id, (task_id, idx))
            ]
            if not new:
                return []
            batch: _Batch = []
            channels = {w.channel for w in new}
            if RESUME in channels and state.waiting_on is not None:
                asked = self._asked_by(state, ns, checkpoint_id, task_id)
                if asked is None or asked == state.waiting_on:
                    grant = {"request_id": state.waiting_on, "by": self.holder}
                    batch.append((ApprovalGranted, grant))
            batch.append(
                (
                    GraphWritesSaved,
                    {
                        "checkpoint_ns": ns,
                        "checkpoint_id": checkpoint_id,
                        "task_id": task_id,
                        "task_path": task_path,
                        "writes": new,
                    },
                )
            )
            if INTERRUPT in channels:
                batch.append(
                    (
                        ApprovalRequested,
                        {
                            "request_id": _interrupt_id(ns, checkpoint_id, task_id, indexed),
                            "prompt": "LangGraph interrupt",
                            "details": {
                                "checkpoint_ns": ns,
                                "checkpoint_id": checkpoint_id,
                                "task_id": task_id,
                            },
                        },
                    )
                )
            return batch

        spent = _model_usages(value for _, _, value in indexed) if self.spend else []
        await self._write(thread_id, events, spent=spent, step=True)

    async def adelete_thread(self, thread_id: str) -> None:
        """Forget every checkpoint and write of a thread (a `GraphThreadDeleted` event).

        The log is append-only: readers stop seeing the thread's past at once, and its bytes
        go when compaction cuts the run's prefix (compaction is not built yet). A thread the
        saver did not hold is released again afterwards.
        """
        held_before = self.holds(thread_id)  # a holding lost is taken again, then let go
        if not held_before:
            state = await self._read(thread_id)
            if not state.checkpoints and not state.writes:
                return

        def events(state: ThreadState) -> _Batch:
            if not state.checkpoints and not state.writes:
                return []
            return [(GraphThreadDeleted, {})]

        async with self._let_go_after(thread_id, held_before=held_before):
            await self._write(thread_id, events, graph_run=False)
            held = self._held.get(thread_id)
            if held is not None:
                await self._settle(held)  # one taken before the deletion must not land after
                held.summary_size = 0  # the next write stores a summary of the emptied thread
            await self._forget_summary(thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune threads: ``keep_latest`` keeps each namespace's latest checkpoint (see
        :mod:`.pruning`), ``delete`` deletes the threads.

        Each pruned thread gets a `GraphCheckpointsRemoved` event under its lease: readers stop
        seeing the older checkpoints at once; compaction cuts the bytes later.

        Raises:
            InvalidInputError: An unknown strategy, a single string for ``thread_ids``, or (for
                ``keep_latest``) a thread whose graph uses a ``DeltaChannel``: then nothing is
                pruned.
            ResumeConflictError: Another process holds one of the threads: the threads before
                it were pruned (each wholly), it and those after it were not; the message
                names both. Any other error part way carries the same in a note.
        """
        if isinstance(thread_ids, str):
            raise InvalidInputError("prune takes a sequence of thread ids, not one string")
        thread_ids = list(thread_ids)  # read twice below: a generator would be spent
        if strategy not in ("keep_latest", "delete"):
            raise InvalidInputError(
                f"unknown prune strategy {strategy!r}; use 'keep_latest' or 'delete'"
            )
        if strategy == "delete":
            for thread_id in thread_ids:
                await self._state(thread_id)  # every id and tenant checked before any deletion
            await _each(thread_ids, "deleted", self.adelete_thread)
            return
        loads = self._loads
        for thread_id in thread_ids:
            pruning.refuse_delta_channels(await self._state(thread_id, whole=True), loads)
        await _each(
            thread_ids,
            "pruned",
            lambda thread_id: self._remove(
                thread_id,
                lambda state: pruning.keep_latest(state, loads),
                why="prune keep_latest: the latest checkpoint of each namespace is kept",
            ),
        )

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Remove every checkpoint a LangGraph run saved (``metadata["run_id"]``), with its
        pending writes, from every thread of this saver's tenant.

        Finding the threads reads the whole log once (no index of LangGraph's run ids yet),
        and the retained copies of the threads compaction cut out of it (named by the
        frontier rows); each thread found gets a `GraphCheckpointsRemoved` event under its
        lease.

        Raises:
            ConfigurationError: Compaction has cut the log and the saver has no frontier store
                to name the threads it cut.
            ResumeConflictError: Another process holds one of the threads found: the threads
                before it were done (each wholly), it and those after it were not; the message
                names both (any other error part way, in a note). Calling again with the same
                run ids finishes the rest.
        """
        if isinstance(run_ids, str):
            raise InvalidInputError("delete_for_runs takes a sequence of run ids, not one string")
        wanted = frozenset(str(r) for r in run_ids)
        if not wanted:
            return
        loads = self._loads
        threads = await pruning.threads_of_runs(
            self.log,
            tenant=self.tenant,
            run_ids=wanted,
            loads=loads,
            frontiers=self.frontiers,
            compaction=self.compaction,
        )
        why = f"delete_for_runs: checkpoints of LangGraph runs {', '.join(sorted(wanted))}"
        await _each(
            threads,
            "done",
            lambda thread_id: self._remove(
                thread_id, lambda state: pruning.of_runs(state, wanted, loads), why=why
            ),
        )

    async def _remove(
        self,
        thread_id: str,
        choose: Callable[[ThreadState], list[GraphCheckpointRef]],
        *,
        why: str,
    ) -> None:
        """Append `GraphCheckpointsRemoved` for what ``choose`` picks from the thread, if any.

        The choice is made again under the lease, on the thread as its holder has it. A thread
        the saver did not hold is released afterwards, and not taken at all when nothing of it
        would go.
        """
        held_before = self.holds(thread_id)  # a holding lost is taken again, then let go
        if not held_before and not choose(await self._read(thread_id)):
            return

        def events(state: ThreadState) -> _Batch:
            gone = choose(state)
            return [(GraphCheckpointsRemoved, {"checkpoints": gone, "why": why})] if gone else []

        async with self._let_go_after(thread_id, held_before=held_before):
            await self._write(thread_id, events, whole=True, graph_run=False)

    def _asked_by(
        self, state: ThreadState, ns: str, checkpoint_id: str, task_id: str
    ) -> str | None:
        """The request id of the interrupt ``task_id`` raised at the checkpoint, as its saved
        ``INTERRUPT`` write names it; ``None`` for a task that raised none there (the resume
        ``Command(resume=...)`` itself writes, under no task's id).

        A ``RESUME`` write answers that interrupt only: with two pending at once (nodes run in
        parallel, each interrupted), answering one must not close the other, which the graph
        still waits on, whichever of the two requests was asked last.
        """
        stored = state.writes.get((ns, checkpoint_id), {})
        raised = [
            (idx, write.channel, self._loads(write.value))
            for (task, idx), write in stored.items()
            if task == task_id and write.channel == INTERRUPT
        ]
        return _interrupt_id(ns, checkpoint_id, task_id, raised) if raised else None

    def _holds_values(self, state: ThreadState, event: GraphCheckpointed) -> bool:
        """Whether the fold holds every channel version the checkpoint refers to."""
        ns = event.checkpoint_ns
        return all(
            (ns, channel, version) in state.values for channel, version in self._refers(event)
        )

    def _loads(self, value: Serialized) -> Any:
        return self.serde.loads_typed(_typed(value))

    def _saved_list(
        self, state: ThreadState, ns: str, channel: str, version: str, value: list[Any]
    ) -> tuple[ChannelValue, list[Any] | None]:
        """How a list channel's new version is saved, and its items as a reader decodes them
        where the saver may keep them (`_shareable`; else ``None``).

        When the saver keeps the version before decoded and the new list starts with the
        very objects (``is``) of those items, they are unchanged (they are immutable values
        or messages, see `_rebuilt`) and only the rest is serialized, saved as an append to
        that version. Otherwise every item is serialized and compared with what the version
        before stored (`_saved_value`), so an item changed in place is saved.
        """
        base = state.latest.get((ns, channel))
        held = state.decoded.get((ns, channel))
        if (
            base is not None
            and base != version
            and held is not None
            and state.values.get((ns, channel, base)) is held.node
            and _starts_with(value, held.items)
        ):
            appended = value[len(held.items) :]
            stored = [_serialized(self.serde.dumps_typed(item)) for item in appended]
            read = self._as_read(appended, stored)
            return (
                ChannelValue(channel=channel, version=version, items=stored, base=base),
                [*held.items, *read] if read is not None else None,
            )
        stored = [_serialized(self.serde.dumps_typed(item)) for item in value]
        return _saved_value(state, ns, channel, version, stored), self._as_read(value, stored)

    def _as_read(self, written: list[Any], stored: list[Serialized]) -> list[Any] | None:
        """The items a reader of ``stored`` gets, if all are `_shareable`: each written object
        itself where the serializer reads it back as an equal object of its type (so the next
        put, handed the same object, is known to extend this list), else what it reads back.
        """
        if not all(_shareable(item) for item in written):
            return None
        out: list[Any] = []
        for item, serialized in zip(written, stored, strict=True):
            read = self._loads(serialized)
            try:
                same = type(read) is type(item) and bool(read == item)
            except Exception:  # noqa: BLE001 - an __eq__ that cannot answer means "not equal"
                same = False
            out.append(item if same else read)
        return out if all(_shareable(item) for item in out) else None

    def _copied_values(
        self, source: ThreadState, event: GraphCheckpointed, copied: set[tuple[str, str, str]]
    ) -> list[ChannelValue]:
        """The values a copy of ``event`` saves: its own (an append whose base was not copied
        goes whole), then every version its checkpoint refers to that no copied checkpoint
        saved, whole. ``copied`` collects what the copy has saved so far."""
        ns = event.checkpoint_ns
        out: list[ChannelValue] = []
        for item in event.values:
            key = (ns, item.channel, item.version)
            node = source.values.get(key)
            extends_copied = item.base is None or (ns, item.channel, item.base) in copied
            out.append(item if extends_copied or node is None else _whole(*key[1:], node))
            copied.add(key)
        versions: dict[str, Any] = self._loads(event.checkpoint).get("channel_versions", {})
        for channel, version in versions.items():
            key = (ns, channel, _version_key(version))
            node = source.values.get(key)
            if key not in copied and node is not None:
                out.append(_whole(channel, key[2], node))
                copied.add(key)
        return out

    def _rebuilt(
        self,
        state: ThreadState,
        ns: str,
        channel: str,
        node: ChannelNode,
        listing: dict[tuple[str, str], DecodedList] | None = None,
    ) -> Any:
        """A stored channel version back as its value (a list rebuilt from its appends).

        A list is a new list at every read, so a caller adding to or removing from it changes
        no later read. When every item of a list is `_shareable` (immutable values, LangChain
        messages), the saver keeps the latest version's items decoded (`DecodedList`) and
        hands out those same objects: reading that version again, or one extending it,
        decodes only what was appended since, and a put handed the same objects back knows
        they are unchanged (`_saved_list`). LangGraph treats messages as values: its channels
        take a checkpoint's value as it is (``from_checkpoint``), ``add_messages`` copies the
        list and replaces a message by its id (it sets only a missing id, and a stored
        message has one), and its own ``DeltaChannel`` stores the writes, not the values, so
        a message changed in place is not saved there either. Code that changes a message in
        place (``message.content = ...``) instead of writing a new one with its id changes
        what this saver reads back, and the change is not saved. Items of other types
        (dicts, lists, other objects) are decoded afresh at every read and compared by their
        serialized bytes at every put, so changing them in place is safe.

        ``listing`` keeps, for one `alist`, the version each channel was last read at: an older
        version it extends is the first items of those (a listing reads newest first), so
        listing a thread decodes each item once, not every checkpoint's list from scratch.
        """
        if not node.listed:
            return None if node.value is None else self._loads(node.value)
        key = (ns, channel)
        latest = state.latest.get(key)
        is_latest = latest is not None and state.values.get((ns, channel, latest)) is node
        held = state.decoded.get(key)
        if held is not None and held.node is node:
            return list(held.items)
        items: list[Any] | None = None
        shareable = True  # a DecodedList holds only shareable items: check what is decoded
        for known in (listing.get(key) if listing is not None else None, held):
            if known is None:
                continue
            if known.node is node:
                items = known.items
                break
            appended = node.items_after(known.node)
            if appended is not None:
                added = [self._loads(item) for item in appended]
                shareable = all(_shareable(item) for item in added)
                items = [*known.items, *added]
                break
            if known.node.reaches(node):
                items = known.items[: node.length]
                break
        if items is None:
            items = [self._loads(item) for item in node.all_items()]
            shareable = all(_shareable(item) for item in items)
        if listing is not None and shareable:
            listing[key] = DecodedList(node, items)
        if is_latest:
            if shareable:
                state.decoded[key] = DecodedList(node, items)
            else:
                state.decoded.pop(key, None)
        return list(items)

    # -- tool calls (see .tools) -----------------------------------------------------------

    async def aclaim(self, thread_id: str) -> ThreadState:
        """Hold the thread (take its lease and claim it, unless this saver holds it already)
        and return its fold: from here on, nobody else's write to it counts.

        What is decided on this state (whether a tool call ran) is decided as its writer.

        Raises:
            ResumeConflictError: Another process holds the thread.
            FencedError: This saver lost the thread while a graph run was writing it.
        """
        held = await self._hold(thread_id)
        async with held.lock:
            self._check_still_held(thread_id, held)
            return await self._fresh(thread_id, held)

    async def arecord(self, thread_id: str, kind: type[Event], **fields: Any) -> None:
        """Append one event of the thread (its envelope filled in) under the thread's lease.

        Raises:
            FencedError: The lease was lost before or during the append.
            ResumeConflictError: Another process holds the thread.
        """
        await self._write(thread_id, _constant([(kind, fields)]))

    @contextmanager
    def _running_call(self, thread_id: str) -> Iterator[None]:
        """Count a dispatched tool call of the thread as running for the block (see
        `_may_go_on`): the middleware runs the tool and records its outcome in it."""
        self._calling[thread_id] = self._calling.get(thread_id, 0) + 1
        try:
            yield
        finally:
            left = self._calling[thread_id] - 1
            if left:
                self._calling[thread_id] = left
            else:
                del self._calling[thread_id]

    @asynccontextmanager
    async def _call_turn(self, thread_id: str, call_id: str) -> AsyncIterator[None]:
        """Handle one tool call of the thread at a time in this saver, for the block.

        A ``ToolNode`` ends its step at one call's ``interrupt()`` without waiting for the
        others (``asyncio.gather``), whose tools run on: when the graph goes on meanwhile, the
        call is met again while it still runs, and read from the log it would look cut off
        (dispatched, no outcome) and be put to a person, or settled as never run and not yet
        dispatched again. Its next handling waits for the one under way, then reads the log.
        """
        key = (thread_id, call_id)
        turn = self._call_turns.get(key)
        if turn is None:
            turn = self._call_turns[key] = _CallTurn()
        turn.users += 1
        try:
            async with turn.lock:
                yield
        finally:
            turn.users -= 1
            if not turn.users:
                del self._call_turns[key]

    def claim(self, thread_id: str) -> ThreadState:
        return self._sync(self.aclaim(thread_id))

    def record(self, thread_id: str, kind: type[Event], **fields: Any) -> None:
        self._sync(self.arecord(thread_id, kind, **fields))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and pending write of one thread onto another.

        Each checkpoint goes over with its writes as one append to the target thread, under the
        target's lease, in the order the source saved them, so the target's values and its
        parent chain are the source's. A value a copied checkpoint needs that no copied
        checkpoint saved (a pruned one did), or the base an append extends, goes over whole
        with the first checkpoint that needs it. The copied writes carry no usage (their
        calls are the source's, which paid for them), so the target is charged nothing for
        them. The source is only read. A target the saver did not hold is released
        afterwards (as `adelete_thread` does), so another process may run it.
        """
        held_before = self.holds(target_thread_id)  # a holding lost is taken again, then let go
        async with self._let_go_after(target_thread_id, held_before=held_before):
            await self._copy(source_thread_id, target_thread_id)

    async def _copy(self, source_thread_id: str, target_thread_id: str) -> None:
        """`acopy_thread`'s appends, one per checkpoint of the source: run in
        `_let_go_after`, so a target taken for them is let go however they end."""
        source = await self._state(source_thread_id, whole=True)
        saved = sorted(
            (
                event
                for checkpoints in source.checkpoints.values()
                for event in checkpoints.values()
            ),
            key=lambda e: (e.checkpoint_id, e.checkpoint_ns),
        )
        copied: set[tuple[str, str, str]] = set()
        for event in saved:
            values = self._copied_values(source, event, copied)
            tasks: dict[tuple[str, str], list[GraphWrite]] = {}
            for (task_id, idx), write in source.writes.get(
                (event.checkpoint_ns, event.checkpoint_id), {}
            ).items():
                tasks.setdefault((task_id, write.task_path), []).append(
                    GraphWrite(channel=write.channel, idx=idx, value=write.value)
                )
            batch: _Batch = [
                (
                    GraphCheckpointed,
                    {
                        "checkpoint_ns": event.checkpoint_ns,
                        "checkpoint_id": event.checkpoint_id,
                        "parent_checkpoint_id": event.parent_checkpoint_id,
                        "checkpoint": event.checkpoint,
                        "metadata": event.metadata,
                        "values": values,
                    },
                ),
                *(
                    (
                        GraphWritesSaved,
                        {
                            "checkpoint_ns": event.checkpoint_ns,
                            "checkpoint_id": event.checkpoint_id,
                            "task_id": task_id,
                            "task_path": task_path,
                            "writes": writes,
                        },
                    )
                    for (task_id, task_path), writes in tasks.items()
                ),
            ]
            await self._write(target_thread_id, _constant(batch), graph_run=False)

    def get_next_version(self, current: str | int | None, channel: None) -> str:
        """A monotonically increasing version: the counter, then a random tie-breaker.

        The same scheme as LangGraph's own savers, so threads move between savers unchanged.
        """
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        next_h = random.random()  # noqa: S311 - a tie-breaker, not a secret
        return f"{current_v + 1:032}.{next_h:016}"

    # -- sync API: the async methods on the saver's loop -----------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        async def read() -> tuple[
            CheckpointTuple | None,
            dict[str, int] | None,
            dict[str, asyncio.Event | None] | None,
            dict[tuple[int, str], tuple[str, str, str]] | None,
        ]:
            found = await self.aget_tuple(config)
            return found, self._read_at.get(), self._read_under.get(), _CANCELLED_READ.get()

        found, read_at, read_under, refused = self._sync(read())
        # The read ran in a copy of this thread's context: the invocation that made it goes on
        # in this one (its writes, from here or its worker threads, carry what it read, and
        # an answer to an interrupt a cancel ended is refused).
        self._read_at.set(read_at)
        self._read_under.set(read_under)
        _CANCELLED_READ.set(refused)
        return found

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        async def collect() -> list[CheckpointTuple]:
            return [t async for t in self.alist(config, filter=filter, before=before, limit=limit)]

        yield from self._sync(collect())

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._sync(self.aput(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._sync(self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._sync(self.adelete_thread(thread_id))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._sync(self.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._sync(self.aprune(thread_ids, strategy=strategy))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._sync(self.adelete_for_runs(run_ids))

    def _sync(
        self, coro: Coroutine[Any, Any, _T], *, context: contextvars.Context | None = None
    ) -> _T:
        """Run ``coro`` on the saver's loop and wait for it; in ``context`` if given (so code
        that reads the caller's context variables, LangGraph's ``interrupt()``, works there).
        """
        loop = self._loop
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop or loop.is_closed():
            coro.close()
            raise InvalidInputError(
                "OnwardSaver's sync methods run its async ones on the loop it was opened on "
                "(`async with saver:`), so call them from another thread; on that loop use "
                "the async API (ainvoke, astream, aget_state)"
            )
        if not loop.is_running():
            # Nothing would run the call: waiting for it would never end.
            coro.close()
            raise InvalidInputError(
                "OnwardSaver's sync methods run its async ones on the loop it was opened on, "
                "and that loop is not running: call them from another thread while the loop "
                "runs (a graph's sync invoke in `asyncio.to_thread`), or use the async API"
            )
        if context is not None:
            coro = _in_context(coro, context)
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    # -- the write path --------------------------------------------------------------------

    async def _write(
        self,
        thread_id: str,
        build: Callable[[ThreadState], _Batch],
        *,
        after: Callable[[ThreadState], None] | None = None,
        whole: bool = False,
        spent: Sequence[tuple[str, Usage]] = (),
        step: bool = False,
        graph_run: bool = True,
    ) -> None:
        """Append what ``build`` makes of the thread's state, under its lease, and fold it;
        then ``after`` sees the state with the batch folded, still under the thread's lock.
        ``whole``: ``build`` needs every checkpoint (not a fold from a summary). ``spent``:
        the model calls whose answers the batch's writes carry, recorded before it is
        appended (the calls were made, whether or not the append lands). ``step``: a graph's
        own checkpoint or task writes, which a budget stops (copying, pruning and deleting a
        thread, or recording a tool call, are never refused for spend). ``graph_run``: a write
        of the graph run writing the thread (see `_hold`); copying, pruning and deleting one
        are not, and are not refused once this saver ended or lost that run.

        Raises:
            FencedError: The lease was lost before or during the append; nothing more may be
                written by this graph run.
            ResumeConflictError: Another process holds the thread.
        """
        self._remember_loop()
        held = await self._hold(thread_id, graph_run=graph_run)
        async with held.lock:
            self._check_still_held(thread_id, held)
            try:
                await held.holder.check()
            except FencedError:
                await self._drop(thread_id, held, lost=True)
                raise
            state = await self._fresh(thread_id, held, whole=whole)
            if state.last_seq < held.spent_at:
                await self._pass_spent_seqs(thread_id, held, state)
            made = build(state)
            await self._may_go_on(
                thread_id, held, made, state.last_seq + 1, spent, step=step, graph_run=graph_run
            )
            fence = held.holder.lease.fence
            batch = [
                stamped(
                    kind,
                    run_id=thread_id,
                    tenant=self.tenant,
                    seq=state.last_seq + 1 + i,
                    fence=fence,
                    **fields,
                )
                for i, (kind, fields) in enumerate(made)
            ]
            if not batch:
                return
            # Masked before anything is encoded; the thread is folded from what was written.
            batch = [self.redactor.redact_event(event) for event in batch]
            try:
                positions = await self.log.append(batch)
            except BaseException:
                # Perhaps stored, perhaps not: the log says which, under the same lease.
                held.stale = True
                raise
            try:
                # Still the holder after the append: nobody claimed the thread before it, so
                # the write counts for every reader.
                await held.holder.confirm()
            except FencedError:
                await self._drop(thread_id, held, lost=True)
                raise
            except BaseException:
                held.stale = True  # the store could not say; the graph run stops here
                raise
            counted = [
                state.apply(StoredEvent(position, cast(Any, event)))
                for event, position in zip(batch, positions, strict=True)
            ]
            if after is not None:
                after(state)
            if all(counted):
                await self._summarize(thread_id, held, batch, positions[-1].offset)
            if any(
                isinstance(e, ApprovalRequested | ApprovalGranted | ApprovalDenied) for e in batch
            ):
                await self._fold_row(thread_id, positions[0].partition)

    async def _pass_spent_seqs(self, thread_id: str, held: _Held, state: ThreadState) -> None:
        """Take the seqs up to ``held.spent_at`` with claims again (this holder's, under its
        fence), as a new process's claim would: a write whose spend was recorded did not
        land (its append failed), and its seq keys the ledger's entry of calls that were
        paid for. Writes of a node made again taking that seq would have their calls dropped
        as recorded already.

        Raises:
            FencedError: The lease was lost.
        """
        fence = held.holder.lease.fence
        claims = [
            stamped(
                RunClaimed,
                run_id=thread_id,
                tenant=self.tenant,
                seq=seq,
                fence=fence,
                worker=self.holder,
            )
            for seq in range(state.last_seq + 1, held.spent_at + 1)
        ]
        await self._append_held(thread_id, held, state, claims)

    async def _append_held(
        self, thread_id: str, held: _Held, state: ThreadState, events: Sequence[Event]
    ) -> Sequence[Position]:
        """Append ``events`` under the thread's lease, confirm it is still held, and fold
        them into ``state``: the small writes a saver makes of its own (claims, an end).

        Raises:
            FencedError: The lease was lost; the thread is let go.
        """
        try:
            positions = await self.log.append(events)
            await held.holder.confirm()
        except FencedError:
            await self._drop(thread_id, held, lost=True)
            raise
        except BaseException:
            held.stale = True  # perhaps stored, perhaps not: the next write reads which
            raise
        for event, position in zip(events, positions, strict=True):
            state.apply(StoredEvent(position, cast(Any, event)))
        return positions

    async def _record_spend(
        self, thread_id: str, made: _Batch, first_seq: int, spent: Sequence[tuple[str, Usage]]
    ) -> int | None:
        """Record the model calls ``spent`` under the seq the batch's writes take (``made``
        is appended from ``first_seq``): one entry for a task's writes (a node that called
        two models is one entry naming both). Returns that seq, ``None`` if nothing was
        recorded."""
        kinds = [kind for kind, _ in made]
        if GraphWritesSaved not in kinds:
            return None
        index = kinds.index(GraphWritesSaved)
        seq = first_seq + index
        entry = self._entry(thread_id, seq, spent, time.time_ns() // 1_000)
        # The writes say what they cost: a claim after this process ended records it from
        # the log if the ledger lacks it (`_record_calls_left`).
        made[index][1]["usage"] = Usage(
            input_tokens=entry.input_tokens, output_tokens=entry.output_tokens
        )
        try:
            await self._record_entry(entry)
        except BackendError as exc:
            # The calls were paid for and their answers are in the writes: failing the write
            # would lose the entry (a node made again writes at the same seq, whose one
            # record counts). The writes go on; the entry is recorded at the next write.
            logger.warning("thread %r: a model call's spend is still to record: %s", thread_id, exc)
        return seq

    def _entry(
        self, thread_id: str, seq: int, spent: Sequence[tuple[str, Usage]], at: int
    ) -> SpendEntry:
        """The ledger's entry of one task's model calls ``spent``, keyed by its writes' seq."""
        models = sorted({model for model, _ in spent})
        return SpendEntry(
            run_id=thread_id,
            tenant=self.tenant,
            seq=seq,
            model=", ".join(models),
            input_tokens=sum(usage.input_tokens for _, usage in spent),
            output_tokens=sum(usage.output_tokens for _, usage in spent),
            micros=sum(self.prices.cost(model, usage) for model, usage in spent),
            at=at,
        )

    async def _record_entry(self, entry: SpendEntry) -> bool:
        """Record one task's model calls; an entry the ledger does not take now is kept for
        `_record_left` and the error raised. Returns whether the ledger had no entry at that
        key yet."""
        assert self.spend is not None
        try:
            return await self.spend.record(entry)
        except BackendError:
            self._records_left[(entry.run_id, entry.seq)] = entry
            raise

    async def _record_left(self) -> None:
        """Record the model calls whose record found the ledger down (`_record_spend`), in
        order, until the ledger still does not answer."""
        if self.spend is None:
            return
        for key, entry in list(self._records_left.items()):
            try:
                await self.spend.record(entry)
            except BackendError as exc:
                logger.warning(
                    "thread %r: a model call's spend is still to record: %s", key[0], exc
                )
                return
            del self._records_left[key]

    async def _record_calls_left(self, thread_id: str, state: ThreadState) -> bool:
        """Record the thread's own model calls the ledger lacks, on claiming it: an entry whose
        record found the ledger down was kept only by the saver that wrote the calls' answers,
        and is lost with it if its process ended before the ledger came back. Each write in
        the log that carries its calls' tokens (`GraphWritesSaved.usage`; a copied write does
        not) is recorded under its own seq, the key its first record took, so one recorded
        already changes nothing; the log is read only when the ledger has no entry under one
        of those writes' seqs (``state.spent_seqs``): its totals cannot stand for them, as an
        entry recorded for writes whose append failed counts as much as a lost one would. A
        ledger that cannot be reached is logged: the writes stay in the log, checked again
        before a budget is weighed (`_may_go_on`). Writes cut from the log (compaction,
        retention) before their entry was recorded cannot be counted: those the log still
        holds are recorded all the same, and the ones cut are named. Returns False when a
        store did not answer (it may next time)."""
        if self.spend is None or not state.spent_calls:
            return True
        try:
            kept = {entry.seq for entry in await self.spend.entries(thread_id)}
            if kept.issuperset(state.spent_seqs):
                return True
            try:
                read = await read_whole_run(
                    self.log,
                    self.compaction,
                    thread_id,
                    start=await self._first_offset(thread_id),
                    end=state.next_offset,
                )
            except LogTruncatedError as exc:
                if exc.start is None:
                    raise
                read = await self.log.read_run(thread_id, start=exc.start, end=state.next_offset)
            guard = SequenceGuard()
            if read and read[0].event.seq > 1:
                # The log lost the thread's first events: counted on from the first it holds.
                guard = SequenceGuard(read[0].event.seq - 1, read[0].event.fence)
            recorded = 0
            seen: set[int] = set()
            # Only what counts: writes a fence refused are not the ones their seq keys.
            for stored in guard.admit_all(read):
                event = stored.event
                if not isinstance(event, GraphWritesSaved) or event.usage is None:
                    continue
                seen.add(event.seq)
                if event.seq in kept:
                    continue
                calls = _model_usages(self._loadable(thread_id, event))
                if calls:
                    entry = self._entry(thread_id, event.seq, calls, event.at)
                    recorded += await self.spend.record(entry)
        except OnwardError as exc:
            logger.warning(
                "thread %r: the spend of its writes is still to check: %s", thread_id, exc
            )
            return not isinstance(exc, BackendError)
        if recorded:
            logger.info(
                "thread %r: the spend of %d writes recorded from the log", thread_id, recorded
            )
        cut = sorted(set(state.spent_seqs) - kept - seen)
        if cut:
            logger.warning(
                "thread %r: the writes at seq %s were cut from the log before their spend was "
                "recorded; the ledger cannot count them, and the thread's and its tenant's "
                "spend stay short by those calls",
                thread_id,
                ", ".join(map(str, cut)),
            )
        return True

    def _loadable(self, thread_id: str, event: GraphWritesSaved) -> Sequence[Any]:
        """The values of ``event``'s writes this saver's serializer loads; one it cannot (a
        type its serializer refuses, as a pickle without ``pickle_fallback``, or a class
        gone from the code) is logged and left out, so a claim counting the calls is not
        failed by a value no model call is in."""
        values: list[Any] = []
        for write in event.writes:
            try:
                values.append(self._loads(write.value))
            except Exception as exc:  # noqa: BLE001 - whatever the serializer raises
                logger.warning(
                    "thread %r: write %r of seq %d cannot be loaded (%s: %s); a model call "
                    "it holds is not counted",
                    thread_id,
                    write.channel,
                    event.seq,
                    type(exc).__name__,
                    exc,
                )
        return values

    async def _hold(self, thread_id: str, *, graph_run: bool = True) -> _Held:
        """The thread's holding, taking the lease and claiming the thread if need be.

        ``graph_run``: for a write of the graph run writing the thread (its steps, its tool
        calls), which stops once this saver ended or lost that run; not for taking the thread
        for a block (``hold``), nor for copying, pruning or deleting it, which read the thread
        afresh under the claim and write nothing of that run.

        Raises:
            ConfigurationError: The saver was closed and not entered since (unless the write
                only records the end of a run a cancel asked as the saver let it go).
            FencedError: This saver lost the thread while writing it, and it has not been read
                since: the graph run that was writing must stop, not claim the thread again
                and carry on from a state another writer has moved past.
        """
        self._remember_loop()
        _checked(thread_id)
        if self._closed and not (graph_run and self._ended_by_ask_kept(thread_id)):
            raise ConfigurationError(
                f"run {thread_id!r}: this OnwardSaver is closed, so it writes no thread (its "
                "lease would be held with nothing to hand it back); use the saver inside "
                "`async with`, or enter it again"
            )
        stopped = self._stopped_since_read(thread_id) if graph_run else None
        if stopped is not None:
            raise stopped()
        if graph_run and (self._read_before_loss(thread_id) or self._lost_by_context(thread_id)):
            raise self._lost_error(thread_id)
        held = self._held.get(thread_id)
        if held is not None and not held.holder.fenced.is_set():
            if graph_run:
                self._writing_under(thread_id, held)
            return held
        taking = self._taking.setdefault(thread_id, _Taking())
        taking.users += 1
        try:
            async with taking.lock:
                held = self._held.get(thread_id)
                if held is not None:
                    if not held.holder.fenced.is_set():
                        return held
                    await self._drop(thread_id, held, lost=True)
                if graph_run and thread_id in self._stopped:
                    raise self._stopped[thread_id]()
                if graph_run and thread_id in self._lost:
                    raise self._lost_error(thread_id)
                held = await self._claim(thread_id)
                self._held[thread_id] = held
                if graph_run:
                    self._writing_under(thread_id, held)
                return held
        finally:
            taking.users -= 1
            if taking.users == 0:
                del self._taking[thread_id]

    def _ended_by_ask_kept(self, thread_id: str) -> bool:
        """Whether a cancel ask kept in `_asked` (heard as the saver let the thread go) ends
        the graph invocation writing (this context's): a closed saver claims the thread for
        that write only to record the end, and lets it go at once."""
        kept = self._asked.get(thread_id)
        if kept is None:
            return False
        read = (self._read_at.get() or {}).get(thread_id)
        return read is None or read <= kept[0]

    def _read_before_loss(self, thread_id: str) -> bool:
        """Whether the graph invocation writing (this context's) read the thread before this
        saver lost it, and nothing released it since: whoever read it since (another
        invocation, a reader) does not make that invocation's writes count."""
        read = (self._read_at.get() or {}).get(thread_id)
        if read is None:
            return False  # not read in this context: `_lost` decides
        lost_at = self._losses.get(thread_id)
        return lost_at is not None and read <= lost_at

    def _lost_by_context(self, thread_id: str) -> bool:
        """Whether the holding the graph invocation writing (this context's) wrote the thread
        under was lost to another writer: bounded by the context, not by what this saver
        remembers of its losses, so a loss it forgot (many threads lost since) still stops
        the invocation rather than letting it claim the thread again from a stale state."""
        fenced = (self._read_under.get() or {}).get(thread_id)
        return fenced is not None and fenced.is_set()

    def _writing_under(self, thread_id: str, held: _Held) -> None:
        """Note in the invocation's context (its tasks share the map its read set) which
        holding its writes of the thread go under, for `_lost_by_context`."""
        under = self._read_under.get()
        if under is not None and thread_id in under:
            under[thread_id] = held.holder.fenced

    def _stopped_since_read(self, thread_id: str) -> Callable[[], OnwardError] | None:
        """What the graph invocation writing (this context's) must raise if this saver ended
        a run of the thread after the invocation read it, and nothing released it since: a
        read by anyone else does not let the ended run write on. ``None`` for a context that
        never read the thread (`_stopped` decides)."""
        read = (self._read_at.get() or {}).get(thread_id)
        stop = self._stops.get(thread_id)
        if read is None or stop is None:
            return None
        stopped_at, error = stop
        return error if read <= stopped_at else None

    def _stop(self, thread_id: str, error: Callable[[], OnwardError]) -> None:
        """Remember this saver ended the thread's graph run: what its later writes raise."""
        _kept(self._stopped, thread_id, error)
        _kept(self._stops, thread_id, (self._started, error))

    def _lost_error(self, thread_id: str) -> FencedError:
        return FencedError(
            f"run {thread_id!r}: this saver lost the thread's lease to another writer while "
            "a graph run was writing it; that run must stop. A new invocation, which reads "
            "the thread first, may write again",
            run_id=thread_id,
            holder=self.holder,
        )

    async def _claim(self, thread_id: str) -> _Held:
        """Take the lease, read the thread, lift the fence above the log's, append the claim.

        A thread this saver has read goes on from that fold (reading only the log's new tail),
        which becomes the holder's: a graph invocation reads the thread, then claims it.
        """
        followed = self._followed.pop(thread_id, None)  # held from here on: its own fold
        if followed is None:
            # Read (and its tenant checked) before the lease: another tenant's thread is refused
            # without being held, even briefly, and without spending a fence of it.
            followed = await self._load(thread_id)
        if followed.last_seq == 0:
            self._check_new(thread_id)
        holder = Leaseholder(
            self.leases, thread_id, tenant=self.tenant, holder=self.holder, policy=self.policy
        )
        await holder.__aenter__()
        holder.when_asked(functools.partial(self._ask_heard, thread_id, holder))
        try:
            state = await self._caught_up(thread_id, followed)
            await holder.raise_fence(state.fence)
            claim = stamped(
                RunClaimed,
                run_id=thread_id,
                tenant=self.tenant,
                seq=state.last_seq + 1,
                fence=holder.lease.fence,
                worker=self.holder,
            )
            (position,) = await self.log.append([claim])
            # Whatever a superseded writer slipped in before the claim landed is part of the
            # thread; whatever it writes after is refused by every reader.
            between = await self.log.read_run(
                thread_id, start=state.next_offset, end=position.offset + 1
            )
            for stored in between:
                state.apply(stored)
            checked = await self._record_calls_left(thread_id, state)
        except BaseException as exc:
            await holder.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        # The thread's row exists from its first claim (a new thread is listed at once).
        await self._fold_row(thread_id, position.partition)
        return _Held(holder, state, calls_unchecked=not checked)

    def _check_still_held(self, thread_id: str, held: _Held) -> None:
        """Raise if the holding was let go while the caller waited for its lock.

        Raises:
            RunCancelledError: The graph run was cancelled meanwhile.
            FencedError: The thread was released or lost meanwhile.
        """
        if self._held.get(thread_id) is held:
            return
        stopped = self._stopped.get(thread_id)
        if stopped is not None:
            raise stopped()
        raise FencedError(
            f"run {thread_id!r}: this saver let the thread go while a write of it waited; "
            "that graph run must stop. A new invocation, which reads the thread first, may "
            "write again",
            run_id=thread_id,
            holder=self.holder,
        )

    async def _may_go_on(
        self,
        thread_id: str,
        held: _Held,
        made: _Batch,
        first_seq: int,
        spent: Sequence[tuple[str, Usage]],
        *,
        step: bool,
        graph_run: bool = True,
    ) -> None:
        """Record the model calls ``spent`` (the batch ``made`` is to be appended from
        ``first_seq``), then end the graph run if it is over a budget (``step``: a graph's
        checkpoint or task writes) or was asked to cancel (``graph_run``: a write of the graph
        run; copying, pruning or deleting the thread is not, and leaves the ask to that run).

        Raises:
            BudgetExceededError: What the thread (or tenant) spent before this write's calls
                reached a budget: the write carrying the answer that passed it was appended
                (it was paid for), and this one ends the run ``failed``.
            RunCancelledError: A cancel was asked; the run ended ``cancelled``.
        """
        # A tool call's outcome is recorded first: the call ran, and left undecided it would
        # be put to a person. The graph run's next write once no call runs ends it.
        outcomes_only = all(kind in _OUTCOMES for kind, _ in made)
        # A graph step's own write while a tool call runs (LangGraph saves a checkpoint beside
        # the step's tasks) does not end the run: the call's outcome could not be recorded.
        calls_running = step and bool(self._calling.get(thread_id))
        if self._records_left and (spent or step):
            await self._record_left()  # counted before any budget is weighed
        try:
            weigh = step and made and not calls_running
            if weigh and held.calls_unchecked and self._budgeted:
                # The claim could not count the thread's calls: without them the ledger may
                # count less than the thread spent, and a budget pass.
                held.calls_unchecked = not await self._record_calls_left(thread_id, held.state)
                if held.calls_unchecked:
                    raise BackendUnavailableError(
                        f"thread {thread_id!r}: the spend ledger (or the log) did not answer "
                        "when the thread was claimed, nor now: what its model calls cost cannot "
                        "be checked, and a budget is not weighed without it",
                        run_id=thread_id,
                    )
            over = await self._over_budget(thread_id) if weigh else None
        finally:
            if spent:
                # Whatever this write comes to (a ledger that cannot weigh the budget fails
                # it): the calls were made, and are kept to record if the ledger is down.
                seq = await self._record_spend(thread_id, made, first_seq, spent)
                if seq is not None:
                    held.spent_at = max(held.spent_at, seq)
        if over is not None:
            await self._end(thread_id, held, "failed", f"{type(over).__name__}: {over}")
            self._stop(thread_id, functools.partial(_copied, over))
            raise over
        if calls_running or not graph_run:
            return
        asked = self._ask_for_this_invocation(thread_id, held)
        if asked is not None and not outcomes_only:
            await self._end(thread_id, held, "cancelled", asked.error)
            self._asked.pop(thread_id, None)
            self._stop(thread_id, functools.partial(_cancelled_error, thread_id, asked))
            raise _cancelled_error(thread_id, asked)

    def _ask_heard(self, thread_id: str, holder: Leaseholder) -> None:
        """A renewal of the thread's holding heard a cancel ask: answer it now if the thread
        is stopped at an interrupt (`_answer_at_interrupt`), rather than at the next
        invocation, which may never come while the asker waits."""
        held = self._held.get(thread_id)
        if held is None or held.holder is not holder or held.lock.locked():
            return  # let go, or a write under way: that write hears the ask itself
        task = asyncio.get_running_loop().create_task(self._answer_at_interrupt(thread_id, held))
        self._answering.add(task)
        task.add_done_callback(functools.partial(self._answered, thread_id))

    def _answered(self, thread_id: str, task: asyncio.Task[None]) -> None:
        """An `_answer_at_interrupt` task is done: nobody awaits it, so what it raised is said
        here (else asyncio reports it, if ever, as a task exception never retrieved)."""
        self._answering.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        logger.error(
            "thread %r: answering a cancel its renewal heard failed",
            thread_id,
            exc_info=task.exception(),
        )

    async def _answer_at_interrupt(self, thread_id: str, held: _Held) -> None:
        """End ``cancelled`` the invocation of a held thread stopped at an interrupt, whose
        holding heard a cancel ask, and let the thread go, as `arelease` and the next
        invocation's start do: it waits on a person, no write of it would hear the ask. A
        thread not stopped at one (its invocation done, or in a slow node) is left: which of
        the two it is, the next invocation's start or write tells."""
        if self._calling.get(thread_id):
            return  # a tool call's outcome is recorded first; that write hears the ask
        async with held.lock:
            if self._held.get(thread_id) is not held or held.holder.fenced.is_set():
                return
            try:
                state = await self._fresh(thread_id, held)
            except OnwardError as exc:
                # The next renewal hears the ask again, and tries again.
                logger.warning("thread %r: not read to answer a cancel: %s", thread_id, exc)
                return
            if state.waiting_on is None:
                return
            asked = self._heard(thread_id, held)
            if asked is None:
                return
            try:
                await self._record_end(thread_id, held, "cancelled", asked.error)
            except OnwardError as exc:
                logger.warning(
                    "thread %r: the cancel asked is not answered yet: %s", thread_id, exc
                )
                held.holder.keep_ask()  # not ended: the thread's next holder hears it
            else:
                # Ended: a node of the invocation still running beside the interrupt (a
                # parallel branch) must not claim the thread again and end it a second time.
                self._asked.pop(thread_id, None)
                self._stop(thread_id, functools.partial(_cancelled_error, thread_id, asked))
            try:
                await self._drop(thread_id, held, lost=False)
            except OnwardError as exc:
                # A store error is retried in the background (`Leaseholder.releasing`).
                logger.warning("thread %r: lease not handed back yet: %s", thread_id, exc)

    def _ask_for_this_invocation(self, thread_id: str, held: _Held) -> CancelAsked | None:
        """The cancel ask that ends the graph invocation writing (this context's), if any: one
        heard after it read the thread (the holding's, kept in `_asked` with how many
        invocations had started by then), not one heard before it started. A write of no
        invocation (the context never read the thread) answers to the holding's ask."""
        asked = self._heard(thread_id, held)
        read = (self._read_at.get() or {}).get(thread_id)
        if read is None:
            return asked
        kept = self._asked.get(thread_id)
        return kept[1] if kept is not None and read <= kept[0] else None

    def _heard(self, thread_id: str, held: _Held) -> CancelAsked | None:
        """The holding's cancel ask, kept in `_asked` for the invocations started by now when
        this holding is the first to hear it (an earlier holding's ask was answered as it was
        let go, and a later ask covers every invocation that one did)."""
        asked = held.holder.cancel_asked
        kept = self._asked.get(thread_id)
        if asked is not None and (kept is None or kept[2] is not held.holder):
            _kept(self._asked, thread_id, (self._started, asked, held.holder))
        return asked

    async def _end(
        self, thread_id: str, held: _Held, status: Literal["failed", "cancelled"], error: str
    ) -> None:
        """Record the thread's run ended (``cancelled``: someone asked its holding; ``failed``:
        over a budget) under the lease and let the thread go; the caller then stops the graph
        run writing.

        The thread itself lives on: its frontier row goes back to ``new`` at its next
        invocation's first write, and nothing of it is collected or cut as an ended run's is.

        Raises:
            FencedError: The lease was lost before the end was recorded.
        """
        await self._record_end(thread_id, held, status, error)
        await self._drop(thread_id, held, lost=False)

    async def _record_end(
        self, thread_id: str, held: _Held, status: Literal["failed", "cancelled"], error: str
    ) -> None:
        """Append the thread's `RunFinished` under the lease, once (see `_end`).

        Raises:
            FencedError: The lease was lost before the end was recorded.
        """
        state = await self._fresh(thread_id, held)
        # Recorded already when an earlier append of it could not say whether it landed.
        if not state.ended:
            ended = stamped(
                RunFinished,
                run_id=thread_id,
                tenant=self.tenant,
                seq=state.last_seq + 1,
                fence=held.holder.lease.fence,
                status=status,
                error=error,
            )
            (position,) = await self._append_held(thread_id, held, state, [ended])
            await self._fold_row(thread_id, position.partition)

    async def _fold_row(self, thread_id: str, partition: int) -> None:
        """With ``checkpoint_inline``, fold the thread's partition into its frontier row.

        Embedded, no projector runs: a row is there (and listed by ``onward runs``, as the
        projector's is on Kafka) only once the saver folds it. A fold that fails leaves the row
        lagging; the log has the events, and the next fold catches up.
        """
        if self._checkpointer is None:
            return
        try:
            await self._checkpointer.catch_up([partition])
        except OnwardError as exc:
            logger.warning("thread %r: frontier row not updated: %s", thread_id, exc)

    @property
    def _budgeted(self) -> bool:
        """Whether the saver keeps spend and was given a budget to weigh it against."""
        return self.spend is not None and (
            self.budgets["run"] is not None or self.budgets["tenant"] is not None
        )

    async def _over_budget(self, thread_id: str) -> BudgetExceededError | None:
        """Why the thread may not go on, if what it (or the tenant) spent has reached a
        budget the saver was given."""
        run_budget, tenant_budget = self.budgets["run"], self.budgets["tenant"]
        if self.spend is None or (run_budget is None and tenant_budget is None):
            return None
        checks = []
        if run_budget is not None:
            checks.append(("run", run_budget, (await self.spend.run_total(thread_id)).micros))
        if tenant_budget is not None:
            spent = (await self.spend.tenant_total(self.tenant)).micros
            checks.append(("tenant", tenant_budget, spent))
        for scope, budget, spent in checks:
            if spent >= budget:
                whose = f"thread {thread_id!r}" if scope == "run" else f"tenant {self.tenant!r}"
                return BudgetExceededError(
                    f"{whose} has spent {spent} micros on model calls, its budget is {budget}; "
                    "the graph run stops here (a saver given a higher budget carries the "
                    "thread on)",
                    run_id=thread_id,
                    scope=scope,
                    budget_micros=budget,
                    spent_micros=spent,
                    estimate_micros=0,
                )
        return None

    async def _drop(self, thread_id: str, held: _Held, *, lost: bool) -> None:
        """Stop holding a thread; ``lost``: another writer took it while this one wrote."""
        if self._held.get(thread_id) is held:
            del self._held[thread_id]
        if lost:
            _kept(self._lost, thread_id, None)
            _kept(self._losses, thread_id, self._started)
        await self._settle(held)
        await held.holder.__aexit__(None, None, None)
        # The row shows what the thread's holder wrote up to its release.
        await self._fold_row(thread_id, partition_for(thread_id, self.log.partitions))

    # -- the read path ---------------------------------------------------------------------

    async def _state(self, thread_id: str, *, whole: bool = False) -> ThreadState:
        """What this saver wrote (read-your-writes) if it holds the thread, else the log's.
        ``whole``: with every checkpoint, not a fold from a summary (`ThreadState.partial`).
        """
        self._remember_loop()
        held = self._held.get(thread_id)
        if held is not None and not held.holder.fenced.is_set():
            async with held.lock:
                return await self._fresh(thread_id, held, whole=whole)
        state = await self._follow(thread_id, whole=whole)
        if state.last_seq == 0:
            # A graph invocation of a thread nobody wrote starts here: refused before its
            # first step runs (its first checkpoint may be put while that step runs).
            self._check_new(thread_id)
        return state

    async def _follow(self, thread_id: str, *, whole: bool = False) -> ThreadState:
        """A thread this saver does not hold, folded to the log's end: only the new tail is
        read when the thread was read before (the fold is incremental, refusals included).
        """
        _checked(thread_id)
        followed = self._followed.pop(thread_id, None)
        if whole and followed is not None and followed.partial:
            followed = None
        state = await self._caught_up(thread_id, followed, whole=whole)
        self._followed[thread_id] = state
        while len(self._followed) > FOLLOWED_THREADS:
            self._followed.popitem(last=False)
        return state

    async def _caught_up(
        self, thread_id: str, state: ThreadState | None, *, whole: bool = False
    ) -> ThreadState:
        """``state`` folded on to the log's end (the new tail only), or the thread read afresh
        (from its summary unless ``whole``) when there is none or its tail is gone."""
        start = state.next_offset if state is not None else None
        if state is None or start is None:
            return await self._read(thread_id) if whole else await self._load(thread_id)
        partition = partition_for(thread_id, self.log.partitions)
        end = (await self.log.bounds(partition)).end
        try:
            tail = await read_whole_run(self.log, self.compaction, thread_id, start=start, end=end)
        except LogTruncatedError:
            return await self._read(thread_id)
        for stored in tail:
            state.apply(stored)
        state.next_offset = max(start, end)
        if state.whole_needed:
            return await self._read(thread_id)
        self._check_tenant(state)
        return state

    async def _fresh(self, thread_id: str, held: _Held, *, whole: bool = False) -> ThreadState:
        """The held thread's fold, read again from the log if an append left it in doubt, or
        whole if it was folded from a summary and ``whole`` (every checkpoint) is needed."""
        state = held.state
        if held.stale or state.whole_needed or (whole and state.partial):
            held.state = await self._read(thread_id)
            held.stale = False
        return held.state

    async def _load(self, thread_id: str) -> ThreadState:
        """The thread folded on from its summary through the log's tail, or from its first
        event when there is no summary it can use."""
        return await self._from_summary(thread_id) or await self._read(thread_id)

    async def _stored_summary(self, thread_id: str) -> ThreadSummary | None:
        """The thread's stored summary, if there is one this code reads, of this tenant."""
        if self.summaries is None:
            return None
        try:
            body = await self.summaries.get(thread_id)
        except OnwardError as exc:
            logger.warning("thread %r: summary not read, folding it whole: %s", thread_id, exc)
            return None
        summary = decode(body) if body is not None else None
        if summary is None or summary.run_id != thread_id or summary.tenant != self.tenant:
            return None
        return summary

    async def _from_summary(self, thread_id: str) -> ThreadState | None:
        """The thread folded on from its stored summary; ``None`` where there is none, or it
        cannot be trusted (see `.summary`): then the thread is folded from its first event."""
        summary = await self._stored_summary(thread_id)
        if summary is None:
            return None
        partition = partition_for(thread_id, self.log.partitions)
        end = (await self.log.bounds(partition)).end
        if summary.last_offset >= end:
            return None
        try:
            tail = await read_whole_run(
                self.log, self.compaction, thread_id, start=summary.last_offset, end=end
            )
        except LogTruncatedError:
            return None
        if not tail or not _names(summary, tail[0]):
            return None
        state = restored(summary, snapshot_every=self.snapshot_every)
        for stored in tail[1:]:
            state.apply(stored)
        state.next_offset = max(state.next_offset or 0, end)
        return None if state.whole_needed else state

    async def _summarize(
        self, thread_id: str, held: _Held, batch: Sequence[Event], last_offset: int
    ) -> None:
        """Store the held thread's summary at the batch's last event, once the bytes appended
        since the last summary exceed that summary's size (so summaries at most double what a
        thread stores). It is taken now and stored in the background (`_settle` waits for
        it); a summary is a cache: a store that fails is logged, not raised."""
        held.appended += sum(len(_msgpack.encode(event)) for event in batch)
        if self.summaries is None or held.appended < held.summary_size:
            return
        state = held.state
        if state.whole_needed or (held.summarizing is not None and not held.summarizing.done()):
            return  # one summary in flight at a time: a later write stores the next
        last = batch[-1]
        summary = summarize(
            state,
            last_offset=last_offset,
            last_fence=last.fence,
            last_at=last.at,
            refers=self._refers,
        )
        held.appended = 0
        held.summarizing = asyncio.create_task(self._store_summary(thread_id, held, summary))

    async def _store_summary(self, thread_id: str, held: _Held, summary: ThreadSummary) -> None:
        """Encode and store a summary, off the write path (the graph's next step runs on)."""
        body = await asyncio.to_thread(encode, summary)
        held.summary_size = len(body)
        if self.summaries is None:
            return
        try:
            await self.summaries.put(thread_id, self.tenant, summary.last_seq, body)
        except OnwardError as exc:
            logger.warning("thread %r: summary not stored: %s", thread_id, exc)

    @staticmethod
    async def _settle(held: _Held) -> None:
        """Wait for the held thread's summary being stored, if one is."""
        if held.summarizing is not None:
            await held.summarizing
            held.summarizing = None

    def _refers(self, event: GraphCheckpointed) -> Iterator[tuple[str, str]]:
        """The (channel, version) pairs a checkpoint's values are at."""
        versions: dict[str, Any] = self._loads(event.checkpoint).get("channel_versions", {})
        for channel, version in versions.items():
            yield channel, _version_key(version)

    async def _forget_summary(self, thread_id: str) -> None:
        """Drop a thread's summary (a deleted thread's values go with it)."""
        if self.summaries is None:
            return
        try:
            await self.summaries.delete(thread_id)
        except OnwardError as exc:
            logger.warning("thread %r: summary not deleted: %s", thread_id, exc)

    async def _read(self, thread_id: str) -> ThreadState:
        """Fold the thread from the log, from its first event where a frontier row says so.

        Raises:
            InvalidInputError: The run under this thread id belongs to another tenant, or the
                thread id is no name a store can keep.
        """
        _checked(thread_id)
        start = await self._first_offset(thread_id)
        partition = partition_for(thread_id, self.log.partitions)
        end = (await self.log.bounds(partition)).end
        state = ThreadState(run_id=thread_id, next_offset=start, snapshot_every=self.snapshot_every)
        try:
            stored_events = await read_whole_run(
                self.log, self.compaction, thread_id, start=start, end=end
            )
        except LogTruncatedError as exc:
            raise HistoryUnavailableError(
                f"thread {thread_id!r} cannot be loaded: {exc}", run_id=thread_id
            ) from exc
        for stored in stored_events:
            state.apply(stored)
        state.next_offset = max(state.next_offset or 0, end)
        self._check_tenant(state)
        return state

    async def _first_offset(self, thread_id: str) -> int | None:
        """Where the thread's first event is, if a frontier row says (else read from the
        start of its partition)."""
        if self.frontiers is not None:
            row = await self.frontiers.get(thread_id)
            if row is not None and row.frontier is not None and row.frontier.first_offset >= 0:
                return row.frontier.first_offset
        return None

    def _check_new(self, thread_id: str) -> None:
        """Refuse to create a thread whose id or tenant is out of a new name's bounds
        (`check_name`): a thread is created by its first write, and what it is named is printed
        and stored by every reader from then on. A stored one is taken as it is (`_checked`).
        """
        try:
            check_name("thread_id", thread_id)
            check_name("tenant", self.tenant, run_id=thread_id)
        except InvalidInputError as exc:
            raise InvalidInputError(
                f"thread {thread_id!r} cannot be created: {exc}", run_id=thread_id
            ) from None

    def _check_tenant(self, state: ThreadState) -> None:
        if state.tenant and state.tenant != self.tenant:
            raise InvalidInputError(
                f"thread {state.run_id!r} cannot be used by tenant {self.tenant!r}: it is "
                "not permitted; use another thread id or a saver of the thread's tenant",
                run_id=state.run_id,
            )

    def _tuple(
        self,
        state: ThreadState,
        thread_id: str,
        event: GraphCheckpointed,
        listing: dict[tuple[str, str], DecodedList] | None = None,
        *,
        cancelled: bool = False,
    ) -> CheckpointTuple:
        """The checkpoint as LangGraph reads it. ``cancelled``: the invocation stopped at its
        interrupts was ended by a cancel, so the tasks that asked are over, not pending: their
        nodes have seen the checkpoint's channels (they run again when one is written, as on
        a new input) and their writes are left out, so an answer resumes none of them."""
        ns = event.checkpoint_ns
        checkpoint = self.serde.loads_typed(_typed(event.checkpoint))
        values: dict[str, Any] = {}
        for channel, version in checkpoint["channel_versions"].items():
            stored = state.values.get((ns, channel, _version_key(version)))
            if stored is not None and (stored.listed or stored.value is not None):
                values[channel] = self._rebuilt(state, ns, channel, stored, listing)
        checkpoint["channel_values"] = values
        writes = state.writes.get((ns, event.checkpoint_id), {})
        ordered = sorted(writes.items(), key=lambda kv: writes_sort_key(kv[1].task_path, *kv[0]))
        if cancelled:
            asked = {w.task_id for _, w in ordered if w.channel == INTERRUPT}
            for _, w in ordered:
                node = _pulled_node(w.task_path) if w.task_id in asked else None
                if node is not None:
                    seen = checkpoint["versions_seen"].setdefault(node, {})
                    seen.update(checkpoint["channel_versions"])
            ordered = [(key, w) for key, w in ordered if w.task_id not in asked]
        return CheckpointTuple(
            config={
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": event.checkpoint_id,
                }
            },
            checkpoint=checkpoint,
            metadata=self.serde.loads_typed(_typed(event.metadata)),
            parent_config=(
                {
                    "configurable": {
                        "thread_id": thread_id,
                        "checkpoint_ns": ns,
                        "checkpoint_id": event.parent_checkpoint_id,
                    }
                }
                if event.parent_checkpoint_id
                else None
            ),
            pending_writes=[
                (w.task_id, w.channel, self.serde.loads_typed(_typed(w.value))) for _, w in ordered
            ],
        )

    def _remember_loop(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()


async def _in_context(coro: Coroutine[Any, Any, _T], context: contextvars.Context) -> _T:
    return await asyncio.get_running_loop().create_task(coro, context=context)


def _names(summary: ThreadSummary, stored: StoredEvent) -> bool:
    """Whether ``stored`` is the event a summary was taken at: the log holds it at the offset
    the summary names, with its run, seq, fence and time (else the summary is another log's,
    or the log was rewritten, and is not used)."""
    event = stored.event
    return (
        stored.position.offset == summary.last_offset
        and event.run_id == summary.run_id
        and event.seq == summary.last_seq
        and event.fence == summary.last_fence
        and event.at == summary.last_at
    )


def _cancelled_error(thread_id: str, asked: CancelAsked) -> RunCancelledError:
    """What every write of a graph run whose thread was cancelled under it raises."""
    return RunCancelledError(
        f"run {thread_id!r}: {asked.error} while this graph run wrote it; the run's end is "
        "recorded and the graph run stops here. A new invocation, which reads the thread "
        "first, may write it again",
        run_id=thread_id,
        by=asked.by,
        why=asked.why,
    )


_CANCELLED_READ: contextvars.ContextVar[dict[tuple[int, str], tuple[str, str, str]] | None] = (
    contextvars.ContextVar("onward_saver_cancelled_read", default=None)
)
"""In a graph invocation's context (its tasks copy it): by saver (its id) and thread, the
namespace and checkpoint id of an interrupt it read ended by a cancel, and the end's error:
an answer to it is refused."""


_K = TypeVar("_K")
_V = TypeVar("_V")


def _remembered(kept: dict[_K, _V] | None, key: _K, value: _V) -> dict[_K, _V]:
    """A copy of a context's ``kept`` with ``key`` (newest) set to ``value``, holding the
    latest `FOLLOWED_THREADS` keys: a context reading one thread after another (a worker's
    loop of invocations) would otherwise keep, and copy at each read, one per thread."""
    out = {k: v for k, v in (kept or {}).items() if k != key}
    out[key] = value
    for old in list(out)[: max(0, len(out) - FOLLOWED_THREADS)]:
        del out[old]
    return out


def _kept(kept: dict[_K, _V], key: _K, value: _V) -> None:
    """Set ``key`` (newest) to ``value`` in ``kept``, which holds the latest `FOLLOWED_THREADS`
    keys: what a saver keeps of each thread it lost, ended or heard a cancel of would grow
    with every thread a long-lived saver served (a graph run of one of the oldest, still
    going, is then told no more than one whose context forgot its read, `_remembered`)."""
    kept.pop(key, None)
    kept[key] = value
    while len(kept) > FOLLOWED_THREADS:
        del kept[next(iter(kept))]


def _answer_refused(thread_id: str, error: str) -> RunCancelledError:
    """What the answer to an interrupt whose invocation a cancel ended raises."""
    by, _, why = error.removeprefix("cancelled by ").partition(": ")
    return RunCancelledError(
        f"run {thread_id!r}: the graph run stopped at this interrupt was {error}; its answer "
        "is not taken and the interrupted node does not run. A new input starts a new "
        "invocation of the thread",
        run_id=thread_id,
        by=by,
        why=why,
    )


def _pulled_node(task_path: str) -> str | None:
    """The node of a task LangGraph scheduled from its channels (``~__pregel_pull, node``);
    ``None`` for any other task (a ``Send``'s)."""
    parts = task_path.removeprefix("~").split(", ")
    return parts[1] if len(parts) == 2 and parts[0] == "__pregel_pull" else None


async def _each(
    thread_ids: Sequence[str], done: str, act: Callable[[str], Awaitable[None]]
) -> None:
    """``act`` on each thread in turn; a thread held elsewhere stops the rest, and its error
    says which threads were ``done`` and which not, so the caller knows what to call again.
    Any other Onward error stops the rest too, and says the same in a note (its kind kept).

    Raises:
        ResumeConflictError: Another process holds one of the threads.
    """
    for i, thread_id in enumerate(thread_ids):
        try:
            await act(thread_id)
        except OnwardError as exc:
            did = ", ".join(map(repr, thread_ids[:i])) or "none"
            left = ", ".join(map(repr, thread_ids[i:]))
            progress = f"threads {done}: {did}; not {done}: {left}"
            if not isinstance(exc, ResumeConflictError):
                exc.add_note(progress)
                raise
            raise ResumeConflictError(
                f"{exc} ({progress})",
                run_id=exc.run_id,
                holder=exc.holder,
                expires_at=exc.expires_at,
            ) from exc


def _copied(error: BudgetExceededError) -> BudgetExceededError:
    """A new exception saying what ``error`` says, to raise again from another write."""
    return BudgetExceededError(
        str(error),
        run_id=error.run_id,
        scope=error.scope,
        budget_micros=error.budget_micros,
        spent_micros=error.spent_micros,
        estimate_micros=error.estimate_micros,
    )


def _budget(value: object, name: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise InvalidInputError(
            f"{name} must be a whole number of micros of at least 0, got {value!r:.40}"
        )
    return value


def _model_usages(values: Iterable[Any]) -> list[tuple[str, Usage]]:
    """The model and usage of each AI message among a task's written values (a message, or
    a list of them, as a node returns to a messages channel) that reports its usage."""
    found: list[tuple[str, Usage]] = []
    for value in values:
        for item in value if isinstance(value, list | tuple) else (value,):
            if not isinstance(item, AIMessage) or not item.usage_metadata:
                continue
            metadata = item.response_metadata or {}
            model = metadata.get("model_name") or metadata.get("model") or "unknown"
            usage = item.usage_metadata
            found.append(
                (
                    str(model),
                    Usage(
                        input_tokens=_tokens(usage.get("input_tokens")),
                        output_tokens=_tokens(usage.get("output_tokens")),
                    ),
                )
            )
    return found


def _tokens(value: Any) -> int:
    """A token count as reported, or 0 for anything that is not a whole number of at least 0."""
    return value if type(value) is int and value >= 0 else 0


def _constant(batch: _Batch) -> Callable[[ThreadState], _Batch]:
    """A batch that does not depend on the thread's state."""
    return lambda _state: batch


def _thread_id(config: RunnableConfig) -> str:
    """The config's thread id as a string; ``None`` or ``""`` is no thread id (else every
    caller that lost its id would share the thread ``"None"``)."""
    try:
        thread_id = config["configurable"]["thread_id"]
    except KeyError:
        thread_id = None
    if thread_id is None or thread_id == "":
        raise InvalidInputError("a LangGraph config for OnwardSaver needs configurable.thread_id")
    return _checked(str(thread_id))


def _checked(thread_id: str) -> str:
    """``thread_id`` if it can name a stored thread (`check_stored_name`: no NUL, which
    PostgreSQL refuses in text, nor lone surrogate), else an error naming it, before any store
    is asked (which would report a NUL as its own fault). A thread stored under a control
    character or a long id (a producer writing to the log directly) is read and carried on by
    its exact id; a new one is held to `check_name` at its first write (`_check_new`)."""
    try:
        return check_stored_name("thread_id", thread_id)
    except InvalidInputError as exc:
        raise InvalidInputError(f"thread id {thread_id!r} cannot be used: {exc}") from None


def _checkpoint_id(config: RunnableConfig) -> str:
    """The checkpoint a config names, which pending writes belong to."""
    checkpoint_id = config["configurable"].get("checkpoint_id")
    if not checkpoint_id:
        raise InvalidInputError(
            "pending writes need the checkpoint they belong to: configurable.checkpoint_id "
            "(the config aput returned)"
        )
    return str(checkpoint_id)


def _version_key(version: Any) -> str:
    """A channel version as its JSON text, so versions 1 and "1" stay distinct."""
    return msgspec.json.encode(version).decode()


def _saved_value(
    state: ThreadState,
    ns: str,
    channel: str,
    version: str,
    serialized: Serialized | list[Serialized] | None,
) -> ChannelValue:
    """How a changed channel is saved: a list that extends the channel's last saved version
    (the same serialized items first) as the items it appends, with that version as its base;
    any other value whole. Items are compared by their serialized bytes, so an item changed
    in place is seen as a change and the list is saved whole."""
    if serialized is None or isinstance(serialized, Serialized):
        return ChannelValue(channel=channel, version=version, value=serialized)
    base = state.latest.get((ns, channel))
    if base is not None and base != version:
        before = state.list_items(ns, channel, base)
        if (
            before is not None
            and len(before) <= len(serialized)
            and serialized[: len(before)] == before
        ):
            return ChannelValue(
                channel=channel, version=version, items=serialized[len(before) :], base=base
            )
    return ChannelValue(channel=channel, version=version, items=serialized)


_IMMUTABLE = (str, bytes, int, float, bool, type(None))


def _shareable(item: Any) -> bool:
    """Whether the saver may hand out (and keep) the same object at every read of a list: an
    immutable value, or a LangChain message (treated as a value, see `OnwardSaver._rebuilt`)."""
    return type(item) in _IMMUTABLE or isinstance(item, BaseMessage)


def _starts_with(value: list[Any], prefix: list[Any]) -> bool:
    """Whether ``value`` begins with the very objects of ``prefix``, in order."""
    return len(value) >= len(prefix) and all(map(operator.is_, value, prefix))


def _whole(channel: str, version: str, node: ChannelNode) -> ChannelValue:
    """A stored channel version saved again whole (a list as all its items)."""
    if node.listed:
        return ChannelValue(channel=channel, version=version, items=node.all_items())
    return ChannelValue(channel=channel, version=version, value=node.value)


def _serialized(typed: tuple[str, bytes]) -> Serialized:
    return Serialized(type=typed[0], data=typed[1])


def _typed(value: Serialized) -> tuple[str, bytes]:
    return (value.type, value.data)


def _interrupt_id(
    ns: str, checkpoint_id: str, task_id: str, writes: Sequence[tuple[int, str, Any]]
) -> str:
    """The approval request id of an interrupt: LangGraph's interrupt id where it has one."""
    for _, channel, value in writes:
        if channel != INTERRUPT:
            continue
        items = value if isinstance(value, list | tuple) else [value]
        for item in items:
            if isinstance(item, Interrupt) and item.id:
                return f"langgraph:{item.id}"
    return f"langgraph:{ns}:{checkpoint_id}:{task_id}"


__all__ = ["OnwardSaver"]
