"""What a LangGraph graph's model calls cost is recorded in the deployment's spend ledger.

The saver reads the usage each AI message a node writes reports, prices it by the message's
model name and records it under the thread and the seq of the writes it came in, once: the
same writes put again (LangGraph retrying them) count nothing more. `onward inspect` shows a
thread's spend as it shows a run's. Embedded SQLite, and Kafka + PostgreSQL + Redis.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from support.servers import KafkaServers
from typer.testing import CliRunner

from onward.eventlog import GraphWritesSaved
from onward.integrations.langgraph import OnwardSaver
from onward.runtime.cli import app as cli
from onward.runtime.spend import PostgresSpendLedger, SpendLedger, SqliteSpendLedger
from onward.runtime.spend.base import PriceTable

from .graphs import config
from .worlds import TENANT, World, kafka_world, sqlite_world

PRICES = PriceTable({"small-1": (2, 10), "large-1": (5, 20)})
"""Micros per input and output token."""


def answered(model: str, tokens_in: int, tokens_out: int) -> AIMessage:
    """An AI message as a chat model returns it: its model's name and the tokens it used."""
    return AIMessage(
        content=f"answer of {model}",
        response_metadata={"model_name": model},
        usage_metadata={
            "input_tokens": tokens_in,
            "output_tokens": tokens_out,
            "total_tokens": tokens_in + tokens_out,
        },
    )


def chat_graph(checkpointer: OnwardSaver) -> CompiledStateGraph[Any]:
    """One turn: the small model answers, then a node asks both models at once (one task's
    writes holding two answers), then a node writes a message that reports no usage."""

    def small(state: MessagesState) -> dict[str, list[Any]]:
        return {"messages": [answered("small-1", 100, 20)]}

    def both(state: MessagesState) -> dict[str, list[Any]]:
        return {"messages": [answered("small-1", 10, 1), answered("large-1", 30, 4)]}

    def quiet(state: MessagesState) -> dict[str, list[Any]]:
        return {"messages": [AIMessage(content="no usage reported")]}

    builder = StateGraph(MessagesState)
    builder.add_node("small", small)
    builder.add_node("both", both)
    builder.add_node("quiet", quiet)
    builder.add_edge(START, "small")
    builder.add_edge("small", "both")
    builder.add_edge("both", "quiet")
    builder.add_edge("quiet", END)
    return builder.compile(checkpointer=checkpointer)


@asynccontextmanager
async def placed(
    clustered: KafkaServers | None, tmp_path: Path
) -> AsyncIterator[tuple[World, SpendLedger, dict[str, str]]]:
    """A world, its spend ledger, and the environment `onward` opens the same stores from."""
    if clustered is None:
        path = tmp_path / "onward.db"
        env = {
            "ONWARD_BACKEND": "sqlite",
            "ONWARD_SQLITE_PATH": str(path),
            "ONWARD_PARTITIONS": "4",
        }
        async with sqlite_world(path) as world, SqliteSpendLedger(path) as ledger:
            yield world, ledger, env
        return
    env = {k: v for k, v in clustered.env(partitions=2).items() if k != "ONWARD_REQUEST_KEY"}
    async with (
        kafka_world(*clustered) as world,
        PostgresSpendLedger(clustered.database_url, schema=clustered.schema) as ledger,
    ):
        yield world, ledger, env


def saver_of(world: World, ledger: SpendLedger) -> OnwardSaver:
    return OnwardSaver(
        world.log,
        world.leases,
        tenant=TENANT,
        frontiers=world.frontiers,
        checkpoint_inline=world.embedded,
        summaries=world.summaries,
        spend=ledger,
        prices=PRICES,
    )


async def test_a_graph_s_model_calls_are_recorded_once_and_shown(
    clustered: KafkaServers | None, tmp_path: Path
) -> None:
    thread_id = f"chat-{uuid.uuid4().hex[:8]}"
    async with (
        placed(clustered, tmp_path) as (world, ledger, env),
        saver_of(world, ledger) as saver,
    ):
        graph = chat_graph(saver)
        await graph.ainvoke({"messages": [HumanMessage("hi")]}, config(thread_id))
        await graph.ainvoke({"messages": [HumanMessage("again")]}, config(thread_id))

        entries = await ledger.entries(thread_id)
        # Per turn: small-1 100/20 = 400; one task's two answers 10/1 + 30/4 = 30 + 230.
        assert [(e.model, e.input_tokens, e.output_tokens, e.micros) for e in entries] == [
            ("small-1", 100, 20, 400),
            ("large-1, small-1", 40, 5, 260),
        ] * 2
        events = {stored.event.seq: stored.event for stored in await world.log.read_run(thread_id)}
        for entry in entries:
            assert isinstance(events[entry.seq], GraphWritesSaved), entry
            assert entry.tenant == TENANT

        # LangGraph putting a task's writes again (a retry) records nothing more.
        written = events[entries[-1].seq]
        assert isinstance(written, GraphWritesSaved)
        again = {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": written.checkpoint_ns,
                "checkpoint_id": written.checkpoint_id,
            }
        }
        await saver.aput_writes(
            again,  # type: ignore[arg-type]
            [("messages", [answered("small-1", 10, 1), answered("large-1", 30, 4)])],
            written.task_id,
        )
        total = await ledger.run_total(thread_id)
        assert (total.micros, total.calls) == (1320, 4)

    argv = ["inspect", thread_id, "--tenant", TENANT, "--json"]
    shown = await asyncio.to_thread(CliRunner().invoke, cli, argv, env=env)
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["spend"] == {"micros": 1320, "calls": 4}


async def test_a_saver_without_a_ledger_records_nothing(tmp_path: Path) -> None:
    path = tmp_path / "onward.db"
    thread_id = "unrecorded"
    async with sqlite_world(path) as world, SqliteSpendLedger(path) as ledger:
        async with world.saver() as saver:
            await chat_graph(saver).ainvoke({"messages": [HumanMessage("hi")]}, config(thread_id))
        assert await ledger.entries(thread_id) == []


@pytest.mark.parametrize(
    ("usage", "counted"),
    [
        ({"input_tokens": -3, "output_tokens": 5}, (0, 5)),
        ({"input_tokens": 12}, (12, 0)),
    ],
)
async def test_usage_a_model_reports_badly_counts_as_no_tokens(
    tmp_path: Path, usage: dict[str, Any], counted: tuple[int, int]
) -> None:
    path = tmp_path / "onward.db"
    odd = AIMessage(content="odd", response_metadata={"model_name": "small-1"})
    odd.usage_metadata = usage  # type: ignore[assignment]  # as a provider's adapter may set it

    def node(state: MessagesState) -> dict[str, list[Any]]:
        return {"messages": [odd]}

    builder = StateGraph(MessagesState)
    builder.add_node("node", node)
    builder.add_edge(START, "node")
    builder.add_edge("node", END)
    async with sqlite_world(path) as world, SqliteSpendLedger(path) as ledger:
        async with saver_of(world, ledger) as saver:
            graph = builder.compile(checkpointer=saver)
            await graph.ainvoke({"messages": []}, config("odd"))
        entries = await ledger.entries("odd")
    # The call is still counted; what it reported that is no token count counts 0.
    assert [(e.input_tokens, e.output_tokens) for e in entries] == [counted]
