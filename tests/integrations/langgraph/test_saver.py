"""`OnwardSaver` beyond the conformance suite: leases, interrupts, reads by others, sync calls."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict, cast

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from support.servers import KafkaServers

import onward.integrations.langgraph as lg
from onward.errors import (
    BackendUnavailableError,
    ConfigurationError,
    InvalidInputError,
    ResumeConflictError,
)
from onward.eventlog import (
    Event,
    EventLog,
    GraphCheckpointed,
    PartitionBounds,
    Position,
    StoredEvent,
    partition_for,
)
from onward.integrations.langgraph import OnwardSaver
from onward.runtime.manager import ExecutionManager

from .graphs import config, steps_graph
from .worlds import TENANT, World, kafka_world, sqlite_world


def test_exports() -> None:
    assert sorted(lg.__all__) == [
        "MemoryThreadSummaries",
        "OnwardSaver",
        "OnwardToolMiddleware",
        "PostgresThreadSummaries",
        "SqliteThreadSummaries",
        "StoredWrite",
        "ThreadState",
        "ThreadSummaryStore",
        "current_fence",
        "current_idempotency_key",
        "current_lease_expires_at",
    ]


async def test_a_reader_that_holds_nothing_sees_what_the_writer_wrote(world: World) -> None:
    async with world.saver(holder="writer") as writer, world.saver(holder="reader") as reader:
        await steps_graph("W", writer).ainvoke({"steps": []}, config("t"))
        await steps_graph("W", writer).ainvoke({"steps": []}, config("t"))
        mine = await writer.aget_tuple(config("t"))
        theirs = await reader.aget_tuple(config("t"))
        assert mine is not None
        assert theirs is not None
        assert theirs.checkpoint == mine.checkpoint
        assert theirs.checkpoint["channel_values"]["steps"] == ["W", "W"]
        listed = [t.config async for t in reader.alist(config("t"))]
        assert listed == [t.config async for t in writer.alist(config("t"))]
        assert not reader.holds("t")


async def test_a_second_writer_waits_for_the_first_to_let_go(world: World) -> None:
    async with world.saver(holder="first") as first, world.saver(holder="second") as second:
        await steps_graph("1", first).ainvoke({"steps": []}, config("t"))
        with pytest.raises(ResumeConflictError):
            await steps_graph("2", second).ainvoke({"steps": []}, config("t"))
        await first.arelease("t")
        out = await steps_graph("2", second).ainvoke({"steps": []}, config("t"))
        assert out["steps"] == ["1", "2"]
        state = await second.aread_thread("t")
        assert state.refused == []
        assert state.fence > 1


async def test_hold_takes_the_lease_for_a_block_and_hands_it_back(world: World) -> None:
    async with world.saver() as saver:
        async with saver.hold("t"):
            assert saver.holds("t")
            assert (await world.leases.current("t")) is not None
            await steps_graph("H", saver).ainvoke({"steps": []}, config("t"))
        assert not saver.holds("t")
        assert (await world.leases.current("t")) is None


async def test_a_closed_saver_refuses_writes_rather_than_hold_a_thread_nobody_releases(
    world: World,
) -> None:
    """A write after the saver's exit would take the thread's lease and renew it for as long
    as the process lives, with nothing left to hand it back: it is refused, naming the saver
    as closed, and the thread stays free for another writer. Reentering opens it again."""
    saver = world.saver(holder="closed")
    async with saver:
        await steps_graph("1", saver).ainvoke({"steps": []}, config("t"))
    with pytest.raises(ConfigurationError, match="OnwardSaver is closed"):
        await steps_graph("2", saver).ainvoke({"steps": []}, config("t"))
    with pytest.raises(ConfigurationError, match="OnwardSaver is closed"):
        async with saver.hold("t"):
            pass
    assert not saver.holds("t")
    assert (await world.leases.current("t")) is None
    async with world.saver(holder="other") as other:
        out = await steps_graph("3", other).ainvoke({"steps": []}, config("t"))
    assert out["steps"] == ["1", "3"]
    async with saver:
        out = await steps_graph("4", saver).ainvoke({"steps": []}, config("t"))
    assert out["steps"] == ["1", "3", "4"]


class Asked(TypedDict):
    answer: str


def _ask(state: Asked) -> dict[str, str]:
    return {"answer": str(interrupt("pay 3 EUR?"))}


async def test_an_interrupt_is_pending_until_it_is_resumed(world: World) -> None:
    builder = StateGraph(Asked)
    builder.add_node("ask", _ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    pending = ExecutionManager(world.frontiers, world.leases)
    async with world.saver() as saver:
        graph = builder.compile(checkpointer=saver)
        out = await graph.ainvoke({"answer": ""}, config("t"))
        assert "__interrupt__" in out
        (waiting,) = await pending.list_pending(tenant=TENANT)
        assert waiting.summary.run_id == "t"
        assert waiting.attention == "waiting_on_approval"
        assert waiting.summary.waiting_on == f"langgraph:{out['__interrupt__'][0].id}"

        assert await graph.ainvoke(Command(resume="yes"), config("t")) == {"answer": "yes"}
        assert await pending.list_pending(tenant=TENANT) == []


async def test_a_checkpoint_event_carries_only_the_channels_that_changed(world: World) -> None:
    async with world.saver() as saver:
        graph = steps_graph("S", saver)
        for _ in range(3):
            await graph.ainvoke({"steps": []}, config("t"))
    stored = await world.log.read_run("t")
    checkpoints = [s.event for s in stored if isinstance(s.event, GraphCheckpointed)]
    assert len(checkpoints) == 9  # three per invocation
    # An invocation's first checkpoint only takes its input: "steps" is not written again.
    assert [[v.channel for v in c.values] for c in checkpoints[3::3]] == [["__start__"]] * 2


async def test_sync_calls_run_on_the_savers_loop_from_another_thread(world: World) -> None:
    async with world.saver() as saver:
        graph = steps_graph("S", saver)
        out = await asyncio.to_thread(graph.invoke, {"steps": []}, config("t"))
        assert out["steps"] == ["S"]
        assert await asyncio.to_thread(saver.get_tuple, config("t")) is not None
        assert len(await asyncio.to_thread(lambda: list(saver.list(config("t"))))) == 3
        with pytest.raises(InvalidInputError, match="another thread"):
            saver.get_tuple(config("t"))


async def test_a_thread_of_another_tenant_is_neither_read_nor_written(world: World) -> None:
    async with world.saver() as saver:
        await steps_graph("S", saver).ainvoke({"steps": []}, config("t"))
    other = OnwardSaver(world.log, world.leases, tenant="globex")
    async with other:
        with pytest.raises(InvalidInputError, match="tenant"):
            await other.aget_tuple(config("t"))
        with pytest.raises(InvalidInputError, match="tenant"):
            await steps_graph("G", other).ainvoke({"steps": []}, config("t"))


async def test_list_needs_a_thread(world: World) -> None:
    async with world.saver() as saver:
        with pytest.raises(InvalidInputError, match="thread_id"):
            [t async for t in saver.alist(None)]


class AppendsThenFails:
    """A log whose next append is stored but reported as failed, as a broken connection can."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.fail_next = False

    @property
    def partitions(self) -> int:
        return self.log.partitions

    async def append(self, events: Sequence[Event]) -> list[Position]:
        positions = await self.log.append(events)
        if self.fail_next:
            self.fail_next = False
            raise BackendUnavailableError("the connection broke before the answer came")
        return positions

    async def read_run(
        self, run_id: str, *, start: int | None = None, end: int | None = None
    ) -> list[StoredEvent]:
        return await self.log.read_run(run_id, start=start, end=end)

    async def bounds(self, partition: int) -> PartitionBounds:
        return await self.log.bounds(partition)


async def test_an_append_in_doubt_is_settled_by_reading_the_log(world: World) -> None:
    log = AppendsThenFails(world.log)
    saver = OnwardSaver(cast(EventLog, log), world.leases, tenant=TENANT)
    async with saver:
        graph = steps_graph("S", saver)
        await graph.ainvoke({"steps": []}, config("t"))
        log.fail_next = True
        with pytest.raises(BackendUnavailableError):
            await graph.ainvoke({"steps": []}, config("t"))
        out = await graph.ainvoke({"steps": []}, config("t"))
        # The second invocation stopped at its first checkpoint, which did land; the third
        # carries on after it with the next seq, so nothing is refused as a duplicate.
        assert out["steps"] == ["S", "S"]
        state = await saver.aread_thread("t")
        assert state.refused == []
        assert len(state.checkpoints[""]) == 7
        mine = await saver.aget_tuple(config("t"))
        assert mine is not None
        assert mine.config["configurable"]["checkpoint_id"] == max(state.checkpoints[""])


async def test_a_deleted_thread_is_forgotten_and_can_start_again(world: World) -> None:
    async with world.saver(holder="writer") as writer, world.saver(holder="janitor") as janitor:
        await steps_graph("W", writer).ainvoke({"steps": []}, config("t"))
        await writer.arelease("t")
        await janitor.adelete_thread("t")
        assert not janitor.holds("t")  # taken for the delete only
        assert await writer.aget_tuple(config("t")) is None
        out = await steps_graph("W", writer).ainvoke({"steps": []}, config("t"))
        assert out["steps"] == ["W"]
    assert (await janitor.aread_thread("t")).refused == []


class RecordsReads(AppendsThenFails):
    """A log that records where each read of a run starts."""

    def __init__(self, log: EventLog) -> None:
        super().__init__(log)
        self.starts: list[int | None] = []

    async def read_run(
        self, run_id: str, *, start: int | None = None, end: int | None = None
    ) -> list[StoredEvent]:
        self.starts.append(start)
        return await self.log.read_run(run_id, start=start, end=end)


async def test_a_reader_rereads_only_the_tail_of_a_thread(world: World) -> None:
    log = RecordsReads(world.log)
    async with (
        world.saver(holder="writer") as writer,
        OnwardSaver(cast(EventLog, log), world.leases, tenant=TENANT) as reader,
    ):
        graph = steps_graph("W", writer)
        await graph.ainvoke({"steps": []}, config("t"))
        first = await reader.aget_tuple(config("t"))
        end = (await world.log.bounds(partition_for("t", world.log.partitions))).end
        await graph.ainvoke({"steps": []}, config("t"))
        second = await reader.aget_tuple(config("t"))
        assert first is not None
        assert second is not None
        assert second.checkpoint["channel_values"]["steps"] == ["W", "W"]
        assert second.parent_config is not None
        assert log.starts == [None, end]  # the whole run once, then only what came after
        assert second == await writer.aget_tuple(config("t"))


async def test_a_copied_thread_is_handed_back_for_another_writer(world: World) -> None:
    async with world.saver(holder="worker") as worker, world.saver(holder="admin") as admin:
        await steps_graph("W", worker).ainvoke({"steps": []}, config("src"))
        await admin.acopy_thread("src", "dst")
        assert not admin.holds("dst")  # taken for the copy only, as a delete or prune is
        out = await steps_graph("W", worker).ainvoke({"steps": []}, config("dst"))
        assert out["steps"] == ["W", "W"]


async def test_a_copy_keeps_a_target_the_saver_held_before(world: World) -> None:
    async with world.saver() as saver:
        await steps_graph("S", saver).ainvoke({"steps": []}, config("src"))
        await steps_graph("S", saver).ainvoke({"steps": []}, config("dst"))
        await saver.acopy_thread("src", "dst")
        assert saver.holds("dst")


@pytest.mark.parametrize("thread_id", [None, ""])
async def test_a_config_whose_thread_id_is_empty_is_refused(
    world: World, thread_id: str | None
) -> None:
    empty = cast(RunnableConfig, {"configurable": {"thread_id": thread_id}})
    async with world.saver() as saver:
        with pytest.raises(InvalidInputError, match="thread_id"):
            await steps_graph("S", saver).ainvoke({"steps": []}, empty)
        with pytest.raises(InvalidInputError, match="thread_id"):
            await saver.aget_tuple(empty)
        assert await world.log.read_run(str(thread_id)) == []


async def check_a_thread_id_holding_a_control_character_is_refused(world: World) -> None:
    """No store can keep a NUL in a name (PostgreSQL refuses it in text): the caller is told
    the thread id is what is wrong, before anything is read or written, on every entry."""
    bad = "t\x00x"
    async with world.saver() as saver:
        with pytest.raises(InvalidInputError, match=r"thread id 't\\x00x'"):
            await steps_graph("S", saver).ainvoke({"steps": []}, config(bad))
        with pytest.raises(InvalidInputError, match=r"thread id 't\\x00x'"):
            await saver.aget_tuple(config(bad))
        with pytest.raises(InvalidInputError, match=r"thread id 't\\x00x'"):
            await saver.adelete_thread(bad)
        with pytest.raises(InvalidInputError, match=r"thread id 't\\x00x'"):
            await saver.aprune([bad])
        with pytest.raises(InvalidInputError, match=r"thread id 't\\x00x'"):
            async with saver.hold(bad):
                pass


async def test_a_thread_id_holding_a_control_character_is_refused_on_sqlite(
    world: World,
) -> None:
    await check_a_thread_id_holding_a_control_character_is_refused(world)


@pytest.mark.kafka
async def test_a_thread_id_holding_a_control_character_is_refused_on_kafka_postgres(
    kafka_servers: KafkaServers,
) -> None:
    """Before the fix: BackendError "loading frontiers: CharacterNotInRepertoireError"."""
    async with kafka_world(*kafka_servers) as world:
        await check_a_thread_id_holding_a_control_character_is_refused(world)


async def test_writes_without_a_checkpoint_id_are_refused_clearly(world: World) -> None:
    async with world.saver() as saver:
        with pytest.raises(InvalidInputError, match="checkpoint_id"):
            await saver.aput_writes(config("t"), [("steps", ["S"])], "task-1")


def test_a_sync_call_while_the_savers_loop_is_idle_is_refused(tmp_path: Path) -> None:
    """Nothing would run the call: the loop the saver was opened on is not running."""
    loop = asyncio.new_event_loop()
    opened = sqlite_world(tmp_path / "onward.db")
    try:
        world = loop.run_until_complete(opened.__aenter__())
        saver = world.saver()
        loop.run_until_complete(saver.__aenter__())
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            call = pool.submit(saver.get_tuple, config("t"))
            try:
                with pytest.raises(InvalidInputError, match="not running"):
                    call.result(timeout=5)
            finally:
                loop.run_until_complete(asyncio.sleep(0.1))  # lets a call sent to it finish
        loop.run_until_complete(saver.__aexit__(None, None, None))
        loop.run_until_complete(opened.__aexit__(None, None, None))
    finally:
        loop.close()
