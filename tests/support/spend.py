"""What the budget tests share: a priced model, an agent that calls a tool every turn, and the
one scenario the acceptance line names, run on any deployment's stores."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

from onward.errors import BackendUnavailableError, BudgetExceededError
from onward.eventlog.events import Message, ModelAnswered, ToolCall
from onward.runtime.agent import Agent
from onward.runtime.backends import Backends
from onward.runtime.providers import ModelReply, Provider, ScriptedProvider, reply
from onward.runtime.runner import AgentRunner
from onward.runtime.spend import PriceTable, Spend, SpendLedger, estimate_usage
from onward.runtime.tools import Tool, tool
from support.crashes import Crash

MODEL = "priced-model"
PRICES = f"{MODEL}=1/5"
"""1 micro an input token, 5 an output token."""
IN, OUT = 1000, 200
CALL_MICROS = IN * 1 + OUT * 5
"""What each scripted call costs: 2000 micros."""


@tool(retry_safe=True)
async def step(n: int, *, idempotency_key: str) -> str:
    return f"step {n} done"


def stepper(*, tools: Sequence[Tool] = (step,), **options: object) -> Agent:
    return Agent(
        name="stepper",
        instructions="step on",
        tools=tools,
        model=MODEL,
        **options,  # type: ignore[arg-type]
    )


def steps(finish_after: int | None = None) -> ScriptedProvider:
    """Asks for one more step every turn (until ``finish_after`` calls, then says done); every
    call reports ``IN`` and ``OUT`` tokens."""

    def answer(messages: Sequence[Message]) -> ModelReply:
        n = sum(1 for m in messages if m.role == "assistant")
        if finish_after is not None and n + 1 >= finish_after:
            return reply("done", input_tokens=IN, output_tokens=OUT)
        call = ToolCall(call_id=f"s{n}", tool="step", args={"n": n})
        return reply("", call, input_tokens=IN, output_tokens=OUT)

    return ScriptedProvider(answer)


async def stops_before_the_call_that_would_pass_its_budget(backends: Backends) -> str:
    """The acceptance scenario: a run with a budget of 5000 micros whose calls cost 2000 each
    makes two calls (4000); the third would take it to 6000, so it stops before it, the model
    not called, the run ``failed``. Returns the run id."""
    provider = steps()
    runner = backends.runner(provider)
    agent = stepper(budget_micros=5000)
    with pytest.raises(BudgetExceededError) as caught:
        await runner.run(agent, "go", tenant="acme")
    stopped = caught.value
    run_id = stopped.run_id
    assert run_id is not None
    assert provider.calls == 2
    assert (stopped.scope, stopped.budget_micros) == ("run", 5000)
    assert (stopped.spent_micros, stopped.estimate_micros) == (2 * CALL_MICROS, CALL_MICROS)
    assert 2 * CALL_MICROS <= 5000 < 3 * CALL_MICROS

    assert await backends.spend.run_total(run_id) == Spend(
        micros=2 * CALL_MICROS, input_tokens=2 * IN, output_tokens=2 * OUT, calls=2
    )
    frontier = await runner.inspect(run_id, tenant="acme")
    assert frontier.status == "failed"
    assert frontier.error is not None
    assert frontier.error.startswith("BudgetExceededError: run ")
    assert frontier.iteration == 2
    # Each call is recorded under the seq its answer was written at.
    answers = [
        s.event.seq
        for s in await backends.log.read_run(run_id)
        if isinstance(s.event, ModelAnswered)
    ]
    assert [e.seq for e in await backends.spend.entries(run_id)] == answers
    return run_id


class SlowModel:
    """Answers "done" a while after it is called, so the calls of runs started together are
    all in flight at once; counts the calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        self.calls += 1
        await asyncio.sleep(0.3)
        return reply("done", input_tokens=IN, output_tokens=OUT)


async def a_crowd_never_passes_its_tenants_budget(backends: Backends) -> None:
    """Eight runs of one tenant reach their first model call at the same moment; the tenant's
    budget has room for three estimated calls. Checked against the spend alone, all eight saw
    room (nothing was spent yet) and all eight called the model; each holds its estimate in
    the same step as its check, so three call and five stop."""
    agent = stepper(tools=(), model_settings={"max_tokens": OUT})
    first_call = [Message(role="user", content="go")]
    estimate = PriceTable.parse(PRICES).cost(MODEL, estimate_usage(agent, first_call, Spend()))
    budget = 3 * estimate + estimate // 2
    bounded = stepper(tools=(), model_settings={"max_tokens": OUT}, tenant_budget_micros=budget)
    model = SlowModel()
    runner = backends.runner(model)
    tenant = f"crowd-{uuid.uuid4().hex[:8]}"
    results = await asyncio.gather(
        *(runner.run(bounded, "go", tenant=tenant) for _ in range(8)), return_exceptions=True
    )
    stopped = [r for r in results if isinstance(r, BudgetExceededError)]
    assert model.calls == 3
    assert len(stopped) == 5
    for refusal in stopped:
        assert refusal.scope == "tenant"
        assert refusal.spent_micros is not None
        assert refusal.estimate_micros is not None
        assert refusal.spent_micros + refusal.estimate_micros > budget
    assert [r.status for r in results if not isinstance(r, BaseException)] == ["completed"] * 3


class DiesMidCall:
    """A model whose first call never answers: the process making it dies (`Crash`)."""

    def __init__(self) -> None:
        self.calls = 0
        self.after = steps(finish_after=2)

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        self.calls += 1
        if self.calls == 1:
            raise Crash("the process died waiting for the model")
        return await self.after.complete(agent, messages)


class DeadRunner(AgentRunner):
    """A runner whose process dies: no handler of its runs on the way out."""

    async def release_hold(self, run_id: str, seq: int) -> None:
        return None


def dead_runner_on(backends: Backends, model: Provider) -> DeadRunner:
    """A `DeadRunner` on the stores of ``backends`` (as `Backends.runner` builds one), worker w1."""
    return DeadRunner(
        provider=model,
        log=backends.log,
        frontiers=backends.frontiers,
        checkpoint_inline=True,
        leases=backends.leases,
        worker="w1",
        spend=backends.spend,
        prices=backends.settings.price_table(),
    )


LEDGER_METHODS = (
    "hold",
    "release",
    "release_run",
    "record",
    "run_total",
    "tenant_total",
    "entries",
)


class Outage:
    """The ledger stops answering at the first record of a call (the provider has answered and
    is owed), and answers nothing until `end`."""

    def __init__(self, ledger: SpendLedger, monkeypatch: pytest.MonkeyPatch) -> None:
        self.down = False
        self.began = False
        for name in LEDGER_METHODS:
            monkeypatch.setattr(ledger, name, self._wrapped(name, getattr(ledger, name)))

    def _wrapped(self, name: str, method: Callable[..., Awaitable[Any]]) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            if name == "record" and not self.began:
                self.began = self.down = True
            if self.down:
                raise BackendUnavailableError("the spend ledger did not answer")
            return await method(*args, **kwargs)

        return call

    def end(self) -> None:
        self.down = False
