"""A resume replays every recorded answer; another tenant never holds the run."""

from __future__ import annotations

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests
from support.stores import Stores

from integrations.pydantic_ai.world import (
    TENANT,
    Crash,
    booking_agent,
    durability_on,
)
from onward.errors import InvalidInputError, NothingToResumeError
from onward.eventlog import ModelAnswered, ToolDispatched
from onward.integrations.pydantic_ai import OnwardDurability, current_idempotency_key
from onward.runtime.demo_ledger import Ledger

RUN = "r-review"


class Ticks:
    """Asks for tick 1, then tick 2, then ends; crashes once when asked the third time."""

    def __init__(self) -> None:
        self.asked = 0
        self.crash = True

    def answer(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.asked += 1
        done = sum(isinstance(m, ModelResponse) for m in messages)
        if done < 2:
            n = done + 1
            return ModelResponse(parts=[ToolCallPart("tick", {"n": n}, tool_call_id=f"t{n}")])
        if self.crash:
            self.crash = False
            raise Crash("third answer")
        return ModelResponse(parts=[TextPart("ticked twice")])


def ticking(
    durability: OnwardDurability[None], ledger: Ledger, model: Ticks
) -> Agent[None, str | DeferredToolRequests]:
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(model.answer),
        name="ticker",
        capabilities=[durability],
        output_type=[str, DeferredToolRequests],
    )

    @agent.tool_plain
    async def tick(n: int) -> str:
        """A call with a side effect."""
        ledger.record("tick", current_idempotency_key() or "", n=n)
        return f"ticked {n}"

    return agent


async def test_every_recorded_answer_is_replayed_after_a_resume(
    stores: Stores, ledger: Ledger
) -> None:
    durability = durability_on(stores, worker="here")
    model = Ticks()
    with pytest.raises(Crash):
        await durability.run(ticking(durability, ledger, model), "tick twice", run_id=RUN)
    assert model.asked == 3
    assert [e["n"] for e in ledger.entries()] == [1, 2]

    done = await durability.resume(ticking(durability, ledger, model), RUN)

    assert done.status == "completed"
    assert done.output == "ticked twice"
    assert [e["n"] for e in ledger.entries()] == [1, 2]  # no tick made twice
    recorded = [s.event for s in await stores.log.read_run(RUN)]
    assert [e.call_id for e in recorded if isinstance(e, ToolDispatched)] == ["t1", "t2"]
    assert sum(isinstance(e, ModelAnswered) for e in recorded) == 3
    assert model.asked == 4  # only the answer never recorded


async def test_another_tenants_resume_and_start_never_take_the_runs_lease(
    stores: Stores, ledger: Ledger
) -> None:
    """As the runner's own resumes and starts (security review #19): another tenant's resume
    of a run, or start under its id, is refused before the run's lease is taken, so it neither
    holds the run, even briefly, nor raises or forgets its fence."""

    async def next_fence() -> int:
        lease = await stores.leases.acquire(RUN, tenant=TENANT, holder="probe", ttl_s=30)
        await stores.leases.release(lease)
        return lease.fence

    ours = durability_on(stores, worker="here")
    waiting = await ours.run(
        booking_agent(ours, ledger, requires_approval=True), "book seat 3A", run_id=RUN
    )
    assert waiting.status == "waiting"
    before = await next_fence()

    evil = OnwardDurability(
        log=stores.log,
        tenant="evil",
        leases=stores.leases,
        frontiers=stores.frontiers,
        checkpoint_inline=stores.embedded,
        worker="evil",
    )
    agent = booking_agent(evil, ledger, requires_approval=True)
    for _ in range(3):
        with pytest.raises(NothingToResumeError):
            await evil.resume(agent, RUN)
        with pytest.raises(InvalidInputError, match="already exists or is not permitted"):
            await evil.run(agent, "book seat 3A", run_id=RUN)

    assert await next_fence() == before + 1


@pytest.mark.parametrize(
    ("tenant", "run_id", "named"),
    [
        ("ac\x00me", RUN, "tenant"),
        ("x" * 201, RUN, "tenant"),
        (TENANT, "r\nforged", "run_id"),
        (TENANT, "r" * 201, "run_id"),
    ],
)
async def test_a_tenant_or_run_id_the_runner_refuses_is_refused_before_anything_is_written(
    stores: Stores, ledger: Ledger, tenant: str, run_id: str, named: str
) -> None:
    """A tenant or run id with a control character, or too long, is refused as the runner
    refuses it (`check_name`), naming the field, and nothing of the run is recorded: kept,
    it would be printed as it is by ``onward inspect`` and refused by PostgreSQL (NUL)."""

    async def start() -> None:
        durability = OnwardDurability(
            log=stores.log,
            tenant=tenant,
            leases=stores.leases,
            frontiers=stores.frontiers,
            checkpoint_inline=stores.embedded,
            worker="here",
        )
        await durability.run(booking_agent(durability, ledger), "book seat 3A", run_id=run_id)

    with pytest.raises(InvalidInputError, match=named):
        await start()
    assert await stores.log.read_run(run_id) == []
