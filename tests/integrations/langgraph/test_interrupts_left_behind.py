"""An interrupt stops being pending once the graph goes on past it, however it does.

An ``interrupt()`` is an `ApprovalRequested`, so the thread is listed as waiting on a person.
A resume whose ``RESUME`` write is saved answers it (`ApprovalGranted`). A graph can also go on
without that write: a new input instead of an answer, ``update_state``, or a resume under
``durability="exit"`` (which saves the final checkpoint and none of the run's writes). LangGraph
then has no interrupt pending, and neither may Onward: the checkpoint that goes on closes it
(`ApprovalDenied`), or the thread looks waiting on a person for good.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Literal, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, interrupt
from support.servers import KafkaServers
from typer.testing import CliRunner, Result

from onward.eventlog import ApprovalDenied, ApprovalGranted, ApprovalRequested
from onward.integrations.langgraph import OnwardSaver
from onward.runtime.cli import app as cli
from onward.runtime.manager import ExecutionManager

from .graphs import config
from .worlds import TENANT, World, kafka_world, sqlite_world


class Order(TypedDict):
    item: str
    answer: str


def _confirm(state: Order) -> dict[str, str]:
    if state["item"] == "nothing":
        return {"answer": "nothing to confirm"}
    return {"answer": str(interrupt(f"buy {state['item']}?"))}


def order_graph(saver: OnwardSaver) -> CompiledStateGraph[Any]:
    builder = StateGraph(Order)
    builder.add_node("confirm", _confirm)
    builder.add_edge(START, "confirm")
    builder.add_edge("confirm", END)
    return builder.compile(checkpointer=saver)


async def waiting(world: World, thread_id: str) -> bool:
    """Whether the thread waits on a person: as a fresh fold of its log has it, and (embedded,
    where the row is kept inline) as ``list_pending`` lists it."""
    async with world.saver() as reader:
        folded = (await reader.aread_thread(thread_id)).waiting_on is not None
    if world.embedded:
        listed = await ExecutionManager(world.frontiers, world.leases).list_pending(tenant=TENANT)
        assert (thread_id in {p.summary.run_id for p in listed}) == folded
    return folded


async def approvals(world: World, thread_id: str) -> list[type]:
    kinds = (ApprovalRequested, ApprovalGranted, ApprovalDenied)
    return [type(s.event) for s in await world.log.read_run(thread_id) if type(s.event) in kinds]


Durability = Literal["sync", "async", "exit"]


async def check_left_behind(world: World) -> None:
    async with world.saver() as saver:
        graph = order_graph(saver)
        # A new input instead of an answer: LangGraph has nothing pending any more.
        out = await graph.ainvoke({"item": "book", "answer": ""}, config("new-input"))
        assert "__interrupt__" in out
        assert await waiting(world, "new-input")
        await graph.ainvoke({"item": "nothing", "answer": ""}, config("new-input"))
        assert (await graph.aget_state(config("new-input"))).interrupts == ()
        assert not await waiting(world, "new-input")
        assert await approvals(world, "new-input") == [ApprovalRequested, ApprovalDenied]

        # The state updated while interrupted: LangGraph has nothing pending either.
        await graph.ainvoke({"item": "lamp", "answer": ""}, config("updated"))
        await graph.aupdate_state(config("updated"), {"item": "nothing"})
        assert (await graph.aget_state(config("updated"))).interrupts == ()
        assert not await waiting(world, "updated")

        # Answered: the saved RESUME write is the answer, nothing is closed as denied.
        durability: Durability
        for durability in ("sync", "async"):
            thread = config(f"answered-{durability}")
            await graph.ainvoke({"item": "pen", "answer": ""}, thread, durability=durability)
            assert await waiting(world, f"answered-{durability}")
            await graph.ainvoke(Command(resume="yes"), thread, durability=durability)
            assert not await waiting(world, f"answered-{durability}")
            assert await approvals(world, f"answered-{durability}") == [
                ApprovalRequested,
                ApprovalGranted,
            ]

        # Answered under durability="exit": no RESUME write is saved, the final checkpoint is.
        thread = config("answered-exit")
        await graph.ainvoke({"item": "pen", "answer": ""}, thread, durability="exit")
        assert await waiting(world, "answered-exit")
        out = await graph.ainvoke(Command(resume="yes"), thread, durability="exit")
        assert out["answer"] == "yes"
        assert not await waiting(world, "answered-exit")

        await graph.ainvoke({"item": "cup", "answer": ""}, config("from-summary"))
    # A saver that folds the thread on from its summary closes it the same way.
    async with world.saver() as fresh:
        await order_graph(fresh).ainvoke({"item": "nothing", "answer": ""}, config("from-summary"))
    assert not await waiting(world, "from-summary")


async def test_an_interrupt_the_graph_went_past_is_not_pending_on_sqlite(world: World) -> None:
    await check_left_behind(world)


@pytest.mark.kafka
async def test_an_interrupt_the_graph_went_past_is_not_pending_on_kafka(
    kafka_servers: KafkaServers,
) -> None:
    async with kafka_world(*kafka_servers) as world:
        await check_left_behind(world)


async def test_onward_approve_refuses_an_interrupt_the_graph_alone_can_be_answered_through(
    tmp_path: Path,
) -> None:
    """The graph reads its answer from its own ``RESUME`` write, never from an approval
    recorded beside it: recorded, the answer was lost, and the thread stopped looking waiting
    while the graph still waited. `inspect` named `onward approve` as the way on."""
    db = tmp_path / "onward.db"
    async with sqlite_world(db) as world, world.saver() as saver:
        out = await order_graph(saver).ainvoke({"item": "pen", "answer": ""}, config("t"))
    request = f"langgraph:{out['__interrupt__'][0].id}"

    def onward(*argv: str) -> Result:
        env = {"ONWARD_BACKEND": "sqlite", "ONWARD_SQLITE_PATH": str(db), "ONWARD_PARTITIONS": "4"}
        return CliRunner().invoke(cli, [*argv, "--tenant", TENANT], env=env)

    shown = await asyncio.to_thread(onward, "inspect", "t", "--json")
    assert shown.exit_code == 0, shown.output
    assert "Command(resume=...)" in json.loads(shown.stdout)["resume_would"]
    for verb in ("approve", "deny"):
        answered = await asyncio.to_thread(onward, verb, "t", request, "--by", "ann")
        assert answered.exit_code == 2, answered.output
        assert "is a LangGraph thread" in answered.stderr
    async with sqlite_world(db) as world:
        assert await approvals(world, "t") == [ApprovalRequested]
        assert await waiting(world, "t")
        async with world.saver() as saver:
            out = await order_graph(saver).ainvoke(Command(resume="yes"), config("t"))
        assert out["answer"] == "yes"
        assert not await waiting(world, "t")
