"""A list channel that grows by appends is stored as what it appends (format 2 of
``graph.checkpointed``), and every read rebuilds the same values a saver storing them whole
returns; threads written before, every value whole (format 1), read and carry on."""

from __future__ import annotations

import itertools
import json
import operator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import msgspec
import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from support.servers import KafkaServers

from onward.errors import CheckpointFormatError, InvalidInputError
from onward.eventlog import (
    EVENT_FORMAT,
    ChannelValue,
    GraphCheckpointed,
    RunClaimed,
    Serialized,
    SqliteEventLog,
    codec,
)
from onward.integrations.langgraph import OnwardSaver

from .graphs import config
from .worlds import TENANT, World, kafka_world

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "langgraph"


class Turns(TypedDict):
    steps: Annotated[list[str], operator.add]
    turns: int


def turns_graph(who: str, checkpointer: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any]:
    """One node appending two items to ``steps`` (a list channel with a reducer) and counting
    ``turns`` (a value stored whole): the graph the format-1 fixture was recorded with."""

    def step(state: Turns) -> dict[str, Any]:
        return {"steps": [who, f"{who}-again"], "turns": state.get("turns", 0) + 1}

    builder = StateGraph(Turns)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    return builder.compile(checkpointer=checkpointer)


def twice(whos: str) -> list[str]:
    """What `turns_graph` appends to ``steps`` over one invocation per letter."""
    return [item for who in whos for item in (who, f"{who}-again")]


def saver_of(world: World, **options: Any) -> OnwardSaver:
    return OnwardSaver(
        world.log,
        world.leases,
        tenant=TENANT,
        frontiers=world.frontiers,
        checkpoint_inline=world.embedded,
        **options,
    )


async def listed_values(saver: BaseCheckpointSaver[Any], thread_id: str) -> list[Any]:
    """Every checkpoint's channel values, newest first."""
    return [t.checkpoint["channel_values"] async for t in saver.alist(config(thread_id))]


async def saved_values(world: World, thread_id: str, channel: str) -> list[ChannelValue]:
    """How each checkpoint of the thread saved ``channel``, in the order they were saved."""
    return [
        item
        for stored in await world.log.read_run(thread_id)
        if isinstance(stored.event, GraphCheckpointed)
        for item in stored.event.values
        if item.channel == channel
    ]


async def test_a_growing_list_is_saved_as_its_appends_and_read_as_a_whole_saver_reads_it(
    world: World,
) -> None:
    await appends_round_trip(world)


@pytest.mark.kafka
async def test_appends_round_trip_on_kafka(kafka_servers: KafkaServers) -> None:
    async with kafka_world(*kafka_servers) as world:
        await appends_round_trip(world)


async def appends_round_trip(world: World) -> None:
    """Five invocations saved by one saver, read by another and by the writer, against the
    values LangGraph's in-memory saver holds for the same invocations."""
    reference = InMemorySaver()
    async with saver_of(world) as writer, saver_of(world) as reader:
        for who in "ABCDE":
            await turns_graph(who, writer).ainvoke({"steps": []}, config("t"))
            await turns_graph(who, reference).ainvoke({"steps": []}, config("t"))
        saved = await saved_values(world, "t", "steps")
        # The first invocation's input saves the empty list whole; from then on each input
        # appends nothing and each step its two items.
        assert [(item.base is None, len(item.items or [])) for item in saved] == [
            (True, 0),
            (False, 2),
        ] + [(False, 0), (False, 2)] * 4
        assert all(item.value is None for item in saved)
        for before, after in itertools.pairwise(saved):
            assert after.base is None or after.base == before.version
        expected = await listed_values(reference, "t")
        assert await listed_values(reader, "t") == expected
        assert await listed_values(writer, "t") == expected
        assert expected[0]["steps"] == twice("ABCDE")


async def test_a_read_walks_at_most_snapshot_every_appends(world: World) -> None:
    reference = InMemorySaver()
    async with saver_of(world, snapshot_every=3) as writer, saver_of(world) as reader:
        for who in "ABCDEFGHIJ":
            await turns_graph(who, writer).ainvoke({"steps": []}, config("t"))
            await turns_graph(who, reference).ainvoke({"steps": []}, config("t"))
        state = await writer.aread_thread("t")
        depths = [node.depth for (_, channel, _), node in state.values.items() if node.listed]
        assert max(depths) == 2
        assert any(not node.items and node.base for node in state.values.values())
        assert sum(1 for d in depths if d == 0) > 1  # whole again, in memory, every 3 appends
        expected = await listed_values(reference, "t")
        assert await listed_values(writer, "t") == expected
        assert await listed_values(reader, "t") == expected
        saved = await saved_values(world, "t", "steps")
        assert sum(1 for item in saved if item.base is None) == 1  # the log holds no snapshot
    with pytest.raises(InvalidInputError, match="snapshot_every"):
        saver_of(world, snapshot_every=0)


class Rows(TypedDict):
    rows: Annotated[list[dict[str, int]], operator.add]
    order: list[str]


def rows_graph(checkpointer: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any]:
    """A node that changes an item it was given in place, then appends one; another that
    drops the first item of a plain list and adds one, so the new list does not start with
    the old one."""

    def change_and_append(state: Rows) -> dict[str, Any]:
        if state["rows"]:
            state["rows"][0]["n"] += 100
        return {"rows": [{"n": len(state["rows"])}], "order": [*state.get("order", []), "x"]}

    def rotate(state: Rows) -> dict[str, Any]:
        return {"order": [*state["order"][1:], "y"]}

    builder = StateGraph(Rows)
    builder.add_node("change_and_append", change_and_append)
    builder.add_node("rotate", rotate)
    builder.add_edge(START, "change_and_append")
    builder.add_edge("change_and_append", "rotate")
    builder.add_edge("rotate", END)
    return builder.compile(checkpointer=checkpointer)


async def test_a_list_that_does_not_extend_the_last_one_is_saved_whole(world: World) -> None:
    async with saver_of(world) as writer, saver_of(world) as reader:
        for _ in range(3):
            # Each checkpoint saved before the next node runs (and changes a row in place).
            out = await rows_graph(writer).ainvoke({"rows": []}, config("t"), durability="sync")
        latest = await reader.aget_tuple(config("t"))
        assert latest is not None
        assert latest.checkpoint["channel_values"]["rows"] == out["rows"]
        assert latest.checkpoint["channel_values"]["order"] == out["order"]
        assert out["rows"][0]["n"] >= 100  # changed in place, and saved so
        # (saved whole, how many items): once the first row is changed in place, the next
        # list's serialized items no longer start with the last one's, so it is saved whole.
        rows = await saved_values(world, "t", "rows")
        assert [(item.base is None, len(item.items or [])) for item in rows] == [
            (True, 0),
            (False, 1),
            (False, 0),
            (True, 2),
            (False, 0),
            (True, 3),
        ]
        order = await saved_values(world, "t", "order")
        assert [(item.base is None, len(item.items or [])) for item in order] == [
            (True, 1),
            (True, 1),
            (False, 1),
            (True, 2),
            (False, 1),
            (True, 3),
        ]


async def test_a_thread_saved_whole_in_format_1_reads_and_carries_on(
    world: World, tmp_path: Path
) -> None:
    records = (FIXTURES / "thread_format_1.jsonl").read_bytes().splitlines()
    expected = json.loads((FIXTURES / "thread_format_1.expected.json").read_text())
    assert {codec.decode(r).format for r in records if b"graph.checkpointed" in r} == {1}
    assert isinstance(world.log, SqliteEventLog)
    for record in records:
        world.log.write_raw("thread-format-1", record)
    thread = config("thread-format-1")
    async with saver_of(world) as saver:
        listed = [t async for t in saver.alist(thread)]
        assert [
            {
                "checkpoint_id": t.config["configurable"]["checkpoint_id"],
                "channel_values": t.checkpoint["channel_values"],
            }
            for t in listed
        ] == expected
        out = await turns_graph("D", saver).ainvoke({"steps": []}, thread)
        out = await turns_graph("E", saver).ainvoke({"steps": []}, thread)
        assert out == {"steps": twice("ABCDE"), "turns": 5}
    new = [
        stored.event
        for stored in await world.log.read_run("thread-format-1")
        if isinstance(stored.event, GraphCheckpointed) and stored.event.format == 2
    ]
    steps = [item for event in new for item in event.values if item.channel == "steps"]
    # The old whole value cannot be extended item by item: saved whole once, then appends.
    assert [item.base is None for item in steps] == [True] + [False] * (len(steps) - 1)
    async with saver_of(world) as reader:
        latest = await reader.aget_tuple(thread)
        assert latest is not None
        assert latest.checkpoint["channel_values"] == out


async def test_pruned_and_copied_threads_keep_what_their_appends_extend(world: World) -> None:
    async with saver_of(world) as saver:
        for who in "ABCD":
            await turns_graph(who, saver).ainvoke({"steps": []}, config("t"))
        before = await saver.aget_tuple(config("t"))
        assert before is not None
        await saver.aprune(["t"], strategy="keep_latest")
        await saver.acopy_thread("t", "copy")
    async with saver_of(world) as reader:
        for thread_id in ("t", "copy"):
            after = await reader.aget_tuple(config(thread_id))
            assert after is not None
            assert after.checkpoint["channel_values"] == before.checkpoint["channel_values"]
        assert len(await listed_values(reader, "copy")) == 1
    copied = await saved_values(world, "copy", "steps")
    assert [(item.base, len(item.items or [])) for item in copied] == [(None, 8)]
    async with saver_of(world) as writer, saver_of(world) as reader:
        for thread_id in ("t", "copy"):
            # Both carry on by appends: to a version a pruned checkpoint saved, and to the copy.
            out = await turns_graph("E", writer).ainvoke({"steps": []}, config(thread_id))
            assert out["steps"] == twice("ABCDE")
            latest = await reader.aget_tuple(config(thread_id))
            assert latest is not None
            assert latest.checkpoint["channel_values"] == out
            last = (await saved_values(world, thread_id, "steps"))[-1]
            assert (last.base is not None, len(last.items or [])) == (True, 2)


def test_graph_checkpoints_are_written_in_format_2_and_a_newer_one_is_refused() -> None:
    blank = Serialized(type="null")
    event = GraphCheckpointed(
        run_id="r",
        tenant=TENANT,
        seq=1,
        fence=1,
        checkpoint_id="c",
        checkpoint=blank,
        metadata=blank,
    )
    assert (event.format, EVENT_FORMAT) == (2, 1)
    assert RunClaimed(run_id="r", tenant=TENANT, seq=1, fence=1, worker="w").format == 1
    newer = msgspec.json.encode({**msgspec.to_builtins(event), "kind": "graph.checkpointed"})
    assert codec.decode(newer).format == 2
    newer = newer.replace(b'"format":2', b'"format":3')
    with pytest.raises(CheckpointFormatError, match="newer than this code reads"):
        codec.decode(newer)
