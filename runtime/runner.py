"""`AgentRunner`: drives agent runs, every one of them under its lease, written ahead to the log.

One iteration: call the model and append `ModelAnswered` with a `ToolDispatched` for every
call of the answer, as one batch acknowledged by the log before any tool runs (the answer goes
alone when a call waits on a person's approval or the run pauses after a model call; the
dispatches follow once the run goes on); run the tools
(concurrently), appending each `ToolCompleted` as it returns; append `TurnSettled`, in the same
batch as the turn's last `ToolCompleted` when that one finds every other call of the turn
recorded (one record batch fewer a step; a batch is durable whole or not at all). A call whose
tool needs a person appends `ApprovalRequested` first and the run stops, waiting; so does a call
whose code asks a person a question (`onward.runtime.ask`), with the question, once it stopped
there.

If `ToolDispatched` cannot be written the tool is not called; if it was written and the lease
cannot be confirmed after it, the tool is not called either, and the call is recorded as never
ran while the lease still lets the run be written. If the process dies anywhere,
`resume` takes the run's lease, reads the run once and claims it under the lease's fence
(`Resumer`), plans every outstanding call (`plan_resume`), records the plan as
`ResumePlanned`, and carries on; a call that may or may not have run is never dispatched again
unless its tool says that is harmless.

The runner only drives: appends go through `RunWriter`, the conversation is a `Conversation`,
reading and claiming a run is the `Resumer`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import (
    AsyncIterator,
    Callable,
    Collection,
    Coroutine,
    Iterable,
    Mapping,
    Sequence,
)
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

import msgspec

from onward._storage import Resource
from onward.errors import (
    BackendError,
    BackendUnavailableError,
    CheckpointFormatError,
    ConfigurationError,
    EventDecodeError,
    FencedError,
    HistoryUnavailableError,
    IndeterminateToolCallError,
    InvalidInputError,
    LogTruncatedError,
    NothingToResumeError,
    OnwardError,
    OutcomeUnknownError,
    PayloadTooLargeError,
    ResumeConflictError,
)
from onward.eventlog.base import EventLog, SequenceGuard
from onward.eventlog.codec import unencodable
from onward.eventlog.events import (
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    Asked,
    Event,
    Message,
    ModelAnswered,
    ResumePlanned,
    RunFinished,
    RunStarted,
    Tagged,
    ToolCall,
    ToolCompleted,
    ToolDispatched,
    ToolError,
    ToolResolved,
    TurnSettled,
    Usage,
)
from onward.eventlog.references import is_reference, unescaped
from onward.projections.audit import one_line, printable
from onward.projections.base import FrontierStore
from onward.projections.compaction import CompactionStore, embedded_compaction
from onward.projections.frontier import Boundary, CallState, Frontier, run_budgets

from .agent import Agent
from .ask import Asking, Question, QuestionAsked, check_answer
from .blobs import BlobStore, ClaimCheck, escape_bodies, output_of
from .checkpoint import Checkpointer, CheckpointPolicy
from .continuation import (
    ContinuationPolicy,
    awaits_hand_over,
    carriable,
    carry_if_due,
    current,
    cut_carry,
    end_overtaken,
    finish_cut_carry,
    hand_over,
    successor_ids,
)
from .conversation import Conversation, as_text, restored
from .dispatch import NOT_CALLED, write_ahead
from .leases.base import CancelAsked, LeasePolicy, LeaseStore, RunLease
from .leases.defaults import default_leases
from .leases.holder import CancelAskHeard, Leaseholder
from .leases.presence import default_holder
from .limits import (
    MAX_DEPTH,
    MAX_NAME_LENGTH,
    MAX_NOTE_LENGTH,
    MAX_TAGS_PER_RUN,
    MAX_TOOL_CALLS_PER_TURN,
    NEEDS_PERSON,
    check_depth,
    check_label,
    check_name,
    check_note,
    check_optional_name,
    check_stored_name,
    too_deep,
)
from .observability import observe
from .options import approval_value, pause_request, recorded_options
from .planning import ResumePlan, plan_resume, refuse_if_undecidable
from .providers import ModelReply, Provider
from .redaction import Redactor
from .result import RunResult
from .resumer import CarriedRun, Resumer
from .spend.base import MAX_COUNT, PriceTable, Spend, SpendEntry, SpendLedger
from .spend.budget import Budgets, estimate_usage, over_budget
from .tools import (
    Reconciled,
    Tool,
    ToolArgumentsError,
    cancelled_as_failure,
    idempotency_key,
    tool_error,
)
from .toolsets import refuse_unbound
from .writer import HeldRun, RunObserver, RunWriter

_log = logging.getLogger("onward.runner")
_T = TypeVar("_T")

_ASKS_ONWARD = 8
"""Times `AgentRunner.ask_to_cancel` asks the run a run carried on goes on as while it is taken
up between the ask finding it free and the cancel taking it (and `AgentRunner.cancel` the run a
carry cut short was started from, while it is let go between the two)."""


Binding = Callable[[str], contextlib.AbstractAsyncContextManager[Agent]]
"""The agent to drive a run of a chain with, by the run's id: the agent with its toolsets
bound to that run (`onward.runtime.toolsets.agent_for_run`)."""


def new_run_id() -> str:
    """A fresh run id, for a run started without one."""
    return f"run-{uuid.uuid4().hex}"


class AgentRunner(Resource):
    """Runs agents on any `EventLog`, each run under its lease, every fact written ahead.

    Args:
        provider: The model.
        log: Where every event goes.
        leases: Who holds which run. Every append is made under a lease and carries its fence.
            Embedded logs bring their own when none is named (`SqliteEventLog`: leases in the
            same file; `MemoryEventLog`: one store per log); any other log needs one every
            worker shares (`RedisLeaseStore`, `PostgresLeaseStore`).
        frontiers: The frontier store. Resume, approve, deny, resolve and inspect read the run's
            row, its transcript up to the row's handle, and only the log after it; with
            ``checkpoint_inline`` (embedded mode) the runner also folds into it. Required for
            any log but the embedded ones (SQLite, memory), which without one fold a run from
            its partition.
        checkpoints: Which boundaries the inline checkpointer folds at.
        checkpoint_inline: Fold into ``frontiers`` from this process (embedded mode).
        redactor: Masks secrets before anything is encoded; ``Redactor(enabled=False)`` only
            where every store is already trusted.
        blobs: Where bodies too large for one log record go (claim check).
        worker: This worker's name in `RunClaimed` and in the lease store.
        observer: Sees each append and each tool return.
        lease_policy: The lease's ttl and renewal margin.
        continuation: When to carry a long run into a new run (`ContinuationPolicy`); `run`
            and `resume` then go on with the new run and return its result.
        compaction: Where compaction keeps the runs' truncation points and retained events:
            `tag` pins its target there (so the next pass retains it, or the tag is refused
            when compaction removed it), and a run without a frontier to resume from is read
            from its retained events once its partition was cut. An embedded SQLite log
            brings its own; a Kafka deployment names its `PostgresCompactionStore` (`Backends`
            does): without one, a tag is not protected from a pass running meanwhile.
        max_tool_calls_per_turn: Most tool calls one model answer may ask for (64 by default,
            `onward.runtime.limits.MAX_TOOL_CALLS_PER_TURN`): an answer asking for more ends
            the run ``failed`` with the count in its error, and none of its calls is recorded
            or run (every call of an answer goes into one log record, which has a size cap).
        spend: Where each model call's cost is recorded (`onward.runtime.spend`), before its
            answer is written, keyed by the run and that answer's seq; budgets are decided on
            its totals. Required for a run with a budget.
        prices: Micros per token per model (`PriceTable`); a model it does not name costs 0.

    Raises:
        ConfigurationError: ``provider`` is not a `Provider`, ``max_tool_calls_per_turn`` is
            not a whole number of at least 1, no lease store for a log that has none of its
            own, no frontier store for a log that is not embedded, or ``checkpoint_inline``
            without a frontier store.
        InvalidInputError: ``worker`` is not a name Onward can store and print.
    """

    def __init__(
        self,
        *,
        provider: Provider,
        log: EventLog,
        leases: LeaseStore | None = None,
        frontiers: FrontierStore | None = None,
        checkpoints: CheckpointPolicy | None = None,
        checkpoint_inline: bool = False,
        redactor: Redactor | None = None,
        blobs: BlobStore | None = None,
        worker: str | None = None,
        observer: RunObserver | None = None,
        lease_policy: LeasePolicy | None = None,
        continuation: ContinuationPolicy | None = None,
        compaction: CompactionStore | None = None,
        max_tool_calls_per_turn: int = MAX_TOOL_CALLS_PER_TURN,
        spend: SpendLedger | None = None,
        prices: PriceTable | None = None,
    ) -> None:
        if not isinstance(provider, Provider):
            raise ConfigurationError(
                "provider must be a chat model with an async complete(agent, messages) (a "
                "Provider, such as OpenAICompatibleProvider; NoModel() for a runner that only "
                f"reads runs or records what people do), got {type(provider).__name__}"
            )
        if (
            not isinstance(max_tool_calls_per_turn, int)
            or isinstance(max_tool_calls_per_turn, bool)
            or max_tool_calls_per_turn < 1
        ):
            raise ConfigurationError(
                f"max_tool_calls_per_turn must be a whole number of at least 1, got "
                f"{max_tool_calls_per_turn!r}"
            )
        if checkpoint_inline and frontiers is None:
            raise ConfigurationError("checkpoint_inline needs a frontier store")
        if leases is None:
            leases = default_leases(log)
        if frontiers is None and not getattr(log, "embedded", False):
            raise ConfigurationError(
                f"{type(log).__name__} needs a frontier store: without one, resume would read "
                "the run's partition from its start, every other run's events included; pass "
                "frontiers=PostgresFrontierStore(DATABASE_URL) and run the projector"
            )
        self.provider = provider
        self.log = log
        self.leases = leases
        self.frontiers = frontiers
        self.worker = default_holder() if worker in (None, "") else check_name("worker", worker)
        self.lease_policy = lease_policy or LeasePolicy()
        self.continuation = continuation
        self.max_tool_calls_per_turn = max_tool_calls_per_turn
        self.spend = spend
        self.prices = prices or PriceTable()
        # Runs whose claim could not check their answers' spend (`record_answers_left`), by
        # id: checked again before their next budget check, which is not weighed without.
        self._answers_to_check: dict[str, tuple[Agent, Frontier, Collection[int] | None]] = {}
        self.compaction = compaction or embedded_compaction(log)
        self.resumer = Resumer(
            log, leases, frontiers, policy=self.lease_policy, compaction=self.compaction
        )
        checkpointer = (
            Checkpointer(frontiers, log, policy=checkpoints, compaction=self.compaction)
            if checkpoint_inline and frontiers is not None
            else None
        )
        self.writer = RunWriter(
            log,
            redactor=redactor or Redactor(),
            claim_check=ClaimCheck(blobs) if blobs is not None else None,
            checkpointer=checkpointer,
            observer=observer,
            spend=spend,
        )

    @property
    def checkpointer(self) -> Checkpointer | None:
        """The inline checkpointer of embedded mode, if configured."""
        return self.writer.checkpointer

    # -- lifecycle ---------------------------------------------------------------------------

    async def close(self) -> None:
        """Nothing to close: the stores are the caller's (or the embedded log's own).

        A runner can still be scoped like the stores it writes to, with ``async with``.
        """

    @contextlib.asynccontextmanager
    async def _holding(self, run_id: str, tenant: str, holder: str) -> AsyncIterator[Leaseholder]:
        """Hold the run's lease for the block, renewed in the background, released after: the
        one way the runner holds a run (start, resume, a person's answer), always entered
        before anything about the run is read.

        A release the lease store does not take once the block is done is retried in the
        background (`Leaseholder.releasing`) and logged, not raised: what the block wrote is
        durable, and an error would have its caller retry a run that went on (or ended)."""
        done = False
        try:
            async with Leaseholder(
                self.leases, run_id, tenant=tenant, holder=holder, policy=self.lease_policy
            ) as held:
                try:
                    yield held
                finally:
                    self.forget_answers_to_check(run_id)
                    await self.settle_checkpoints()
                done = True
        except BackendError as exc:
            if not done or held.releasing is None:
                raise
            _log.warning(
                "run %s: its lease is released in the background, the store refusing it now: %s",
                printable(run_id),
                one_line(str(exc), 300),
            )

    def forget_answers_to_check(self, run_id: str) -> None:
        """As a holding of the run ends: the answers its claim could not check the spend of
        (`record_answers_left`) are checked again by the next holder's claim, and kept here
        past the holding, a long-lived worker would keep one entry per run it ever claimed."""
        self._answers_to_check.pop(run_id, None)

    async def settle_checkpoints(self) -> None:
        """Until the inline checkpoints being folded in the background are stored
        (`Checkpointer.settled`): a run's holder waits for them before it lets the run go, so
        the next holder's resume starts from them."""
        if self.checkpointer is not None:
            await self.checkpointer.settled()

    def _held(
        self, run_id: str, tenant: str
    ) -> contextlib.AbstractAsyncContextManager[Leaseholder]:
        return self._holding(run_id, tenant, self.worker)

    # -- starting and resuming ---------------------------------------------------------------

    async def run(
        self,
        agent: Agent,
        input: Any,
        *,
        tenant: str,
        run_id: str | None = None,
        options: Mapping[str, Any] | None = None,
        bind: Binding | None = None,
    ) -> RunResult:
        """Start a run and drive it until it finishes or waits on a person.

        Args:
            options: Recorded in `RunStarted` (`onward.runtime.options.Options.recorded`); the
                fold reads ``user``, ``mode`` and ``checkpoints`` (a collaborative run waits
                for a person at those boundaries) and ``max_iterations``.
            bind: The agent for each run it is carried on into, by its id, as for `resume`.

        Raises:
            ResumeConflictError: Another worker holds a run under that id.
            InvalidInputError: A run under that id already exists (or is another tenant's), or
                garbage collection removed one whose events are still in the log, or a name or
                value is out of bounds (`onward.runtime.limits`; the field is named); nothing
                was written.
        """
        run_id = check_name("run_id", run_id) if run_id is not None else new_run_id()
        check_name("tenant", tenant, run_id=run_id)
        check_name("agent.name", agent.name, run_id=run_id)
        check_depth("input", input, run_id=run_id)
        _check_encodable("input", input, run_id)
        if options:
            check_optional_name("options.user", options.get("user"), run_id=run_id)
            _check_budget_options(options, run_id)
        refuse_unbound(agent)
        self.check_call_bounds(agent)
        self.check_budgets(agent, Budgets.of(agent, *run_budgets(dict(options or {}))), run_id)
        await self.resumer.refuse_stored(run_id, tenant)
        async with self._holding(run_id, tenant, self.worker) as held:
            await self.resumer.refuse_existing(run_id, held.lease)
            run = HeldRun(
                agent, held, Frontier.empty(run_id, tenant), Conversation(agent.instructions)
            )
            started = self.writer.event(
                run,
                RunStarted,
                agent=agent.name,
                revision=agent.revision,
                input=input,
                options=recorded_options(options, agent),
            )
            await self.writer.append(run, [started])
            result = await self._drive(run)
        return await self._onward(agent, result, bind)

    async def end_at_start(
        self,
        agent: str,
        input: Any,
        *,
        tenant: str,
        run_id: str,
        options: Mapping[str, Any] | None = None,
        status: Literal["failed", "cancelled"],
        error: str,
    ) -> None:
        """Record a start nobody will drive as a run that ended ``status`` at once, with
        ``error``: a start for an agent this process does not carry (``failed``), or one taken
        back before any worker took it (``cancelled``, `PostgresRequests.withdraw_start`).
        Whoever follows the run reads why, where a start dropped would leave them waiting for a
        run that never comes.

        Its `RunStarted` names the agent asked for and no revision (empty: none ran); the
        input and options are recorded as a start records them. Nothing else is written.

        Raises:
            ResumeConflictError: Another worker holds a run under that id.
            InvalidInputError: A run under that id already exists (or is another tenant's), or
                a name or value is out of bounds; nothing was written.
            FencedError: The lease was lost before the write; nothing was written.
        """
        check_name("run_id", run_id)
        check_name("tenant", tenant, run_id=run_id)
        check_name("agent", agent, run_id=run_id)
        check_depth("input", input, run_id=run_id)
        _check_encodable("input", input, run_id)
        await self.resumer.refuse_stored(run_id, tenant)
        async with self._holding(run_id, tenant, self.worker) as held:
            await self.resumer.refuse_existing(run_id, held.lease)
            # A run needs an agent to be held; this one is never driven, and only its name is
            # written (the revision stays empty: no definition of it was used).
            stand_in = Agent(name=agent, instructions="")
            run = HeldRun(stand_in, held, Frontier.empty(run_id, tenant), Conversation(""))
            started = self.writer.event(
                run, RunStarted, agent=agent, revision="", input=input, options=dict(options or {})
            )
            finished = self.writer.event(run, RunFinished, status=status, error=error)
            await self.writer.append(run, [started, finished])

    async def resume(
        self, agent: Agent, run_id: str, *, tenant: str, bind: Binding | None = None
    ) -> RunResult:
        """Carry a run on from the log: claim it, plan its outstanding calls, drive it.

        Args:
            bind: The agent for each other run of its chain this resume goes on with, by its
                id (``agent``'s toolsets bound to that run, as ``agent`` is to ``run_id``):
                a toolset keeping state per run must see the run it serves. Without it,
                ``agent`` drives them all.

        Raises:
            ResumeConflictError: Another worker holds the run (nothing was read).
            NothingToResumeError: No run under that id for that tenant (a row of another
                tenant's run is refused before its lease is taken).
            RevisionMismatchError: ``agent`` is not the revision the run started with.
            IndeterminateToolCallError: A call may or may not have run; a person must settle it.
            CheckpointFormatError: The run was written by a newer Onward.
            HistoryUnavailableError: The run's history has a hole (the log was truncated
                below what the frontier row needs, or the transcript lacks messages, its own or
                those of a run it was carried on from); the model is not called.
            InvalidInputError: The run id or tenant is out of bounds (`onward.runtime.limits`).
        """
        result = await self._resume_one(agent, run_id, tenant=tenant, bind=bind)
        return await self._onward(agent, result, bind)

    async def _resume_one(
        self,
        agent: Agent,
        run_id: str,
        *,
        tenant: str,
        bind: Binding | None = None,
        into: str | None = None,
    ) -> RunResult:
        """`resume` of this run alone: a result ``continued`` into another run is returned
        as it is, for `_onward` to take that run up. ``into``: a run a carry of this one
        started and died before ending this one into (`cut_carry`)."""
        _check_run(run_id, tenant)
        refuse_unbound(agent)
        self.check_call_bounds(agent)
        await self.resumer.refuse_another_tenants(run_id, tenant)
        async with self._holding(run_id, tenant, self.worker) as held:
            carried = await self.resumer.claim(agent, held, worker=self.worker, history=True)
            await self.record_answers_left(agent, carried.frontier, _answered_seqs(carried))
            if carried.claimed:
                await self.release_holds_left(run_id)
            handed = "handed_over"
            if carried.claimed and awaits_hand_over(carried.frontier):
                handed = await hand_over(carried.frontier, resumer=self.resumer)
            if handed == "overtaken":
                run = HeldRun(agent, held, carried.frontier, Conversation(""))
                await end_overtaken(run, writer=self.writer, resumer=self.resumer)
                return await self._ended(run.frontier)
            if handed == "handed_over":
                result = await self._restored_and_carried_on(agent, held, carried, into)
            else:
                # Let go undriven until the old run is ended into it: an ask it heard is for
                # its next holder, the one that carries it on.
                held.keep_ask()
        old_id = carried.frontier.continuation_of
        if handed == "unfinished" and old_id is not None:
            # The old run is ended `RunContinued` into this one first, then goes on with it:
            # named, as no derived id finds a run a policy named (`cut_carry`).
            if bind is None:
                result = await self._resume_one(agent, old_id, tenant=tenant, into=run_id)
            else:
                async with bind(old_id) as bound:
                    result = await self._resume_one(
                        bound, old_id, tenant=tenant, bind=bind, into=run_id
                    )
            if result.continued_to != run_id:
                # Not ended into this run after all (cancelled meanwhile, by a person who could
                # not end this run too while it was held here, or gone on): this run is
                # overtaken now, and ends so, not left showing running (`end_overtaken`).
                return await self._resume_one(agent, run_id, tenant=tenant, bind=bind)
            return await self._onward(agent, result, bind)
        return result

    async def _restored_and_carried_on(
        self, agent: Agent, held: Leaseholder, carried: CarriedRun, into: str | None = None
    ) -> RunResult:
        """The claimed run's conversation rebuilt, then the run carried on from its claim."""
        self.check_budgets(agent, Budgets.of_run(agent, carried.frontier), carried.frontier.run_id)
        if not carried.claimed:
            # Settled already: nothing to carry on, so no conversation to rebuild (a resume
            # walking a chain would read every earlier run's transcript again at each run of
            # it); its result still says what it ended with and what it cost. A run waiting
            # on a person ends as asked: released as it is, its ask would be dropped.
            run = HeldRun(agent, held, carried.frontier, Conversation(""))
            await self.answer_ask_left(run)
            return await self._ended(run.frontier)
        conversation = Conversation(agent.instructions)
        claim_check = self.writer.claim_check
        for row in await self.resumer.inherited(carried.frontier):
            conversation.inherit(await restored(row, claim_check))
        for row in carried.transcript:
            conversation.recall(await restored(row, claim_check))
        for stored in carried.events:
            # Bodies put back, then wrapped again as written: the conversation reads a body as
            # the log holds it (`message_of` takes the wrapping of a look-alike off once).
            conversation.remember(escape_bodies(await self.writer.restore(stored.event)))
        return await self._carry_on(HeldRun(agent, held, carried.frontier, conversation), into)

    async def _onward(
        self, agent: Agent, result: RunResult, bind: Binding | None = None
    ) -> RunResult:
        """Go on with the run a result's run was carried into, if it was, and so on along the
        chain: one run after another, not each inside the last (a chain of some hundreds of
        runs would exhaust the stack). A run another worker took up already (a fleet worker
        hears the hand-over at once) is its holder's to carry on: the run is returned as
        ``continued`` into it, as `RunResult.continued_to` says, not as a conflict over a run
        the caller never named, since the carry that got it there succeeded. Each run is
        driven by the agent ``bind`` gives for it, if given."""
        while result.status == "continued" and result.continued_to is not None:
            try:
                result = await self._resume_next(agent, result, bind)
            except ResumeConflictError as held:
                _log.info(
                    "run %s was continued into %s, which %s carries on",
                    result.run_id,
                    result.continued_to,
                    held.holder or "another worker",
                )
                return result
        return result

    async def _resume_next(
        self, agent: Agent, result: RunResult, bind: Binding | None
    ) -> RunResult:
        """`_resume_one` of the run ``result``'s run was continued into, with the agent
        ``bind`` gives for it (``agent`` without)."""
        new_id, tenant = result.continued_to, result.tenant
        assert new_id is not None  # `_onward` goes on only to a run the result names
        if bind is None:
            return await self._resume_one(agent, new_id, tenant=tenant)
        async with bind(new_id) as bound:
            return await self._resume_one(bound, new_id, tenant=tenant, bind=bind)

    async def _carry_on(self, run: HeldRun, into: str | None = None) -> RunResult:
        """Plan the claimed run's outstanding calls, record the plan, and drive it on; ended
        first into a successor a carry of it cut short started (``into``, if named)."""
        plan, reconciled = await self._plan(run)
        planned = self.writer.event(run, ResumePlanned, **plan.recorded())
        # A carry cut short by a crash is finished whatever this runner's policy: the turn in
        # progress belongs to the successor now, and `_drive` stops at the run's end. Looking
        # for the successor only reads, so it is not kept waiting for the plan's append.
        cut = asyncio.ensure_future(cut_carry(run.frontier, resumer=self.resumer, into=into))
        try:
            await self.writer.append(run, [planned])
            refuse_if_undecidable(plan)
            successor = await cut
        finally:
            cut.cancel()  # nothing once it is done
            await asyncio.gather(cut, return_exceptions=True)
        await finish_cut_carry(
            run, successor, writer=self.writer, holding=self._held, resumer=self.resumer
        )
        result = await self._drive(run)
        return dataclasses.replace(result, plan=plan, reconciled=tuple(reconciled))

    def check_call_bounds(self, agent: Agent) -> None:
        """Refuse an agent with a tool whose calls could outlast the lease they start under.

        Raises:
            ConfigurationError: A tool's ``max_call_s`` plus the renewal margin is over the
                lease ttl (the tool and both figures are named).
        """
        ttl = self.lease_policy.ttl_s
        margin = self.lease_policy.renew_margin.total_seconds()
        for tool in agent.tools:
            if tool.max_call_s is not None and tool.max_call_s + margin > ttl:
                raise ConfigurationError(
                    f"agent {agent.name!r}: tool {tool.name!r} may take {tool.max_call_s:g}s "
                    f"(max_call_s), which with the lease's renewal margin of {margin:g}s is over "
                    f"its ttl of {ttl:g}s: a call could outlast the lease it started under. "
                    "Raise the lease ttl or lower max_call_s"
                )

    def check_budgets(self, agent: Agent, budgets: Budgets, run_id: str) -> None:
        """Refuse a budget that could not be kept: no ledger to count against, or no price for
        the agent's model.

        Raises:
            ConfigurationError: Either; the model is not called.
        """
        if not budgets.bounded:
            return
        if self.spend is None:
            raise ConfigurationError(
                f"run {run_id!r} has a budget, and this runner no spend ledger to count it "
                "against; pass spend= (Backends.runner does)",
                run_id=run_id,
            )
        self.prices.check_priced(agent.model, run_id=run_id)

    async def _within_budget(self, run: HeldRun) -> int | None:
        """Hold the next model call's estimated cost against the run's budget and its
        tenant's, or stop the run before the call if that would pass one: the run ends
        ``failed``. The hold is keyed by the seq the call's answer is to be written at, which
        is returned (``None`` when no budget bounds the run or no ledger keeps spend); the
        answer's record replaces it (`record_spend`), a failed call releases it.

        Raises:
            BudgetExceededError: It would; the model is not called.
        """
        budgets = Budgets.of_run(run.agent, run.frontier)
        return await self.hold_model_call(run, budgets, run.conversation.messages)

    async def hold_model_call(
        self, run: HeldRun, budgets: Budgets, messages: Sequence[Message]
    ) -> int | None:
        """Hold the next model call's cost, estimated from ``messages`` (what it is sent, as
        far as the caller knows) and the run's calls so far, against ``budgets``; the seq held
        (its answer's), or ``None`` when no budget bounds the run or no ledger keeps spend.
        Over a budget, the run ends ``failed`` and `BudgetExceededError` is raised. A caller
        that then fails to call the model gives the hold back (`release_hold`).

        Raises:
            BudgetExceededError: The call would pass a budget; the model is not to be called.
        """
        if not budgets.bounded or self.spend is None:
            self._answers_to_check.pop(run.run_id, None)
            return None
        unchecked = self._answers_to_check.get(run.run_id)
        if unchecked is not None:
            # The claim could not count what the run's answers cost: without it the ledger
            # may count less than the run spent, and a budget pass.
            await self.record_answers_left(*unchecked)
            if run.run_id in self._answers_to_check:
                raise BackendUnavailableError(
                    f"run {run.run_id!r}: the spend ledger (or the log) did not answer when "
                    "the run was claimed, nor now: what its answers cost cannot be checked, "
                    "and a budget is not weighed without it; the model was not called",
                    run_id=run.run_id,
                )
        await self.writer.drop_holds_left()  # of runs that ended while the ledger was down
        estimate = estimate_usage(run.agent, messages, await self.spend.run_total(run.run_id))
        seq = self.writer.next_seq(run)  # the answer's, as `_model_step` writes it
        # An estimate past what a ledger counts (a max_tokens of 10**30) is held at that most,
        # so a budget refuses the call rather than the ledger the entry.
        held = await self.spend.hold(
            SpendEntry(
                run_id=run.run_id,
                tenant=run.tenant,
                seq=seq,
                model=run.agent.model,
                input_tokens=min(estimate.input_tokens, MAX_COUNT),
                output_tokens=min(estimate.output_tokens, MAX_COUNT),
                micros=min(self.prices.cost(run.agent.model, estimate), MAX_COUNT),
                at=time.time_ns() // 1_000,
            ),
            run_budget=budgets.run_micros,
            tenant_budget=budgets.tenant_micros,
        )
        if held.held:
            return seq
        refusal = over_budget(
            budgets,
            run_id=run.run_id,
            tenant=run.tenant,
            model=run.agent.model,
            estimate=estimate,
            prices=self.prices,
            run_spent=Spend(micros=held.run_micros),
            tenant_spent=Spend(micros=held.tenant_micros),
        )
        if refusal is None:  # the ledger's check and this one are the same sum
            raise AssertionError("the spend ledger refused a hold no budget refuses")
        error = f"{type(refusal).__name__}: {refusal}"
        await self.writer.append(
            run, [self.writer.event(run, RunFinished, status="failed", error=error)]
        )
        raise refusal

    async def release_hold(self, run_id: str, seq: int) -> None:
        """Release the hold of a model call that failed (`release_holds_left` those a holder
        that died mid-call left). A ledger that cannot be reached keeps it, counted against
        the budgets and never as spent."""
        if self.spend is None:
            return
        try:
            await asyncio.shield(self.spend.release(run_id, seq))
        except OnwardError as exc:
            _log.warning("run %s: the hold of a failed model call stays (%s)", run_id, exc)

    async def release_holds_left(self, run_id: str) -> None:
        """Release every hold of a run this worker has just claimed: it has made no call yet,
        so each was left by a holder before it that died (or was superseded) mid-call. Not
        only the claim's seq, which that call's answer would have taken: anything written to
        the run meanwhile (a person's tag) moves the claim past it, and a hold left there
        would count against the budgets until the run ends (for ever, carried on into
        another). A record made there, of an answer the provider gave, stays. A ledger that
        cannot be reached keeps them, counted against the budgets and never as spent."""
        if self.spend is None:
            return
        try:
            await asyncio.shield(self.spend.release_run(run_id))
        except OnwardError as exc:
            _log.warning("run %s: the holds its holder before left stay (%s)", run_id, exc)

    async def record_spend(self, run: HeldRun, answered: ModelAnswered) -> None:
        """Record what the model call ``answered`` answers cost, keyed by the seq the answer
        is to be written at, before it is written: a crash between the two leaves the call
        counted (the provider was paid for it) under a seq that holds no answer, and the call
        made again on resume is counted too, under its own answer's seq. Recording one key
        again (a retry) changes nothing. An entry the ledger does not take now is kept and
        the answer written all the same (`RunWriter.record_spend`); a resume records it from
        the log if this process dies first (`record_answers_left`)."""
        if self.spend is None:
            return
        await self.writer.record_spend(self._spend_entry(run.agent, answered))

    def _spend_entry(self, agent: Agent, answered: ModelAnswered) -> SpendEntry:
        """The ledger's entry of the call ``answered`` answers, keyed by the answer's seq."""
        usage = answered.usage
        return SpendEntry(
            run_id=answered.run_id,
            tenant=answered.tenant,
            seq=answered.seq,
            model=agent.model,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            micros=self.prices.cost(agent.model, usage),
            at=answered.at,
        )

    async def record_answers_left(
        self, agent: Agent, frontier: Frontier, answered: Collection[int] | None = None
    ) -> None:
        """Record the spend of the run's answers the ledger lacks, on taking the run: an entry
        whose record found the ledger down was kept only by the process that wrote its answer
        (`RunWriter.record_spend`), and is lost with it if that process died before the
        ledger came back. Every answer in the log is recorded under its own seq, the key its
        first record took, so one recorded already changes nothing.

        ``answered``: the seqs of the run's counted answers through ``frontier``, when the
        caller has them (`_answered_seqs` of a claim that read the run's history); the log is
        then read only when one of them has no entry, and not at all for a run with none.
        Without them it is read at every claim: the ledger's totals (or its count of entries)
        cannot stand for them, as an entry recorded for a call whose answer was never written
        (its process died between the two) counts as much as one lost would, and hides it.

        A ledger that cannot be reached is logged: the answers stay in the log, checked again
        before the run's next budget check (`hold_model_call`), which is not weighed without
        them. An answer cut from the log (compaction, retention) before its entry was
        recorded cannot be counted: the answers the log still holds are recorded all the
        same, and the ones cut are named."""
        if self.spend is None or (answered is not None and not answered):
            return
        run_id = frontier.run_id
        self._answers_to_check.pop(run_id, None)
        end = frontier.through_offset + 1
        try:
            kept = {entry.seq for entry in await self.spend.entries(run_id)}
            if answered is not None and kept.issuperset(answered):
                return
            guard = SequenceGuard()
            try:
                read = await self.log.read_run(
                    run_id,
                    start=frontier.first_offset if frontier.first_offset >= 0 else None,
                    end=end,
                )
            except LogTruncatedError as exc:
                if exc.start is None:
                    raise
                read = await self.log.read_run(run_id, start=exc.start, end=end)
                if read:
                    # Counted on from the first event the log still holds of the run.
                    guard = SequenceGuard(read[0].event.seq - 1, read[0].event.fence)
            recorded = 0
            seen: set[int] = set()
            # Only what counts: an answer a fence refused is not the one its seq keys.
            for stored in guard.admit_all(read):
                event = stored.event
                if isinstance(event, ModelAnswered):
                    seen.add(event.seq)
                    if event.seq not in kept:
                        recorded += await self.spend.record(self._spend_entry(agent, event))
        except OnwardError as exc:
            if isinstance(exc, BackendError):  # a store did not answer: it may next time
                self._answers_to_check[run_id] = (agent, frontier, answered)
            _log.warning("run %s: the spend of its answers is still to check (%s)", run_id, exc)
            return
        if recorded:
            _log.info("run %s: the spend of %d answers recorded from the log", run_id, recorded)
        cut = sorted(set(answered or ()) - kept - seen)
        if cut:
            _log.warning(
                "run %s: the answers at seq %s were cut from the log before their spend was "
                "recorded; the ledger cannot count them, and the run's and its tenant's spend "
                "stay short by those calls",
                run_id,
                ", ".join(map(str, cut)),
            )

    async def _ended(self, frontier: Frontier) -> RunResult:
        """The result a run's frontier describes, with the output it ended with as it was given
        (`output_of`: the frontier keeps it as the log does) and its spend (`_spent`)."""
        result = RunResult.of(frontier)
        if frontier.output is not None:
            output = await output_of(frontier, self.writer.claim_check)
            result = dataclasses.replace(result, output=output)
        return await self._spent(result)

    async def _spent(self, result: RunResult) -> RunResult:
        """The result with the run's spend, as the ledger has it, when there is one.

        Read once the result is durable: a ledger that does not answer then leaves
        ``spend_micros`` unset (logged) rather than turn a run that ended into an error its
        caller would retry (and `run` refuse, the run existing)."""
        if self.spend is None:
            return result
        try:
            spent = await self.spend.run_total(result.run_id)
        except BackendUnavailableError as exc:
            _log.warning(
                "run %s is %s; its spend could not be read: %s",
                printable(result.run_id),
                result.status,
                one_line(str(exc), 300),
            )
            return result
        return dataclasses.replace(result, spend_micros=spent.micros)

    async def _plan(self, run: HeldRun) -> tuple[ResumePlan, list[str]]:
        """Plan, asking each undecided call's tool once (`reconcile`) and recording its answer.

        A call dispatched with a deadline is asked about only after it: until then the
        holder that was paused mid-call may still make it take effect.

        Returns the plan and the calls the tools' status checks settled.
        """
        plan = plan_resume(run.frontier, run.agent)
        reconciled: list[str] = []
        for call in plan.indeterminate:
            tool = run.agent.tool(call.tool)
            if tool is None or tool.reconcile is None:
                continue
            await _after_deadline(run, call)
            await run.held.check()
            answer = await self._status(run, call, tool)
            if answer is None:
                continue
            await self._record_reconciled(run, call, answer)
            reconciled.append(call.call_id)
        return plan_resume(run.frontier, run.agent), reconciled

    async def _record_reconciled(self, run: HeldRun, call: CallState, answer: Reconciled) -> None:
        """Record a status check's answer; a result no store can keep (one too large for the
        log among them) is the call's typed error (the call did complete, so the run goes
        on), never a write that fails the run. A call that never ran has no result: whatever
        came with that answer is not recorded, or an error made of it would settle the call
        as made."""
        result, error = (answer.result if answer.outcome == "completed" else None), None
        fault = (
            f"nested more than {MAX_DEPTH} levels deep" if too_deep(result) else unencodable(result)
        )
        if fault is not None:
            result, error = (
                None,
                ToolError(
                    type="UnencodableResult",
                    message=f"{call.tool}'s status check answered completed with a result that "
                    f"cannot be recorded: {fault}",
                ),
            )
        resolved = self.writer.event(
            run,
            ToolResolved,
            call_id=call.call_id,
            outcome=answer.outcome,
            result=result,
            error=error,
            by="reconcile",
            why=f"{call.tool}'s status check answered {answer.outcome}",
        )
        try:
            await self.writer.append(run, [resolved])
        except PayloadTooLargeError as exc:
            if result is None:
                raise
            error = ToolError(
                type="PayloadTooLarge",
                message=f"{call.tool}'s status check answered completed with a result too "
                f"large to record ({exc}); it was not recorded: give the runner a blob store "
                "(blobs=)",
            )
            resolved = msgspec.structs.replace(resolved, result=None, error=error)
            await self.writer.append(run, [resolved])

    async def inspect(self, run_id: str, *, tenant: str) -> Frontier:
        """The run's frontier as the log has it now. Takes no lease and writes nothing."""
        _check_run(run_id, tenant)
        return await self.resumer.read(run_id, tenant=tenant)

    # -- what people do ----------------------------------------------------------------------

    async def approve(
        self, run_id: str, request_id: str, *, tenant: str, by: str, value: Any = None
    ) -> None:
        """Answer a run's approval request with yes; a later resume carries the run on.

        Raises:
            InvalidInputError: The run does not wait on ``request_id``, is a LangGraph thread
                (its graph is answered with ``Command(resume=...)``), or ``value`` does not
                fit the schema its question was asked with (`onward.runtime.ask`); nothing
                was written and the run still waits.
        """
        await self._answer(run_id, request_id, tenant=tenant, by=by, value=value, granted=True)

    async def deny(
        self, run_id: str, request_id: str, *, tenant: str, by: str, value: Any = None
    ) -> None:
        """Answer a run's approval request with no; the run ends, cancelled."""
        await self._answer(run_id, request_id, tenant=tenant, by=by, value=value, granted=False)

    async def _answer(
        self, run_id: str, request_id: str, *, tenant: str, by: str, value: Any, granted: bool
    ) -> None:
        """Write a person's answer to the approval request the run waits on (named as the run
        stored it: `check_stored_name`)."""
        check_stored_name("request_id", request_id, run_id=run_id)
        check_depth("value", value, run_id=run_id)
        _check_encodable("value", value, run_id)
        async with self._as_person(run_id, tenant, by) as run:
            _check_not_graph_thread(run.frontier, request_id)
            _check_waiting(run.frontier, request_id)
            if granted:
                check_answer(
                    run.frontier.answer_schema,
                    value,
                    run_id=run_id,
                    request_id=request_id,
                    redactor=self.writer.redactor,
                )
            kind = ApprovalGranted if granted else ApprovalDenied
            events: list[Event] = [
                self.writer.event(run, kind, request_id=request_id, by=by, value=value)
            ]
            if not granted:
                error = f"approval {request_id} denied by {by}"
                events.append(
                    self.writer.event(run, RunFinished, 1, status="cancelled", error=error)
                )
            try:
                await self.writer.append(run, events)
            except PayloadTooLargeError as exc:
                raise _value_too_large(run_id, request_id, exc) from exc

    async def cancel(self, run_id: str, *, tenant: str, by: str, why: str = "") -> Frontier:
        """End a run ``cancelled`` as a person, whatever it was doing: running (its holder
        gone), waiting on a person, or left for one. Nothing of it is carried on after; the
        spend it holds is released (`RunWriter`). A call dispatched and never settled stays
        undecided in its record: it may have run. A carry of the run cut short (its new run
        started, the run not ended into it) is cancelled whole: the other run it left ends
        ``cancelled`` too. Returns the run's frontier as it ended.

        Raises:
            InvalidInputError: The run has ended already (naming how), or is a LangGraph thread
                between invocations (no graph run writes it, none waits on an interrupt);
                nothing was written.
            ResumeConflictError: Another worker holds the run; nothing was written.
            CheckpointFormatError: A newer Onward wrote the run, or the run a carry cut short
                started it from; nothing was written.
        """
        if why != "":  # any other value, None too, is refused
            check_note("why", why, run_id=run_id)
        async with self._as_person(run_id, tenant, by) as run:
            if run.frontier.finished:
                # A run carried on goes on under its successor's id: say which, or the person
                # takes the work for ended while it goes on.
                onward = run.frontier.continued_to
                goes_on = f"; it goes on as run {onward!r}: cancel that run" if onward else ""
                raise InvalidInputError(
                    f"run {run_id!r} has ended already ({run.frontier.status}){goes_on}",
                    run_id=run_id,
                )
            check_invocation_to_end(run.frontier)
            # A carry of it cut short (the new run started, this one not ended into it) holds
            # its turn in progress: that run is ended too, or it would show running and then
            # end failed, as overtaken, though the person stopped the work.
            successor = await self._cut_carry_to_cancel(run.frontier)
            if awaits_hand_over(run.frontier):
                await self._cancel_left_behind(run.frontier, by=by, why=why)
            await self._end_cancelled(run, by, why)
            if successor is not None:
                await self._cancel_cut_carry(successor, tenant=tenant, by=by, why=why)
            return run.frontier

    async def _cut_carry_to_cancel(self, frontier: Frontier) -> str | None:
        """The run a carry of ``frontier``'s run cut short started (`cut_carry`), to be cancelled
        with it. A run under a successor's id that cannot be read (a hole, a record nobody can
        read) does not keep the person from ending this run, which such a carry cannot go on
        without (`end_overtaken`): it is named in a warning, for them to cancel too."""
        try:
            return await cut_carry(frontier, resumer=self.resumer)
        except BackendUnavailableError:
            raise
        except OnwardError as exc:
            # A record too damaged to say its run (or one claiming another's) names no run the
            # person could cancel: the ids a carry of this run takes are named instead.
            ids = successor_ids(frontier.run_id)
            unread = (
                f"run {exc.run_id!r}"
                if exc.run_id in ids
                else f"the run under an id a carry of it takes ({ids[0]!r} first)"
            )
            _log.warning(
                "run %s: ended cancelled without %s, which could not be read to tell "
                "whether it is a carry of it cut short (%s): if it is, cancel that run too "
                "once it can be read",
                printable(frontier.run_id),
                printable(unread),
                one_line(str(exc), 300),
            )
            return None

    async def _cancel_left_behind(self, frontier: Frontier, *, by: str, why: str) -> None:
        """End the run ``frontier``'s run was carried on from ``cancelled`` too while it stands
        where it was carried, its end into this run not written (the carry cut short): it
        holds the turn this run was handed, and its next resume would otherwise find its
        successor ended and make that turn's calls itself. Held this moment, its holder is
        asked to end it (`LeaseStore.ask_to_cancel`), before this run's end is written.

        Its holder letting go between the cancel finding it held and the ask is tried again
        (`_ASKS_ONWARD` times): the person asked one cancel, of this run, not of that one.

        Raises:
            ResumeConflictError: It was taken up and let go each time it was tried; nothing
                was written.
            CheckpointFormatError: A newer Onward wrote it; nothing was written.
            BackendError: A store failed reading it; nothing was written.
        """
        old_id, tenant = frontier.continuation_of, frontier.tenant
        assert old_id is not None  # awaits_hand_over
        try:
            if await hand_over(frontier, resumer=self.resumer) != "unfinished":
                return
        except CheckpointFormatError:
            # A newer Onward wrote it and resumes it: with this run ended, it would make the
            # turn's calls itself. Nor is a store's failure passed over: a later resume reads on.
            raise
        except (HistoryUnavailableError, EventDecodeError) as exc:
            # Nothing of the old run can be read (a hole, a record nobody can read): no resume
            # carries it on either, and it is no reason to keep this run going.
            _log.warning(
                "run %s: cancelled without run %s it was carried on from, which could not be "
                "read (%s): if it can be read again, cancel that run too",
                printable(frontier.run_id),
                printable(repr(old_id)),
                one_line(str(exc), 300),
            )
            return
        for _ in range(_ASKS_ONWARD):
            try:
                async with self._as_person(old_id, tenant, by) as old:
                    if carriable(old.frontier) and current(frontier, old.frontier):
                        await self._end_cancelled(old, by, why)
            except ResumeConflictError:
                asked = await self.leases.ask_to_cancel(old_id, tenant=tenant, by=by, why=why)
                if asked is not None:
                    return
            else:
                return
        raise ResumeConflictError(
            f"run {frontier.run_id!r} was not cancelled: run {old_id!r} it was carried on "
            f"from, which holds its turn, was taken up and let go again each of "
            f"{_ASKS_ONWARD} times it was tried; nothing was written: cancel "
            f"{frontier.run_id!r} again",
            run_id=frontier.run_id,
        )

    async def _cancel_cut_carry(self, new_id: str, *, tenant: str, by: str, why: str) -> None:
        """End ``new_id``, the run a carry cut short started, ``cancelled`` as its old run just
        was, unless it was handed over or ended meanwhile. The old run's end is written: one
        this cannot write (held this moment, a store failing) is left to the new run's next
        resume, which ends it so too (`end_overtaken`)."""
        try:
            async with self._as_person(new_id, tenant, by) as new:
                if awaits_hand_over(new.frontier):
                    await self._end_cancelled(new, by, why)
        except OnwardError as exc:
            _log.info(
                "run %s: not ended with the run it was carried on from (%s); its next resume "
                "ends it cancelled",
                printable(new_id),
                one_line(str(exc), 300),
            )

    async def _end_cancelled(self, run: HeldRun, by: str, why: str) -> None:
        """Write the run's end, ``cancelled`` by ``by`` (and why), under its lease."""
        finished = self.writer.event(
            run, RunFinished, status="cancelled", error=CancelAsked(by, why).error
        )
        await self.writer.append(run, [finished])

    async def _end_as_asked(self, run: HeldRun, asked: CancelAsked) -> None:
        """End the run ``cancelled`` as someone asked its holder to.

        The end is kept trying for as long as the lease holds (`RunWriter.append_while_held`);
        one given up on after that leaves the ask with the lease for the run's next holder
        (`LeaseStore.ask_to_cancel`).
        """
        finished = self.writer.event(run, RunFinished, status="cancelled", error=asked.error)
        await self.writer.append_while_held(
            run, [finished], what=f"its end, cancelled by {asked.by}"
        )

    async def ask_to_cancel(
        self, run_id: str, *, tenant: str, by: str, why: str = ""
    ) -> RunLease | None:
        """Ask whoever holds the run now to end it ``cancelled`` at its next boundary (before
        its next model call; a tool call in flight finishes and is recorded first).

        For a run another process drives, which `cancel` is refused: the ask is kept with the
        run's lease (`LeaseStore.ask_to_cancel`) and its holder hears it at its next lease
        renewal or tool call, then writes the run's end itself, recording ``by`` and ``why``
        (also where the run would have waited on a person, or been carried into a new run);
        a model call in flight when it hears it is abandoned (`Leaseholder.cancelled_by_ask`).
        A run its holder carried on meanwhile has the ask passed on to the run it goes on as.
        Returns the holding asked, or ``None`` when nobody holds the run (`cancel` it then).
        """
        _check_run(run_id, tenant)
        check_name("by", by, run_id=run_id)
        if why != "":  # any other value, None too, is refused
            check_note("why", why, run_id=run_id)
        holding = await self.leases.ask_to_cancel(run_id, tenant=tenant, by=by, why=why)
        if holding is not None:
            try:
                await self._ask_onward(run_id, tenant=tenant, by=by, why=why)
            except OnwardError as exc:
                _log.warning(
                    "run %s: the cancel asked of it was kept with its holding, but whether it "
                    "goes on as another run could not be read (%s): if it does, cancel that run",
                    printable(run_id),
                    one_line(str(exc), 300),
                )
        return holding

    async def _ask_onward(self, run_id: str, *, tenant: str, by: str, why: str) -> None:
        """Pass a cancel ask kept with the holding of a run carried on to the run it goes on
        as: its holder may have looked for an ask last before it was made, and lets go of a
        run nobody takes up again, so the run it goes on as would go on unasked while the
        asker was told it ends. A run held is asked (and followed on, if carried on too), one
        nobody holds is ended ``cancelled`` here; a run not carried on is left to its holder.
        """
        try:
            onward = (await self.resumer.read(run_id, tenant=tenant)).continued_to
        except NothingToResumeError:
            return  # being started under its lease: its holder hears the ask
        tries = 0
        while onward is not None:
            if await self.leases.ask_to_cancel(onward, tenant=tenant, by=by, why=why) is None:
                try:
                    await self.cancel(onward, tenant=tenant, by=by, why=why)
                except ResumeConflictError:
                    tries += 1
                    if tries < _ASKS_ONWARD:
                        continue  # taken up since the ask found it free: ask that holding
                    raise
                except InvalidInputError:
                    pass  # ended already: carried on further, or as someone else ended it
                else:
                    return
            onward = (await self.resumer.read(onward, tenant=tenant)).continued_to

    async def resolve(
        self,
        run_id: str,
        call_id: str,
        *,
        tenant: str,
        outcome: Literal["completed", "never_ran"],
        by: str,
        why: str,
        result: Any = None,
    ) -> None:
        """Settle an undecided call as a person: it completed (with its result) or never ran.

        The call is named as the run stored it (`check_stored_name`): a call id a producer
        wrote to the log out of a new name's bounds is still settled.
        """
        check_stored_name("call_id", call_id, run_id=run_id)
        if why:
            check_note("why", why, run_id=run_id)
        check_depth("result", result, run_id=run_id)
        _check_encodable("result", result, run_id)
        async with self._as_person(run_id, tenant, by) as run:
            call = run.frontier.call(call_id)
            if call is None or call.outcome is not None:
                raise InvalidInputError(
                    f"run {run_id!r} has no undecided call {call_id!r}"
                    + (f" (it is {call.outcome})" if call and call.outcome else ""),
                    run_id=run_id,
                )
            if call.asked_seq is not None:
                # Its code stopped at a person's question and did nothing after it: no call
                # that may have run. Settled, the answer would reach no code.
                waiting = run.frontier.waiting_on
                raise InvalidInputError(
                    f"run {run_id!r}: call {call_id!r} is not undecided, its code stopped at "
                    f"the question at seq {call.asked_seq} and runs again with the answer"
                    + (
                        f"; answer request {waiting} with onward approve or onward deny"
                        if waiting is not None
                        else ""
                    ),
                    run_id=run_id,
                )
            resolved = self.writer.event(
                run, ToolResolved, call_id=call_id, outcome=outcome, result=result, by=by, why=why
            )
            await self.writer.append(run, [resolved])

    async def tag(
        self, run_id: str, label: str, *, tenant: str, seq: int | None = None, by: str = "tagger"
    ) -> int:
        """Put a label on one of the run's events; tagged events survive compaction.

        Written as a `Tagged` event under the run's lease, so a run a worker is carrying on
        is tagged by that worker (this raises `ResumeConflictError` meanwhile).
        A label already on that event is not written again.

        Args:
            seq: The event to tag; by default the run's latest boundary (its resume point).
            by: Who tags it, as the lease store shows the holder while the tag is written.

        Returns:
            The seq that was tagged.

        Raises:
            InvalidInputError: An empty label, one out of bounds (`onward.runtime.limits`), a
                seq the run does not have, no boundary yet, a run that already holds
                `MAX_TAGS_PER_RUN` tags, or a seq below the run's truncation point that
                compaction did not retain.
        """
        return await self._tag(run_id, label, tenant=tenant, seq=seq, by=by, capped=True)

    async def leave_for_person(
        self, run_id: str, why: str, *, tenant: str, by: str = "tagger"
    ) -> int:
        """Tag the run ``needs-person: <why>`` at its latest boundary: a worker found a call
        it must not guess about and leaves the run to a person (`onward resolve`).

        Written even when the run already holds `MAX_TAGS_PER_RUN` tags: a run left for a
        person must not be carried on until it is out of attempts and ended ``failed`` over
        a call that may have taken effect. Such tags stay few (one per call left undecided).

        Returns:
            The seq that was tagged.
        """
        label = f"{NEEDS_PERSON}: {why}"
        return await self._tag(run_id, label, tenant=tenant, seq=None, by=by, capped=False)

    async def _tag(
        self, run_id: str, label: str, *, tenant: str, seq: int | None, by: str, capped: bool
    ) -> int:
        """`tag`; with ``capped``, refused once the run holds `MAX_TAGS_PER_RUN` tags."""
        if isinstance(label, str) and not label.strip():
            raise InvalidInputError("a tag needs a non-empty label", run_id=run_id)
        check_label("label", label, run_id=run_id)
        async with self._as_person(run_id, tenant, by) as run:
            target = run.frontier.resume_seq if seq is None else seq
            if capped and any(t.seq == target and t.label == label for t in run.frontier.tags):
                # Already there: a tag delivered twice (a rebalance, a submit tried again)
                # writes nothing, as a start, an answer or a cancel delivered twice does.
                return target
            if capped and len(run.frontier.tags) >= MAX_TAGS_PER_RUN:
                raise InvalidInputError(
                    f"run {run_id!r} already holds {len(run.frontier.tags)} tags, the most one "
                    "run may hold; tag a run's events sparingly (tags are kept on its frontier)",
                    run_id=run_id,
                )
            if not 1 <= target <= run.frontier.last_seq:
                raise InvalidInputError(
                    f"run {run_id!r} has no event {target} to tag (its events are 1 to "
                    f"{run.frontier.last_seq})"
                    if seq is not None
                    else f"run {run_id!r} has reached no boundary yet; name the seq to tag",
                    run_id=run_id,
                )
            if self.compaction is not None:
                # Pinned before the Tagged event is written: a pass from now on retains the
                # target before it can cut it, and one that already did refuses the pin.
                await self.compaction.pin(run_id, tenant, target)
                # A collection from now on keeps the run (its pin is newer than its row); one
                # that removed it since it was read must not have the tag land on nothing.
                await self.resumer.read(run_id, tenant=tenant)
            await self.writer.append(
                run, [self.writer.event(run, Tagged, target_seq=target, label=label)]
            )
            return target

    @contextlib.asynccontextmanager
    async def _as_person(self, run_id: str, tenant: str, by: str) -> AsyncIterator[HeldRun]:
        """A person's append: read, take the lease (a waiting run has no holder), read again,
        write, release.

        The first read, before the lease, refuses a run that does not exist or is another
        tenant's (`NothingToResumeError`) without leaving lease state behind (a lease store
        keeps a run's fence for good) and without holding another tenant's run even briefly.
        Two people answering one request cannot both win: the second waits for or is refused
        the lease, and then finds the request already answered.
        """
        _check_run(run_id, tenant)
        check_name("by", by, run_id=run_id)
        await self.resumer.read(run_id, tenant=tenant)
        async with self._holding(run_id, tenant, f"person:{by}") as held:
            frontier = await self.resumer.read(run_id, tenant=tenant)
            await held.raise_fence(frontier.fence)
            agent = Agent(name=frontier.agent or "unknown", instructions="")
            run = HeldRun(agent, held, frontier, Conversation(""))
            yield run
            if not run.frontier.finished:
                # A cancel ask its holder let go of unanswered waits for the run's next driver.
                held.keep_ask()

    # -- the loop ----------------------------------------------------------------------------

    async def _drive(self, run: HeldRun) -> RunResult:
        # The agent's bound is a ceiling: a run's options may lower it, never raise it.
        ceiling = run.agent.max_iterations
        limit = min(run.frontier.max_iterations or ceiling, ceiling)
        while not run.frontier.finished and run.frontier.status != "waiting":
            # Heard before anything else at a boundary (an ask a holder that let go never heard
            # too, kept with the lease): a run carried into a new run would not hear it, and one
            # left waiting on a person would not until a person answers.
            asked = run.held.cancel_asked
            if asked is not None:  # someone asked its holder to cancel it (`onward cancel`)
                await self._end_as_asked(run, asked)
                break
            # A checkpoint the run pauses at comes before a carry: the run it would be carried
            # into has reached no boundary of its own, so it would go on without pausing.
            at: Boundary = "after_model_call" if run.frontier.calls else "after_tool_result"
            if (
                self.continuation is not None
                and pause_request(run.frontier, at) is None
                and await carry_if_due(
                    run,
                    self.continuation,
                    writer=self.writer,
                    resumer=self.resumer,
                    holding=self._held,
                )
            ):
                break
            if run.held.cancel_asked is not None:
                continue  # heard as a carry confirmed the lease: the run ends here, as asked
            if run.frontier.calls:
                if await self._paused(run, "after_model_call"):
                    break
                with observe.run_step("tools", run.run_id, run.fence):
                    settled = await self._run_turn(run)
                if not settled:
                    break
                continue
            if run.frontier.iteration >= limit:
                stopped = self.writer.event(
                    run, RunFinished, status="failed", error=f"stopped after max_iterations={limit}"
                )
                await self.writer.append(run, [stopped])
                break
            if await self._paused(run, "after_tool_result"):
                break
            with observe.run_step("model", run.run_id, run.fence):
                dispatches = await self._model_step(run)
            if dispatches:
                with observe.run_step("tools", run.run_id, run.fence):
                    dispatched = {d.call_id for d in dispatches}
                    pending = [c for c in run.frontier.calls if c.call_id in dispatched]
                    if not await self._finish_turn(run, pending, dispatches):
                        break
        await self.answer_ask_left(run)
        return await self._ended(run.frontier)

    async def answer_ask_left(self, run: HeldRun) -> None:
        """As the driver lets go of a run that stopped without ending, end it as asked if it
        waits on a person and was asked; a run left otherwise keeps the ask for its next
        driver (`Leaseholder.keep_ask`)."""
        if run.frontier.status == "waiting":
            # An ask made since the last renewal is heard now: the release that lets the run
            # wait keeps it, but nobody takes the run until a person answers, and its asker was
            # told it ends.
            with contextlib.suppress(FencedError, BackendError):
                await run.held.confirm()
        asked = run.held.cancel_asked
        if asked is not None and run.frontier.status == "waiting":
            # Heard while its turn ran: it ends rather than wait for a person to go on with it.
            await self._end_as_asked(run, asked)
        if not run.frontier.finished:
            run.held.keep_ask()  # not answered by this holding: the run's next driver ends it

    async def _paused(self, run: HeldRun, boundary: Boundary) -> bool:
        """A collaborative run waits for a person at each boundary it pauses at (once)."""
        asked = pause_request(run.frontier, boundary)
        if asked is not None:
            await self.writer.append(run, [self.writer.event(run, ApprovalRequested, **asked)])
        return asked is not None

    async def _model_step(self, run: HeldRun) -> list[ToolDispatched]:
        """Call the model and record its answer; the dispatches written with it, if any.

        An answer whose calls go out at once (none waits on a person, the run does not pause
        after a model call) is written in one batch with their `ToolDispatched`: one append
        fewer a step, and the answer is never durable without them, so a crash before the
        batch calls the model again and one after it finds the calls dispatched, as a crash
        after a separate dispatch batch would.
        """
        observer = self.writer.observer
        if observer is not None:
            await observer.before_model_call()
        held = await self._within_budget(run)
        try:
            # A cancel ask heard meanwhile abandons the call (it has no effect but its cost).
            async with run.held.cancelled_by_ask():
                reply = await self.provider.complete(run.agent, list(run.conversation.messages))
        except CancelAskHeard as heard:
            if held is not None:
                await self.release_hold(run.run_id, held)
            await self._end_as_asked(run, heard.asked)
            return []
        except BaseException:
            if held is not None:
                await self.release_hold(run.run_id, held)
            raise
        fault = _reply_fault(reply)
        if fault is None and (found := _message_fault(reply.message)) is not None:
            fault = f"the model's message cannot be recorded: {found}"
        if fault is not None:
            await self._answer_unrecordable(run, reply, fault)
            return []
        asked = len(reply.tool_calls)
        if asked > self.max_tool_calls_per_turn:
            answered = self.writer.event(
                run, ModelAnswered, message=reply.message, tool_calls=[], usage=reply.usage
            )
            await self.record_spend(run, answered)
            error = (
                f"the model asked for {asked} tool calls in one answer, over "
                f"max_tool_calls_per_turn={self.max_tool_calls_per_turn}; none of them was run"
            )
            failed = self.writer.event(run, RunFinished, 1, status="failed", error=error)
            await self.writer.append(run, [answered, failed])
            return []
        calls = [_keyed(run, call, index) for index, call in enumerate(reply.tool_calls)]
        answered = self.writer.event(
            run, ModelAnswered, message=reply.message, tool_calls=calls, usage=reply.usage
        )
        await self.record_spend(run, answered)
        try:
            if calls and self._dispatched_at_once(run, calls):
                dispatches = self._dispatches(run, calls, first=1)
                await self._write_ahead(run, [answered, *dispatches], dispatches)
                return dispatches
            if calls:
                await self.writer.append(run, [answered])
                return []
            finished = self.writer.event(
                run, RunFinished, 1, status="completed", output=reply.message.content
            )
            await self.writer.append(run, [answered, finished])
        except PayloadTooLargeError as exc:
            await self._answer_too_large(run, answered, exc)
        return []

    async def _answer_too_large(
        self, run: HeldRun, answered: ModelAnswered, refused: PayloadTooLargeError
    ) -> None:
        """End the run failed when the model's answer is too large for the log (no blob store
        took its body, nor, a final answer, the run's output): the answer is recorded without
        its text and calls, for its usage, and the run's error says why. Not raised: a resume
        would ask the (paid) model again, be answered alike, and be refused again, for ever."""
        remedy = (
            "ask for less"
            if self.writer.claim_check is not None
            else "give the runner a blob store (blobs=)"
        )
        calls = len(answered.tool_calls)
        unrun = f"; none of its {calls} tool calls was run" if calls else ""
        error = f"the model's answer is too large to record ({refused}){unrun}: {remedy}"
        bare = msgspec.structs.replace(
            answered, message=Message(role=answered.message.role), tool_calls=[]
        )
        failed = self.writer.event(run, RunFinished, 1, status="failed", error=error)
        await self.writer.append(run, [bare, failed])

    async def _answer_unrecordable(self, run: HeldRun, reply: ModelReply, fault: str) -> None:
        """End the run failed when the provider's answer cannot be written as it is (a field
        a `ModelReply` does not hold, such as a negative token count or ``args`` that are not
        a dict; or ``nan`` in its message, which would be written as ``null``): the answer is
        recorded without its text and calls, for its usage when that is sound, and the run's
        error, ``fault``, names the value at fault. Not raised, as `_answer_too_large` is
        not."""
        calls = getattr(reply, "tool_calls", None)
        unrun = (
            f"; none of its {len(calls)} tool calls was run"
            if isinstance(calls, list) and calls
            else ""
        )
        usage = getattr(reply, "usage", None)
        if not isinstance(usage, Usage) or _shape_fault(usage, Usage) is not None:
            usage = Usage()
        bare = self.writer.event(run, ModelAnswered, message=Message(role="assistant"), usage=usage)
        await self.record_spend(run, bare)
        failed = self.writer.event(run, RunFinished, 1, status="failed", error=f"{fault}{unrun}")
        await self.writer.append(run, [bare, failed])

    def _dispatched_at_once(self, run: HeldRun, calls: list[ToolCall]) -> bool:
        """Whether a new answer's calls go out with it: none needs a person's approval and the
        run does not pause after a model call (`pause_request` would ask first)."""
        return "after_model_call" not in run.frontier.pause_at and not any(
            _awaits_approval(run, call) for call in calls
        )

    def _dispatches(
        self, run: HeldRun, calls: Sequence[CallState | ToolCall], *, first: int = 0
    ) -> list[ToolDispatched]:
        """The `ToolDispatched` of each of ``calls``, numbered from ``first`` in their batch."""
        return [
            self.writer.event(
                run,
                ToolDispatched,
                first + i,
                call_id=c.call_id,
                tool=c.tool,
                idempotency_key=c.idempotency_key,
                deadline=_deadline(run, c),
            )
            for i, c in enumerate(calls)
        ]

    async def _run_turn(self, run: HeldRun) -> bool:
        """Dispatch and settle the open turn. False if the run now waits on a person."""
        pending = [
            c
            for c in run.frontier.calls
            if c.outcome in (None, "never_ran") and _needs_dispatch(c, run.fence)
        ]
        for call in pending:
            if _awaits_approval(run, call):
                # The person is shown the arguments the model gave, not the log's reference
                # to them. The details hold them whole; the prompt cuts long ones, or written
                # twice in one record they could be too large for the log.
                args = await self._arguments(run, call)
                shown = as_text(args)
                if len(shown) > MAX_NOTE_LENGTH:
                    shown = f"{shown[:MAX_NOTE_LENGTH]}... ({len(shown)} characters in all)"
                asked = self.writer.event(
                    run,
                    ApprovalRequested,
                    request_id=call.call_id,
                    prompt=f"allow {call.tool} with {shown}?",
                    details={"tool": call.tool, "args": args},
                )
                await self.writer.append(run, [asked])
                return False
        dispatches: list[ToolDispatched] = []
        if pending:
            dispatches = self._dispatches(run, pending)
            # Every dispatch of the turn is durable before any tool is called, and the lease,
            # renewed after the deadlines were set, outlasts each of them (the ttl is over every
            # max_call_s: `check_call_bounds`).
            await self._write_ahead(run, dispatches, dispatches)
        return await self._finish_turn(run, pending, dispatches)

    async def _write_ahead(
        self, run: HeldRun, batch: Sequence[Event], dispatches: list[ToolDispatched]
    ) -> None:
        """`write_ahead` of ``batch``, which holds ``dispatches``.

        When it fails no tool is called; a dispatch already durable would then leave its call
        looking as if it may have run, and a resume would leave it to a person. So each call
        dispatched here is recorded as never ran, while the lease still lets this holder write
        (a lease store that did not answer the confirmation, say, or the run cancelled while
        it was asked), and the error goes on: the next holder makes the call.
        """
        await write_ahead(
            lambda: self.writer.append(run, batch),
            run.held.confirm,
            lambda: self._not_called(run, dispatches),
        )

    async def _not_called(
        self, run: HeldRun, dispatches: Sequence[ToolDispatched | CallState]
    ) -> None:
        """Record the calls of ``dispatches`` that this holder dispatched and did not make as
        never ran (`_write_ahead`, `_arguments_to_call`); a write refused is logged, the calls
        then left undecided."""
        calls = [run.frontier.call(d.call_id) for d in dispatches]
        left = [
            c
            for c in calls
            if c is not None
            and c.dispatched_seq is not None
            and c.dispatched_fence == run.fence
            and c.outcome is None
        ]
        if not left:
            return
        resolved = [
            self.writer.event(
                run,
                ToolResolved,
                i,
                call_id=c.call_id,
                outcome="never_ran",
                by=self.worker,
                why=NOT_CALLED,
            )
            for i, c in enumerate(left)
        ]
        try:
            await self.writer.append(run, resolved)
        except OnwardError as exc:
            _log.warning(
                "run %s: %s were dispatched and not called; that could not be recorded, so "
                "they are left undecided: %s",
                run.run_id,
                ", ".join(f"{c.call_id} ({c.tool})" for c in left),
                one_line(str(exc), 300),
            )

    async def _finish_turn(
        self, run: HeldRun, pending: list[CallState], dispatches: list[ToolDispatched]
    ) -> bool:
        """Make the turn's ``pending`` calls, their ``dispatches`` durable, and settle the
        turn. False if the run now waits on a person."""
        if pending:
            deadlines = {d.call_id: d.deadline for d in dispatches}
            called = [c.call_id for c in pending]
            ended = await _all_or_none(
                self._observed_call(
                    run, c, deadlines[c.call_id], [i for i in called if i != c.call_id]
                )
                for c in pending
            )
            undecided = [call for call in ended if isinstance(call, CallState)]
            questions = [q for q in ended if isinstance(q, Question)]
            if questions:
                await self._ask(run, questions)
            if undecided:
                raise IndeterminateToolCallError(
                    f"run {run.run_id!r}: cut off at their deadline or left unanswered by their "
                    "service, these calls may or may not "
                    f"have taken effect and their tools have no status check that answered: "
                    + ", ".join(f"{c.call_id} ({c.tool})" for c in undecided)
                    + ". Settle each with `onward resolve` (completed or never ran)",
                    run_id=run.run_id,
                    calls=tuple(undecided),
                )
            if questions:
                return False
        if run.frontier.calls:  # no call's outcome settled the turn with it (`_call_tool`)
            await self.writer.append(run, [self._settled(run)])
        return True

    def _settled(self, run: HeldRun) -> TurnSettled:
        """The event settling the open turn (its seq is set when it is appended)."""
        return self.writer.event(
            run,
            TurnSettled,
            iteration=run.frontier.iteration,
            call_ids=[c.call_id for c in run.frontier.calls],
        )

    async def _ask(self, run: HeldRun, questions: list[Question]) -> None:
        """Record the first question the turn's calls stopped at; the run waits on it.

        Every call that stopped at a question is named in it, so each runs again once the run
        goes on (the others ask theirs again then, one at a time).
        """
        first = questions[0]
        call = run.frontier.call(first.call_id)
        asked = self.writer.event(
            run,
            ApprovalRequested,
            request_id=first.request_id,
            prompt=first.text,
            details={
                "tool": call.tool if call is not None else "",
                "args": await self._arguments(run, call) if call is not None else {},
                "question": first.text,
            },
            asked=Asked(
                call_id=first.call_id,
                index=first.index,
                schema=first.schema,
                suspended=[q.call_id for q in questions],
            ),
        )
        await self.writer.append(run, [asked])

    async def _observed_call(
        self, run: HeldRun, call: CallState, deadline: int | None, others: list[str]
    ) -> CallState | Question | None:
        """`_call_tool`, counted and traced by how the call ended."""
        with observe.tool_call(run.run_id, run.fence, call.call_id, call.tool) as end:
            ended = await self._call_tool(run, call, deadline, others)
            if isinstance(ended, ToolCompleted):
                # Its batch may have settled the turn, and the frontier forgotten the call.
                end.disposition = "completed" if ended.error is None else "error"
                return None
            end.disposition = (
                "asked" if isinstance(ended, Question) else _disposition(run, call.call_id, ended)
            )
            return ended

    async def _call_tool(
        self,
        run: HeldRun,
        call: CallState,
        deadline: int | None = None,
        others: list[str] | None = None,
    ) -> CallState | Question | ToolCompleted | None:
        """Call the tool and record its outcome, returned (``None`` when its status check's
        answer was recorded instead); the call, if it was cut off at its deadline
        and its status check could not say whether it took effect (nothing is recorded); the
        question its code stopped at (`ask`), if it asked one nobody answered yet (nothing is
        recorded: the turn's questions are, by `_ask`).

        ``others`` are the turn's other calls made with this one: when each of them has its
        outcome recorded already, the turn is settled in the same batch as this outcome."""
        tool = run.agent.tool(call.tool)
        result: Any = None
        error: ToolError | None = None
        if tool is None:
            error = ToolError(type="UnknownTool", message=f"the agent has no tool {call.tool!r}")
        elif (refused := _arguments_refused(call)) is not None:
            error = refused
        else:
            args = await self._arguments_to_call(run, call)
            lease = run.held.lease
            calling = tool.call(
                args,
                idempotency_key=call.idempotency_key,
                approval=approval_value(run.frontier, call.call_id),
                fence=lease.fence,
                lease_expires_at=lease.expires_at,
            )
            scope = Asking.of(call.call_id, run.frontier.grants)
            try:
                with scope.active():
                    result = await _within(calling, deadline)
            except QuestionAsked as stopped:
                return scope.question or stopped.question
            except (_DeadlinePassedError, OutcomeUnknownError) as exc:
                verdict = await self._cut_off(
                    run, call, tool, _unanswered(call, tool, exc, self.writer.redactor)
                )
                if not isinstance(verdict, ToolError):
                    return verdict
                error = verdict
            except (ToolArgumentsError, _NotStartedError) as exc:
                error = _uncalled_error(call, tool, exc)
            except Exception as exc:  # noqa: BLE001 - a tool's failure is recorded, not raised
                error = tool_error(exc, self.writer.redactor)
            if scope.question is not None:
                # Its code caught the stop and went on: it still stopped at its question.
                return scope.question
            if too_deep(result):
                # Recorded as the call's outcome, so the run goes on: a value this deep could
                # not be masked, stored or read back by every reader.
                result = None
                error = ToolError(
                    type="PayloadTooDeep",
                    message=f"{call.tool} returned a value nested more than {MAX_DEPTH} levels "
                    "deep; it was not recorded",
                )
            elif error is None and (fault := unencodable(result)) is not None:
                # The tool returned, so its effect is done: the refusal is its outcome, and
                # the model is told why, rather than the call left undecided for a person.
                result = None
                error = ToolError(
                    type="UnencodableResult",
                    message=f"{call.tool} returned a value that cannot be recorded: {fault}; "
                    "return JSON values (text, numbers, lists, dicts) or convert it first",
                )
        if self.writer.observer is not None:
            await self.writer.observer.tool_returned(call.call_id)
        return await self._record_outcome(run, call, result, error, others or [])

    async def _arguments_to_call(self, run: HeldRun, call: CallState) -> dict[str, Any]:
        """`_arguments` of a dispatched call, about to be made. When they cannot be had (the
        blob store lost them, or the run was cancelled while they were read: a sibling call
        failed, a shutdown) the tool is not called, and the call is recorded as never ran
        (`_not_called`): left open, a resume would leave it to a person as one that may have
        run.

        Raises:
            HistoryUnavailableError: As `_arguments`.
        """
        try:
            return await self._arguments(run, call)
        except (Exception, asyncio.CancelledError):
            await self._not_called(run, [call])
            raise

    async def _arguments(self, run: HeldRun, call: CallState) -> dict[str, Any]:
        """The call's arguments as the model gave them: the log holds large ones out of line
        (`ClaimCheck.shrink`), and the frontier folds what the log holds.

        Raises:
            HistoryUnavailableError: They are in a blob store this runner has none of, or
                that no longer holds them.
        """
        claim_check = self.writer.claim_check
        if claim_check is not None:
            return await claim_check.arguments(call.args, run_id=run.run_id, seq=call.requested_seq)
        if is_reference(call.args):
            raise HistoryUnavailableError(
                f"run {run.run_id!r} seq {call.requested_seq}: the arguments of {call.call_id} "
                "are in a blob store and this runner has none; configure blobs=",
                run_id=run.run_id,
            )
        return unescaped(call.args)  # type: ignore[no-any-return]

    async def _record_outcome(
        self, run: HeldRun, call: CallState, result: Any, error: ToolError | None, others: list[str]
    ) -> ToolCompleted:
        """Record the outcome of a call whose tool returned (or raised): its effect is done.

        A result too large for the log (no blob store to take it) is refused as the call's
        outcome, and the model is told why, as an unencodable one is: not the call left
        undecided for a person, nor a retry-safe one made again at every resume. An outcome
        the log did not take is named in a warning before the error goes on, so the person
        who must then settle the call knows its tool returned."""
        completed = self.writer.event(
            run, ToolCompleted, call_id=call.call_id, result=result, error=error
        )
        settling = self._settling(run, others)
        try:
            await self.writer.append(run, [completed, *settling])
        except PayloadTooLargeError as exc:
            if result is None:
                raise
            error = ToolError(
                type="PayloadTooLarge",
                message=f"{call.tool} returned a value too large to record ({exc}); it was "
                "not recorded: return less, or give the runner a blob store (blobs=)",
            )
            completed = self.writer.event(run, ToolCompleted, call_id=call.call_id, error=error)
            await self.writer.append(run, [completed, *settling])
        except BackendError as exc:
            ended = (
                f"returned the error {error.type}: {one_line(error.message, 200)}"
                if error is not None
                else "returned a result"
            )
            _log.warning(
                "run %s: %s (%s) %s, but its outcome could not be recorded (%s); a person "
                "settling the call (`onward resolve`) can go by this",
                run.run_id,
                call.call_id,
                call.tool,
                ended,
                one_line(str(exc), 300),
            )
            raise
        return completed

    def _settling(self, run: HeldRun, others: list[str]) -> list[TurnSettled]:
        """`TurnSettled`, to go with the outcome of the one call of the turn still running,
        if ``others`` (the turn's other calls made with it) all have theirs recorded: nothing is
        left to wait for, and settling in the same batch writes one record batch fewer. A call
        that asked a question or was cut off undecided records nothing, so it holds the turn
        open here, and the runner goes on as it would have."""
        for call_id in others:
            state = run.frontier.call(call_id)
            if state is None or state.outcome is None:
                return []
        return [self._settled(run)]

    async def _cut_off(
        self, run: HeldRun, call: CallState, tool: Tool, failed: ToolError
    ) -> ToolError | CallState | None:
        """What a call that may or may not have taken effect comes to, now that it is over: cut
        off at its deadline, or its tool raised `OutcomeUnknownError` (``failed`` says which).

        Returns the error to record when it did not take effect (a retry-safe tool, or its
        status check says so: the model may ask again); ``None`` when its status check says it
        did (recorded here, with its result); the call itself when nobody can say.
        """
        _log.warning(
            "run %s: %s (%s) may or may not have taken effect: %s",
            run.run_id,
            call.call_id,
            call.tool,
            failed.message,
        )
        if tool.retry_safe:
            return failed
        answer = await self._status_after_cut_off(run, call, tool)
        if answer is None:
            return call
        if answer.outcome == "never_ran":
            return ToolError(
                type=failed.type,
                message=f"{failed.message}; its status check says it did not take effect",
            )
        await self._record_reconciled(run, call, answer)
        return None

    async def _status(self, run: HeldRun, call: CallState, tool: Tool) -> Reconciled | None:
        """`Tool.check_status` about ``call``, given as long as the lease's ttl to answer: a
        check that hangs (its service gone silent) must not keep the run, and its lease, for
        ever.

        Raises:
            BackendUnavailableError: It did not answer in time (retryable).
        """
        bound = self.lease_policy.ttl_s
        limit = asyncio.timeout(bound)
        try:
            async with limit:
                return await tool.check_status(call.idempotency_key, fence=run.fence)
        except TimeoutError as exc:
            if not limit.expired():
                raise
            raise BackendUnavailableError(
                f"run {run.run_id!r}: the status check of {call.call_id} ({call.tool}) did not "
                f"answer within {bound:g}s (the lease's ttl)",
                run_id=run.run_id,
            ) from exc

    async def _status_after_cut_off(
        self, run: HeldRun, call: CallState, tool: Tool
    ) -> Reconciled | None:
        """The status check's answer about a call cut off in this turn (`_status`). A check
        that fails or does not answer in time is no answer, and the call is left for a person:
        not a turn whose other calls are stopped mid-call by an error of this one's check."""
        try:
            return await self._status(run, call, tool)
        except Exception as exc:  # noqa: BLE001 - no answer: the call is left undecided
            why = tool_error(exc, self.writer.redactor).message
            _log.warning(
                "run %s: the status check of %s (%s) gave no answer: %s",
                run.run_id,
                call.call_id,
                call.tool,
                one_line(why, 300),
            )
            return None


TOO_DEEP_ARGUMENTS = "onward.too_deep"
"""The one key of the arguments recorded for a call whose own nest more than `MAX_DEPTH` levels
deep: the tool is not called, the call's outcome is a ``PayloadTooDeep`` error."""

UNENCODABLE_ARGUMENTS = "onward.unencodable"
"""The one key of the arguments recorded for a call whose own cannot be written as they are
(``nan``, which JSON would write as ``null``), holding why: the tool is not called, the call's
outcome is an ``UnencodableArguments`` error."""

RESERVED_PREFIX = "onward."
"""Ids Onward gives its own requests start with it (``onward.checkpoint:...``), so a model's
call id never does: one that would is rewritten."""


def _answered_seqs(carried: CarriedRun) -> set[int]:
    """The seqs of the run's counted model answers through its claim, from what a claim with
    the run's history (``history=True``) read anyway: its transcript, where every answer is
    an assistant's message and nothing else is, and its counted events after it. Of a claim
    without the history, empty whatever the run holds."""
    seqs = {row.seq for row in carried.transcript if row.message.role == "assistant"}
    seqs.update(s.event.seq for s in carried.events if isinstance(s.event, ModelAnswered))
    return seqs


def _unanswered(call: CallState, tool: Tool, exc: Exception, redactor: Redactor) -> ToolError:
    """The error of a call that may or may not have taken effect, if it did not."""
    if isinstance(exc, _DeadlinePassedError):
        took = f"{call.tool} took longer than its max_call_s of {tool.max_call_s:g}s"
        return ToolError(type="DeadlineExceeded", message=f"{took}; it was cut off")
    return tool_error(exc, redactor)


def _uncalled_error(call: CallState, tool: Tool, exc: Exception) -> ToolError:
    """The error of a call whose tool was not called: its arguments did not fit, or its
    deadline passed before it could start. It certainly did not take effect."""
    if isinstance(exc, _NotStartedError):
        return ToolError(
            type="DeadlineExceeded",
            message=f"{call.tool}'s deadline (its max_call_s of {tool.max_call_s:g}s) passed "
            "before it could start; it was not called",
        )
    return ToolError(type="InvalidArguments", message=str(exc))


def _disposition(run: HeldRun, call_id: str, undecided: CallState | None) -> str:
    """How a call the runner just made ended, from what its outcome folded into the run."""
    if undecided is not None:
        return "indeterminate"
    state = next((c for c in run.frontier.calls if c.call_id == call_id), None)
    if state is None or state.outcome is None:
        return "interrupted"
    if state.resolved_by == "reconcile" and state.outcome == "completed":
        return "reconciled"
    return "completed" if state.outcome == "completed" else "error"


def _keyed(run: HeldRun, call: ToolCall, index: int) -> ToolCall:
    """A model's call with a call id unique in the run and the idempotency key derived from it.

    The model's text may choose call ids (some providers let it), so a call id is the model's
    own only while it is a plain name outside Onward's namespace: one that starts with
    ``onward.`` (it could equal a checkpoint's request id, and so count as approved when a
    person answers the checkpoint), is too long or holds a control character is rewritten to
    ``call-<iteration>-<n>``. A tool name that is not a plain name is recorded escaped (no
    tool has that name: the call ends ``UnknownTool``), and arguments nested too deep are not
    recorded (`TOO_DEEP_ARGUMENTS`), nor are arguments the log cannot keep as they are
    (`UNENCODABLE_ARGUMENTS`): the tool would get ``null`` where the model gave ``nan``.
    """
    iteration = run.frontier.iteration + 1
    call_id = call.call_id or f"call-{iteration}"
    if call_id.startswith(RESERVED_PREFIX) or not _plain_name(call_id):
        call_id = f"call-{iteration}-{index + 1}"
    if call_id in run.conversation.call_ids:
        # Made unique however often the id repeats (a server giving every call of an answer
        # the same id): two calls under one id would fold into one call state, and one of
        # them would silently never run, the other sharing its idempotency key.
        call_id = _unused(call_id, f"~{iteration}", run.conversation.call_ids)
    run.conversation.call_ids.add(call_id)
    tool = call.tool if _plain_name(call.tool) else _escaped(call.tool)
    args = call.args
    if too_deep(args):
        args = {TOO_DEEP_ARGUMENTS: f"nested more than {MAX_DEPTH} levels deep; not recorded"}
    elif (fault := unencodable(args)) is not None:
        args = {UNENCODABLE_ARGUMENTS: fault}
    return msgspec.structs.replace(
        call,
        call_id=call_id,
        tool=tool,
        args=args,
        idempotency_key=idempotency_key(run.run_id, call_id),
    )


def _value_too_large(
    run_id: str, request_id: str, refused: PayloadTooLargeError
) -> PayloadTooLargeError:
    """The log's refusal of a person's answer, saying what applies to it: an answer's value is
    always written in line (a blob store never takes it), so only a smaller one will do."""
    measured = (
        f" ({refused.size} bytes with its record, over the log's limit of {refused.limit})"
        if refused.size is not None and refused.limit is not None
        else ""
    )
    return PayloadTooLargeError(
        f"run {run_id!r}: the value given with the answer to {request_id} is too large to "
        f"record{measured}; answer values are written in line, never to a blob store: give a "
        "smaller value (a reference to where the data is kept, say)",
        run_id=run_id,
        size=refused.size,
        limit=refused.limit,
    )


def _arguments_refused(call: CallState) -> ToolError | None:
    """The error a call ends with, its tool not called, when `_keyed` did not record the
    model's arguments (too deep, or not as they are); ``None`` when it did."""
    if TOO_DEEP_ARGUMENTS in call.args:
        return ToolError(
            type="PayloadTooDeep",
            message=f"the model's arguments nest more than {MAX_DEPTH} levels deep; "
            f"{call.tool} was not called",
        )
    if UNENCODABLE_ARGUMENTS in call.args:
        return ToolError(
            type="UnencodableArguments",
            message=f"the model's arguments cannot be recorded: "
            f"{call.args[UNENCODABLE_ARGUMENTS]}; {call.tool} was not called",
        )
    return None


def _reply_fault(reply: object) -> str | None:
    """Why a provider's answer is not a `ModelReply` the log can keep as it is, naming the
    field at fault (``Expected `int` >= 0 - at `$.usage.input_tokens```), or ``None``.

    A Struct is not checked when it is built, so a user-written provider can answer with a
    negative or fractional token count or a call whose ``args`` is a string; written, such an
    answer is refused by the log, and every resume would pay the model again to be refused
    again. Values JSON has no form for are left to `_message_fault` and `_keyed`."""
    if not isinstance(reply, ModelReply):
        return f"the provider answered with a {type(reply).__name__}, not a ModelReply"
    fault = _shape_fault(reply, ModelReply)
    if fault is None and isinstance(reply.usage, Usage):
        # Checked alone too: a reply holding a key JSON has no form for is not checked whole.
        fault = _shape_fault(reply.usage, Usage)
        fault = None if fault is None else fault.replace("`$", "`$.usage", 1)
    return None if fault is None else f"the provider's answer cannot be recorded: {fault}"


def _shape_fault(value: msgspec.Struct, kind: type[msgspec.Struct]) -> str | None:
    """Why ``value``, written and read back as ``kind``, is refused, or ``None``. A value
    JSON has no form for is written as ``null`` here: only the shape is checked."""
    try:
        msgspec.json.decode(_SHAPE_ENCODER.encode(value), type=kind)
    except msgspec.ValidationError as exc:
        return str(exc)
    except (TypeError, ValueError, OverflowError, RecursionError):
        return None
    return None


_SHAPE_ENCODER = msgspec.json.Encoder(enc_hook=lambda _: None)


def _message_fault(message: Message) -> str | None:
    """Why a model's message cannot be written as it is (`unencodable`), or ``None``. Text is
    always written as it is; only a message of parts is looked into."""
    content = message.content
    return None if isinstance(content, str) else unencodable(content)


def _unused(call_id: str, mark: str, taken: set[str]) -> str:
    """``call_id`` marked (``c~3``, then ``c~3-2``, ...) until no call of the run has it, cut
    to fit `MAX_NAME_LENGTH` so `resolve` and `approve` can still name it."""
    again = 1
    suffix = mark
    while (renamed := call_id[: MAX_NAME_LENGTH - len(suffix)] + suffix) in taken:
        again += 1
        suffix = f"{mark}-{again}"
    return renamed


def _plain_name(name: str) -> bool:
    try:
        check_name("name", name)
    except InvalidInputError:
        return False
    return True


def _escaped(name: str) -> str:
    """A name with its control characters escaped, cut to fit (``a\\x00b``)."""
    return name.encode("unicode_escape").decode("ascii")[:MAX_NAME_LENGTH] or "(empty)"


async def _all_or_none(calls: Iterable[Coroutine[Any, Any, _T]]) -> list[_T]:
    """Await a turn's calls together; if one fails, stop the others and wait until they have.

    The run's lease is released once the failure reaches the caller, and the next holder
    decides each call without an outcome (its status check, or a person): a sibling still
    running then would make its effect a second time beside the resumed one.
    """
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class _DeadlinePassedError(Exception):
    """A tool call was cut off at its deadline."""


class _NotStartedError(Exception):
    """A tool call's deadline had passed before it could start: it was not called."""


async def _within(calling: Coroutine[Any, Any, Any], deadline: int | None) -> Any:
    """Await a tool call, cut off at ``deadline`` (microseconds since the epoch) if it has one.

    The deadline is turned into the event loop's clock once, so a process paused past it
    (SIGSTOP, a long GC) finds the timer expired as soon as it runs again: the call is
    cancelled at its next await instead of going on to its effect. What the call raises is
    told apart by whether the deadline passed, not by its type: a `TimeoutError` of the tool's
    own before then is its failure, raised as any other; whatever it raises once cut off (its
    clean-up failing, say) is the cut-off. A call whose deadline passed before it could start
    (a slow dispatch write, a process paused before the call) is not started at all
    (`_NotStartedError`): it certainly did not take effect.
    """
    if deadline is None:
        return await cancelled_as_failure(calling)
    left = deadline / 1_000_000 - time.time()
    if left <= 0:
        # Started now, the call would run up to its first await (its effect, for a tool that
        # makes it before one) and be settled as cut off, left for a person, although nothing
        # of it could have taken effect before.
        calling.close()
        raise _NotStartedError
    timeout = asyncio.timeout(left)
    try:
        async with timeout:
            return await cancelled_as_failure(calling)
    except Exception as exc:
        if not timeout.expired():
            raise
        raise _DeadlinePassedError from exc


def _awaits_approval(run: HeldRun, call: CallState | ToolCall) -> bool:
    """Whether a call's tool needs a person's approval that the run has not been given."""
    tool = run.agent.tool(call.tool)
    return tool is not None and tool.requires_approval and call.call_id not in run.frontier.approved


def _deadline(run: HeldRun, call: CallState | ToolCall) -> int | None:
    """When a call of a tool with ``max_call_s`` is cut off, in microseconds since the epoch."""
    tool = run.agent.tool(call.tool)
    if tool is None or tool.max_call_s is None:
        return None
    return time.time_ns() // 1_000 + int(tool.max_call_s * 1_000_000)


async def _after_deadline(run: HeldRun, call: CallState) -> None:
    """Wait, saying until when, for a call's recorded deadline to pass: the holder it was
    dispatched under may be paused mid-call and could still make it take effect until then."""
    if call.deadline is None:
        return
    left = call.deadline / 1_000_000 - time.time()
    if left <= 0:
        return
    until = datetime.fromtimestamp(call.deadline / 1_000_000, UTC).isoformat(timespec="seconds")
    _log.warning(
        "run %s: waiting %.1fs, until %s, for the deadline of %s (%s) dispatched under fence "
        "%s before asking its status check",
        run.run_id,
        left,
        until,
        call.call_id,
        call.tool,
        call.dispatched_fence,
    )
    await asyncio.sleep(left)


def _check_encodable(field: str, value: Any, run_id: str) -> None:
    """Refuse a value that could not be written as it is (``nan`` would become ``null``).

    Raises:
        InvalidInputError: Naming the field and the path to the value at fault.
    """
    fault = unencodable(value)
    if fault is not None:
        raise InvalidInputError(f"{field} cannot be recorded: {fault}", run_id=run_id)


def _check_budget_options(options: Mapping[str, Any], run_id: str) -> None:
    """Refuse a budget option that is not whole micros of at least 0: the fold reads such a
    value as no budget (`run_budgets`), so the run would spend without the bound it was given.

    Raises:
        InvalidInputError: Naming the option and its value.
    """
    for name in ("budget_micros", "tenant_budget_micros"):
        budget = options.get(name)
        if budget is not None and (type(budget) is not int or budget < 0):
            raise InvalidInputError(
                f"options.{name} must be whole micros of at least 0, got {budget!r:.40}",
                run_id=run_id,
            )


def _check_run(run_id: str, tenant: str) -> None:
    """Refuse a run id or tenant no stored run has before anything is read or held: an
    existing run is named as it was stored (`check_stored_name`), which a producer writing
    to the log directly may have made out of a new name's bounds."""
    check_stored_name("run_id", run_id)
    check_stored_name("tenant", tenant, run_id=run_id)


def _check_not_graph_thread(frontier: Frontier, request_id: str) -> None:
    """Refuse an answer to a LangGraph thread (a run with no agent of Onward's own).

    Its interrupt is answered by resuming the graph, which reads its answer from its own
    writes and never from an `ApprovalGranted` written here: recorded, the answer would be
    lost, and the thread would stop looking waiting while the graph still waits.
    """
    if not frontier.agent:
        raise InvalidInputError(
            f"run {frontier.run_id!r} is a LangGraph thread: answer {request_id!r} by resuming "
            "the graph with Command(resume={interrupt_id: value}) (the id after 'langgraph:'), "
            "or end it with onward cancel; an answer recorded here would never reach the "
            "graph. Nothing was written",
            run_id=frontier.run_id,
        )


def check_invocation_to_end(frontier: Frontier) -> None:
    """Refuse to cancel a LangGraph thread nobody is writing and no interrupt holds.

    A cancel ends one invocation of a thread, not the thread: between invocations (the last
    one completed, or ended without its end heard) there is none to end, and a cancelled end
    recorded then would report an invocation cancelled that completed.
    """
    if not frontier.agent and frontier.status != "waiting":
        raise InvalidInputError(
            f"run {frontier.run_id!r} is a LangGraph thread no graph run is writing now: its "
            "last invocation is over, and a cancel ends one invocation, not the thread. "
            "Nothing was written",
            run_id=frontier.run_id,
        )


def _check_waiting(frontier: Frontier, request_id: str) -> None:
    """Refuse an answer to a request the run does not wait on now.

    A run that ended is refused first, whatever request its frontier still names (a row
    folded before the end cleared it): a grant written after a cancel would have the fold
    make the run ``running`` again, and the next resume carry on what a person stopped.
    """
    if frontier.finished:
        raise InvalidInputError(
            f"run {frontier.run_id!r} has ended already ({frontier.status}); "
            f"{request_id!r} can no longer be answered",
            run_id=frontier.run_id,
        )
    if frontier.waiting_on != request_id:
        waiting = frontier.waiting_on
        raise InvalidInputError(
            f"run {frontier.run_id!r} is not waiting on {request_id!r}"
            + (f" (it waits on {waiting!r})" if waiting else " (it waits on nothing)")
            + "; it may have been answered already",
            run_id=frontier.run_id,
        )


def _needs_dispatch(call: CallState, fence: int) -> bool:
    """Not yet dispatched, or dispatched by an earlier holder and planned to run again."""
    return call.dispatched_seq is None or (
        call.dispatched_fence is not None and call.dispatched_fence < fence
    )


__all__ = ["AgentRunner", "RunObserver", "RunResult"]
