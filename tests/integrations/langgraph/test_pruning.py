"""`OnwardSaver.aprune` and `adelete_for_runs` beyond LangGraph's conformance suite."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)

from onward.errors import BackendUnavailableError, InvalidInputError, ResumeConflictError
from onward.eventlog import (
    Event,
    EventLog,
    GraphCheckpointsRemoved,
    PartitionBounds,
    Position,
    StoredEvent,
)
from onward.integrations.langgraph import OnwardSaver
from onward.projections.audit import audit_timeline

from .worlds import TENANT, World


async def _put(
    saver: OnwardSaver,
    thread_id: str,
    *,
    ns: str = "",
    parent: RunnableConfig | None = None,
    **metadata: Any,
) -> RunnableConfig:
    config = generate_config(thread_id, checkpoint_ns=ns)
    if parent is not None:
        config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    return await saver.aput(config, generate_checkpoint(), generate_metadata(**metadata), {})


async def _ids(saver: OnwardSaver, thread_id: str, ns: str) -> list[str]:
    return [
        t.config["configurable"]["checkpoint_id"]
        async for t in saver.alist(generate_config(thread_id, checkpoint_ns=ns))
    ]


async def test_a_subgraph_call_goes_with_the_root_checkpoint_it_started_from(world: World) -> None:
    async with world.saver() as saver:
        first = await _put(saver, "t")
        await _put(
            saver, "t", ns="call:task-1", parents={"": first["configurable"]["checkpoint_id"]}
        )
        latest = await _put(saver, "t", parent=first)
        kept_call = await _put(
            saver, "t", ns="call:task-2", parents={"": latest["configurable"]["checkpoint_id"]}
        )
        await saver.aprune(["t"])
        assert await _ids(saver, "t", "") == [latest["configurable"]["checkpoint_id"]]
        assert await _ids(saver, "t", "call:task-1") == []
        assert await _ids(saver, "t", "call:task-2") == [kept_call["configurable"]["checkpoint_id"]]


async def test_what_pruning_removed_is_gone_for_every_reader_and_shown_in_audit(
    world: World,
) -> None:
    async with world.saver(holder="writer") as writer, world.saver(holder="reader") as reader:
        first = await _put(writer, "t")
        latest = await _put(writer, "t", parent=first)
        await writer.arelease("t")
        await reader.aprune(["t"])
        assert not reader.holds("t")  # a thread it did not hold is handed back
        assert await _ids(writer, "t", "") == [latest["configurable"]["checkpoint_id"]]
        lines = [line.as_json() for line in await audit_timeline(world.log, "t", tenant=TENANT)]
        removed = [line for line in lines if line["kind"] == "graph.checkpoints_removed"]
        assert len(removed) == 1
        assert removed[0]["description"].startswith("1 checkpoints removed: prune keep_latest")
        assert not removed[0]["refused"]


async def test_a_thread_with_nothing_to_prune_is_not_written(world: World) -> None:
    async with world.saver() as saver:
        await _put(saver, "t")
        await saver.arelease("t")
        before = await world.log.read_run("t")
        await saver.aprune(["t", "never-written"])
        assert await world.log.read_run("t") == before
        assert await world.log.read_run("never-written") == []


async def test_a_delta_channel_thread_is_refused_and_nothing_is_pruned(world: World) -> None:
    async with world.saver() as saver:
        plain = await _put(saver, "plain")
        await _put(saver, "plain", parent=plain)
        delta = await _put(saver, "delta", counters_since_delta_snapshot={"messages": [1, 1]})
        await _put(saver, "delta", parent=delta)
        with pytest.raises(InvalidInputError, match="'delta' uses a DeltaChannel"):
            await saver.aprune(["plain", "delta"])
        assert len(await _ids(saver, "plain", "")) == 2
        await saver.aprune(["delta"], strategy="delete")
        assert await _ids(saver, "delta", "") == []


async def test_bad_arguments_are_named(world: World) -> None:
    async with world.saver() as saver:
        with pytest.raises(InvalidInputError, match="unknown prune strategy 'oldest'"):
            await saver.aprune(["t"], strategy="oldest")
        with pytest.raises(InvalidInputError, match="not one string"):
            await saver.aprune("t")
        with pytest.raises(InvalidInputError, match="not one string"):
            await saver.adelete_for_runs("run-1")


async def test_delete_for_runs_finds_every_thread_of_the_run_and_only_its_tenant(
    world: World,
) -> None:
    other = OnwardSaver(world.log, world.leases, tenant="other")
    async with world.saver() as saver, other:
        for thread_id in ("a", "b"):
            kept = await _put(saver, thread_id, run_id="keep")
            await _put(saver, thread_id, parent=kept, run_id="drop")
        await _put(other, "c", run_id="drop")
        await saver.adelete_for_runs(["drop"])
        for thread_id in ("a", "b"):
            assert len(await _ids(saver, thread_id, "")) == 1
            removed = [
                s.event
                for s in await world.log.read_run(thread_id)
                if isinstance(s.event, GraphCheckpointsRemoved)
            ]
            assert len(removed) == 1
            assert "LangGraph runs drop" in removed[0].why
        assert len(await _ids(other, "c", "")) == 1


async def test_pruning_a_thread_another_process_holds_waits_its_turn(world: World) -> None:
    async with world.saver(holder="writer") as writer, world.saver(holder="pruner") as pruner:
        first = await _put(writer, "t")
        await _put(writer, "t", parent=first)
        with pytest.raises(ResumeConflictError):
            await pruner.aprune(["t"])
        assert len(await _ids(writer, "t", "")) == 2


async def test_thread_ids_given_as_a_generator_are_all_pruned(world: World) -> None:
    async with world.saver() as saver:
        for thread_id in ("a", "b"):
            first = await _put(saver, thread_id)
            await _put(saver, thread_id, parent=first)
        await saver.aprune(thread_id for thread_id in ("a", "b"))  # type: ignore[arg-type]
        for thread_id in ("a", "b"):
            assert len(await _ids(saver, thread_id, "")) == 1


async def test_a_thread_held_elsewhere_stops_pruning_and_the_error_names_what_was_done(
    world: World,
) -> None:
    async with world.saver(holder="writer") as writer, world.saver(holder="pruner") as pruner:
        for thread_id in ("a", "b", "c"):
            first = await _put(writer, thread_id)
            await _put(writer, thread_id, parent=first)
            if thread_id != "b":
                await writer.arelease(thread_id)
        with pytest.raises(ResumeConflictError, match=r"pruned: 'a'.*not pruned: 'b', 'c'"):
            await pruner.aprune(["a", "b", "c"])
        assert [len(await _ids(pruner, t, "")) for t in ("a", "b", "c")] == [1, 2, 2]


async def test_a_record_no_one_can_read_does_not_stop_delete_for_runs(world: World) -> None:
    """Another writer's junk on the log (here in a partition the thread is not in) is passed
    over, as projectors pass over it: every tenant's deletion would fail on it otherwise."""
    async with world.saver() as saver:
        kept = await _put(saver, "a", run_id="keep")
        await _put(saver, "a", parent=kept, run_id="drop")
        world.log.write_raw("junk", b"\x00not an event")  # type: ignore[attr-defined]
        world.log.write_raw("a", b"\x00not an event either")  # type: ignore[attr-defined]
        await saver.adelete_for_runs(["drop"])
        assert await _ids(saver, "a", "") == [kept["configurable"]["checkpoint_id"]]


async def test_deleting_threads_among_which_one_is_another_tenants_deletes_none(
    world: World,
) -> None:
    """`InvalidInputError` says nothing was written: a list of threads to delete holding one
    another tenant's is refused before any is deleted. Before the fix the threads before it
    were deleted, and the error said nothing of them."""
    other = OnwardSaver(world.log, world.leases, tenant="globex", frontiers=world.frontiers)
    async with other, world.saver() as saver:
        await _put(other, "theirs")
        await _put(saver, "mine")
        await saver.arelease("mine")
        with pytest.raises(InvalidInputError, match="theirs"):
            await saver.aprune(["mine", "theirs"], strategy="delete")
        assert len(await _ids(saver, "mine", "")) == 1


async def test_a_failure_part_way_through_pruning_names_what_was_done(world: World) -> None:
    """Any error that stops a prune part way (a store fault here) says which threads were
    pruned already, not only a thread held elsewhere does."""
    failing = _FailsForThread(world.log, "b")
    saver = OnwardSaver(cast(EventLog, failing), world.leases, tenant=TENANT)
    async with saver:
        for thread_id in ("a", "b", "c"):
            first = await _put(saver, thread_id)
            await _put(saver, thread_id, parent=first)
            await saver.arelease(thread_id)
        failing.armed = True
        with pytest.raises(BackendUnavailableError) as failed:
            await saver.aprune(["a", "b", "c"])
        said = "\n".join(getattr(failed.value, "__notes__", []))
        assert "pruned: 'a'" in said
        assert "not pruned: 'b', 'c'" in said
        assert [len(await _ids(saver, t, "")) for t in ("a", "b", "c")] == [1, 2, 2]


class _FailsForThread:
    """A log whose appends to one thread fail, once armed, as an unreachable store's do."""

    def __init__(self, log: EventLog, thread_id: str) -> None:
        self.log = log
        self.thread_id = thread_id
        self.armed = False

    @property
    def partitions(self) -> int:
        return self.log.partitions

    async def append(self, events: Sequence[Event]) -> list[Position]:
        if self.armed and any(e.run_id == self.thread_id for e in events):
            raise BackendUnavailableError("the store did not answer")
        return await self.log.append(events)

    async def read_run(
        self, run_id: str, *, start: int | None = None, end: int | None = None
    ) -> list[StoredEvent]:
        return await self.log.read_run(run_id, start=start, end=end)

    async def bounds(self, partition: int) -> PartitionBounds:
        return await self.log.bounds(partition)
