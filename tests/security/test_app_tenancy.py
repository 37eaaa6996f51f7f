"""The application API reads and answers a run only for its tenant (security review #5, #6).

An application that forwards a user's run id must not reach another tenant's run with it: every
call is for a tenant (the call's ``tenant=`` or the app's), and another tenant's run answers as
no run at all. A start that loses the race for its run id to another tenant's start ends its
stream with an error instead of following the winner's run.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from support.appapi import agents, provider

import onward
from onward.errors import InvalidInputError, NothingToResumeError, RunTimeoutError
from onward.runtime.application.messages import RunMessage
from onward.runtime.resumer import Resumer
from onward.runtime.settings import Settings


@pytest.fixture(params=["sqlite", "memory"])
def settings(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    monkeypatch.setenv("APP_LEDGER", str(tmp_path / "ledger.jsonl"))
    return Settings(backend=request.param, sqlite_path=tmp_path / "onward.db")


@pytest_asyncio.fixture
async def app(settings: Settings) -> AsyncIterator[onward.App]:
    async with onward.open(settings, agents=agents, provider=provider()) as opened:
        yield opened


async def waiting_payment(app: onward.App, run_id: str, tenant: str) -> RunMessage:
    """Start a payment of ``tenant`` and return the approval request it waits on."""
    options = {"agent": "payer", "run_id": run_id, "tenant": tenant, "user": "ann"}
    async for message in app.query("pay 5", options, follow_waits=False):
        if message.is_hil_request:
            return message
    raise AssertionError("the payment never asked for approval")


async def test_a_run_id_alone_reads_and_answers_nothing(app: onward.App) -> None:
    """Security review #6: get_session_state, resume(run_id, value) and list_pending without a
    tenant had read and answered any tenant's run."""
    asked = await waiting_payment(app, "ticket-7", "acme")

    assert app.tenant == "default"
    assert await app.get_session_state("ticket-7") is None
    assert await app.get_session_state("ticket-7", tenant="evil") is None
    with pytest.raises(NothingToResumeError, match="no run 'ticket-7' for tenant 'default'"):
        await app.resume("ticket-7", {"ok": True}).__anext__()
    assert await app.manager.list_pending() == []
    with pytest.raises(NothingToResumeError):
        await app.manager.get_status("ticket-7")

    state = await app.get_session_state("ticket-7", tenant="acme")
    assert state is not None
    assert state.status == "waiting"
    assert state.waiting_on == asked.request_id
    assert [s.summary.run_id for s in await app.manager.list_pending(tenant="acme")] == ["ticket-7"]


async def test_an_app_bound_to_a_tenant_acts_for_it_alone(settings: Settings) -> None:
    """Security review #6: a caller context bound to one tenant (``onward.open(tenant=...)``)."""
    async with onward.open(settings, agents=agents, provider=provider(), tenant="acme") as acme:
        await waiting_payment(acme, "ticket-7", "acme")
        await waiting_payment(acme, "ticket-8", "other")
        state = await acme.get_session_state("ticket-7")
        assert state is not None
        assert state.tenant == "acme"
        assert await acme.get_session_state("ticket-8") is None
        pending = await acme.manager.list_pending()
        assert [s.summary.run_id for s in pending] == ["ticket-7"]
        messages = await acme.resume("ticket-7", {"ok": True}).collect()
        assert messages[-1].is_result
        assert messages[-1].tenant == "acme"
        started = await acme.query("pay 5", {"agent": "payer"}, follow_waits=False).collect()
        assert started[0].tenant == "acme"


async def test_a_start_that_lost_its_run_id_to_another_tenant_does_not_follow_it(
    app: onward.App,
) -> None:
    """Security review #5: two tenants start one id at once; the loser's stream had adopted the
    winner's tenant and shown (and could answer) the winner's run."""
    first = app.query("pay 5", {"agent": "payer", "run_id": "s-1", "tenant": "evil"})
    second = app.query("pay 5", {"agent": "payer", "run_id": "s-1", "tenant": "acme"})

    won, lost = await asyncio.gather(first.__anext__(), second.__anext__(), return_exceptions=True)

    assert isinstance(won, RunMessage)
    assert won.tenant == "evil"
    assert isinstance(lost, InvalidInputError)
    assert "already exists" in str(lost)
    assert "evil" not in str(lost)
    with pytest.raises(StopAsyncIteration):
        await second.__anext__()


async def test_a_start_refused_under_another_tenants_run_id_ends_none_of_that_runs_streams(
    app: onward.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app's worker refuses a start whose id another tenant's run took (it landed as the
    start looked the id up). Its refusal is the refused start's streams' alone: the run's
    own stream, waiting on its person, went on waiting rather than end saying "the run could
    not be started" (naming the other tenant)."""
    looked = Resumer.exists
    theirs: list[onward.RunStream] = []

    async def looked_then_taken(self: Resumer, run_id: str) -> bool:
        found = await looked(self, run_id)
        if not theirs:
            stream = app.query(
                "pay 5", {"agent": "payer", "run_id": "s-2", "tenant": "evil"}, timeout=2
            )
            theirs.append(stream)
            async for message in stream:
                if message.is_hil_request:
                    break
        return found

    monkeypatch.setattr(Resumer, "exists", looked_then_taken)
    mine = app.query("pay 5", {"agent": "payer", "run_id": "s-2", "tenant": "acme"})
    with pytest.raises(InvalidInputError, match="already exists"):
        await asyncio.wait_for(mine.__anext__(), 30)
    with pytest.raises(RunTimeoutError, match="waits on an answer"):
        await asyncio.wait_for(theirs[0].__anext__(), 30)
