"""A pydantic-ai agent as Onward sees it: its name, model and tools, and so its revision.

A run is pinned to the revision it started with: resuming it with an agent whose tools or model
changed is refused (`RevisionMismatchError`), because a re-execution replays recorded answers in
order and would pair them with the wrong calls. The description also carries each tool's
``retry_safe`` flag (``metadata={"onward": {"retry_safe": True}}``), which resume planning reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.agent import AbstractAgent
from pydantic_ai.models import Model
from pydantic_ai.toolsets import (
    AbstractToolset,
    CombinedToolset,
    FunctionToolset,
    PrefixedToolset,
    RenamedToolset,
    SetMetadataToolset,
    WrapperToolset,
)

from onward.runtime.agent import Agent
from onward.runtime.tools import Tool

METADATA_KEY = "onward"
"""The key of a pydantic-ai tool's metadata that holds Onward's options for it."""


@dataclass(frozen=True)
class DescribedAgent(Agent):
    """The Onward agent of a pydantic-ai agent, whose tools are also found by the names the
    model calls them (a prefixed or renamed toolset's), as the log records its calls, and are
    as retry-safe as the metadata the journal reads when it runs them says.

    Attributes:
        called_as: The described tool's name for each name the model calls a tool by that
            differs from it. Not part of the revision: only how calls are matched to tools.
        retry_safe_as: Whether a described tool is retry-safe, for each whose toolsets'
            metadata (``with_metadata(onward=...)``) says otherwise than its own. Not part of
            the revision either.
    """

    called_as: Mapping[str, str] = field(default_factory=dict, compare=False)
    retry_safe_as: Mapping[str, bool] = field(default_factory=dict, compare=False)

    def tool(self, name: str) -> Tool | None:
        found = super().tool(name)
        if found is None and name in self.called_as:
            found = super().tool(self.called_as[name])
        if found is not None and found.name in self.retry_safe_as:
            return dataclasses.replace(found, retry_safe=self.retry_safe_as[found.name])
        return found


def describe(agent: AbstractAgent[Any, Any], name: str) -> DescribedAgent:
    """The Onward agent a pydantic-ai agent's runs are recorded under."""
    tools: list[Tool] = []
    called_as: dict[str, str] = {}
    retry_safe_as: dict[str, bool] = {}

    def visit(toolset: AbstractToolset[Any], outward: Callable[[str], str], meta: Metadata) -> None:
        if isinstance(toolset, FunctionToolset):
            named = {t.name for t in tools}
            for tool in toolset.tools.values():
                described = _tool(tool, toolset, named)
                tools.append(described)
                if outward(tool.name) != described.name:
                    called_as[outward(tool.name)] = described.name
                if retry_safe(meta(tool.metadata)) != described.retry_safe:
                    retry_safe_as[described.name] = not described.retry_safe
        elif toolset.id is not None:
            tools.append(_opaque(toolset))

    for toolset in agent.toolsets:
        _walk(toolset, lambda tool_name: tool_name, lambda metadata: metadata, visit)
    model = agent.model
    return DescribedAgent(
        name=name,
        instructions="",
        tools=sorted(tools, key=lambda t: t.name),
        model=model.model_name if isinstance(model, Model) else str(model or "default"),
        max_iterations=1_000_000,
        called_as=called_as,
        retry_safe_as=retry_safe_as,
    )


Metadata = Callable[[dict[str, Any] | None], dict[str, Any] | None]
"""How the toolsets around a leaf change a tool's metadata (``with_metadata``)."""


def _walk(
    toolset: AbstractToolset[Any],
    outward: Callable[[str], str],
    meta: Metadata,
    visit: Callable[[AbstractToolset[Any], Callable[[str], str], Metadata], None],
) -> None:
    """Visit the leaf toolsets as ``toolset.apply`` does, in its order, with how each leaf's
    tool names reach the model (the prefixes and renames of the toolsets around it) and how
    its tools' metadata does (the ``with_metadata`` around it, merged as pydantic-ai does)."""
    if isinstance(toolset, PrefixedToolset):
        prefix = toolset.prefix
        _walk(toolset.wrapped, lambda n: outward(f"{prefix}_{n}"), meta, visit)
    elif isinstance(toolset, RenamedToolset):
        renamed = {original: new for new, original in toolset.name_map.items()}
        _walk(toolset.wrapped, lambda n: outward(renamed.get(n, n)), meta, visit)
    elif isinstance(toolset, SetMetadataToolset):
        merged = toolset.metadata
        _walk(toolset.wrapped, outward, lambda m: meta({**(m or {}), **merged}), visit)
    elif isinstance(toolset, WrapperToolset) and type(toolset).apply is WrapperToolset.apply:
        _walk(toolset.wrapped, outward, meta, visit)
    elif isinstance(toolset, CombinedToolset):
        for member in toolset.toolsets:
            _walk(member, outward, meta, visit)
    else:
        toolset.apply(lambda leaf: visit(leaf, outward, meta))


def retry_safe(metadata: dict[str, Any] | None) -> bool:
    """Whether a tool's metadata says calling it twice is harmless."""
    options = (metadata or {}).get(METADATA_KEY)
    return isinstance(options, dict) and bool(options.get("retry_safe", False))


async def _not_called(**_: Any) -> None:
    raise RuntimeError("pydantic-ai calls its own tools; this one only describes a tool")


class _Described(Tool):
    """A pydantic-ai tool as the revision and resume planning see it: pydantic-ai calls the
    tool itself, with its own arguments, so an argument may be named like one of Onward's
    keywords."""

    arguments_as_keywords = False


def _tool(tool: Any, toolset: FunctionToolset[Any], named: set[str]) -> Tool:
    """A function tool, named as its toolset names it; qualified by the toolset's id when an
    earlier toolset has a tool of that name (each toolset prefixed, the model sees two tools)."""
    name = tool.name if tool.name not in named else f"{toolset.id}:{tool.name}"
    return _Described(
        name=name,
        description=tool.description or "",
        parameters=tool.function_schema.json_schema,
        fn=_not_called,
        retry_safe=retry_safe(tool.metadata),
    )


def _opaque(toolset: AbstractToolset[Any]) -> Tool:
    """A toolset whose tools are listed at run time (MCP, dynamic): its id stands for them."""
    return Tool(
        name=f"{type(toolset).__name__}:{toolset.id}",
        description="",
        parameters={},
        fn=_not_called,
    )
