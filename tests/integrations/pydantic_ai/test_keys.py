"""A call the log knows is dispatched again with the key recorded for it, never a derived one.

The run books seat 3A (call b1) and the process dies after the booking took effect, before its
outcome is recorded. Then the way keys are derived changes (a new release), and the run is
resumed: b1 is dispatched again (a retry-safe tool, or a person approved it to run again) and
must carry the key the log recorded, or the booking system would not know it for a repeat. The
model's next call (b2, asked for after the change) gets a key of the new derivation. On
embedded SQLite and on Kafka + PostgreSQL + Redis.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults
from support.servers import KafkaServers
from support.stores import Stores, kafka_stores, sqlite_stores

import onward.integrations.pydantic_ai as integration
from integrations.pydantic_ai.world import Crash, Faults, Script, booking_agent, durability_on
from onward.eventlog import ModelAnswered, ToolDispatched
from onward.runtime.demo_ledger import Ledger
from onward.runtime.tools import idempotency_key

RUN = "r-keys"
Opener = Callable[[], AbstractAsyncContextManager[Stores]]


class TwoBookings(Script):
    """Books 3A (b1); once that returned, books 4B (b2); then reports."""

    def answer(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.asked += 1
        answered = sum(isinstance(m, ModelResponse) for m in messages)
        if answered == 0:
            return ModelResponse(
                parts=[TextPart("booking"), ToolCallPart("book", {"seat": "3A"}, tool_call_id="b1")]
            )
        if answered == 1:
            return ModelResponse(parts=[ToolCallPart("book", {"seat": "4B"}, tool_call_id="b2")])
        return ModelResponse(parts=[TextPart("both booked")])


@pytest.fixture(params=["sqlite", pytest.param("kafka", marks=pytest.mark.kafka)])
def stores_of_the_run(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """Opens the run's stores, afresh each time (as a new process would)."""
    if request.param == "sqlite":
        return lambda: sqlite_stores(tmp_path / "onward.db")
    servers: KafkaServers = request.getfixturevalue("kafka_servers")
    return lambda: kafka_stores(*servers)


def new_derivation(run_id: str, call_id: str) -> str:
    return f"new-{call_id}"


def derive_keys_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every module of the integration that derives keys now derives them the new way."""
    patched = []
    for found in pkgutil.iter_modules(integration.__path__):
        module = importlib.import_module(f"{integration.__name__}.{found.name}")
        if getattr(module, "idempotency_key", None) is idempotency_key:
            monkeypatch.setattr(module, "idempotency_key", new_derivation)
            patched.append(found.name)
    assert patched, "the integration derives keys somewhere: new calls need them"


async def crash_after_booking_3a(open_stores: Opener, ledger: Ledger, *, retry_safe: bool) -> str:
    """Start the run and die once b1 took effect; the key b1 was dispatched with."""
    async with open_stores() as stores:
        durability = durability_on(stores, worker="first")
        script = TwoBookings(faults=Faults({"after_effect"}))
        agent = booking_agent(
            durability, ledger, script, book_options={"retry_safe": True} if retry_safe else None
        )
        with pytest.raises(Crash):
            await durability.run(agent, "book 3A, then 4B", run_id=RUN)
    [booked] = ledger.entries()
    assert booked["key"] == idempotency_key(RUN, "b1")
    return str(booked["key"])


async def dispatches_of(stores: Stores) -> list[tuple[str, str]]:
    recorded = [stored.event for stored in await stores.log.read_run(RUN)]
    return [(e.call_id, e.idempotency_key) for e in recorded if isinstance(e, ToolDispatched)]


async def asked_keys(stores: Stores) -> list[tuple[str, str]]:
    recorded = [stored.event for stored in await stores.log.read_run(RUN)]
    return [
        (call.call_id, call.idempotency_key)
        for e in recorded
        if isinstance(e, ModelAnswered)
        for call in e.tool_calls
    ]


async def test_a_retry_safe_call_is_dispatched_again_with_its_recorded_key(
    stores_of_the_run: Opener, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    recorded = await crash_after_booking_3a(stores_of_the_run, ledger, retry_safe=True)
    derive_keys_anew(monkeypatch)

    async with stores_of_the_run() as stores:
        durability = durability_on(stores, worker="second")
        agent = booking_agent(durability, ledger, TwoBookings(), book_options={"retry_safe": True})
        done = await durability.resume(agent, RUN)

        assert done.status == "completed"
        assert [(e["seat"], e["key"]) for e in ledger.entries()] == [
            ("3A", recorded),
            ("3A", recorded),
            ("4B", "new-b2"),
        ]
        assert await dispatches_of(stores) == [("b1", recorded), ("b1", recorded), ("b2", "new-b2")]
        assert await asked_keys(stores) == [("b1", recorded), ("b2", "new-b2")]


async def test_a_call_approved_to_run_again_shows_and_carries_its_recorded_key(
    stores_of_the_run: Opener, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    recorded = await crash_after_booking_3a(stores_of_the_run, ledger, retry_safe=False)
    derive_keys_anew(monkeypatch)

    async with stores_of_the_run() as stores:
        durability = durability_on(stores, worker="second")
        agent = booking_agent(durability, ledger, TwoBookings())
        waiting = await durability.resume(agent, RUN)

        assert waiting.status == "waiting"
        assert isinstance(waiting.output, DeferredToolRequests)
        assert waiting.output.metadata["b1"]["onward"]["idempotency_key"] == recorded
        pending = await durability.pending(RUN)
        assert pending.requests is not None
        assert pending.requests.metadata["b1"]["onward"]["idempotency_key"] == recorded

        await durability.decide(RUN, DeferredToolResults(approvals={"b1": True}), by="alice")
        done = await durability.resume(agent, RUN)

        assert done.status == "completed"
        assert [(e["seat"], e["key"]) for e in ledger.entries()] == [
            ("3A", recorded),
            ("3A", recorded),
            ("4B", "new-b2"),
        ]
        assert await dispatches_of(stores) == [("b1", recorded), ("b1", recorded), ("b2", "new-b2")]
