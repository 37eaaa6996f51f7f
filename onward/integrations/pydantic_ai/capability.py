"""`OnwardDurability`: pydantic-ai's durable execution capability, on Onward's log and leases."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, get_args

from pydantic_ai.agent import AbstractAgent, EventStreamHandler
from pydantic_ai.capabilities.abstract import AbstractCapability, leaf_capabilities
from pydantic_ai.capabilities.wrapper import WrapperCapability
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    DurabilityEngineSpec,
    DurableOperationBackend,
    DurableOperationId,
    RoleBasedOperationConfig,
)
from pydantic_ai.models import Model
from pydantic_ai.tools import AgentDepsT, DeferredToolRequests, DeferredToolResults, RunContext
from pydantic_ai.toolsets import ToolsetTool

from onward.errors import ConfigurationError, InvalidInputError
from onward.eventlog.base import EventLog
from onward.runtime.spend.budget import Budgets

from .backend import OnwardOperationBackend, UnitConfig
from .compat import external_events
from .driver import DurableRunResult, DurableRuns, Pending
from .journal import current_journal
from .revision import METADATA_KEY, describe
from .waiter import OnwardWaiter


@dataclass(init=False, kw_only=True)
class OnwardDurability(BaseDurabilityCapability[AgentDepsT]):
    """Makes a pydantic-ai agent's runs Onward runs: one writer per run, nothing run twice.

    Attach it to an agent, then start and resume runs through it::

        durability = OnwardDurability(log=log, tenant="acme")
        agent = Agent(model, name="booker", tools=[book], capabilities=[durability],
                      output_type=[str, DeferredToolRequests])
        result = await durability.run(agent, "book 3A", run_id="r-1")
        result = await durability.resume(agent, "r-1")  # after a crash, on any worker

    Every model answer and tool call of a run is an event in the log, written under the run's
    lease and fence. A resumed run is executed again from its start: recorded answers and tool
    outcomes are replayed, calls that never ran are dispatched (write-ahead), and a call that
    was dispatched but whose outcome was never recorded comes back as pydantic-ai's own approval
    request (``DeferredToolRequests``), never run again unasked. Waits on people (deferred calls,
    ``HandleDeferredToolCalls`` with a token, any external event) are Onward approvals: the run
    stops, holding nothing, and `decide` (or ``onward approve``) answers it.

    Args:
        log: The event log.
        tenant: The tenant every run belongs to.
        stores: The rest of what `AgentRunner` takes besides its provider, with the same
            defaults: ``leases`` (embedded logs bring their own), ``frontiers`` (required for
            any log but the embedded ones), ``checkpoint_inline``, ``checkpoints``,
            ``redactor`` (recorded answers are masked too), ``blobs``, ``worker``,
            ``lease_policy``, ``spend`` and ``prices`` (each model call's cost is recorded
            in the ledger, once, under its answer's seq, and held against the run's budgets
            first).
        name: The agent's name in the units' persisted names (default: the agent's own).
        models: Further models a run may switch to, by id (as for every durable engine).
        event_stream_handler: Receives the run's events (model events live, not replayed).
    """

    engine_spec = DurabilityEngineSpec(
        engine_name="Onward",
        durable_unit_noun="step",
        durable_container_noun="run",
        codec=JSON_CODEC,  # every recorded answer and outcome is JSON in the log
        # Toolsets passed to one `agent.run` would not be journaled, so they are refused.
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        toolset_lifecycles={
            "function": "enter-always",
            "mcp": "enter-always",
            "dynamic": "enter-never",
        },
        journal_discovery=True,
        sequential_tools_in_durable_context=False,
        tool_config_key=METADATA_KEY,
    )

    def __init__(
        self,
        *,
        log: EventLog,
        tenant: str,
        name: str | None = None,
        models: Mapping[str, Model] | None = None,
        event_stream_handler: EventStreamHandler[AgentDepsT] | None = None,
        **stores: Any,
    ) -> None:
        super().__init__(models=models, event_stream_handler=event_stream_handler, name=name)
        self._runs = DurableRuns(tenant=tenant, log=log, **stores)

    # -- runs ----------------------------------------------------------------------------------

    async def run(
        self,
        agent: AbstractAgent[Any, Any],
        user_prompt: str | None = None,
        *,
        run_id: str | None = None,
        budget_micros: int | None = None,
        tenant_budget_micros: int | None = None,
        **options: Any,
    ) -> DurableRunResult:
        """Start a run of ``agent`` and drive it until it finishes or waits on a person.

        Args:
            agent: An agent this capability is attached to.
            user_prompt: The prompt, recorded with the run (text).
            run_id: The run's id (default: a new one).
            budget_micros: Most this run may spend on model calls, in micros (recorded with
                it, so a resume keeps it): a call whose estimated cost would pass it is not
                made, and the run ends ``failed`` with `BudgetExceededError`. Needs ``spend=``
                and a price for the model (``prices=``).
            tenant_budget_micros: The same for the run's tenant, all its runs together.
            options: Passed to ``agent.run`` (``deps``, ``model_settings``, ...), every time the
                run is executed: pass the same ones to `resume`.

        Raises:
            InvalidInputError: A run under that id exists, or a budget is not a whole number of
                micros, 0 or more.
            ConfigurationError: A budget is set without a spend ledger or a price for the
                model; nothing is written.
            BudgetExceededError: A model call would pass a budget; the run ended ``failed``.
            ResumeConflictError: Another worker holds a run under that id.
        """
        for name, budget in (
            ("budget_micros", budget_micros),
            ("tenant_budget_micros", tenant_budget_micros),
        ):
            if budget is not None and (type(budget) is not int or budget < 0):
                raise InvalidInputError(
                    f"{name} is a whole number of micros, 0 or more, not {budget!r}"
                )
        described = self._described(agent, options)
        budgets = Budgets(run_micros=budget_micros, tenant_micros=tenant_budget_micros)
        return await self._runs.start(
            agent, described, user_prompt, run_id, options, budgets=budgets
        )

    async def resume(
        self, agent: AbstractAgent[Any, Any], run_id: str, **options: Any
    ) -> DurableRunResult:
        """Carry a run on from the log: after a crash, or once a person answered it.

        A run that finished, or still waits on a person, is returned as it stands.

        Raises:
            ResumeConflictError: Another worker holds the run.
            NothingToResumeError: No run under that id for this tenant.
            RevisionMismatchError: The agent's tools or model changed since the run started.
        """
        return await self._runs.resume(agent, self._described(agent, options), run_id, options)

    async def pending(self, run_id: str) -> Pending:
        """What a waiting run waits for: the request, and the deferred calls to decide."""
        return await self._runs.pending(run_id)

    async def decide(self, run_id: str, results: DeferredToolResults, *, by: str) -> None:
        """Answer a run waiting on deferred tool calls; `resume` then carries it on.

        The decision is recorded under the run's lease (``ApprovalGranted``, its value the
        results), and calls that may or may not have run are settled as the person said
        (``ToolResolved``): approved, it did not take effect and runs again with the same
        idempotency key; denied, the model is told the person's message and it never runs again.

        Raises:
            InvalidInputError: The run waits on nothing, or the results do not fit its request.
        """
        await self._runs.decide(run_id, results, by=by)

    async def answer(self, run_id: str, payload: Any, *, by: str) -> None:
        """Answer the external event a run waits for (``wait_for_external_event``)."""
        await self._runs.answer(run_id, payload, by=by)

    def _described(self, agent: AbstractAgent[Any, Any], options: Mapping[str, Any]) -> Any:
        bound = type(self).from_agent(agent)
        if bound is None:
            raise ConfigurationError(
                f"agent {agent.name!r} has no OnwardDurability among its capabilities; pass "
                "capabilities=[durability] when building it"
            )
        output_spec = options.get("output_type", agent.output_type)
        if not _hands_back_deferred(output_spec) and not _handles_deferred(agent):
            # A call whose outcome is unknown comes back as a deferred request; an agent that
            # cannot return one would fail the run instead of leaving it for a person.
            raise ConfigurationError(
                f"agent {agent.name!r}: a durable run needs DeferredToolRequests among its "
                "output types (output_type=[str, DeferredToolRequests]) or a capability that "
                "handles deferred calls (HandleDeferredToolCalls), so a call that may have run "
                "is handed to a person rather than failing the run"
            )
        return describe(agent, bound.name)

    # -- pydantic-ai's hooks ---------------------------------------------------------------------

    @property
    def in_durable_context(self) -> bool:
        return current_journal() is not None

    def get_default_run_id(self) -> str | None:
        journal = current_journal()
        return None if journal is None else journal.next_segment_id()

    async def get_run_start_time(self, run_id: str) -> datetime | None:
        journal = current_journal()
        if journal is None:
            return None
        return datetime.fromtimestamp(journal.events[0].at / 1_000_000, tz=UTC)

    async def wrap_run(self, ctx: RunContext[AgentDepsT], *, handler: Any) -> Any:
        """Install the waiter that waits on people through Onward approvals, then run."""
        journal = current_journal()
        if journal is None or external_events is None:
            return await super().wrap_run(ctx, handler=handler)
        with external_events.external_event_scope(OnwardWaiter(journal)):
            return await super().wrap_run(ctx, handler=handler)

    def get_durable_operation_backend(self) -> DurableOperationBackend[Any]:
        return OnwardOperationBackend(
            agent_name=self.name,
            config=RoleBasedOperationConfig[UnitConfig](
                model={}, event={}, capability={}, tool={}, resolve_tool=_tool_config
            ),
        )


def _hands_back_deferred(output_spec: object) -> bool:
    """Whether an output spec (a type, a sequence of them, or a union) has DeferredToolRequests."""
    if output_spec is DeferredToolRequests:
        return True
    if isinstance(output_spec, Sequence) and not isinstance(output_spec, str):
        return any(_hands_back_deferred(item) for item in output_spec)
    return any(_hands_back_deferred(arg) for arg in get_args(output_spec))


def _handles_deferred(agent: AbstractAgent[Any, Any]) -> bool:
    """Whether a capability of the agent answers deferred calls (``HandleDeferredToolCalls``)."""
    base = getattr(AbstractCapability, "handle_deferred_tool_calls", None)
    if base is None:
        return False  # a release without the hook: only the output type can hand a call back
    for leaf in leaf_capabilities(agent.root_capability):
        while isinstance(leaf, WrapperCapability):
            leaf = leaf.wrapped  # noqa: PLW2901  # the capability a wrapper stands for
        if getattr(type(leaf), "handle_deferred_tool_calls", base) is not base:
            return True
    return False


def _tool_config(
    operation_id: DurableOperationId, tool: object | None, tool_name: str
) -> UnitConfig | Literal[False]:
    """A tool's options: its ``metadata["onward"]`` (``False`` runs it outside the journal)."""
    metadata = tool.tool_def.metadata if isinstance(tool, ToolsetTool) else None
    options = (metadata or {}).get(METADATA_KEY)
    if options is False:
        return False
    if options is not None and not isinstance(options, dict):
        raise ConfigurationError(
            f"tool {tool_name!r}: metadata[{METADATA_KEY!r}] must be a dict of options "
            f"(retry_safe) or False, not {type(options).__name__}"
        )
    return dict(options or {})
