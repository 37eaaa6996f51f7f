"""A cancel ask its holder never heard is not lost when the holder lets go of the run.

`App.cancel` and `onward cancel` of a run another process drives ask its holder once
(`AgentRunner.ask_to_cancel`) and tell the user the run ends. The holder may let go before it
reaches a boundary where it hears the ask: its model call fails and the error leaves the block,
it is drained, its process dies. Whoever takes the run next must end it cancelled, as asked,
before anything it would do next (a model call, a tool call): not carry it on.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from support.runners import embedded_log

from onward.errors import InvalidInputError
from onward.eventlog import Message, ToolCall
from onward.eventlog.base import EventLog
from onward.runtime import Agent, AgentRunner, reply, tool
from onward.runtime.leases import LeaseStore, PostgresLeaseStore, RedisLeaseStore
from onward.runtime.providers import ModelReply

TENANT = "acme"
RUN = "r"


class ProviderDownError(Exception):
    """The model call failed, and the holder let go of the run without ending it."""


@dataclass
class Model:
    """Asks the run's holder to cancel it during the first call, then fails that call; the
    next call asks for a payment (which must never be made), the one after ends the run."""

    runner: AgentRunner | None = None
    calls: int = 0

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        self.calls += 1
        if self.calls == 1:
            assert self.runner is not None
            held = await self.runner.ask_to_cancel(RUN, tenant=TENANT, by="ann", why="stop it")
            assert held is not None  # the holder was asked: Ann is told the run ends
            raise ProviderDownError("the provider is down")
        if self.calls == 2:
            return reply("", ToolCall(call_id="a", tool="pay", args={}))
        return reply("done")


@dataclass
class World:
    log: EventLog
    options: dict[str, Any]
    paid: list[str] = field(default_factory=list)

    def agent(self) -> Agent:
        @tool
        async def pay(*, idempotency_key: str) -> str:
            self.paid.append(idempotency_key)
            return "paid"

        return Agent(name="payer", instructions="pay", tools=[pay])

    def runner(self, model: Model) -> AgentRunner:
        runner = AgentRunner(provider=model, log=self.log, **self.options)
        model.runner = runner
        return runner


@pytest.fixture(params=["memory", "sqlite", "redis", "postgres"])
def stores(request: pytest.FixtureRequest) -> tuple[str, Callable[[], LeaseStore] | None]:
    """The log (embedded in memory or in a SQLite file) and, unless the log's own, where the
    leases are: Redis or PostgreSQL."""
    if request.param == "redis":
        url, prefix = (request.getfixturevalue(f) for f in ("redis_url", "redis_prefix"))
        return "sqlite", lambda: RedisLeaseStore(url, prefix=prefix)
    if request.param == "postgres":
        url, schema = (request.getfixturevalue(f) for f in ("database_url", "pg_schema"))
        return "sqlite", lambda: PostgresLeaseStore(url, schema=schema)
    return request.param, None


@pytest_asyncio.fixture
async def world(
    stores: tuple[str, Callable[[], LeaseStore] | None], tmp_path: Path
) -> AsyncIterator[World]:
    kind, leases = stores
    async with AsyncExitStack() as stack:
        log, options = await stack.enter_async_context(embedded_log(kind, tmp_path))
        if leases is not None:
            options = {**options, "leases": await stack.enter_async_context(leases())}
        yield World(log, options)


async def test_a_run_whose_holder_let_go_after_an_ask_ends_cancelled_under_the_next(
    world: World,
) -> None:
    first = Model()
    with pytest.raises(ProviderDownError):
        await world.runner(first).run(world.agent(), "pay once", tenant=TENANT, run_id=RUN)

    second = Model(calls=1)
    runner = world.runner(second)
    result = await runner.resume(world.agent(), RUN, tenant=TENANT)

    assert world.paid == [], "the next holder paid for a run asked to cancel"
    assert second.calls == 1, "the next holder called the model of a run asked to cancel"
    assert result.status == "cancelled"
    frontier = await runner.inspect(RUN, tenant=TENANT)
    assert frontier.status == "cancelled"
    assert frontier.error == "cancelled by ann: stop it"


async def test_a_person_writing_to_the_run_meanwhile_does_not_take_the_ask_away(
    world: World,
) -> None:
    """A person's write (a tag) takes the run's lease between the two holders: it does not
    answer the ask, so the run's next holder still ends the run."""
    with pytest.raises(ProviderDownError):
        await world.runner(Model()).run(world.agent(), "pay once", tenant=TENANT, run_id=RUN)
    second = Model(calls=1)
    runner = world.runner(second)
    await runner.tag(RUN, "looked at", tenant=TENANT, seq=1, by="bob")

    result = await runner.resume(world.agent(), RUN, tenant=TENANT)

    assert world.paid == [], "the next holder paid for a run asked to cancel"
    assert (result.status, result.error) == ("cancelled", "cancelled by ann: stop it")


@dataclass
class PayOnApproval:
    """Asks for a payment that waits on a person's approval, then ends the run."""

    calls: int = 0

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        self.calls += 1
        if self.calls == 1:
            return reply("", ToolCall(call_id="a", tool="pay", args={}))
        return reply("done")


def approved_payer(world: World) -> Agent:
    @tool(requires_approval=True)
    async def pay(*, idempotency_key: str) -> str:
        world.paid.append(idempotency_key)
        return "paid"

    return Agent(name="payer", instructions="pay", tools=[pay])


async def test_a_waiting_run_asked_while_a_resume_holds_it_ends_cancelled(
    world: World,
) -> None:
    """A resume holds a run that waits on a person (nothing to carry on) as Ann asks its
    holder to cancel it: she is told the run ends, so it must end, not go on waiting and
    make the payment once a person approves it."""
    agent = approved_payer(world)
    runner = AgentRunner(provider=PayOnApproval(), log=world.log, **world.options)
    waiting = await runner.run(agent, "pay once", tenant=TENANT, run_id=RUN)
    assert waiting.status == "waiting"
    request = waiting.waiting_on
    assert request is not None
    claim = runner.resumer.claim
    asked: list[Any] = []

    async def claimed_then_asked(*args: Any, **kwargs: Any) -> Any:
        carried = await claim(*args, **kwargs)
        asked.append(await runner.ask_to_cancel(RUN, tenant=TENANT, by="ann", why="stop it"))
        return carried

    runner.resumer.claim = claimed_then_asked  # type: ignore[method-assign]
    result = await runner.resume(agent, RUN, tenant=TENANT)
    runner.resumer.claim = claim  # type: ignore[method-assign]
    # Resumed again before anyone answers: its holder hears the ask at its acquisition.
    again = await runner.resume(agent, RUN, tenant=TENANT)

    assert asked[0] is not None  # the resume's holding was asked: Ann is told the run ends
    with contextlib.suppress(InvalidInputError):
        await runner.approve(RUN, request, tenant=TENANT, by="bob")
    await runner.resume(agent, RUN, tenant=TENANT)
    assert world.paid == [], "a run asked to cancel made its payment once approved"
    assert (result.status, result.error) == ("cancelled", "cancelled by ann: stop it")
    assert again.status == "cancelled"
