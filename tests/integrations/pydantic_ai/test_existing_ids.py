"""A pydantic-ai run stored under a name out of a new name's bounds is carried on by its name.

The log refuses only NUL in a run id, so another producer (or an older Onward) may have stored
a run whose id or tenant holds a control character or is over 200 characters. A durability of
that tenant shows what the run waits on, records the decision and resumes it; a NEW run under
such a name or tenant is still refused before anything is written. Embedded SQLite, and Kafka +
PostgreSQL + Redis.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
import pytest_asyncio
from pydantic_ai.tools import DeferredToolResults
from support.servers import KafkaServers
from support.stores import Stores, kafka_stores, sqlite_stores

from integrations.pydantic_ai.world import booking_agent, durability_on
from onward.errors import InvalidInputError
from onward.integrations.pydantic_ai import OnwardDurability
from onward.runtime.demo_ledger import Ledger

ODD_RUN = "run\x1b[2J" + "x" * 200
ODD_TENANT = "ac\x07me"


@pytest_asyncio.fixture
async def placed(tmp_path: Path, clustered: KafkaServers | None) -> AsyncIterator[Stores]:
    if clustered is None:
        async with sqlite_stores(tmp_path / "onward.db") as stores:
            yield stores
        return
    async with kafka_stores(*clustered) as stores:
        yield stores


def durability_of(stores: Stores, tenant: str) -> OnwardDurability[None]:
    return OnwardDurability(
        log=stores.log,
        tenant=tenant,
        leases=stores.leases,
        frontiers=stores.frontiers,
        checkpoint_inline=stores.embedded,
        worker="here",
    )


async def test_a_run_stored_under_an_odd_id_and_tenant_is_decided_and_resumed(
    placed: Stores, ledger: Ledger
) -> None:
    seed = f"seed-{uuid.uuid4().hex[:8]}"
    run_id = f"{ODD_RUN}-{uuid.uuid4().hex[:8]}"
    ours = durability_on(placed, worker="seed")
    waiting = await ours.run(
        booking_agent(ours, ledger, requires_approval=True), "book seat 3A", run_id=seed
    )
    assert waiting.status == "waiting"
    events = [s.event for s in await placed.log.read_run(seed)]
    await placed.log.append(
        [msgspec.structs.replace(e, run_id=run_id, tenant=ODD_TENANT) for e in events]
    )

    durability = durability_of(placed, ODD_TENANT)
    agent = booking_agent(durability, ledger, requires_approval=True)
    assert (await durability.resume(agent, run_id)).status == "waiting"
    pending = await durability.pending(run_id)
    assert pending.requests is not None
    await durability.decide(run_id, DeferredToolResults(approvals={"b1": True}), by="alice")
    done = await durability.resume(agent, run_id)

    assert done.status == "completed"
    assert done.output == "done: seat 3A booked"
    assert len(ledger.entries()) == 1


async def test_a_new_run_of_an_odd_tenant_is_refused_and_nothing_written(
    placed: Stores, ledger: Ledger
) -> None:
    run_id = f"r-{uuid.uuid4().hex[:8]}"
    durability = durability_of(placed, ODD_TENANT)
    with pytest.raises(InvalidInputError, match="tenant holds the control character"):
        await durability.run(booking_agent(durability, ledger), "book seat 3A", run_id=run_id)
    assert await placed.log.read_run(run_id) == []
    assert ledger.entries() == []


@pytest.mark.parametrize(
    ("run_id", "said"),
    [("r\x00x", "run_id holds a NUL character"), ("\udfff", "run_id holds '\\\\udfff'")],
)
async def test_a_resume_of_what_no_stored_name_holds_is_refused_naming_it(
    placed: Stores, ledger: Ledger, run_id: str, said: str
) -> None:
    """As the runner's resume refuses it, before any store is asked (PostgreSQL refuses a
    NUL in text as its own fault)."""
    durability = durability_of(placed, "acme")
    with pytest.raises(InvalidInputError, match=said):
        await durability.resume(booking_agent(durability, ledger), run_id)
