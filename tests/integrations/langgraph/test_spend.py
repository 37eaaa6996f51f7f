"""What a LangGraph graph's model calls cost is recorded in the deployment's spend ledger.

The saver reads the usage each AI message a node writes reports, prices it by the message's
model name and records it under the thread and the seq of the writes it came in, once: the
same writes put again (LangGraph retrying them) count nothing more. `onward inspect` shows a
thread's spend as it shows a run's. Embedded SQLite, and Kafka + PostgreSQL + Redis.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from support.servers import KafkaServers
from typer.testing import CliRunner

from onward.errors import (
    BackendUnavailableError,
    BudgetExceededError,
    ConfigurationError,
    InvalidInputError,
    RunCancelledError,
)
from onward.eventlog import GraphWritesSaved, RunFinished
from onward.integrations.langgraph import OnwardSaver
from onward.runtime.cli import app as cli
from onward.runtime.spend import (
    MemorySpendLedger,
    PostgresSpendLedger,
    SpendLedger,
    SqliteSpendLedger,
)
from onward.runtime.spend.base import PriceTable, SpendEntry

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


def saver_of(
    world: World,
    ledger: SpendLedger,
    *,
    budget_micros: int | None = None,
    tenant_budget_micros: int | None = None,
) -> OnwardSaver:
    """A saver of ``world`` counting spend in ``ledger`` at `PRICES`."""
    return world.saver(
        spend=ledger,
        prices=PRICES,
        budget_micros=budget_micros,
        tenant_budget_micros=tenant_budget_micros,
    )


def ledger_down(
    ledger: SpendLedger, monkeypatch: pytest.MonkeyPatch, *, now: bool = True
) -> dict[str, bool]:
    """``ledger.record`` fails as a ledger that does not answer while the switch returned says
    ``now``; set it False and the ledger is back."""
    down = {"now": now}
    record = ledger.record

    async def record_unless_down(entry: SpendEntry) -> bool:
        if down["now"]:
            raise BackendUnavailableError("the spend ledger did not answer")
        return await record(entry)

    monkeypatch.setattr(ledger, "record", record_unless_down)
    return down


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


async def test_a_thread_over_its_budget_stops_after_the_call_that_passed_it(
    clustered: KafkaServers | None, tmp_path: Path
) -> None:
    thread_id = f"budgeted-{uuid.uuid4().hex[:8]}"
    # durability "sync": each step's checkpoint is written before the next step starts, so
    # where the run stops does not depend on how LangGraph interleaves its writes.
    sync: dict[str, Any] = {"durability": "sync"}
    async with placed(clustered, tmp_path) as (world, ledger, _):
        async with saver_of(world, ledger, budget_micros=700) as saver:
            graph = chat_graph(saver)
            await graph.ainvoke({"messages": [HumanMessage("hi")]}, config(thread_id))
            assert (await ledger.run_total(thread_id)).micros == 660
            # The second turn's first answer (400) passes the budget: it is kept, and the
            # write after it (that step's checkpoint) ends the graph run.
            with pytest.raises(BudgetExceededError, match="has spent 1060 micros") as stopped:
                await graph.ainvoke(
                    {"messages": [HumanMessage("again")]}, config(thread_id), **sync
                )
            assert (stopped.value.scope, stopped.value.budget_micros) == ("run", 700)
            assert stopped.value.spent_micros == 1060
            assert not saver.holds(thread_id)
            # A new invocation of the thread is stopped at its first write, calling nothing.
            with pytest.raises(BudgetExceededError, match="has spent 1060 micros"):
                await graph.ainvoke({"messages": [HumanMessage("more")]}, config(thread_id))
        assert (await ledger.run_total(thread_id)).calls == 3

        events = [stored.event for stored in await world.log.read_run(thread_id)]
        ends = [e for e in events if isinstance(e, RunFinished)]
        assert [e.status for e in ends] == ["failed", "failed"]
        assert ends[0].error is not None
        assert ends[0].error.startswith("BudgetExceededError: thread ")
        last_paid = (await ledger.entries(thread_id))[-1].seq
        assert isinstance(events[[e.seq for e in events].index(last_paid)], GraphWritesSaved)

        # A saver given more carries the thread on from the answer that was paid for.
        # Over its budget, the thread may still be copied, pruned (and deleted): not steps.
        async with saver_of(world, ledger, budget_micros=700) as saver:
            await saver.acopy_thread(thread_id, f"{thread_id}-copy")
            await saver.aprune([thread_id])
            assert (await saver.aget_tuple(config(thread_id))) is not None
            assert (await saver.aget_tuple(config(f"{thread_id}-copy"))) is not None

        async with saver_of(world, ledger, budget_micros=5_000) as saver:
            out = await chat_graph(saver).ainvoke(
                {"messages": [HumanMessage("go on")]}, config(thread_id), **sync
            )
        said = [m.content for m in out["messages"]]
        assert said[-2:] == ["answer of large-1", "no usage reported"]
        # "more" was never written: its invocation was stopped at its input's checkpoint.
        assert [m for m in said if m in ("hi", "again", "more", "go on")] == [
            "hi",
            "again",
            "go on",
        ]
        assert (await ledger.run_total(thread_id)).micros > 1060


async def test_a_tenant_over_its_budget_stops_every_thread_of_it(tmp_path: Path) -> None:
    path = tmp_path / "onward.db"
    sync: dict[str, Any] = {"durability": "sync"}
    async with sqlite_world(path) as world, SqliteSpendLedger(path) as ledger:
        async with saver_of(world, ledger, tenant_budget_micros=500) as saver:
            graph = chat_graph(saver)
            # 400, then 660 after the node asking both models: the next write ends the run.
            with pytest.raises(BudgetExceededError, match="tenant 'acme' has spent 660") as one:
                await graph.ainvoke({"messages": [HumanMessage("hi")]}, config("one"), **sync)
            assert one.value.scope == "tenant"
            with pytest.raises(BudgetExceededError, match="tenant 'acme' has spent 660"):
                await graph.ainvoke({"messages": [HumanMessage("hi")]}, config("two"), **sync)
            # Copying a thread is not a step of a graph: the tenant's budget does not stop it.
            await saver.acopy_thread("one", "one-copy")
            assert (await saver.aget_tuple(config("one-copy"))) is not None
        assert (await ledger.run_total("two")).calls == 0
        assert (await ledger.tenant_total(TENANT)).micros == 660


@pytest.mark.kafka
async def test_a_copied_thread_is_not_charged_again_for_the_calls_it_was_copied_with(
    kafka_servers: KafkaServers, tmp_path: Path
) -> None:
    """A copy's writes carry the usage of calls made for the thread they were copied from:
    a saver taking the copy records none of them (so no spend is recorded from the log)."""
    source = f"forked-{uuid.uuid4().hex[:8]}"
    copy = f"{source}-copy"
    async with placed(kafka_servers, tmp_path) as (placed_world, ledger, _):
        # Where the log is not SQLite, a thread summary store is optional: without one, the
        # saver that takes a thread reads the whole of it.
        world = dataclasses.replace(placed_world, summaries=None)
        async with saver_of(world, ledger) as saver:
            graph = chat_graph(saver)
            for said in ("hi", "again", "more", "still more"):
                await graph.ainvoke({"messages": [HumanMessage(said)]}, config(source))
            await saver.acopy_thread(source, copy)
        paid = await ledger.tenant_total(TENANT)
        assert (await ledger.run_total(source)).calls == 8
        # Whoever takes the copy next carries it on: the answers it was copied with were
        # paid for once, by the thread they were made in, and charged to the tenant then.
        async with saver_of(world, ledger) as saver:
            await saver.aclaim(copy)
            await saver.arelease(copy)
        assert (await ledger.run_total(copy)).calls == 0
        assert await ledger.tenant_total(TENANT) == paid


async def test_a_call_whose_writes_a_cancel_refused_is_still_counted(tmp_path: Path) -> None:
    path = tmp_path / "onward.db"
    place = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "x"}}
    async with sqlite_world(path) as world, SqliteSpendLedger(path) as ledger:
        async with saver_of(world, ledger) as saver:
            await saver.aput_writes(place, [("messages", [HumanMessage("hi")])], "ask")  # type: ignore[arg-type]
            assert await world.leases.ask_to_cancel("t", tenant=TENANT, by="ops")
            await saver.aput_writes(place, [("messages", [HumanMessage("go")])], "go")  # type: ignore[arg-type]
            # That write's confirmation heard the ask: the next one, carrying an answer the
            # model gave meanwhile, is refused and the run ended; the call was made all the same.
            with pytest.raises(RunCancelledError):
                await saver.aput_writes(
                    place,  # type: ignore[arg-type]
                    [("messages", [answered("small-1", 100, 20)])],
                    "model",
                )
        events = [stored.event for stored in await world.log.read_run("t")]
        entries = await ledger.entries("t")
    end = events[-1]
    assert isinstance(end, RunFinished)
    assert end.status == "cancelled"
    assert not any(isinstance(e, GraphWritesSaved) and e.task_id == "model" for e in events)
    assert [(e.seq, e.micros) for e in entries] == [(end.seq, 400)]


def test_a_budget_needs_a_ledger_and_a_count_of_micros(tmp_path: Path) -> None:
    async def refused() -> None:
        async with sqlite_world(tmp_path / "onward.db") as world:
            with pytest.raises(ConfigurationError, match="a budget needs the spend ledger"):
                OnwardSaver(world.log, world.leases, tenant=TENANT, budget_micros=10)
            for bad in (-1, 2.5, True, "10"):
                with pytest.raises(InvalidInputError, match="tenant_budget_micros must be"):
                    OnwardSaver(
                        world.log,
                        world.leases,
                        tenant=TENANT,
                        spend=MemorySpendLedger(),
                        tenant_budget_micros=bad,  # type: ignore[arg-type]
                    )

    asyncio.run(refused())


async def test_a_call_answered_while_the_ledger_was_down_is_still_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node's model answers (the provider is paid), but the ledger does not answer the
    record of that call. The call is counted all the same once the ledger is back: lost, a
    thread would pass its budget by a call each time the ledger blinks."""
    path = tmp_path / "onward.db"
    made: list[str] = []

    def small(state: MessagesState) -> dict[str, list[Any]]:
        made.append("small-1")
        return {"messages": [answered("small-1", 100, 20)]}

    builder = StateGraph(MessagesState)
    builder.add_node("small", small)
    builder.add_edge(START, "small")
    builder.add_edge("small", END)
    async with sqlite_world(path) as world, SqliteSpendLedger(path) as ledger:
        lost = {"once": True}
        record = ledger.record

        async def record_once(entry: SpendEntry) -> bool:
            if lost.pop("once", False):
                raise BackendUnavailableError("the spend ledger did not answer")
            return await record(entry)

        monkeypatch.setattr(ledger, "record", record_once)
        async with saver_of(world, ledger) as saver:
            graph = builder.compile(checkpointer=saver)
            # The answer is written all the same: the graph goes on, the call is not made again.
            await graph.ainvoke({"messages": [HumanMessage("hi")]}, config("t"))
            assert not lost
            await graph.ainvoke({"messages": [HumanMessage("again")]}, config("t"))
        total = await ledger.run_total("t")
    assert len(made) == 2
    assert (total.calls, total.micros) == (2, 800)


async def test_a_call_answered_while_the_ledger_was_down_counts_under_a_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same, for a saver given a budget: the ledger, down at the write carrying the
    answer, cannot weigh the budget either. The graph run stops on the ledger's error (a
    budget nobody can weigh is not passed), but the call it paid for is counted once the
    ledger is back."""
    path = tmp_path / "onward.db"

    def small(state: MessagesState) -> dict[str, list[Any]]:
        return {"messages": [answered("small-1", 100, 20)]}

    builder = StateGraph(MessagesState)
    builder.add_node("small", small)
    builder.add_edge(START, "small")
    builder.add_edge("small", END)
    async with sqlite_world(path) as world, SqliteSpendLedger(path) as ledger:
        down = {"now": False}

        def flaky(method: Any) -> Any:
            async def call(*args: Any, **kwargs: Any) -> Any:
                if down["now"]:
                    raise BackendUnavailableError("the spend ledger did not answer")
                return await method(*args, **kwargs)

            return call

        for name in ("record", "run_total", "tenant_total"):
            monkeypatch.setattr(ledger, name, flaky(getattr(ledger, name)))
        async with saver_of(world, ledger, budget_micros=10_000) as saver:
            graph = builder.compile(checkpointer=saver)
            down["now"] = True
            with pytest.raises(BackendUnavailableError):
                await graph.ainvoke({"messages": [HumanMessage("hi")]}, config("t"))
            down["now"] = False
        total = await ledger.run_total("t")
    assert (total.calls, total.micros) == (1, 400)


def small_graph(checkpointer: OnwardSaver, made: list[str]) -> CompiledStateGraph[Any]:
    """One node: the small model answers (400 micros), counted in ``made``."""

    def small(state: MessagesState) -> dict[str, list[Any]]:
        made.append("small-1")
        return {"messages": [answered("small-1", 100, 20)]}

    builder = StateGraph(MessagesState)
    builder.add_node("small", small)
    builder.add_edge(START, "small")
    builder.add_edge("small", END)
    return builder.compile(checkpointer=checkpointer)


async def test_a_call_made_again_after_its_writes_were_lost_is_counted_too(
    clustered: KafkaServers | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node's model answers, its spend is recorded, and the append of its writes fails
    (nothing stored). The next invocation makes the node again: a second paid call, written
    at the seq the lost writes were to take, which must count as well as the first."""
    thread_id = f"lost-{uuid.uuid4().hex[:8]}"
    made: list[str] = []
    sync: dict[str, Any] = {"durability": "sync"}
    async with placed(clustered, tmp_path) as (world, ledger, _):
        log = {"down": False, "cut": False}
        append = world.log.append

        async def cut_at_the_answer(events: Any) -> Any:
            paid = any(
                isinstance(e, GraphWritesSaved)
                and any(b"small-1" in w.value.data for w in e.writes)
                for e in events
            )
            if paid and not log["cut"]:
                log["cut"] = log["down"] = True
            if log["down"]:
                raise BackendUnavailableError("the log did not answer; nothing was stored")
            return await append(events)

        monkeypatch.setattr(world.log, "append", cut_at_the_answer)
        async with saver_of(world, ledger) as saver:
            graph = small_graph(saver, made)
            with pytest.raises(BackendUnavailableError):
                await graph.ainvoke({"messages": [HumanMessage("hi")]}, config(thread_id), **sync)
            assert log["cut"]
            log["down"] = False
            # The node's writes were lost: it runs again, and its model is paid again.
            out = await graph.ainvoke(None, config(thread_id), **sync)
            assert [m.content for m in out["messages"]] == ["hi", "answer of small-1"]
        total = await ledger.run_total(thread_id)
        events = [stored.event for stored in await world.log.read_run(thread_id)]
    assert len(made) == 2
    assert (total.calls, total.micros) == (2, 800)
    paid = [
        e.seq
        for e in events
        if isinstance(e, GraphWritesSaved)
        and e.task_id
        and any(b"small-1" in w.value.data for w in e.writes)
    ]
    assert len(paid) == 1


async def test_a_call_left_unrecorded_by_a_saver_that_ended_is_counted_at_the_next_claim(
    clustered: KafkaServers | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node's model answers while the ledger is down, and the saver that wrote the answer
    ends before the ledger comes back: the entry it kept is gone with it. The next saver to
    take the thread counts the call from the log, once, however often the thread is taken;
    a copy of the thread, whose writes carry the same answer, is charged nothing."""
    thread_id = f"ended-{uuid.uuid4().hex[:8]}"
    copy = f"{thread_id}-copy"
    made: list[str] = []
    async with placed(clustered, tmp_path) as (world, ledger, _):
        down = ledger_down(ledger, monkeypatch)
        async with saver_of(world, ledger) as saver:
            await small_graph(saver, made).ainvoke(
                {"messages": [HumanMessage("hi")]}, config(thread_id)
            )
        # That saver is gone (its process ended) with the ledger still down.
        assert (await ledger.run_total(thread_id)).calls == 0
        down["now"] = False
        async with saver_of(world, ledger) as saver:
            await saver.aclaim(thread_id)
            await saver.arelease(thread_id)
            assert (await ledger.run_total(thread_id)).calls == 1
            await saver.acopy_thread(thread_id, copy)
            await small_graph(saver, made).ainvoke(
                {"messages": [HumanMessage("again")]}, config(thread_id)
            )
        async with saver_of(world, ledger) as saver:
            await saver.aclaim(thread_id)
            await saver.aclaim(copy)
        total = await ledger.run_total(thread_id)
        copied = await ledger.run_total(copy)
        paid = await ledger.tenant_total(TENANT)
    assert len(made) == 2
    assert (total.calls, total.micros) == (2, 800)
    assert copied.calls == 0
    if clustered is None:
        assert (paid.calls, paid.micros) == (2, 800)


async def test_a_call_left_unrecorded_is_counted_beside_one_whose_writes_were_lost(
    clustered: KafkaServers | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node's model answers, its spend is recorded, and the append of its writes fails; the
    saver ends. The next saver makes the node again while the ledger is down, and ends before
    it comes back. The ledger then holds one entry (of the lost writes) as large as the writes
    in the log carry, but not the entry of the call those writes hold: the next claim must
    count it, not take the ledger's totals for it."""
    thread_id = f"both-{uuid.uuid4().hex[:8]}"
    made: list[str] = []
    sync: dict[str, Any] = {"durability": "sync"}
    async with placed(clustered, tmp_path) as (world, ledger, _):
        log = {"down": False, "cut": False}
        append = world.log.append

        async def cut_at_the_first_answer(events: Any) -> Any:
            paid = any(
                isinstance(e, GraphWritesSaved)
                and any(b"small-1" in w.value.data for w in e.writes)
                for e in events
            )
            if paid and not log["cut"]:
                log["cut"] = log["down"] = True
            if log["down"]:
                raise BackendUnavailableError("the log did not answer; nothing was stored")
            return await append(events)

        monkeypatch.setattr(world.log, "append", cut_at_the_first_answer)
        down = ledger_down(ledger, monkeypatch, now=False)
        async with saver_of(world, ledger) as saver:
            with pytest.raises(BackendUnavailableError):
                await small_graph(saver, made).ainvoke(
                    {"messages": [HumanMessage("hi")]}, config(thread_id), **sync
                )
            log["down"] = False
        assert (await ledger.run_total(thread_id)).calls == 1
        down["now"] = True
        async with saver_of(world, ledger) as saver:
            await small_graph(saver, made).ainvoke(None, config(thread_id), **sync)
        down["now"] = False
        async with saver_of(world, ledger) as saver:
            await saver.aclaim(thread_id)
            await saver.arelease(thread_id)
        total = await ledger.run_total(thread_id)
    assert len(made) == 2
    assert (total.calls, total.micros) == (2, 800)


class Opaque:
    """A value msgpack cannot write: a serializer with ``pickle_fallback`` pickles it."""


async def test_a_write_the_serializer_cannot_load_does_not_stop_a_claim_counting_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node answers (its spend left unrecorded: the ledger is down and the saver ends) and
    writes beside its messages a value the saver pickled. The next saver does not load
    pickles. Its claim, which reads the writes to count the call, must still take the thread
    and count the call from the messages it can read, not fail on the value it cannot."""
    path = tmp_path / "onward.db"

    class State(MessagesState):
        note: Any

    def small(state: State) -> dict[str, Any]:
        return {"messages": [answered("small-1", 100, 20)], "note": Opaque()}

    builder = StateGraph(State)
    builder.add_node("small", small)
    builder.add_edge(START, "small")
    builder.add_edge("small", END)
    async with sqlite_world(path) as world, SqliteSpendLedger(path) as ledger:
        down = ledger_down(ledger, monkeypatch)
        async with saver_of(world, ledger) as saver:
            saver.serde = JsonPlusSerializer(pickle_fallback=True)
            graph = builder.compile(checkpointer=saver)
            await graph.ainvoke(State(messages=[HumanMessage("hi")], note=None), config("t"))
        down["now"] = False
        async with saver_of(world, ledger) as saver:
            await saver.aclaim("t")
            await saver.arelease("t")
        total = await ledger.run_total("t")
    assert (total.calls, total.micros) == (1, 400)


async def test_a_ledger_blip_at_the_claim_does_not_let_a_thread_past_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node's call (400 micros) is answered while the ledger is down, and its saver ends:
    the thread has spent its budget of 400, though the ledger does not know it. The next
    saver's claim finds the ledger down for a moment and cannot count the call; back by the
    graph run's first write, the budget must weigh that call and stop the run before the
    node's model is paid again, not take the ledger's zero for what the thread spent."""
    path = tmp_path / "onward.db"
    made: list[str] = []
    async with sqlite_world(path) as world, SqliteSpendLedger(path) as ledger:
        down = ledger_down(ledger, monkeypatch)
        async with saver_of(world, ledger) as saver:
            await small_graph(saver, made).ainvoke({"messages": [HumanMessage("hi")]}, config("t"))
        down["now"] = False
        entries = ledger.entries
        blip = {"left": 1}

        async def entries_after_a_blip(run_id: str) -> list[SpendEntry]:
            if blip["left"]:
                blip["left"] -= 1
                raise BackendUnavailableError("the spend ledger did not answer")
            return await entries(run_id)

        monkeypatch.setattr(ledger, "entries", entries_after_a_blip)
        async with saver_of(world, ledger, budget_micros=400) as saver:
            with pytest.raises(BudgetExceededError):
                # Each step saved before the next runs: the budget is weighed before the node.
                await small_graph(saver, made).ainvoke(
                    {"messages": [HumanMessage("again")]}, config("t"), durability="sync"
                )
        total = await ledger.run_total("t")
    assert not blip["left"]
    assert len(made) == 1, "the node's model was paid again past the thread's budget"
    assert (total.calls, total.micros) == (1, 400)


async def test_a_call_cut_from_the_log_does_not_keep_the_rest_from_being_counted(
    clustered: KafkaServers | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two invocations each make one call (400 micros) while the ledger is down, and their
    saver ends; the log is then cut past the first call's writes (retention, or compaction
    without the saver's store). The next claim cannot count that call: it must still count
    the second, whose writes the log holds, and say which writes it cannot count, rather than
    give up on all of them as the runner once did."""
    thread_id = f"cut-{uuid.uuid4().hex[:8]}"
    made: list[str] = []
    async with placed(clustered, tmp_path) as (world, ledger, _):
        down = ledger_down(ledger, monkeypatch)
        async with saver_of(world, ledger) as saver:
            for said in ("hi", "again"):
                await small_graph(saver, made).ainvoke(
                    {"messages": [HumanMessage(said)]}, config(thread_id)
                )
        down["now"] = False
        paid = [
            stored
            for stored in await world.log.read_run(thread_id)
            if isinstance(stored.event, GraphWritesSaved) and stored.event.usage is not None
        ]
        assert len(paid) == 2
        async with saver_of(world, ledger) as saver:
            assert await saver.aget_tuple(config(thread_id)) is not None
            first = paid[0].position
            await world.log.truncate_before(first.partition, first.offset + 1)
            await saver.aclaim(thread_id)
            await saver.arelease(thread_id)
        total = await ledger.run_total(thread_id)
    assert len(made) == 2
    assert (total.calls, total.micros) == (1, 400)
    assert f"seq {paid[0].event.seq} were cut from the log" in caplog.text
