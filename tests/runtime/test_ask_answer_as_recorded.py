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
from pydantic import BaseModel, ConfigDict

from onward.errors import InvalidInputError
from onward.eventlog import SqliteEventLog, ToolCall
from onward.runtime.agent import Agent
from onward.runtime.ask import ask, ask_request, check_answer, json_schema_of
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.runner import AgentRunner
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
