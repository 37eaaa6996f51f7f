"""An answer that reaches a run after it ended is refused, and never carries the run on.

A run waiting on a person can be cancelled (`onward cancel`, `App.cancel`) while an answer to
its question is on its way (a person's second tab, an `AnswerRequest` still on the requests
topic). The cancel ends the run; the answer must then find nothing to answer: a cancelled run
that an answer made ``running`` again would be carried on by the next resume, its tool making
the effect the person cancelled the run to prevent.

On the embedded SQLite file and on PostgreSQL alone, through the runner a person's answer goes
through (`AgentRunner.approve` / `deny`), and in the fold, whatever wrote the events.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.ask_world import refund_agent, refund_provider

from onward.errors import InvalidInputError
from onward.eventlog import (
    ApprovalGranted,
    ApprovalRequested,
    Position,
    RunFinished,
    RunStarted,
    StoredEvent,
)
from onward.projections.frontier import Frontier, fold_all
from onward.runtime.ask import ask_request
from onward.runtime.backends import open_backends
from onward.runtime.demo_ledger import Ledger
from onward.runtime.settings import Settings

TENANT = "acme"
QUESTION = ask_request("r", 0)


@pytest.fixture(params=["sqlite", "postgres"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    if request.param == "postgres":
        url, schema = request.getfixturevalue("database_url"), request.getfixturevalue("pg_schema")
        return Settings(backend="postgres", database_url=url, database_schema=schema)
    return Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db")


@pytest.mark.parametrize("granted", [True, False], ids=["approve", "deny"])
async def test_an_answer_after_a_cancel_is_refused_and_the_run_stays_cancelled(
    settings: Settings, tmp_path: Path, granted: bool
) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    agent = refund_agent(ledger)
    async with open_backends(settings) as backends:
        runner = backends.runner(refund_provider(), worker="w")
        waiting = await runner.run(agent, "refund A-1", tenant=TENANT, run_id="q")
        assert waiting.waiting_on == QUESTION
        await runner.cancel("q", tenant=TENANT, by="ops", why="wrong order")
        ended = await runner.inspect("q", tenant=TENANT)
        assert ended.status == "cancelled"

        answer = runner.approve if granted else runner.deny
        with pytest.raises(InvalidInputError, match=r"has ended already \(cancelled\)"):
            await answer("q", QUESTION, tenant=TENANT, by="ann", value=40 if granted else None)
        after = await runner.inspect("q", tenant=TENANT)
        assert (after.status, after.last_seq) == ("cancelled", ended.last_seq)
        assert (await runner.resume(agent, "q", tenant=TENANT)).status == "cancelled"
    # The refund the person cancelled the run to stop was never made.
    assert [e for e in ledger.entries() if e["tool"] == "refund"] == []


def test_a_grant_folded_after_the_end_does_not_open_the_run_again() -> None:
    """A log another writer (or an earlier release) wrote with a grant after the run's end."""
    run: dict[str, Any] = {"run_id": "q", "tenant": TENANT, "at": 1}
    events: list[Any] = [
        RunStarted(**run, seq=1, fence=1, agent="a", revision="r1", input="x"),
        ApprovalRequested(**run, seq=2, fence=1, request_id=QUESTION, prompt="how much?"),
        RunFinished(**run, seq=3, fence=2, status="cancelled", error="ops"),
        ApprovalGranted(**run, seq=4, fence=3, request_id=QUESTION, by="ann", value=40),
    ]
    stored = [StoredEvent(Position(0, i), e) for i, e in enumerate(events)]
    frontier = fold_all(Frontier.empty("q", TENANT), stored)
    assert (frontier.status, frontier.waiting_on, frontier.grants) == ("cancelled", None, ())
