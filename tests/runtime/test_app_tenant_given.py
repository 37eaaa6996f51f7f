"""A tenant a call names is the tenant it acts for, never the app's in its place.

An application serving several tenants passes each request's tenant on each call (``tenant=``).
A tenant that came out empty (a missing claim, an unset header) is no tenant: the call must be
refused naming it, not quietly act for the app's own tenant, whose runs the caller may not see
or touch. Runs on the embedded SQLite file, memory and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from support.appapi import agents, provider

import onward
from onward.errors import InvalidInputError
from onward.runtime.settings import Settings

APP_TENANT = "acme"


@pytest.fixture(params=["sqlite", "memory", "postgres"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    if request.param == "postgres":
        return Settings(
            backend="postgres",
            database_url=request.getfixturevalue("database_url"),
            database_schema=request.getfixturevalue("pg_schema"),
        )
    return Settings(backend=request.param, sqlite_path=tmp_path / "onward.db")


@pytest_asyncio.fixture
async def app(settings: Settings) -> AsyncIterator[onward.App]:
    async with onward.open(
        settings, agents=agents, provider=provider(), tenant=APP_TENANT
    ) as opened:
        yield opened


async def test_an_empty_tenant_is_refused_not_taken_for_the_app_s(app: onward.App) -> None:
    async for message in app.query("pay 5", {"agent": "payer", "run_id": "acme-pay"}):
        if message.is_hil_request:
            break
    with pytest.raises(InvalidInputError, match="tenant"):
        await app.get_session_state("acme-pay", tenant="")
    with pytest.raises(InvalidInputError, match="tenant"):
        await app.resume("acme-pay", tenant="").__anext__()
    with pytest.raises(InvalidInputError, match="tenant"):
        await app.resume("acme-pay", {"ok": True}, tenant="").__anext__()
    with pytest.raises(InvalidInputError, match="tenant"):
        await app.cancel("acme-pay", by="ops", tenant="")
    state = await app.get_session_state("acme-pay")
    assert state is not None
    assert (state.tenant, state.status) == (APP_TENANT, "waiting")
