"""A thread folded inline on PostgreSQL alone whose frontier is over the snapshot cap is kept
uncapped beside its row, in the compaction store the saver is given: the thread's next fold
goes on from it rather than read the thread from its first event again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TypedDict

import pytest_asyncio
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from onward.integrations.langgraph import OnwardSaver
from onward.runtime.backends import Backends, open_backends
from onward.runtime.settings import SecretUrl, Settings

from .graphs import config

TENANT = "acme"
CAP = 300


@pytest_asyncio.fixture
async def backends(database_url: str, pg_schema: str) -> AsyncIterator[Backends]:
    settings = Settings(
        backend="postgres",
        database_url=SecretUrl(database_url),
        database_schema=pg_schema,
        partitions=1,
    )
    async with open_backends(settings) as opened:
        yield opened


class Asked(TypedDict):
    answer: str


def _ask(state: Asked) -> dict[str, str]:
    return {"answer": str(interrupt("z" * CAP))}


async def test_a_thread_over_the_cap_is_kept_beside_its_row(backends: Backends) -> None:
    builder = StateGraph(Asked)
    builder.add_node("ask", _ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    assert backends.compaction is not None
    saver = OnwardSaver(
        backends.log,
        backends.leases,
        tenant=TENANT,
        frontiers=backends.frontiers,
        checkpoint_inline=True,
        compaction=backends.compaction,
    )
    async with saver:
        folder = saver._checkpointer
        assert folder is not None
        folder.projection.max_bytes = CAP
        graph = builder.compile(checkpointer=saver)
        out = await graph.ainvoke({"answer": ""}, config("t"))
        assert "__interrupt__" in out
        row = await backends.frontiers.get("t")
        assert row is not None
        assert row.frontier is None  # over the cap: the row keeps the reason
        kept = (await backends.compaction.snapshots(["t"])).get("t")
        assert kept is not None, "the thread's frontier over the cap is kept beside its row"

        assert await graph.ainvoke(Command(resume="yes"), config("t")) == {"answer": "yes"}
        assert folder.projection.stats.refolded_from_log == 0
