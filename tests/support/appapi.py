"""Agents and a model for the application API tests, in process and in a fleet.

``payer`` pays once, a call that needs a person's approval; the tool records the value the
call was approved with in the ledger ``APP_LEDGER`` names. ``stepper`` makes ``STEPS`` tool
calls, one per turn, then answers with the notes a person gave it at checkpoints (every user
message after the run's input), so a test sees that an answer reached the model. ``looper``
calls ``tick`` turn after turn and never ends: a runaway run, for the tests that cancel one.
The model tells the agents apart by their instructions, the first message it is given.

Run as ``python -m support.appapi`` it is an application process: ``query AGENT RUN_ID`` starts
a run and prints its messages (JSON lines) until the run waits on a person or ends; ``resume
RUN_ID [VALUE_JSON [SEQ PART]]`` answers it with the value and prints the messages after that
position (all of them without one) until the run ends or waits again. The settings come from the
environment (``ONWARD_APP_MODE`` says in process or fleet).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

import onward
from onward.errors import InvalidInputError
from onward.eventlog import Message, ToolCall
from onward.runtime.agent import Agent
from onward.runtime.application.messages import RunMessage
from onward.runtime.application.stream import RunStream
from onward.runtime.demo_ledger import Ledger
from onward.runtime.providers import ModelReply, ScriptedProvider, reply
from onward.runtime.tools import tool

STEPS = 3


def ledger() -> Ledger:
    return Ledger(os.environ.get("APP_LEDGER", "app-ledger.jsonl"))


@tool(requires_approval=True)
async def pay(amount: int, *, idempotency_key: str, approval: Any = None) -> dict[str, Any]:
    """Pay ``amount``; a person approves it first."""
    ledger().record("pay", idempotency_key, amount=amount, approval=approval, pid=os.getpid())
    return {"paid": amount, "approval": approval}


@tool
async def step(n: int, *, idempotency_key: str) -> dict[str, int]:
    """One step of a longer job."""
    ledger().record("step", idempotency_key, n=n)
    return {"done": n}


@tool
async def tick(n: int, *, idempotency_key: str) -> dict[str, int]:
    """One turn of a run that never ends by itself."""
    await asyncio.sleep(0.02)
    ledger().record("tick", idempotency_key, n=n)
    return {"ticked": n}


agents: dict[str, Agent] = {
    "payer": Agent(name="payer", instructions="pay what is asked", tools=[pay]),
    "stepper": Agent(name="stepper", instructions="work step by step", tools=[step]),
    "looper": Agent(
        name="looper", instructions="loop for ever", tools=[tick], max_iterations=100_000
    ),
}


def script(messages: Sequence[Message]) -> ModelReply:
    """``payer``: one payment, then "paid"; ``stepper``: STEPS steps, then the notes it got."""
    turn = sum(1 for m in messages if m.role == "assistant")
    if str(messages[0].content).startswith("loop"):
        call = ToolCall(call_id=f"t{turn + 1}", tool="tick", args={"n": turn + 1})
        return reply(f"tick {turn + 1}", call)
    if str(messages[0].content).startswith("pay"):
        if turn == 0:
            return reply("paying", ToolCall(call_id="p", tool="pay", args={"amount": 5}))
        return reply("paid")
    if turn < STEPS:
        return reply(
            f"step {turn + 1}",
            ToolCall(call_id=f"s{turn + 1}", tool="step", args={"n": turn + 1}),
        )
    notes = [str(m.content) for m in messages[2:] if m.role == "user"]
    return reply("notes: " + " | ".join(notes))


def provider() -> ScriptedProvider:
    return ScriptedProvider(script)


class GatedModel:
    """`script`, except that its second turn waits for ``gate`` (after setting ``asked``): the
    moment a test closes an app, or cancels a run, with the run in flight."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.gate = asyncio.Event()
        self.turns = 0

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        self.turns += 1
        if self.turns == 2:
            self.asked.set()
            await self.gate.wait()
        return script(messages)


async def until(check: Callable[[], Awaitable[object]], what: str) -> None:
    """Wait until ``check()`` is truthy; fail saying ``what`` did not happen."""
    deadline = asyncio.get_running_loop().time() + 90
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"{what} did not happen"
        await asyncio.sleep(0.05)


def naps_begun(app: onward.App, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """An event set whenever a stream of ``app`` begins a nap: a stream's turn that found
    nothing new ends in one, once it has said what it waits on."""
    begun = asyncio.Event()
    real_nap = app.nap

    async def nap(
        stream: RunStream,
        seconds: float,
        *,
        most_s: float | None = None,
        heed_after_s: float = 0.0,
    ) -> None:
        begun.set()
        await real_nap(stream, seconds, most_s=most_s, heed_after_s=heed_after_s)

    monkeypatch.setattr(app, "nap", nap)
    return begun


async def one_more_turn(stream: RunStream, begun: asyncio.Event) -> None:
    """Wake ``stream`` from its nap and return once it has taken another turn (`naps_begun`):
    whatever that turn would say (a line said once only, said again) is said by then."""
    begun.clear()
    stream.wake()
    try:
        await asyncio.wait_for(begun.wait(), 30)
    except TimeoutError:
        pytest.fail(f"the stream of run {stream.run_id!r} took no turn within 30 s of a wake")


async def until_completed(app: onward.App, run_id: str) -> None:
    """Wait until the run has completed (read through the app, from the log)."""

    async def completed() -> bool:
        state = await app.get_session_state(run_id)
        return state is not None and state.status == "completed"

    await until(completed, f"the end of {run_id}")


def app_process(env: dict[str, str], *argv: str) -> list[dict[str, object]]:
    """Run this module as an application process in ``env``; the messages it printed."""
    done = subprocess.run(
        [sys.executable, "-m", "support.appapi", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def as_json(message: RunMessage) -> str:
    """What the application process prints of a message."""
    return json.dumps(
        {
            "type": message.type,
            "seq": message.seq,
            "part": message.part,
            "content": message.content,
            "request_id": message.request_id,
            "tool_name": message.tool_name,
            "output": message.output,
            "status": message.status,
        }
    )


async def _main(argv: list[str]) -> None:
    async with onward.open(agents=agents, provider=provider()) as app:
        if argv[0] == "query":
            stream = app.query("pay 5", {"agent": argv[1], "run_id": argv[2], "user": "ann"})
        else:
            value = json.loads(argv[2]) if len(argv) > 2 else None
            after = (int(argv[3]), int(argv[4])) if len(argv) > 4 else (0, -1)
            stream = app.resume(argv[1], value, after=after, follow_waits=False)
        async for message in stream:
            print(as_json(message), flush=True)
            if message.is_hil_request and argv[0] == "query":
                break  # the person answers later, from another process


async def refuse_every_start(app: onward.App, monkeypatch: pytest.MonkeyPatch) -> None:
    """Have the app's worker refuse each start for good, as its runner refuses a value the
    app does not check before handing the start on (a value JSON cannot hold is refused by
    the app itself, `InvalidInputError` as the stream is read, as in a fleet)."""
    worker = app._worker
    assert worker is not None

    async def refuse(*args: Any, **kwargs: Any) -> Any:
        raise InvalidInputError("input cannot be recorded: refused by this runner")

    monkeypatch.setattr(worker.runner, "run", refuse)


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1:]))
