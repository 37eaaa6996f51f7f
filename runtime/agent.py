"""An agent definition and its revision: what a run is pinned to."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from onward.errors import ConfigurationError

from .tools import Tool, canonical

if TYPE_CHECKING:
    from .settings import Settings


@runtime_checkable
class RunToolset(Protocol):
    """Tools an agent gets per run, built when the run is driven (an MCP server's, listed or
    read from the run's cache): `onward.integrations.mcp.MCPToolset` is one. Bound to a run by
    `onward.runtime.toolsets.agent_for_run`."""

    def run_tools(
        self, run_id: str, *, tenant: str | None, settings: Settings
    ) -> AbstractAsyncContextManager[Sequence[Tool]]:
        """The tools for ``run_id``, usable until the context ends.

        Args:
            run_id: The run they serve: a resume of it must get the same tools.
            tenant: The run's tenant.
            settings: The deployment's settings (for a cache the toolset keeps per run).
        """
        ...

    async def close(self) -> None:
        """Release what the toolset shares between runs (connections). Idempotent."""
        ...


_AS_TOOLSET = (
    "give it as toolsets=[...] (its tools built for each run), or its tools once it is open "
    "(tools=toolset.tools)"
)
"""What to do with a toolset given as a tool: no decorator makes it one."""


@dataclass(frozen=True)
class Agent:
    """What a run executes.

    Attributes:
        name: The agent's name.
        instructions: The system prompt.
        tools: Tools the model may call.
        model: The model name the provider is asked for.
        model_settings: Provider options (temperature, ...), part of the revision.
        max_iterations: Upper bound on model calls per run.
        toolsets: Toolsets whose tools are built for each run (MCP servers): `onward worker`
            and `onward.open` add their tools for the run being driven
            (`onward.runtime.toolsets`), and the run's revision covers them.
        budget_micros: Most a run may spend on model calls, in micros (`onward.runtime.spend`);
            a ceiling a run's options may lower, never raise. ``None``: no bound.
        tenant_budget_micros: Most the run's tenant may have spent, all its runs together,
            before this agent makes another model call for it. ``None``: no bound.
    """

    name: str
    instructions: str
    tools: Sequence[Tool] = ()
    model: str = "default"
    model_settings: Mapping[str, Any] = field(default_factory=dict)
    max_iterations: int = 25
    toolsets: Sequence[RunToolset] = ()
    budget_micros: int | None = None
    tenant_budget_micros: int | None = None

    def __post_init__(self) -> None:
        self._check_tools()
        names = [t.name for t in self.tools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigurationError(f"agent {self.name!r} has tools named twice: {duplicates}")
        if self.max_iterations < 1:
            raise ConfigurationError(f"agent {self.name!r}: max_iterations must be at least 1")
        for name in ("budget_micros", "tenant_budget_micros"):
            budget = getattr(self, name)
            if budget is not None and (type(budget) is not int or budget < 0):
                raise ConfigurationError(
                    f"agent {self.name!r}: {name} must be whole micros of at least 0, "
                    f"got {budget!r}"
                )

    def _check_tools(self) -> None:
        """Refuse ``tools`` that are not tools in an order (a list, a tuple, a dict's values, a
        generator: any iterable but a dict or a string) when the agent is made, naming
        what was given: one tool not in a list, or a function without ``@tool``, would
        otherwise fail on an attribute deep in the revision or the run. A toolset (an MCP
        server's) is sent to ``toolsets``: no decorator makes it a tool."""
        tools: object = self.tools
        if isinstance(tools, Tool):
            raise ConfigurationError(
                f"agent {self.name!r}: tools must be a list of tools, got one Tool: "
                f"tools=[{tools.name}]"
            )
        if isinstance(tools, RunToolset):
            raise ConfigurationError(
                f"agent {self.name!r}: tools must be a list of tools, got a toolset "
                f"({type(tools).__name__}): {_AS_TOOLSET}"
            )
        if isinstance(tools, Mapping):
            raise ConfigurationError(
                f"agent {self.name!r}: tools must be a list of tools, got a "
                f"{type(tools).__name__}: give its values, tools=list(tools_by_name.values())"
            )
        if not isinstance(tools, Iterable) or isinstance(tools, str | bytes):
            raise ConfigurationError(
                f"agent {self.name!r}: tools must be a list of tools, got {type(tools).__name__}"
            )
        if not isinstance(tools, Sequence):
            # ``registry.values()`` or a generator: their order is settled, and a generator
            # can be read only once, so they are kept as a tuple.
            tools = tuple(tools)
            object.__setattr__(self, "tools", tools)
        for index, candidate in enumerate(tools):
            if isinstance(candidate, Tool):
                continue
            if isinstance(candidate, RunToolset):
                raise ConfigurationError(
                    f"agent {self.name!r}: tools[{index}] is a toolset "
                    f"({type(candidate).__name__}), not a Tool: {_AS_TOOLSET}"
                )
            if callable(candidate):
                raise ConfigurationError(
                    f"agent {self.name!r}: tools[{index}] is a function, not a Tool: decorate it "
                    "with @tool (onward.runtime.tool)"
                )
            raise ConfigurationError(
                f"agent {self.name!r}: tools[{index}] is a {type(candidate).__name__}, not a "
                "Tool: give the function decorated with @tool (onward.runtime.tool) itself"
            )

    @cached_property
    def revision(self) -> str:
        """Hash of instructions, tool schemas and model settings.

        A run is pinned to the revision it started with; resuming it with another is refused,
        because a past run that names a revision it did not use is an audit record that lies.
        """
        material = {
            "instructions": self.instructions,
            "tools": [t.fingerprint() for t in self.tools],
            "model": self.model,
            "model_settings": dict(self.model_settings),
        }
        return "rev-" + hashlib.sha256(canonical(material)).hexdigest()[:16]

    def tool(self, name: str) -> Tool | None:
        """The tool of that name, if the agent has it."""
        for candidate in self.tools:
            if candidate.name == name:
                return candidate
        return None
