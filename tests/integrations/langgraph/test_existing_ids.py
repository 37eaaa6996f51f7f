"""A thread stored under a name out of a new name's bounds is read and written on by its id.

The log refuses only NUL in a run id, so another producer (or an older Onward) may have stored
a LangGraph thread whose id or tenant holds a control character or is over 200 characters. A
saver reads it, carries it on, copies, prunes and deletes it by its exact id, as the runner
addresses such a run; a NEW thread under such a name (or tenant) is still refused before
anything of it is written. Embedded SQLite, and Kafka + PostgreSQL + Redis.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
import pytest_asyncio
from support.servers import KafkaServers

from onward.errors import InvalidInputError
from onward.integrations.langgraph import OnwardSaver

from .graphs import config, steps_graph
from .worlds import TENANT, World, kafka_world, sqlite_world

ODD_ID = "thread\x1b[2J" + "x" * 200
ODD_TENANT = "ac\x07me"


@pytest_asyncio.fixture
async def placed(tmp_path: Path, clustered: KafkaServers | None) -> AsyncIterator[World]:
    if clustered is None:
        async with sqlite_world(tmp_path / "onward.db") as world:
            yield world
        return
    async with kafka_world(*clustered) as world:
        yield world


def saver_of(world: World, tenant: str) -> OnwardSaver:
    return OnwardSaver(
        world.log,
        world.leases,
        tenant=tenant,
        frontiers=world.frontiers,
        checkpoint_inline=world.embedded,
        summaries=world.summaries,
    )


async def stored_as(
    world: World, thread_id: str, tenant: str, run: uuid.UUID | None = None
) -> None:
    """A thread that ran once (``steps == ["a"]``, as LangGraph run ``run``), its events
    appended under ``thread_id`` and ``tenant`` as a producer writing to the log directly
    would."""
    seed = f"seed-{uuid.uuid4().hex[:8]}"
    async with world.saver() as saver:
        await steps_graph("a", saver).ainvoke(
            {"steps": []}, {**config(seed), "metadata": {"run_id": str(run or uuid.uuid4())}}
        )
    events = [s.event for s in await world.log.read_run(seed)]
    await world.log.append(
        [msgspec.structs.replace(e, run_id=thread_id, tenant=tenant) for e in events]
    )


async def carried_on(world: World, thread_id: str, tenant: str) -> None:
    """The stored thread read, written on, copied, pruned and deleted by its exact id (a
    copy is a new thread: under a tenant out of a new name's bounds it is refused)."""
    copy = f"copy-{uuid.uuid4().hex[:8]}"
    async with saver_of(world, tenant) as saver:
        graph = steps_graph("b", saver)
        assert (await graph.aget_state(config(thread_id))).values == {"steps": ["a"]}
        done = await graph.ainvoke({"steps": []}, config(thread_id))
        assert done == {"steps": ["a", "b"]}
        assert len([c async for c in saver.alist(config(thread_id))]) > 1
        if tenant == TENANT:
            await saver.acopy_thread(thread_id, copy)
            assert (await graph.aget_state(config(copy))).values == {"steps": ["a", "b"]}
        else:
            with pytest.raises(InvalidInputError, match="cannot be created: tenant"):
                await saver.acopy_thread(thread_id, copy)
            assert await world.log.read_run(copy) == []
        await saver.aprune([thread_id])
        assert len([c async for c in saver.alist(config(thread_id))]) == 1
        await saver.adelete_thread(thread_id)
        assert await saver.aget_tuple(config(thread_id)) is None


async def test_a_thread_stored_under_an_odd_id_is_carried_on(placed: World) -> None:
    thread_id = f"{ODD_ID}-{uuid.uuid4().hex[:8]}"
    await stored_as(placed, thread_id, TENANT)
    await carried_on(placed, thread_id, TENANT)


async def test_a_thread_stored_under_an_odd_tenant_is_carried_on(placed: World) -> None:
    thread_id = f"t-{uuid.uuid4().hex[:8]}"
    await stored_as(placed, thread_id, ODD_TENANT)
    await carried_on(placed, thread_id, ODD_TENANT)


async def test_delete_for_runs_reaches_a_thread_stored_under_an_odd_id(placed: World) -> None:
    """Found by the LangGraph run that saved it, the thread is read by its id: refused, the
    deletion stopped there, leaving the run's checkpoints in it and in every thread after."""
    run = uuid.uuid4()
    thread_id = f"{ODD_ID}-{uuid.uuid4().hex[:8]}"
    await stored_as(placed, thread_id, TENANT, run)
    async with placed.saver() as saver:
        await saver.adelete_for_runs([str(run)])
        assert await saver.aget_tuple(config(thread_id)) is None


async def test_a_new_thread_under_an_odd_id_is_refused_and_nothing_written(
    placed: World,
) -> None:
    thread_id = f"new\x1b[2J-{uuid.uuid4().hex[:8]}"
    source = f"t-{uuid.uuid4().hex[:8]}"
    long_id = "y" * 201
    ran: list[str] = []

    async def node() -> None:
        ran.append("node")

    async with placed.saver() as saver:
        graph = steps_graph("a", saver, inside=node)
        with pytest.raises(InvalidInputError, match="cannot be created: thread_id holds"):
            await graph.ainvoke({"steps": []}, config(thread_id))
        assert ran == [], "the graph's first step ran for a thread that cannot be written"
        await graph.ainvoke({"steps": []}, config(source))
        with pytest.raises(InvalidInputError, match="cannot be created: thread_id is 201"):
            await saver.acopy_thread(source, long_id)
    assert await placed.log.read_run(thread_id) == []
    assert await placed.log.read_run(long_id) == []


async def test_a_new_thread_of_an_odd_tenant_is_refused_and_nothing_written(
    placed: World,
) -> None:
    thread_id = f"t-{uuid.uuid4().hex[:8]}"
    async with saver_of(placed, ODD_TENANT) as saver:
        with pytest.raises(InvalidInputError, match="tenant holds the control character"):
            await steps_graph("a", saver).ainvoke({"steps": []}, config(thread_id))
    assert await placed.log.read_run(thread_id) == []


@pytest.mark.parametrize(
    ("thread_id", "said"),
    [("t\x00x", "NUL character"), ("\udfff", "lone surrogate")],
)
async def test_what_no_stored_name_holds_is_refused_on_a_read(
    placed: World, thread_id: str, said: str
) -> None:
    async with placed.saver() as saver:
        with pytest.raises(InvalidInputError, match=said):
            await saver.aget_tuple(config(thread_id))
