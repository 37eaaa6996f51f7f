"""`AgentRunner`: the agent loop, written ahead to the log, and resume.

One iteration: call the model and append `ModelAnswered`; append `ToolDispatched` for every
call of the answer as one batch, acknowledged by the log before any tool runs; run the tools
(concurrently), appending each `ToolCompleted` as it returns; append `TurnSettled`. A call whose
tool needs a person appends `ApprovalRequested` first and the run stops, waiting.

If `ToolDispatched` cannot be written the tool is not called. If the process dies anywhere,
`resume` folds the log, claims the run under a higher fence, plans every outstanding call
(`plan_resume`), records the plan as `ResumePlanned`, and carries on; a call that may or may
not have run is never dispatched again unless its tool says that is harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

import msgspec

from onward.errors import (
    ConfigurationError,
    FencedError,
    InvalidInputError,
    NothingToResumeError,
    RevisionMismatchError,
)
from onward.eventlog.base import EventLog, SequenceGuard, StoredEvent
from onward.eventlog.events import (
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    Event,
    Message,
    ModelAnswered,
    ResumePlanned,
    RunClaimed,
    RunFinished,
    RunStarted,
    ToolCall,
    ToolCompleted,
    ToolDispatched,
    ToolError,
    ToolResolved,
    TurnSettled,
)
from onward.projections.base import FrontierStore
from onward.projections.frontier import CallState, Frontier, fold

from .agent import Agent
from .blobs import BlobStore, ClaimCheck
from .checkpoint import Checkpointer, CheckpointPolicy
from .leases.base import LeasePolicy, LeaseStore, RunLease
from .leases.holder import Leaseholder
from .providers import Provider
from .redaction import Redactor
from .resume import ResumePlan, outstanding_ids, plan_resume, refuse_if_undecidable
from .resumer import Resumer
from .tools import ToolArgumentsError, idempotency_key, tool_error

_E = TypeVar("_E", bound=Event)
TERMINAL = frozenset({"completed", "failed", "cancelled", "continued"})


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


@dataclass(frozen=True, slots=True)
class RunResult:
    """Where a run stands after `run` or `resume` returns.

    Attributes:
        status: ``completed``, ``failed``, ``cancelled``, ``waiting`` (on a person), or
            ``continued``.
        plan: What resume decided, when this came from a resume that carried on.
    """

    run_id: str
    tenant: str
    status: str
    output: Any = None
    error: str | None = None
    iteration: int = 0
    fence: int = 0
    waiting_on: str | None = None
    plan: ResumePlan | None = None
    reconciled: tuple[str, ...] = ()


@dataclass
class _Run:
    """One run held by this process: what it has written and how to write more."""

    agent: Agent
    run_id: str
    tenant: str
    fence: int
    frontier: Frontier
    messages: list[Message]
    call_ids: set[str] = field(default_factory=set)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    held: Leaseholder | None = None


def _default_worker() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class AgentRunner:
    """Runs agents on any `EventLog`, writing every fact ahead of acting on it.

    Args:
        provider: The model.
        log: Where every event goes.
        frontiers: The frontier store. With ``checkpoint_inline`` (embedded mode) the runner folds
            into it after each boundary; with a projector running elsewhere it is left to that.
        checkpoints: Which boundaries the inline checkpointer folds at.
        checkpoint_inline: Fold into ``frontiers`` from this process (embedded mode).
        redactor: Masks secrets before anything is encoded; ``Redactor(enabled=False)`` only
            where every store is already trusted.
        blobs: Where bodies too large for one log record go (claim check).
        worker: This worker's name in `RunClaimed` and in the lease store.
        observer: Sees each append and each tool return.
        leases: Who holds which run. Every append is made under a lease and carries its fence;
            without a lease store there is no mutual exclusion (one worker per run, by hand),
            and starting a run reads its partition to refuse a reused id.
        lease_policy: The lease's ttl and renewal margin.
    """

    def __init__(
        self,
        *,
        provider: Provider,
        log: EventLog,
        frontiers: FrontierStore | None = None,
        checkpoints: CheckpointPolicy | None = None,
        checkpoint_inline: bool = False,
        redactor: Redactor | None = None,
        blobs: BlobStore | None = None,
        worker: str | None = None,
        observer: RunObserver | None = None,
        leases: LeaseStore | None = None,
        lease_policy: LeasePolicy | None = None,
    ) -> None:
        if checkpoint_inline and frontiers is None:
            raise ConfigurationError("checkpoint_inline needs a frontier store")
        self.provider = provider
        self.log = log
        self.frontiers = frontiers
        self.checkpointer = (
            Checkpointer(frontiers, log, policy=checkpoints)
            if checkpoint_inline and frontiers is not None
            else None
        )
        self.redactor = redactor or Redactor()
        self.claim_check = ClaimCheck(blobs) if blobs is not None else None
        self.worker = worker or _default_worker()
        self.observer = observer
        self.leases = leases
        self.lease_policy = lease_policy or LeasePolicy()

    # -- starting and resuming ---------------------------------------------------------------

    async def run(
        self, agent: Agent, input: Any, *, tenant: str, run_id: str | None = None
    ) -> RunResult:
        """Start a run and drive it until it finishes or waits on a person."""
        run_id = run_id or f"run-{uuid.uuid4().hex}"
        async with self._holding(run_id, tenant, self.worker) as held:
            # A lease store that never saw the id (fence 1) proves the run is new without reading
            # its partition, which on Kafka means every other run's records since the start.
            if (held is None or held.lease.fence > 1) and await self.log.read_run(run_id):
                raise InvalidInputError(f"run {run_id!r} already exists; resume it instead")
            run = _Run(
                agent,
                run_id,
                tenant,
                fence=held.lease.fence if held else 1,
                frontier=Frontier.empty(run_id, tenant),
                messages=[Message(role="system", content=agent.instructions)],
                held=held,
            )
            await self._append(
                run,
                [
                    self._event(
                        run,
                        RunStarted,
                        0,
                        agent=agent.name,
                        revision=agent.revision,
                        input=input,
                    )
                ],
            )
            return await self._drive(run)

    @contextlib.asynccontextmanager
    async def _holding(
        self, run_id: str, tenant: str, holder: str, lease: RunLease | None = None
    ) -> AsyncIterator[Leaseholder | None]:
        """Hold the run's lease for the block (renewed in the background), if there is a store."""
        if self.leases is None:
            yield None
            return
        async with Leaseholder(
            self.leases, run_id, tenant=tenant, holder=holder, policy=self.lease_policy, lease=lease
        ) as held:
            yield held

    async def resume(self, agent: Agent, run_id: str, *, tenant: str) -> RunResult:
        """Carry a run on from the log: claim it, plan its outstanding calls, drive it.

        Raises:
            NothingToResumeError: No run under that id for that tenant.
            RevisionMismatchError: ``agent`` is not the revision the run started with.
            IndeterminateToolCallError: A call may or may not have run; a person must settle it.
            CheckpointFormatError: The run was written by a newer Onward.
        """
        if self.leases is not None:
            return await self._resume_leased(agent, run_id, tenant)
        run = await self._load(agent, run_id, tenant)
        if _settled(run.frontier):
            return self._result(run)
        run.fence = run.frontier.fence + 1
        await self._append(run, [self._event(run, RunClaimed, 0, worker=self.worker)])
        return await self._carry_on(run)

    async def _resume_leased(self, agent: Agent, run_id: str, tenant: str) -> RunResult:
        """Resume under a lease: take it first, then claim, fold the tail, plan (`Resumer`)."""
        assert self.leases is not None
        resumer = Resumer(self.log, self.leases, self.frontiers, policy=self.lease_policy)
        carried = await resumer.resume(agent, run_id, tenant=tenant, worker=self.worker)
        async with self._holding(run_id, tenant, self.worker, lease=carried.lease) as held:
            run = await self._conversation(agent, run_id, tenant, carried.frontier)
            run.fence = carried.lease.fence
            run.held = held
            if _settled(run.frontier):
                return self._result(run)
            return await self._carry_on(run)

    async def _carry_on(self, run: _Run) -> RunResult:
        """Plan the claimed run's outstanding calls, record the plan, and drive it on."""
        plan, reconciled = await self._plan(run)
        await self._append(
            run,
            [
                self._event(
                    run,
                    ResumePlanned,
                    0,
                    replayed=outstanding_ids(plan.completed),
                    dispatched=outstanding_ids(plan.to_dispatch),
                    undecided=outstanding_ids(plan.indeterminate),
                    reason="; ".join(plan.describe()),
                )
            ],
        )
        refuse_if_undecidable(plan)
        result = await self._drive(run)
        return dataclasses.replace(result, plan=plan, reconciled=tuple(reconciled))

    async def _plan(self, run: _Run) -> tuple[ResumePlan, list[str]]:
        """Plan, asking each undecided call's tool once (`reconcile`) and recording its answer.

        Returns the plan and the calls the tools' status checks settled.
        """
        plan = plan_resume(run.frontier, run.agent)
        reconciled: list[str] = []
        for call in plan.indeterminate:
            tool = run.agent.tool(call.tool)
            if tool is None or tool.reconcile is None:
                continue
            answer = await tool.reconcile(call.idempotency_key)
            if answer is None:
                continue
            await self._append(
                run,
                [
                    self._event(
                        run,
                        ToolResolved,
                        0,
                        call_id=call.call_id,
                        outcome=answer.outcome,
                        result=answer.result,
                        by="reconcile",
                        why=f"{call.tool}'s status check answered {answer.outcome}",
                    )
                ],
            )
            reconciled.append(call.call_id)
        return plan_resume(run.frontier, run.agent), reconciled

    async def _load(self, agent: Agent | None, run_id: str, tenant: str) -> _Run:
        """Fold a run's whole history from the log into a `_Run` held by nobody yet."""
        stored = await self.log.read_run(run_id)
        guard = SequenceGuard()
        admitted = guard.admit_all(stored)
        if not admitted or admitted[0].event.tenant != tenant:
            raise NothingToResumeError(
                f"no run {run_id!r} for tenant {tenant!r}; check the id and tenant",
                run_id=run_id,
            )
        frontier = Frontier.empty(run_id, tenant)
        for item in stored:
            frontier = fold(frontier, item)
        if agent is not None and frontier.revision != agent.revision:
            raise RevisionMismatchError(
                f"run {run_id!r} started with agent revision {frontier.revision}, the agent "
                f"passed in is {agent.revision}; resume it with the definition it started with",
                run_id=run_id,
            )
        return await self._conversation(agent, run_id, tenant, frontier, admitted)

    async def _conversation(
        self,
        agent: Agent | None,
        run_id: str,
        tenant: str,
        frontier: Frontier,
        admitted: Sequence[StoredEvent] | None = None,
    ) -> _Run:
        """A `_Run` with the conversation the model saw, rebuilt from the run's counted events."""
        if admitted is None:
            admitted = SequenceGuard().admit_all(await self.log.read_run(run_id))
        used_agent = agent if agent is not None else Agent(name=frontier.agent, instructions="")
        run = _Run(used_agent, run_id, tenant, frontier.fence, frontier, messages=[])
        run.messages = [Message(role="system", content=used_agent.instructions)]
        for item in admitted:
            self._remember(run, await self._restore(item.event))
        return run

    async def inspect(self, run_id: str, *, tenant: str) -> Frontier:
        """The run's frontier, folded from the log. Takes no lease and writes nothing."""
        return (await self._load(None, run_id, tenant)).frontier

    # -- what people do ----------------------------------------------------------------------

    async def approve(
        self, run_id: str, request_id: str, *, tenant: str, by: str, value: Any = None
    ) -> None:
        """Answer a run's approval request with yes; a later resume carries the run on."""
        async with self._as_person(run_id, tenant, by) as run:
            _check_waiting(run, request_id)
            await self._append(
                run,
                [self._event(run, ApprovalGranted, 0, request_id=request_id, by=by, value=value)],
            )

    async def deny(
        self, run_id: str, request_id: str, *, tenant: str, by: str, value: Any = None
    ) -> None:
        """Answer a run's approval request with no; the run ends, cancelled."""
        async with self._as_person(run_id, tenant, by) as run:
            _check_waiting(run, request_id)
            await self._append(
                run,
                [
                    self._event(run, ApprovalDenied, 0, request_id=request_id, by=by, value=value),
                    self._event(
                        run,
                        RunFinished,
                        1,
                        status="cancelled",
                        error=f"approval {request_id} denied by {by}",
                    ),
                ],
            )

    @contextlib.asynccontextmanager
    async def _as_person(self, run_id: str, tenant: str, by: str) -> AsyncIterator[_Run]:
        """A person's append: take the lease (a waiting run has no holder), read, write, release.

        Two people answering one request cannot both win: the second waits for or is refused
        the lease, and then finds the request already answered.
        """
        holder = f"person:{by}"
        if self.leases is None:
            run = await self._load(None, run_id, tenant)
            run.fence = run.frontier.fence + 1
            yield run
            return
        async with self._holding(run_id, tenant, holder) as held:
            assert held is not None
            run = await self._load(None, run_id, tenant)
            run.fence = held.lease.fence
            run.held = held
            yield run

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
        """Settle an undecided call as a person: it completed (with its result) or never ran."""
        async with self._as_person(run_id, tenant, by) as run:
            call = run.frontier.call(call_id)
            if call is None or call.outcome is not None:
                raise InvalidInputError(
                    f"run {run_id!r} has no undecided call {call_id!r}"
                    + (f" (it is {call.outcome})" if call and call.outcome else ""),
                    run_id=run_id,
                )
            await self._append(
                run,
                [
                    self._event(
                        run,
                        ToolResolved,
                        0,
                        call_id=call_id,
                        outcome=outcome,
                        result=result,
                        by=by,
                        why=why,
                    )
                ],
            )

    # -- the loop ----------------------------------------------------------------------------

    async def _drive(self, run: _Run) -> RunResult:
        while run.frontier.status not in TERMINAL and run.frontier.status != "waiting":
            if run.frontier.calls:
                if not await self._run_turn(run):
                    break
                continue
            if run.frontier.iteration >= run.agent.max_iterations:
                await self._append(
                    run,
                    [
                        self._event(
                            run,
                            RunFinished,
                            0,
                            status="failed",
                            error=f"stopped after max_iterations={run.agent.max_iterations}",
                        )
                    ],
                )
                break
            await self._model_step(run)
        return self._result(run)

    async def _model_step(self, run: _Run) -> None:
        if self.observer is not None:
            await self.observer.before_model_call()
        reply = await self.provider.complete(run.agent, list(run.messages))
        calls = [self._keyed(run, call) for call in reply.tool_calls]
        answered = self._event(
            run, ModelAnswered, 0, message=reply.message, tool_calls=calls, usage=reply.usage
        )
        if calls:
            await self._append(run, [answered])
            return
        finished = self._event(
            run, RunFinished, 1, status="completed", output=reply.message.content
        )
        await self._append(run, [answered, finished])

    def _keyed(self, run: _Run, call: ToolCall) -> ToolCall:
        call_id = call.call_id or f"call-{run.frontier.iteration + 1}"
        if call_id in run.call_ids:
            call_id = f"{call_id}~{run.frontier.iteration + 1}"
        run.call_ids.add(call_id)
        return msgspec.structs.replace(
            call, call_id=call_id, idempotency_key=idempotency_key(run.run_id, call_id)
        )

    async def _run_turn(self, run: _Run) -> bool:
        """Dispatch and settle the open turn. False if the run now waits on a person."""
        pending = [
            c
            for c in run.frontier.calls
            if c.outcome in (None, "never_ran") and _needs_dispatch(c, run)
        ]
        for call in pending:
            tool = run.agent.tool(call.tool)
            if (
                tool is not None
                and tool.requires_approval
                and call.call_id not in run.frontier.approved
            ):
                await self._append(
                    run,
                    [
                        self._event(
                            run,
                            ApprovalRequested,
                            0,
                            request_id=call.call_id,
                            prompt=f"allow {call.tool} with {_as_text(call.args)}?",
                            details={"tool": call.tool, "args": call.args},
                        )
                    ],
                )
                return False
        if pending:
            # Write-ahead: every dispatch of the turn is durable before any tool is called.
            await self._append(
                run,
                [
                    self._event(
                        run,
                        ToolDispatched,
                        i,
                        call_id=c.call_id,
                        tool=c.tool,
                        idempotency_key=c.idempotency_key,
                    )
                    for i, c in enumerate(pending)
                ],
            )
            if run.held is not None:
                # The last word before side effects: a holder paused past its ttl finds out here.
                await run.held.confirm()
            await asyncio.gather(*(self._call_tool(run, c) for c in pending))
        settled = run.frontier.calls
        await self._append(
            run,
            [
                self._event(
                    run,
                    TurnSettled,
                    0,
                    iteration=run.frontier.iteration,
                    call_ids=[c.call_id for c in settled],
                )
            ],
        )
        return True

    async def _call_tool(self, run: _Run, call: CallState) -> None:
        tool = run.agent.tool(call.tool)
        result: Any = None
        error: ToolError | None = None
        if tool is None:
            error = ToolError(type="UnknownTool", message=f"the agent has no tool {call.tool!r}")
        else:
            try:
                result = await tool.call(call.args, idempotency_key=call.idempotency_key)
            except ToolArgumentsError as exc:
                error = ToolError(type="InvalidArguments", message=str(exc))
            except Exception as exc:  # noqa: BLE001 - a tool's failure is recorded, not raised
                error = tool_error(exc)
        if self.observer is not None:
            await self.observer.tool_returned(call.call_id)
        await self._append(
            run,
            [self._event(run, ToolCompleted, 0, call_id=call.call_id, result=result, error=error)],
        )

    # -- writing -----------------------------------------------------------------------------

    def _event(self, run: _Run, kind: type[_E], offset: int, **fields: Any) -> _E:
        """An event of ``run`` with its envelope; ``offset`` counts within one batch."""
        return kind(
            run_id=run.run_id,
            tenant=run.tenant,
            seq=run.frontier.last_seq + 1 + offset,
            fence=run.fence,
            at=time.time_ns() // 1_000,
            **fields,
        )

    async def _append(self, run: _Run, events: list[Event]) -> None:
        """Mask, size, append and fold a batch of one run, in this run's order."""
        async with run.lock:
            if run.held is not None:
                await run.held.check()
            base = run.frontier.last_seq + 1
            batch = [
                msgspec.structs.replace(e, seq=base + i) if e.seq != base + i else e
                for i, e in enumerate(events)
            ]
            batch = [self.redactor.redact_event(e) for e in batch]
            if self.claim_check is not None:
                batch = [await self.claim_check.shrink(e) for e in batch]
            positions = await self.log.append(batch)
            frontier = run.frontier
            for event, position in zip(batch, positions, strict=True):
                frontier = fold(frontier, StoredEvent(position, event))  # type: ignore[arg-type]
            if frontier.refused > run.frontier.refused:
                raise FencedError(
                    f"run {run.run_id!r}: this worker's writes under fence {run.fence} were "
                    f"refused ({frontier.last_refusal}); another worker holds the run",
                    run_id=run.run_id,
                )
            run.frontier = frontier
            for event in events:
                self._remember(run, event)
            if self.checkpointer is not None:
                await self.checkpointer.after_append(batch, positions)
            if self.observer is not None:
                await self.observer.appended(batch)

    async def _restore(self, event: Event) -> Event:
        if self.claim_check is None:
            return event
        return await self.claim_check.restore(event)

    def _remember(self, run: _Run, event: Event) -> None:
        """Keep the conversation the model sees in step with the log."""
        if isinstance(event, RunStarted):
            run.messages.append(Message(role="user", content=_as_text(event.input)))
        elif isinstance(event, ModelAnswered):
            content: str | list[Any] = event.message.content
            if event.tool_calls:
                parts: list[Any] = list(content) if isinstance(content, list) else []
                if isinstance(content, str) and content:
                    parts.append({"type": "text", "text": content})
                parts.append(
                    {
                        "type": "tool_calls",
                        "tool_calls": [
                            {"id": c.call_id, "name": c.tool, "arguments": c.args}
                            for c in event.tool_calls
                        ],
                    }
                )
                content = parts
            run.messages.append(Message(role="assistant", content=content))
            run.call_ids.update(c.call_id for c in event.tool_calls)
        elif isinstance(event, ToolCompleted):
            body = (
                event.result if event.error is None else {"error": msgspec.to_builtins(event.error)}
            )
            run.messages.append(
                Message(role="tool", content=_as_text(body), tool_call_id=event.call_id)
            )
        elif isinstance(event, ToolResolved) and event.outcome == "completed":
            run.messages.append(
                Message(role="tool", content=_as_text(event.result), tool_call_id=event.call_id)
            )

    def _result(self, run: _Run) -> RunResult:
        f = run.frontier
        return RunResult(
            run_id=f.run_id,
            tenant=f.tenant,
            status=f.status,
            output=f.output,
            error=f.error,
            iteration=f.iteration,
            fence=f.fence,
            waiting_on=f.waiting_on,
        )


def _settled(frontier: Frontier) -> bool:
    """Nothing to carry on: the run ended, or it waits on a person who has not answered."""
    return frontier.status in TERMINAL or (
        frontier.status == "waiting" and frontier.waiting_on is not None
    )


def _check_waiting(run: _Run, request_id: str) -> None:
    if run.frontier.waiting_on != request_id:
        waiting = run.frontier.waiting_on
        raise InvalidInputError(
            f"run {run.run_id!r} is not waiting on {request_id!r}"
            + (f" (it waits on {waiting!r})" if waiting else " (it waits on nothing)")
            + "; it may have been answered already",
            run_id=run.run_id,
        )


def _needs_dispatch(call: CallState, run: _Run) -> bool:
    """Not yet dispatched, or dispatched by an earlier holder and planned to run again."""
    return call.dispatched_seq is None or (
        call.dispatched_fence is not None and call.dispatched_fence < run.fence
    )


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return msgspec.json.encode(value).decode()


def summarize(frontier: Frontier) -> Mapping[str, Any]:
    """The facts `inspect` prints about a run."""
    return {
        "run": frontier.run_id,
        "tenant": frontier.tenant,
        "agent": frontier.agent,
        "revision": frontier.revision,
        "status": frontier.status,
        "iteration": frontier.iteration,
        "usage": f"{frontier.input_tokens} in, {frontier.output_tokens} out",
        "fence": frontier.fence,
        "waiting_on": frontier.waiting_on,
        "outstanding": [
            f"{c.call_id} {c.tool} "
            + (c.outcome or ("dispatched" if c.dispatched_seq else "not dispatched"))
            for c in frontier.calls
        ],
    }
