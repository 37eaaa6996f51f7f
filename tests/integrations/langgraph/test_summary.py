"""A thread's holder keeps a summary of its fold beside the log; a saver that has not read the
thread folds on from it through the log's tail, and returns what a fold of the whole thread
returns. A summary it cannot trust (another log's, unreadable, past what the log holds) is
ignored, and asking for older checkpoints, pruning or copying folds the thread whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple
from support.servers import KafkaServers

from onward.eventlog import ToolDispatched, ToolResolved
from onward.integrations.langgraph import OnwardSaver, SqliteThreadSummaries, ThreadSummaryStore
from onward.integrations.langgraph.summary import decode, encode, restored, summarize
from onward.integrations.langgraph.thread import SENT_AGAIN

from .graphs import config
from .test_decoded import chat_graph
from .worlds import World, kafka_world, sqlite_world

TURNS = 12


async def chat(saver: OnwardSaver, thread_id: str, turns: int, *, first: int = 0) -> None:
    graph = chat_graph(saver)
    for turn in range(first, first + turns):
        await graph.ainvoke({"messages": [HumanMessage(content=f"q{turn}")]}, config(thread_id))


def whole_saver(world: World) -> OnwardSaver:
    """A saver that keeps no summaries: it folds every thread from its first event."""
    return OnwardSaver(world.log, world.leases, tenant="acme", summaries=_NoSummaries())


class _NoSummaries:
    """A summary store that holds nothing (the saver's ``None`` means "the log's own")."""

    async def get(self, run_id: str) -> bytes | None:
        return None

    async def put(self, run_id: str, tenant: str, last_seq: int, body: bytes) -> None:
        return None

    async def delete(self, run_id: str) -> None:
        return None

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> _NoSummaries:
        return self

    async def __aexit__(self, *_: object) -> None:
        return None


def summaries_of(world: World) -> ThreadSummaryStore:
    saver = world.saver()
    assert saver.summaries is not None
    return saver.summaries


def same(a: CheckpointTuple | None, b: CheckpointTuple | None) -> None:
    assert a is not None
    assert b is not None
    assert a.config == b.config
    assert a.checkpoint == b.checkpoint
    assert a.metadata == b.metadata
    assert a.parent_config == b.parent_config
    assert a.pending_writes == b.pending_writes


async def listed(saver: OnwardSaver, thread_id: str) -> list[tuple[Any, Any, Any]]:
    return [
        (t.config, t.checkpoint["channel_values"], t.metadata)
        async for t in saver.alist(config(thread_id))
    ]


def from_summary(saver: OnwardSaver, thread_id: str) -> bool:
    """Whether the saver's fold of a thread it does not hold came from a summary."""
    return saver._followed[thread_id].partial


async def check_fresh_reads(world: World) -> None:
    async with world.saver(holder="writer") as writer:
        await chat(writer, "t", TURNS)
        written = await writer.aget_tuple(config("t"))
        history = await listed(writer, "t")
    # Stored in the background, waited for when the thread is released (here: at the exit).
    assert await summaries_of(world).get("t") is not None
    async with world.saver(holder="fresh") as fresh, whole_saver(world) as whole:
        got = await fresh.aget_tuple(config("t"))
        assert from_summary(fresh, "t")
        same(got, written)
        same(got, await whole.aget_tuple(config("t")))
        assert got is not None
        assert len(got.checkpoint["channel_values"]["messages"]) == 2 * TURNS
        # Older checkpoints and the list: the thread folded whole, the same answers.
        older = history[len(history) // 2][0]
        same(await fresh.aget_tuple(older), await whole.aget_tuple(older))
        assert await listed(fresh, "t") == history
        assert not from_summary(fresh, "t")


async def test_a_fresh_reader_folds_on_from_the_summary_on_sqlite(world: World) -> None:
    await check_fresh_reads(world)


@pytest.mark.kafka
async def test_a_fresh_reader_folds_on_from_the_summary_on_kafka(
    kafka_servers: KafkaServers,
) -> None:
    async with kafka_world(*kafka_servers) as world:
        await check_fresh_reads(world)


async def test_a_writer_goes_on_from_the_summary_and_the_next_reader_sees_it(
    world: World,
) -> None:
    async with world.saver(holder="first") as first:
        await chat(first, "t", TURNS)
    async with world.saver(holder="second") as second:
        await chat(second, "t", 3, first=TURNS)
    async with world.saver(holder="reader") as reader, whole_saver(world) as whole:
        got = await reader.aget_tuple(config("t"))
        same(got, await whole.aget_tuple(config("t")))
        assert got is not None
        contents = [m.content for m in got.checkpoint["channel_values"]["messages"]]
        assert contents[-2:] == [f"q{TURNS + 2}", f"re: q{TURNS + 2}"]
        assert len(contents) == 2 * (TURNS + 3)
        assert await listed(reader, "t") == await listed(whole, "t")


async def test_a_holder_folding_on_from_the_summary_knows_which_calls_a_person_sent_again(
    world: World,
) -> None:
    """The tool middleware passes over as many ``retry`` answers as a person already sent a
    call again for (LangGraph gives them back): a fold from the summary must count them too."""
    async with world.saver(holder="writer") as writer:
        await writer.arecord("t", ToolDispatched, call_id="c", tool="book", idempotency_key="k")
        retry = {"outcome": "never_ran", "result": SENT_AGAIN, "by": "ops", "why": "try again"}
        await writer.arecord("t", ToolResolved, call_id="c", **retry)
        await chat(writer, "t", TURNS)
    async with world.saver(holder="next") as holder:
        state = await holder.aclaim("t")
        assert state.partial
        assert state.sent_again == {"c": 1}


async def test_a_summary_the_log_does_not_hold_is_ignored(world: World) -> None:
    store = summaries_of(world)
    async with world.saver(holder="writer") as writer:
        await chat(writer, "t", TURNS)
        written = await writer.aget_tuple(config("t"))
    body = await store.get("t")
    assert body is not None
    summary = decode(body)
    assert summary is not None
    # The same seq at another time: the log's event at that offset is not the one it names.
    forged = msgspec.structs.replace(
        summary, last_seq=summary.last_seq + 1_000, last_at=summary.last_at + 1, checkpoints=[]
    )
    await store.put("t", "acme", forged.last_seq, encode(forged))
    async with world.saver(holder="fresh") as fresh:
        same(await fresh.aget_tuple(config("t")), written)
        assert not from_summary(fresh, "t")
    await store.delete("t")
    await store.put("t", "acme", 1, b"not a summary")
    async with world.saver(holder="fresh") as fresh:
        same(await fresh.aget_tuple(config("t")), written)
        assert not from_summary(fresh, "t")


async def test_a_summary_of_a_thread_in_another_file_is_ignored(tmp_path: Path) -> None:
    async with sqlite_world(tmp_path / "a.db") as a, sqlite_world(tmp_path / "b.db") as b:
        async with a.saver() as writer:
            await chat(writer, "t", TURNS)
        async with b.saver() as writer:
            await chat(writer, "t", 2)
            written = await writer.aget_tuple(config("t"))
        body = await summaries_of(a).get("t")
        assert body is not None
        await summaries_of(b).put("t", "acme", 10_000, body)
        async with b.saver() as fresh:
            same(await fresh.aget_tuple(config("t")), written)
            assert not from_summary(fresh, "t")


async def test_prune_copy_and_delete_on_a_thread_read_from_its_summary(world: World) -> None:
    async with world.saver(holder="writer") as writer:
        await chat(writer, "t", TURNS)
        await chat(writer, "u", TURNS)
    async with world.saver(holder="fresh") as fresh, whole_saver(world) as whole:
        await fresh.aget_tuple(config("t"))
        await fresh.aget_tuple(config("u"))
        assert from_summary(fresh, "t")
        await fresh.acopy_thread("t", "copy")
        assert await listed(fresh, "copy") == [
            ({**c, "configurable": {**c["configurable"], "thread_id": "copy"}}, v, m)
            for c, v, m in await listed(whole, "t")
        ]
        await fresh.aprune(["t"])
        assert len(await listed(whole, "t")) == 1
        same(await fresh.aget_tuple(config("t")), await whole.aget_tuple(config("t")))
        await fresh.adelete_thread("u")
        assert await summaries_of(world).get("u") is None
        assert await fresh.aget_tuple(config("u")) is None
    async with world.saver(holder="third") as third:
        assert await third.aget_tuple(config("u")) is None
        assert len(await listed(third, "t")) == 1


async def test_removing_the_newest_checkpoint_after_the_summary_folds_the_thread_whole(
    world: World,
) -> None:
    async with world.saver(holder="writer") as writer:
        await chat(writer, "t", TURNS)
        await writer.arelease("t")  # the summary being stored is stored
        body = await summaries_of(world).get("t")
        run_id = "the-last-turn"
        await chat_graph(writer).ainvoke(
            {"messages": [HumanMessage(content="last")]},
            {**config("t"), "metadata": {"run_id": run_id}},
        )
        latest = await writer.aget_tuple(config("t"))
        assert latest is not None
        assert latest.metadata["run_id"] == run_id
        await writer.adelete_for_runs([run_id])
    # The summary stored before the removal holds the removed checkpoint as the newest.
    assert body is not None
    await summaries_of(world).delete("t")
    summary = decode(body)
    assert summary is not None
    await summaries_of(world).put("t", "acme", summary.last_seq, body)
    async with world.saver(holder="fresh") as fresh, whole_saver(world) as whole:
        got = await fresh.aget_tuple(config("t"))
        same(got, await whole.aget_tuple(config("t")))
        assert got is not None
        assert got.metadata.get("run_id") != run_id
        assert len(got.checkpoint["channel_values"]["messages"]) == 2 * TURNS
        assert not from_summary(fresh, "t")


async def test_summaries_are_stored_beside_an_embedded_log(world: World) -> None:
    assert isinstance(summaries_of(world), SqliteThreadSummaries)


async def test_writes_saved_before_their_checkpoint_are_in_the_summary(world: World) -> None:
    """LangGraph saves a task's writes apart from its checkpoint, and the writes may land
    first (an interrupt's, under ``durability="async"``): a summary stored between the two
    keeps them, or a reader folding on from it reads the checkpoint with no pending writes
    (the interrupt gone, a finished task's writes lost, so it runs again)."""
    async with world.saver(holder="writer") as writer:
        await chat(writer, "t", 2)
        ahead: RunnableConfig = {
            "configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "z"}
        }
        await writer.aput_writes(ahead, [("__interrupt__", ["buy?"])], "task-1")
    state = await writer.aread_thread("t")
    summary = summarize(state, last_offset=0, last_fence=0, last_at=0, refers=writer._refers)
    back = restored(summary, snapshot_every=writer.snapshot_every)
    assert back.writes.get(("", "z")) == state.writes[("", "z")]
