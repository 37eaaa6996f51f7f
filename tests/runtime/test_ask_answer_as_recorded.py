"""An answer is a JSON value: checked as the log records it, and read by ``ask`` as JSON.

A JSON Schema validator takes a ``Decimal`` for a number, but the log writes one as a string: an
answer checked as given would pass ``{"type": "number"}`` and reach the tool's code as text. And
a strict pydantic type takes ``"2030-01-02"`` for a date from JSON but not from Python: read as
Python, an answer that fit the recorded schema would fail the tool's code, its question gone.
"""

from __future__ import annotations

import datetime
import decimal
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, SecretStr
from support.servers import REQUEST_KEY

import onward
from onward.errors import InvalidInputError
from onward.eventlog import SqliteEventLog, ToolCall
from onward.runtime.agent import Agent
from onward.runtime.ask import ask, ask_request, check_answer, json_schema_of
from onward.runtime.backends import open_backends
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.runner import AgentRunner
from onward.runtime.settings import SecretUrl, Settings
from onward.runtime.tools import tool

TENANT = "acme"
QUESTION = ask_request("r", 0)


async def test_a_decimal_answer_to_a_number_question_is_refused_not_recorded_as_text(
    tmp_path: Path,
) -> None:
    got: list[Any] = []

    @tool
    async def refund(*, idempotency_key: str) -> str:
        amount = ask("refund how much?", schema={"type": "number"})
        got.append(amount)
        return f"refunded {amount}"

    agent = Agent(name="refunder", instructions="", tools=[refund])
    provider = ScriptedProvider([reply("", ToolCall(call_id="r", tool="refund")), reply("done")])
    async with SqliteEventLog(tmp_path / "onward.db") as log:
        runner = AgentRunner(provider=provider, log=log, worker="w")
        assert (await runner.run(agent, "go", tenant=TENANT, run_id="q")).waiting_on == QUESTION
        before = await runner.inspect("q", tenant=TENANT)
        with pytest.raises(InvalidInputError, match=r"'12\.50' is not of type 'number'"):
            await runner.approve(
                "q", QUESTION, tenant=TENANT, by="ann", value=decimal.Decimal("12.50")
            )
        still = await runner.inspect("q", tenant=TENANT)
        assert (still.status, still.waiting_on, still.last_seq) == (
            "waiting",
            QUESTION,
            before.last_seq,
        )
        await runner.approve("q", QUESTION, tenant=TENANT, by="ann", value=12.5)
        assert (await runner.resume(agent, "q", tenant=TENANT)).status == "completed"
    assert got == [12.5]


def test_an_answer_is_checked_in_the_form_it_is_recorded_in() -> None:
    day, _ = json_schema_of(datetime.date)
    # Recorded as "2030-01-02", which fits the question's schema.
    check_answer(json.dumps(day), datetime.date(2030, 1, 2), run_id="q", request_id=QUESTION)
    with pytest.raises(InvalidInputError, match="cannot be recorded: nan"):
        check_answer('{"type": "number"}', float("nan"), run_id="q", request_id=QUESTION)


class Booking(BaseModel):
    model_config = ConfigDict(strict=True)

    day: datetime.date
    seats: int


async def test_a_strict_model_gets_the_answer_that_fit_its_schema(tmp_path: Path) -> None:
    booked: list[Booking] = []

    @tool
    async def book(*, idempotency_key: str) -> str:
        booked.append(ask("which day, how many seats?", schema=Booking))
        return "booked"

    agent = Agent(name="booker", instructions="", tools=[book])
    provider = ScriptedProvider([reply("", ToolCall(call_id="r", tool="book")), reply("done")])
    async with SqliteEventLog(tmp_path / "onward.db") as log:
        runner = AgentRunner(provider=provider, log=log, worker="w")
        await runner.run(agent, "go", tenant=TENANT, run_id="q")
        answer = {"day": "2030-01-02", "seats": 2}
        await runner.approve("q", QUESTION, tenant=TENANT, by="ann", value=answer)
        assert (await runner.resume(agent, "q", tenant=TENANT)).status == "completed"
    assert booked == [Booking(day=datetime.date(2030, 1, 2), seats=2)]


async def test_an_answer_whose_masked_form_does_not_fit_is_refused_naming_the_masking(
    tmp_path: Path,
) -> None:
    """A number under a secret's name is recorded as the mask: checked unmasked, it passed,
    and the tool read ``"[REDACTED]"`` for the number it asked for (a fleet's worker refused
    it only in its log, the app's caller told it was sent)."""
    got: list[Any] = []

    @tool
    async def join(*, idempotency_key: str) -> str:
        got.append(ask("which session?", schema=Joining))
        return "joined"

    agent = Agent(name="joiner", instructions="", tools=[join])
    provider = ScriptedProvider([reply("", ToolCall(call_id="r", tool="join")), reply("done")])
    async with SqliteEventLog(tmp_path / "onward.db") as log:
        runner = AgentRunner(provider=provider, log=log, worker="w")
        await runner.run(agent, "go", tenant=TENANT, run_id="q")
        with pytest.raises(InvalidInputError, match="masked") as refused:
            await runner.approve("q", QUESTION, tenant=TENANT, by="ann", value={"session": 3})
        assert "session: '[REDACTED]' is not valid" in str(refused.value)
        assert (await runner.inspect("q", tenant=TENANT)).waiting_on == QUESTION
        await runner.approve("q", QUESTION, tenant=TENANT, by="ann", value={"session": None})
        assert (await runner.resume(agent, "q", tenant=TENANT)).status == "completed"
    assert got == [Joining(session=None)]


class Joining(BaseModel):
    session: int | None


async def test_a_fleet_app_refuses_an_answer_its_requests_would_send_masked(
    database_url: str, pg_schema: str, tmp_path: Path
) -> None:
    """A fleet's app checked the answer unmasked and sent it masked: the worker refused it,
    only in its log, while the caller was told it was sent and its stream waited."""

    @tool
    async def join(*, idempotency_key: str) -> str:
        return f"joined {ask('which session?', schema=Joining)}"

    agent = Agent(name="joiner", instructions="", tools=[join])
    provider = ScriptedProvider([reply("", ToolCall(call_id="r", tool="join")), reply("done")])
    settings = Settings(
        backend="postgres", database_url=SecretUrl(database_url), database_schema=pg_schema
    )
    async with open_backends(settings) as backends:
        runner = backends.runner(provider, worker="w")
        await runner.run(agent, "go", tenant=TENANT, run_id="q")
    fleet = settings.model_copy(update={"app_mode": "fleet", "request_key": SecretStr(REQUEST_KEY)})
    async with onward.open(fleet) as app:
        stream = app.resume("q", tenant=TENANT, timeout=30)
        question = await anext(m async for m in stream if m.is_hil_request)
        with pytest.raises(InvalidInputError, match="masked"):
            await question.respond({"session": 3}, by="ann")
        await question.respond({"session": None}, by="ann")
