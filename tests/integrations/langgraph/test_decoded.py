"""The saver keeps the latest version of a list of messages decoded: reads decode only what was
appended since, puts handed the same messages back serialize only the new ones, and nothing a
caller does to a returned value, nor prune, copy or delete, makes a later read differ from what
a saver reading the log afresh returns."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.graph.state import CompiledStateGraph
from support.servers import KafkaServers

from onward.eventlog import Serialized
from onward.integrations.langgraph import OnwardSaver
from onward.integrations.langgraph.thread import ChannelNode

from .graphs import config
from .worlds import TENANT, World, kafka_world


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def chat_graph(checkpointer: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any]:
    """One node answering the last message: each invocation appends a question and an answer."""

    def answer(state: Chat) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"re: {state['messages'][-1].content}")]}

    builder = StateGraph(Chat)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    builder.add_edge("answer", END)
    return builder.compile(checkpointer=checkpointer)


class CountingSerializer(JsonPlusSerializer):
    """LangGraph's serializer (strict, as the saver's default), counting the messages it
    writes and reads."""

    def __init__(self) -> None:
        super().__init__(allowed_msgpack_modules=None)
        self.dumped = 0
        self.loaded = 0

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        self.dumped += isinstance(obj, BaseMessage)
        return super().dumps_typed(obj)

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        obj = super().loads_typed(data)
        self.loaded += isinstance(obj, BaseMessage)
        return obj


def saver_of(world: World, **options: Any) -> OnwardSaver:
    return OnwardSaver(
        world.log,
        world.leases,
        tenant=TENANT,
        frontiers=world.frontiers,
        checkpoint_inline=world.embedded,
        **options,
    )


async def ask(saver: OnwardSaver, thread_id: str, *questions: str) -> list[BaseMessage]:
    """One invocation per question; the conversation after the last."""
    out: dict[str, Any] = {}
    for question in questions:
        out = await chat_graph(saver).ainvoke(
            {"messages": [HumanMessage(content=question)]}, config(thread_id)
        )
    return list(out["messages"])


async def latest_messages(saver: OnwardSaver, thread_id: str) -> list[Any]:
    found = await saver.aget_tuple(config(thread_id))
    assert found is not None
    return list(found.checkpoint["channel_values"]["messages"])


async def as_the_log_has_it(world: World, thread_id: str) -> list[Any]:
    """The latest conversation as a saver that never held the thread reads it from the log."""
    async with saver_of(world) as fresh:
        return await latest_messages(fresh, thread_id)


async def test_reads_decode_only_what_was_appended_and_puts_serialize_only_new_messages(
    world: World,
) -> None:
    questions = [f"q{i}" for i in range(12)]
    writing, reading = CountingSerializer(), CountingSerializer()
    async with saver_of(world, serde=writing) as writer, saver_of(world, serde=reading) as reader:
        conversation = await ask(writer, "t", *questions)
        assert len(conversation) == 2 * len(questions)
        # Each message is serialized once as the node's write and once in the checkpoint
        # that appends it (not again at every later checkpoint: that would be 300 and more).
        assert writing.dumped <= 2 * len(conversation) + len(questions)
        writing.loaded = 0
        assert await latest_messages(writer, "t") == conversation
        assert writing.loaded == 0  # the writer holds what it wrote
        assert await latest_messages(reader, "t") == conversation
        assert reading.loaded == len(conversation)
        await ask(writer, "t", "one more")
        reading.loaded = 0
        again = await latest_messages(reader, "t")
        assert again == await as_the_log_has_it(world, "t")
        assert reading.loaded == 2  # the question and its answer only


async def test_a_saver_that_read_a_thread_goes_on_from_its_fold_when_it_writes(
    world: World,
) -> None:
    async with saver_of(world) as first:
        conversation = await ask(first, "t", *(f"q{i}" for i in range(10)))
    serde = CountingSerializer()
    async with saver_of(world, serde=serde) as second:
        # An invocation reads the thread, then claims it at its first put: the claim folds on
        # from that read (the log's new tail only), so the messages read stay decoded and the
        # puts serialize only the new ones, not the 20 before them again.
        after = await ask(second, "t", "next")
        assert after[: len(conversation)] == conversation
        # (Each new message is read back once too, to check it reads back as itself.)
        assert serde.loaded == len(conversation) + 2
        assert serde.dumped <= 2 * 2 + 1
    assert await as_the_log_has_it(world, "t") == after


async def test_a_caller_changing_a_returned_list_does_not_change_the_next_read(
    world: World,
) -> None:
    await returned_lists_changed(world, "t")


async def test_kept_messages_follow_prune_copy_and_delete(world: World) -> None:
    await pruned_copied_deleted(world, "t", "copy")


@pytest.mark.kafka
async def test_kept_messages_on_kafka(kafka_servers: KafkaServers) -> None:
    async with kafka_world(*kafka_servers) as world:
        await returned_lists_changed(world, "changed")
        await pruned_copied_deleted(world, "t", "copy")


async def returned_lists_changed(world: World, t: str) -> None:
    """A returned list changed by its caller, on the writer and on another reader."""
    async with saver_of(world) as writer, saver_of(world) as reader:
        conversation = await ask(writer, t, "a", "b", "c")
        for saver in (writer, reader):
            first = await latest_messages(saver, t)
            found = await saver.aget_tuple(config(t))
            assert found is not None
            returned = found.checkpoint["channel_values"]["messages"]
            returned.append(HumanMessage(content="not saved"))
            del returned[0]
            returned.reverse()
            assert await latest_messages(saver, t) == first == conversation
        # The messages themselves are shared between reads (each is a value to LangGraph):
        # a second read decodes nothing again.
        once, twice = await latest_messages(reader, t), await latest_messages(reader, t)
        assert all(a is b for a, b in zip(once, twice, strict=True))
        # A later invocation carries on from the list as stored.
        assert [_plain(m) for m in await ask(writer, t, "d")] == await ask_reference("abcd")
        assert await latest_messages(reader, t) == await as_the_log_has_it(world, t)


async def ask_reference(questions: str) -> list[BaseMessage]:
    """The conversation LangGraph's in-memory saver holds after one invocation per letter."""
    from langgraph.checkpoint.memory import InMemorySaver  # noqa: PLC0415

    graph = chat_graph(InMemorySaver())
    out: dict[str, Any] = {}
    for question in questions:
        out = await graph.ainvoke({"messages": [HumanMessage(content=question)]}, config("r"))
    return [_plain(m) for m in out["messages"]]


def _plain(message: BaseMessage) -> BaseMessage:
    """A message without its id (ids are random per saver), to compare conversations."""
    return message.model_copy(update={"id": None})


async def pruned_copied_deleted(world: World, t: str, copy: str) -> None:
    """Threads read (so kept decoded), then pruned, copied, carried on, deleted, begun again."""
    async with saver_of(world) as writer, saver_of(world) as reader:
        await ask(writer, t, "a", "b")
        for saver in (writer, reader):
            await latest_messages(saver, t)  # kept decoded from here on
        await writer.aprune([t], strategy="keep_latest")
        await ask(writer, t, "c")
        await writer.acopy_thread(t, copy)
        await ask(writer, copy, "d")
        for thread_id, letters in ((t, "abc"), (copy, "abcd")):
            expected = await as_the_log_has_it(world, thread_id)
            assert [_plain(m) for m in expected] == await ask_reference(letters)
            for saver in (writer, reader):
                assert await latest_messages(saver, thread_id) == expected
        await writer.adelete_thread(t)
        assert await writer.aget_tuple(config(t)) is None
        assert await reader.aget_tuple(config(t)) is None
        # Started again: nothing of the deleted conversation comes back from what was kept.
        await ask(writer, t, "z")
        expected = await as_the_log_has_it(world, t)
        assert [_plain(m) for m in expected] == await ask_reference("z")
        for saver in (writer, reader):
            assert await latest_messages(saver, t) == expected


def add_rows(left: list[dict[str, int]], right: list[dict[str, int]]) -> list[dict[str, int]]:
    return [*left, *right]


class Rows(TypedDict):
    rows: Annotated[list[dict[str, int]], add_rows]


async def test_items_that_are_not_values_are_decoded_afresh_at_every_read(world: World) -> None:
    def append(state: Rows) -> dict[str, Any]:
        return {"rows": [{"n": len(state["rows"])}]}

    builder = StateGraph(Rows)
    builder.add_node("append", append)
    builder.add_edge(START, "append")
    builder.add_edge("append", END)
    async with saver_of(world) as saver:
        graph = builder.compile(checkpointer=saver)
        for _ in range(3):
            await graph.ainvoke({"rows": []}, config("t"))
        found = await saver.aget_tuple(config("t"))
        assert found is not None
        found.checkpoint["channel_values"]["rows"][0]["n"] = 99  # a dict changed in place
        again = await saver.aget_tuple(config("t"))
        assert again is not None
        assert again.checkpoint["channel_values"]["rows"] == [{"n": 0}, {"n": 1}, {"n": 2}]


def test_the_items_appended_since_a_version_are_found_through_empty_appends_and_snapshots() -> None:
    def item(n: int) -> Serialized:
        return Serialized(type="int", data=str(n).encode())

    first = ChannelNode(items=(item(0), item(1)), listed=True, length=2)
    nothing_added = ChannelNode(base=first, listed=True, depth=1, length=2, extends=first)
    one_added = ChannelNode(
        items=(item(2),), base=nothing_added, listed=True, depth=2, length=3, extends=nothing_added
    )
    # A node holding the list whole again still names the version it appended to.
    whole_again = ChannelNode(
        items=tuple(map(item, range(4))), listed=True, length=4, extends=one_added
    )
    assert one_added.items_after(first) == [item(2)]
    assert whole_again.items_after(first) == [item(2), item(3)]
    assert whole_again.items_after(nothing_added) == [item(2), item(3)]
    assert whole_again.items_after(whole_again) == []
    assert first.items_after(one_added) is None  # an older version extends no newer one
    same_items_elsewhere = ChannelNode(items=(item(0), item(1)), listed=True, length=2)
    assert whole_again.items_after(same_items_elsewhere) is None


async def test_listing_a_thread_decodes_each_message_once(world: World) -> None:
    questions = [f"q{i}" for i in range(12)]
    async with saver_of(world) as writer:
        conversation = await ask(writer, "t", *questions)
    serde = CountingSerializer()
    async with saver_of(world, serde=serde) as reader, saver_of(world) as reference:
        listed = [t async for t in reader.alist(config("t"))]
        # Each checkpoint's list is the one of the checkpoint after it, less what that one
        # appended: a listing decodes every message once, not each checkpoint's from scratch
        # (that would be over 150 here, and grow with the square of the thread's length).
        assert serde.loaded <= len(conversation) + len(questions)
        assert [t.checkpoint for t in listed] == [
            t.checkpoint async for t in reference.alist(config("t"))
        ]
        assert listed[0].checkpoint["channel_values"]["messages"] == conversation
