"""An answer whose string is not of the ``format`` its question's schema names is refused
where it is given, and the run keeps waiting.

``ask(..., schema=datetime.date)`` records ``{"type": "string", "format": "date"}``. A JSON
Schema validator only annotates ``format`` unless told to assert it, so "tomorrow" would fit
the recorded schema, be written as the answer, and then fail the type in the tool's code: the
call would end with an error and its question be gone, instead of the person being told at
once and asked again.
"""

from __future__ import annotations

import datetime
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from onward.errors import InvalidInputError
from onward.eventlog import SqliteEventLog, ToolCall
from onward.runtime.agent import Agent
from onward.runtime.ask import ask, ask_request, check_answer, json_schema_of
from onward.runtime.providers import ScriptedProvider, reply
from onward.runtime.runner import AgentRunner
from onward.runtime.tools import tool

TENANT = "acme"
QUESTION = ask_request("d", 0)


async def test_an_answer_that_is_no_date_is_refused_and_the_run_still_waits(
    tmp_path: Path,
) -> None:
    booked: list[datetime.date] = []

    @tool
    async def book(*, idempotency_key: str) -> str:
        day: datetime.date = ask("which day?", schema=datetime.date)
        booked.append(day)
        return day.isoformat()

    agent = Agent(name="booker", instructions="", tools=[book])
    provider = ScriptedProvider([reply("", ToolCall(call_id="d", tool="book")), reply("done")])
    async with SqliteEventLog(tmp_path / "onward.db") as log:
        runner = AgentRunner(provider=provider, log=log, worker="w")
        assert (await runner.run(agent, "book", tenant=TENANT, run_id="q")).waiting_on == QUESTION
        with pytest.raises(InvalidInputError, match=r"is not a 'date'.*still waits"):
            await runner.approve("q", QUESTION, tenant=TENANT, by="ann", value="tomorrow")
        still = await runner.inspect("q", tenant=TENANT)
        assert (still.status, still.waiting_on) == ("waiting", QUESTION)
        await runner.approve("q", QUESTION, tenant=TENANT, by="ann", value="2030-01-02")
        assert (await runner.resume(agent, "q", tenant=TENANT)).status == "completed"
    assert booked == [datetime.date(2030, 1, 2)]


@pytest.mark.parametrize(
    ("kind", "good", "bad"),
    [
        (datetime.date, "2030-01-02", "02/01/2030"),
        (datetime.datetime, "2030-01-02T03:04:05Z", "soon"),
        (datetime.time, "03:04:05", "25:99"),
        (datetime.timedelta, "PT1H", "an hour"),
        (uuid.UUID, str(uuid.UUID(int=7)), "not-a-uuid"),
    ],
)
def test_each_format_a_type_records_is_checked_as_the_type_reads_it(
    kind: Any, good: str, bad: str
) -> None:
    recorded, adapter = json_schema_of(kind)
    assert recorded is not None
    assert adapter is not None
    text = json.dumps(recorded)
    check_answer(text, good, run_id="q", request_id=QUESTION)
    adapter.validate_python(good)  # what the tool's code gets
    with pytest.raises(InvalidInputError, match="does not fit its schema"):
        check_answer(text, bad, run_id="q", request_id=QUESTION)
