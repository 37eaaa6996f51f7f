"""Driving pydantic-ai runs as Onward runs: under the run's lease, from its journal.

Starting a run takes its lease, records ``RunStarted`` and executes the agent. Resuming one
takes the lease through the `Resumer` (which claims the run under a higher fence and plans every
call outstanding), records the plan as ``ResumePlanned``, reads the run's counted events, and
executes the agent again from its start against them (`RunJournal`): what happened is replayed,
what did not happens now.

An execution is one or more pydantic-ai runs. When one ends with ``DeferredToolRequests`` (calls
that need approval, or calls Onward cannot tell ran), the Onward run waits on a person
(``ApprovalRequested``, its details the requests). Their decision (``ApprovalGranted``, its value
the ``DeferredToolResults``) is what the next pydantic-ai run continues with, as pydantic-ai
continues any deferred run: the previous messages plus the results.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

import pydantic
from pydantic_ai.agent import AbstractAgent
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied
from pydantic_core import PydanticSerializationError, to_jsonable_python

from onward.errors import (
    ConfigurationError,
    HistoryUnavailableError,
    InvalidInputError,
    LogTruncatedError,
    OnwardError,
    PayloadTooLargeError,
)
from onward.eventlog import (
    ApprovalDenied,
    ApprovalRequested,
    Event,
    ModelAnswered,
    ResumePlanned,
    RunFinished,
    RunStarted,
    SequenceGuard,
)
from onward.projections.compaction.history import read_whole_run
from onward.projections.frontier import Frontier
from onward.runtime.agent import Agent
from onward.runtime.blobs import output_of
from onward.runtime.conversation import Conversation
from onward.runtime.leases.holder import Leaseholder
from onward.runtime.limits import MAX_NOTE_LENGTH, check_name, check_stored_name
from onward.runtime.planning import ResumePlan
from onward.runtime.runner import AgentRunner
from onward.runtime.spend.budget import Budgets
from onward.runtime.tools import tool_error
from onward.runtime.writer import HeldRun

from .journal import RunCancelled, RunJournal, RunSpend, RunSuspended

_REQUESTS = pydantic.TypeAdapter(DeferredToolRequests)
_RESULTS = pydantic.TypeAdapter(DeferredToolResults)

DECISION = "decision"
"""The name of the waits a run opens when pydantic-ai hands back ``DeferredToolRequests``."""


@dataclass(frozen=True, slots=True)
class DurableRunResult:
    """Where a run stands after it was started or resumed.

    Attributes:
        status: ``completed``, ``failed``, ``cancelled`` or ``waiting`` (on a person).
        output: The agent's output once completed; the ``DeferredToolRequests`` to decide
            while it waits on a decision.
        waiting_on: The request a person answers (`OnwardDurability.decide`).
        result: pydantic-ai's result of its last run, when one ran to its end in this process.
        plan: What resume decided for the calls outstanding, when this came from a resume.
    """

    run_id: str
    status: str
    output: Any = None
    error: str | None = None
    waiting_on: str | None = None
    result: Any = None
    plan: ResumePlan | None = None

    @classmethod
    def settled(cls, frontier: Frontier) -> DurableRunResult:
        """The result of a run there was nothing to carry on of."""
        return cls(
            frontier.run_id,
            frontier.status,
            frontier.output,
            frontier.error,
            frontier.waiting_on,
        )


@dataclass(frozen=True, slots=True)
class Pending:
    """What a waiting run waits for.

    Attributes:
        request_id: The approval request the answer goes to.
        requests: The tool calls to decide, when pydantic-ai handed them back.
        details: The request's details as recorded.
    """

    run_id: str
    request_id: str
    requests: DeferredToolRequests | None
    details: Any


class _ModelOfTheFramework:
    """The provider slot of the runner that writes for pydantic-ai: pydantic-ai asks its model."""

    async def complete(self, agent: Agent, messages: Sequence[Any]) -> Any:
        raise RuntimeError("pydantic-ai asks its own model; this runner only records answers")


class DurableRuns:
    """Starts, resumes and answers pydantic-ai runs on Onward's stores.

    Args:
        runner_options: What an `AgentRunner` takes besides its provider: the log, leases,
            frontier store, blobs, redactor, worker name, lease policy.
        tenant: The tenant every run belongs to. Its runs may be stored already under it
            (`check_stored_name`); a new run is held to `check_name` when it is started.
    """

    def __init__(self, *, tenant: str, **runner_options: Any) -> None:
        self.tenant = check_stored_name("tenant", tenant)
        try:
            self.runner = AgentRunner(provider=_ModelOfTheFramework(), **runner_options)
        except TypeError as exc:
            raise ConfigurationError(f"OnwardDurability: {exc}") from exc

    async def start(
        self,
        agent: AbstractAgent[Any, Any],
        described: Agent,
        user_prompt: str | None,
        run_id: str | None,
        options: Mapping[str, Any],
        *,
        budgets: Budgets | None = None,
    ) -> DurableRunResult:
        """Record a new run, with its own budgets if any, and execute the agent on it.

        Raises:
            ConfigurationError: A budget is set and this runner has no spend ledger, or no
                price for the agent's model (nothing is written).
        """
        if user_prompt is not None and not isinstance(user_prompt, str):
            raise InvalidInputError(
                f"a durable run's prompt is text (it is recorded and fed again on resume), "
                f"not {type(user_prompt).__name__}"
            )
        # Only an omitted id is made up: an empty one is refused, as `Options` refuses it.
        run_id = check_name("run_id", f"run-{uuid.uuid4().hex}" if run_id is None else run_id)
        check_name("tenant", self.tenant, run_id=run_id)
        budgets = budgets or Budgets()
        self.runner.check_budgets(described, budgets, run_id)
        named = {"budget_micros": budgets.run_micros, "tenant_budget_micros": budgets.tenant_micros}
        # Executed again from its first event on resume: compaction keeps them all.
        recorded: dict[str, Any] = {"replays": True}
        recorded.update({name: budget for name, budget in named.items() if budget is not None})
        # Before the lease: a start under another tenant's run id must not hold that run.
        await self.runner.resumer.refuse_stored(run_id, self.tenant)
        async with self._holding(run_id) as held:
            await self.runner.resumer.refuse_existing(run_id, held.lease)
            run = HeldRun(described, held, Frontier.empty(run_id, self.tenant), Conversation(""))
            writer = self.runner.writer
            started = writer.event(
                run,
                RunStarted,
                agent=described.name,
                revision=described.revision,
                input=user_prompt,
                options=recorded,
            )
            await writer.append(run, [started])
            journal = RunJournal(run, writer, [started], spend=RunSpend(self.runner, budgets))
            return await self._execute(agent, journal, options)

    async def resume(
        self,
        agent: AbstractAgent[Any, Any],
        described: Agent,
        run_id: str,
        options: Mapping[str, Any],
    ) -> DurableRunResult:
        """Claim a run, plan its outstanding calls, and execute the agent again from its start.

        Raises:
            ResumeConflictError: Another worker holds the run (nothing was read).
            NothingToResumeError: No such run for this tenant.
            RevisionMismatchError: The agent's tools or model are not the ones the run started with.
            HistoryUnavailableError: The run's events are no longer all in the log.
            InvalidInputError: The run id is no name a stored run has (`check_stored_name`).
        """
        # Named as stored, before any store is asked (PostgreSQL would report a NUL as its own
        # fault, and a lone surrogate failed to encode).
        check_stored_name("run_id", run_id)
        # Before the lease: another tenant's resume must not hold the run, nor raise its fence.
        await self.runner.resumer.refuse_another_tenants(run_id, self.tenant)
        async with self._holding(run_id) as held:
            carried = await self.runner.resumer.claim(described, held, worker=self.runner.worker)
            if not carried.claimed:
                await self.runner.record_answers_left(described, carried.frontier)
                run = HeldRun(described, held, carried.frontier, Conversation(""))
                # Released as it is, the lease would drop a cancel ask it heard, and a run
                # waiting on a person go on once a person decided.
                await self.runner.answer_ask_left(run)
                return await self._as_it_stands(run.frontier)
            # A holder that died mid-call left its call held: that call is not being made any
            # more (its answer, had it come, was recorded).
            await self.runner.release_holds_left(run_id)
            events = await self._events(carried.frontier)
            # The run is executed from its first event, so its answers are known without
            # reading the log again: it is read only when one of them has no entry.
            answered = [e.seq for e in events if isinstance(e, ModelAnswered)]
            await self.runner.record_answers_left(described, carried.frontier, answered)
            budgets = Budgets.of_run(described, carried.frontier)
            self.runner.check_budgets(described, budgets, run_id)
            run = HeldRun(described, held, carried.frontier, Conversation(""))
            journal = RunJournal(
                run, self.runner.writer, events, spend=RunSpend(self.runner, budgets)
            )
            await journal.append(journal.event(ResumePlanned, **carried.plan.recorded()))
            outcome = await self._execute(agent, journal, options)
            return dataclasses.replace(outcome, plan=carried.plan)

    async def _as_it_stands(self, frontier: Frontier) -> DurableRunResult:
        """A run there was nothing to carry on of; one that waits, with what it waits on as
        its output (the calls to decide), as the execution that began the wait returned it."""
        settled = DurableRunResult.settled(frontier)
        if frontier.output is not None:
            output = await output_of(frontier, self.runner.writer.claim_check)
            settled = dataclasses.replace(settled, output=output)
        if frontier.status != "waiting" or frontier.waiting_on is None:
            return settled
        details = _details_of(await self._events(frontier), frontier.waiting_on)
        return dataclasses.replace(settled, output=_requests_in(details) or details)

    async def pending(self, run_id: str) -> Pending:
        """What the run waits for.

        Raises:
            InvalidInputError: The run waits on nothing.
        """
        return (await self._pending(run_id))[0]

    async def _pending(self, run_id: str) -> tuple[Pending, Frontier]:
        frontier = await self.runner.inspect(run_id, tenant=self.tenant)
        if frontier.status != "waiting" or frontier.waiting_on is None:
            raise InvalidInputError(
                f"run {run_id!r} is {frontier.status} and waits on nothing", run_id=run_id
            )
        details = _details_of(await self._events(frontier), frontier.waiting_on)
        return Pending(run_id, frontier.waiting_on, _requests_in(details), details), frontier

    async def decide(self, run_id: str, results: DeferredToolResults, *, by: str) -> None:
        """Answer a run waiting on tool calls with pydantic-ai's ``DeferredToolResults``.

        Calls Onward could not tell ran are settled in the log first, as the person decided:
        approved means it did not take effect (it runs again, with the same idempotency key),
        denied settles it with the person's message as what the model reads.

        Raises:
            InvalidInputError: The run waits on nothing, or the results name calls it does not
                wait on.
        """
        pending, frontier = await self._pending(run_id)
        if pending.requests is not None:
            _check_fits(pending, results)
        for call_id, settlement in _settlements(pending, results).items():
            call = frontier.call(call_id)
            if call is None or call.outcome is not None:
                continue  # settled by an earlier attempt at this decision
            outcome, result, why = settlement
            await self.runner.resolve(
                run_id, call_id, tenant=self.tenant, outcome=outcome, by=by, why=why, result=result
            )
        await self.runner.approve(
            run_id,
            pending.request_id,
            tenant=self.tenant,
            by=by,
            value=_RESULTS.dump_python(results, mode="json"),
        )

    async def answer(self, run_id: str, payload: Any, *, by: str) -> None:
        """Answer the external event a run waits for with a JSON payload."""
        pending = await self.pending(run_id)
        await self.runner.approve(
            run_id, pending.request_id, tenant=self.tenant, by=by, value=to_jsonable_python(payload)
        )

    # -- executing -----------------------------------------------------------------------------

    async def _execute(
        self, agent: AbstractAgent[Any, Any], journal: RunJournal, options: Mapping[str, Any]
    ) -> DurableRunResult:
        """Run the agent against the journal until it finishes or waits on a person."""
        run_id = journal.run_id
        with journal.executing():
            try:
                # An ask the run's last holder let go of unanswered ends it before anything.
                await journal.end_if_asked()
                result = await agent.run(_prompt_of(journal), **options)
                while isinstance(result.output, DeferredToolRequests):
                    decision = await _decision(journal, result.output)
                    result = await agent.run(
                        message_history=result.all_messages(),
                        deferred_tool_results=decision,
                        **options,
                    )
            except RunCancelled as cancelled:
                return DurableRunResult(run_id, "cancelled", error=cancelled.error)
            except RunSuspended as waiting:
                try:
                    # Left waiting, the run would not hear the ask until a person answered.
                    await journal.end_if_asked(confirm=True)
                except RunCancelled as cancelled:
                    return DurableRunResult(run_id, "cancelled", error=cancelled.error)
                return DurableRunResult(
                    run_id,
                    "waiting",
                    _requests_in(waiting.details) or waiting.details,
                    waiting_on=waiting.request_id,
                )
            except OnwardError as exc:
                if not journal.raised_by_a_tool(exc):
                    raise  # the run's own writing failed (its lease, the log): left to resume
                await self._fail(journal, exc)
                raise
            except Exception as exc:
                await self._fail(journal, exc)
                raise
        try:
            output = to_jsonable_python(result.output)
        except PydanticSerializationError as exc:
            # Left without an end, every resume would execute the run again to the same output.
            await self._fail(journal, exc)
            raise
        try:
            await journal.append(journal.event(RunFinished, status="completed", output=output))
        except PayloadTooLargeError as exc:
            await self._output_too_large(journal, exc)
        return DurableRunResult(run_id, "completed", result.output, result=result)

    @staticmethod
    async def _output_too_large(journal: RunJournal, refused: PayloadTooLargeError) -> NoReturn:
        """End the run failed when its output is too large for the log (no blob store took it
        out of line), and raise: left to resume, the run would be executed again to the same
        output and refused again, for ever.

        Raises:
            PayloadTooLargeError: Saying so.
        """
        remedy = (
            "return less"
            if journal.writer.claim_check is not None
            else "give the runner a blob store (blobs=)"
        )
        error = f"the run's output is too large to record ({refused}): {remedy}"
        await journal.append(journal.event(RunFinished, status="failed", error=error))
        raise PayloadTooLargeError(
            error, run_id=journal.run_id, size=refused.size, limit=refused.limit
        ) from refused

    @staticmethod
    async def _fail(journal: RunJournal, exc: Exception) -> None:
        """Record the run's end, failed with ``exc``: its message masked and cut as a tool's
        error is (`tool_error`), or one too long for the log (a tool's, say) would leave the
        run without an end, the failure surfacing as the log's refusal instead."""
        said = tool_error(exc, journal.writer.redactor)
        error = f"{said.type}: {said.message}"
        await journal.append(journal.event(RunFinished, status="failed", error=error))

    @asynccontextmanager
    async def _holding(self, run_id: str) -> AsyncIterator[Leaseholder]:
        runner = self.runner
        async with Leaseholder(
            runner.leases,
            run_id,
            tenant=self.tenant,
            holder=runner.worker,
            policy=runner.lease_policy,
        ) as held:
            try:
                yield held
            finally:
                runner.forget_answers_to_check(run_id)
                await runner.settle_checkpoints()

    async def _events(self, frontier: Frontier) -> list[Event]:
        """The run's counted events through the frontier, bodies put back.

        Raises:
            HistoryUnavailableError: Some are no longer in the log.
        """
        start = frontier.first_offset if frontier.first_offset >= 0 else None
        try:
            stored = await read_whole_run(
                self.runner.log,
                self.runner.compaction,
                frontier.run_id,
                start=start,
                end=frontier.through_offset + 1,
            )
        except LogTruncatedError as exc:
            raise HistoryUnavailableError(
                f"run {frontier.run_id!r}: its events are no longer all in the log ({exc}); a "
                "pydantic-ai run is executed again from its start, so it cannot go on",
                run_id=frontier.run_id,
            ) from exc
        counted = SequenceGuard().admit_all(stored)
        return [await self.runner.writer.restore(s.event) for s in counted]


async def _decision(journal: RunJournal, requests: DeferredToolRequests) -> DeferredToolResults:
    """The recorded decision on deferred calls, or a new wait for one (the run stops).

    An approval that does not decide the calls (``onward approve`` with no value, or with one
    that is not ``DeferredToolResults`` for them) is passed over and the calls asked about
    again: the person's answer must not fail the run, nor be guessed at.
    """
    prompt = f"decide {_listed(requests)}"
    while True:
        request_id, recorded = journal.next_wait(DECISION)
        if recorded is None:
            details = _REQUESTS.dump_python(requests, mode="json")
            await journal.ask(request_id, prompt, details)
            raise RunSuspended(request_id, details)
        if recorded.answer is None:
            raise RunSuspended(request_id, recorded.asked.details)
        if isinstance(recorded.answer, ApprovalDenied):
            message = f"denied by {recorded.answer.by}"
            return requests.build_results(
                approvals={c.tool_call_id: ToolDenied(message) for c in requests.approvals},
                calls={c.tool_call_id: {"denied": message} for c in requests.calls},
            )
        try:
            results = _RESULTS.validate_python(recorded.answer.value)
        except pydantic.ValidationError:
            problem: str | None = "its value is not DeferredToolResults"
        else:
            problem = _misfit(requests, results)
            if problem is None:
                return results
        prompt = f"decide {_listed(requests)} (the answer to {request_id} did not: {problem})"


def _misfit(requests: DeferredToolRequests, results: DeferredToolResults) -> str | None:
    """What keeps ``results`` from deciding ``requests``: a call they do not ask about, or one
    left undecided; ``None`` when they fit."""
    try:
        requests.build_results(approvals=results.approvals, calls=results.calls)
    except ValueError as exc:
        return str(exc)
    asked = {c.tool_call_id for c in (*requests.approvals, *requests.calls)}
    missing = sorted(asked - set(results.approvals) - set(results.calls))
    if missing:
        return f"it leaves {', '.join(missing)} undecided; every deferred call needs a result"
    return None


def _check_fits(pending: Pending, results: DeferredToolResults) -> None:
    """Refuse a decision that names calls the run does not wait on, or leaves one undecided.

    Raises:
        InvalidInputError: Naming what does not fit.
    """
    assert pending.requests is not None
    problem = _misfit(pending.requests, results)
    if problem is not None:
        raise InvalidInputError(
            f"run {pending.run_id!r}: the decision does not fit what {pending.request_id} "
            f"asks: {problem}",
            run_id=pending.run_id,
        )


def _prompt_of(journal: RunJournal) -> Any:
    """The prompt the run was started with, fed to every execution of it.

    Raises:
        InvalidInputError: The run was not started as a pydantic-ai run.
    """
    first = journal.events[0] if journal.events else None
    if not isinstance(first, RunStarted):
        raise InvalidInputError(
            f"run {journal.run_id!r} does not begin with RunStarted: it was not started by "
            "OnwardDurability",
            run_id=journal.run_id,
        )
    return first.input


def _listed(requests: DeferredToolRequests) -> str:
    calls = [*requests.approvals, *requests.calls]
    return ", ".join(f"{c.tool_name} ({c.tool_call_id})" for c in calls)


def _details_of(events: Sequence[Event], request_id: str) -> Any:
    """The details of the request a run waits on, as recorded."""
    asked = [e for e in events if isinstance(e, ApprovalRequested) and e.request_id == request_id]
    return asked[-1].details if asked else None


def _requests_in(details: Any) -> DeferredToolRequests | None:
    """The deferred calls a wait's details hold, when it is a decision on calls."""
    if not isinstance(details, dict) or "approvals" not in details:
        return None
    try:
        return _REQUESTS.validate_python(details)
    except pydantic.ValidationError:
        return None


Settlement = tuple[Literal["completed", "never_ran"], Any, str]


def _settlements(pending: Pending, results: DeferredToolResults) -> dict[str, Settlement]:
    """How a decision settles the calls Onward could not tell ran, by the run's call id."""
    if pending.requests is not None:
        metadata: Mapping[str, Any] = pending.requests.metadata
    elif isinstance(pending.details, dict):
        metadata = pending.details.get("undecided") or {}
    else:
        metadata = {}
    settled: dict[str, Settlement] = {}
    for model_call_id, approval in results.approvals.items():
        onward = (metadata.get(model_call_id) or {}).get("onward")
        if not isinstance(onward, dict) or "call_id" not in onward:
            continue
        if approval is True or isinstance(approval, ToolApproved):
            settled[onward["call_id"]] = ("never_ran", None, "approved: it did not take effect")
        else:
            message = approval.message if isinstance(approval, ToolDenied) else "denied"
            settled[onward["call_id"]] = ("completed", {"denied": message}, _note(message))
    return settled


_NOT_IN_A_NOTE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _note(message: str) -> str:
    """A denial's message as the settlement's ``why``, a note a person leaves: its control
    characters (bar tabs and newlines) as spaces, cut to `MAX_NOTE_LENGTH`. The model reads the
    message whole in the call's result; held to a note's limits, a longer one would refuse the
    decision naming a ``why`` the person never gave."""
    return _NOT_IN_A_NOTE.sub(" ", message)[:MAX_NOTE_LENGTH]
