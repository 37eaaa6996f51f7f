"""A saver of one tenant given another tenant's thread: refused before it holds the thread."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from support.stores import sqlite_stores

from onward.errors import InvalidInputError
from onward.integrations.langgraph import OnwardSaver


class Steps(TypedDict):
    steps: list[str]


def graph(saver: OnwardSaver) -> Any:
    builder = StateGraph(Steps)
    builder.add_node("step", lambda state: {"steps": [*state["steps"], "S"]})
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    return builder.compile(checkpointer=saver)


async def test_another_tenants_saver_takes_no_lease_on_a_thread_and_is_not_told_whose(
    tmp_path: Path,
) -> None:
    """A saver of tenant ``globex`` writing acme's thread is refused before it takes the
    thread's lease (no fence of acme's thread is spent on it) and is not told whose it is.
    Before the fix it took the lease, raised the thread's fence, then refused naming acme."""
    async with sqlite_stores(tmp_path / "threads.db") as stores:

        def saver(tenant: str) -> OnwardSaver:
            return OnwardSaver(
                stores.log,
                stores.leases,
                tenant=tenant,
                frontiers=stores.frontiers,
                checkpoint_inline=stores.embedded,
            )

        async with saver("acme") as owner:
            await graph(owner).ainvoke({"steps": []}, {"configurable": {"thread_id": "t"}})
        probe = await stores.leases.acquire("t", tenant="acme", holder="probe", ttl_s=30)
        await stores.leases.release(probe)

        async with saver("globex") as other:
            with pytest.raises(InvalidInputError) as refused:
                async with other.hold("t"):
                    pass
            with pytest.raises(InvalidInputError):
                await graph(other).ainvoke({"steps": []}, {"configurable": {"thread_id": "t"}})

        again = await stores.leases.acquire("t", tenant="acme", holder="probe", ttl_s=30)
        await stores.leases.release(again)
        assert again.fence == probe.fence + 1, "another tenant's saver took acme's thread lease"
        assert "acme" not in str(refused.value)


@pytest.mark.parametrize("tenant", ["ac\nme", "x" * 201])
async def test_a_tenant_the_runner_refuses_is_refused_by_the_saver(
    tmp_path: Path, tenant: str
) -> None:
    """A tenant with a control character, or too long, is refused as the runner refuses it,
    before any thread is written under it (stored, it is printed as it is by ``onward
    inspect``). The saver itself is made: threads a producer stored under that tenant are
    read and carried on by it (see test_existing_ids)."""
    async with sqlite_stores(tmp_path / "threads.db") as stores:
        saver = OnwardSaver(stores.log, stores.leases, tenant=tenant, frontiers=stores.frontiers)
        async with saver:
            with pytest.raises(InvalidInputError, match="cannot be created: tenant"):
                await graph(saver).ainvoke({"steps": []}, {"configurable": {"thread_id": "t"}})
        assert await stores.log.read_run("t") == []


async def test_a_tenant_no_stored_name_holds_is_refused_by_the_saver(tmp_path: Path) -> None:
    """A NUL: PostgreSQL refuses it in the frontier row, so no thread is stored under it."""
    async with sqlite_stores(tmp_path / "threads.db") as stores:
        with pytest.raises(InvalidInputError, match="tenant holds a NUL"):
            OnwardSaver(stores.log, stores.leases, tenant="ac\x00me", frontiers=stores.frontiers)
