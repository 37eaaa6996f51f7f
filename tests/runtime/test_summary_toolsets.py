"""`onward inspect --agent` with an agent whose tools are built per run (`Agent.toolsets`): its
revision without them cannot be the run's, so inspect says it does not compare them rather than
warn that resume will refuse the run."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

from rich.console import Console

from onward.runtime.agent import Agent
from onward.runtime.cli.summary import run_summary
from onward.runtime.settings import Settings
from onward.runtime.tools import Tool
from onward.testing.frontiers import frontier


class NoTools:
    """A toolset that lists nothing: enough to make the agent's tools per-run ones."""

    @contextlib.asynccontextmanager
    async def _tools(self) -> AsyncIterator[Sequence[Tool]]:
        yield ()

    def run_tools(
        self, run_id: str, *, tenant: str | None, settings: Settings
    ) -> contextlib.AbstractAsyncContextManager[Sequence[Tool]]:
        return self._tools()

    async def close(self) -> None:
        return None


def summary_text(agent: Agent) -> str:
    console = Console(width=200, record=True, file=None, force_terminal=False)
    with console.capture() as captured:
        console.print(run_summary(frontier("run-1", through=3), lease=None, agent=agent))
    return captured.get()


def test_an_agent_with_toolsets_is_not_said_to_be_refused() -> None:
    shown = summary_text(Agent(name="booker", instructions="", toolsets=(NoTools(),)))
    assert "declares toolsets, whose tools are built per run" in shown
    assert "resume will refuse it" not in shown


def test_an_agent_of_another_revision_still_is() -> None:
    shown = summary_text(Agent(name="booker", instructions=""))
    assert "resume will refuse it" in shown
    assert "declares toolsets" not in shown
