"""Toolsets an agent declares and a worker binds to each run: tools listed per run, not at import.

An MCP server's tools are only known once it is asked, and warm restart wants that answer kept
per run (so a resume builds the same tools, hence the same revision, without asking again). So
an agent names such toolsets (`RunToolset`) in ``Agent.toolsets``, and whoever drives a run
(`onward worker`, `onward.open`'s application) opens a view of each for that run, with the run
id, its tenant and the deployment's `Settings` (where the view finds its schema cache), and
drives the agent with the view's tools added to its own. The views close when the run stops;
the toolset's connections stay open for the next run and close with the worker.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Iterable

from onward.errors import ConfigurationError

from .agent import Agent, RunToolset
from .settings import Settings
from .tools import Tool


@contextlib.asynccontextmanager
async def agent_for_run(
    agent: Agent, run_id: str, *, tenant: str | None, settings: Settings
) -> AsyncIterator[Agent]:
    """``agent`` with its toolsets' tools for ``run_id`` among its tools (itself when it
    declares none); the toolsets' views stay open until the block ends.

    Raises:
        BackendUnavailableError: A toolset's server could not be reached to list its tools.
        ConfigurationError: A toolset's tool has the name of another tool of the agent.
    """
    if not agent.toolsets:
        yield agent
        return
    async with contextlib.AsyncExitStack() as stack:
        tools: list[Tool] = list(agent.tools)
        for toolset in agent.toolsets:
            view = toolset.run_tools(run_id, tenant=tenant, settings=settings)
            tools.extend(await stack.enter_async_context(view))
        yield dataclasses.replace(agent, tools=tuple(tools), toolsets=())


async def close_toolsets(agents: Iterable[Agent]) -> None:
    """Close the toolsets of ``agents`` (once each): what a worker does when it stops."""
    seen: set[int] = set()
    for agent in agents:
        for toolset in agent.toolsets:
            if id(toolset) not in seen:
                seen.add(id(toolset))
                await toolset.close()


def refuse_unbound(agent: Agent) -> None:
    """Refuse to drive an agent whose toolsets were not bound to the run (`agent_for_run`):
    its run would start without those tools, and record a revision without them.

    Raises:
        ConfigurationError: The agent declares toolsets.
    """
    if agent.toolsets:
        raise ConfigurationError(
            f"agent {agent.name!r} declares toolsets, whose tools are built per run: drive it "
            "with `onward worker` or `onward.open`, or bind them with "
            "onward.runtime.toolsets.agent_for_run"
        )


__all__ = ["RunToolset", "agent_for_run", "close_toolsets", "refuse_unbound"]
