"""The durable operation backend: each pydantic-ai unit goes to the run's journal.

pydantic-ai hands every unit of a durable run (a model request, a tool call, argument
validation, tool discovery, an event-stream callback) to the backend's ``execute``. Model
requests and tool calls are journaled (`RunJournal`); the rest are cheap and deterministic or
only deliver events, so they run again when the run is re-executed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.durable_exec import (
    DurableOperationId,
    JournalCallableOperationBackend,
    ModelRequestId,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
)
from pydantic_ai.models import ModelRequestParameters

from .journal import current_journal

UnitConfig = dict[str, Any]
"""Per-unit options; for a tool, what its ``metadata={"onward": {...}}`` says."""


class OnwardOperationBackend(JournalCallableOperationBackend[UnitConfig]):
    """Runs each unit through the journal of the Onward run being executed.

    Args:
        agent_name: The agent's name, in the units' persisted names.
        config: Per-role options, and the per-tool resolver of ``metadata["onward"]``.
    """

    def __init__(self, *, agent_name: str, config: RoleBasedOperationConfig[UnitConfig]) -> None:
        super().__init__(agent_name=agent_name, config=config)

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: UnitConfig,
    ) -> object:
        journal = current_journal()
        if journal is None:
            return await body()
        if isinstance(operation_id, ModelRequestId):
            return await journal.model_request(body, outputs=_output_tools(cache_key))
        if isinstance(operation_id, ToolsetCallToolId):
            ctx = _run_context(cache_key, name)
            return await journal.tool_call(
                ctx.tool_call_id or name,
                ctx.tool_name or name,
                retry_safe=bool((config or {}).get("retry_safe", False)),
                run=body,
            )
        return await body()


def _output_tools(cache_key: tuple[object, ...]) -> frozenset[str]:
    """The names of the model request's output tools (its parameters are in the unit's cache
    identity): a call of one is the run's output, which pydantic-ai processes itself."""
    for item in cache_key:
        if isinstance(item, ModelRequestParameters):
            return frozenset(tool.name for tool in item.output_tools)
    return frozenset()


def _run_context(cache_key: tuple[object, ...], name: str) -> RunContext[Any]:
    """The tool call's run context, which every tool call unit's cache identity carries."""
    for item in cache_key:
        if isinstance(item, RunContext):
            return item
    raise RuntimeError(f"the tool call unit {name!r} carries no run context")
