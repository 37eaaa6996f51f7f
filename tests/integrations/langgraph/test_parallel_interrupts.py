"""Two interrupts pending at once: answering one leaves the other pending, in Onward too.

Two nodes run in parallel and each calls ``interrupt()``: LangGraph holds both, and a resume
may answer one of them by its id (``Command(resume={id: value})``). The node answered saves its
``RESUME`` write once it is done; the other is run again and asks again first. That write
answers its own interrupt only: taken as the answer to the request asked last (the other's),
it closed that one, and the thread dropped out of ``list_pending`` while the graph still waited
on a person there.
"""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, interrupt
from support.servers import KafkaServers

from onward.eventlog import ApprovalGranted, ApprovalRequested

from .graphs import config
from .test_interrupts_left_behind import waiting
from .worlds import World, kafka_world


class Answers(TypedDict):
    got: Annotated[list[str], operator.add]


async def asked(world: World, thread_id: str) -> list[str]:
    return [
        s.event.request_id
        for s in await world.log.read_run(thread_id)
        if isinstance(s.event, ApprovalRequested)
    ]


def two_questions(world: World, thread_id: str, saver: Any) -> CompiledStateGraph[Any]:
    """Nodes ``a`` and ``b`` each ask in parallel; ``a``, once answered, finishes only after
    ``b`` has asked again (three requests in the log), so its ``RESUME`` write comes last."""

    async def a(state: Answers) -> dict[str, list[str]]:
        answer = interrupt("a?")
        for _ in range(500):
            if len(await asked(world, thread_id)) >= 3:
                break
            await asyncio.sleep(0.01)
        return {"got": [f"a={answer}"]}

    async def b(state: Answers) -> dict[str, list[str]]:
        return {"got": [f"b={interrupt('b?')}"]}

    builder = StateGraph(Answers)
    builder.add_node("a", a)
    builder.add_node("b", b)
    builder.add_edge(START, "a")
    builder.add_edge(START, "b")
    builder.add_edge("a", END)
    builder.add_edge("b", END)
    return builder.compile(checkpointer=saver)


async def check_one_answered(world: World) -> None:
    thread = config("both")
    async with world.saver() as saver:
        graph = two_questions(world, "both", saver)
        out = await graph.ainvoke({"got": []}, thread)
        ids = {i.value: i.id for i in out["__interrupt__"]}
        assert await waiting(world, "both")

        out = await graph.ainvoke(Command(resume={ids["a?"]: "yes"}), thread)
        assert out["got"] == ["a=yes"]
        assert [i.id for i in (await graph.aget_state(thread)).interrupts] == [ids["b?"]]
        assert len(await asked(world, "both")) == 3
        # The graph waits on b: so does the thread, on b's request, which nobody answered.
        assert await waiting(world, "both")
        async with world.saver() as reader:
            assert (await reader.aread_thread("both")).waiting_on == f"langgraph:{ids['b?']}"
        granted = [
            s.event.request_id
            for s in await world.log.read_run("both")
            if isinstance(s.event, ApprovalGranted)
        ]
        assert f"langgraph:{ids['b?']}" not in granted

        out = await graph.ainvoke(Command(resume={ids["b?"]: "no"}), thread)
        assert sorted(out["got"]) == ["a=yes", "b=no"]
        assert not await waiting(world, "both")


async def test_answering_one_of_two_interrupts_leaves_the_other_pending_on_sqlite(
    world: World,
) -> None:
    await check_one_answered(world)


@pytest.mark.kafka
async def test_answering_one_of_two_interrupts_leaves_the_other_pending_on_kafka(
    kafka_servers: KafkaServers,
) -> None:
    async with kafka_world(*kafka_servers) as world:
        await check_one_answered(world)
