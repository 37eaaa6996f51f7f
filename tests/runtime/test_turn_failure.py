"""A turn that fails part way stops every call of the turn before its lease goes.

A turn makes its calls together. When one of them fails in a way that is not the tool's (its
outcome cannot be recorded: the log's server went away), the run stops and its lease is
released, so another worker (or a retry) may carry the run on at once. A sibling call still
running then would be making its effect outside any lease while the resume, finding no outcome
for it, asks its status check, hears "never ran", and makes it again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from support.proxy import TcpProxy
from support.runners import log_runner

from onward.errors import BackendUnavailableError
from onward.eventlog import PostgresEventLog, ToolCall
from onward.runtime import Agent, ScriptedProvider, reply
from onward.runtime.leases import SqliteLeaseStore
from onward.runtime.tools import Reconciled, tool
from onward.testing.eventlog import new_run_id

TENANT = "acme"


def through(url: str, proxy: TcpProxy) -> str:
    parts = urlsplit(url)
    credentials = parts.netloc.rsplit("@", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{credentials}@{proxy.host}:{proxy.port}"))


class Ledger:
    """What the two tools really did, whatever the log says; their status checks read it."""

    def __init__(self, proxy: TcpProxy) -> None:
        self.proxy = proxy
        self.made: dict[str, int] = {}
        self.slow_entered = 0
        self.slow_started = asyncio.Event()
        self.slow_again = asyncio.Event()
        self.go = asyncio.Event()

    def agent(self) -> Agent:
        async def status(key: str) -> Reconciled:
            return Reconciled("completed", "done") if key in self.made else Reconciled("never_ran")

        @tool(reconcile=status)
        async def quick(*, idempotency_key: str) -> str:
            """Done at once; the log's server goes away as it returns (the first time)."""
            self.made[idempotency_key] = self.made.get(idempotency_key, 0) + 1
            if self.made[idempotency_key] == 1:
                await self.slow_started.wait()
                await self.proxy.cut()
            return "quick done"

        @tool(reconcile=status)
        async def slow(*, idempotency_key: str) -> str:
            """Takes its time: a payment waiting on its provider."""
            self.slow_entered += 1
            self.slow_started.set()
            if self.slow_entered == 2:
                self.slow_again.set()
            await self.go.wait()
            self.made[idempotency_key] = self.made.get(idempotency_key, 0) + 1
            return "slow done"

        return Agent(name="payer", instructions="pay", tools=[quick, slow])


def model() -> ScriptedProvider:
    return ScriptedProvider(
        [
            reply(
                "",
                ToolCall(call_id="q", tool="quick", args={}),
                ToolCall(call_id="s", tool="slow", args={}),
            ),
            reply("done"),
        ]
    )


async def test_a_sibling_call_is_stopped_when_the_turn_fails_so_it_is_made_once(
    tmp_path: Path, database_url: str, pg_schema: str
) -> None:
    parts = urlsplit(database_url)
    assert parts.hostname is not None
    assert parts.port is not None
    async with (
        TcpProxy(parts.hostname, parts.port) as proxy,
        PostgresEventLog(through(database_url, proxy), schema=pg_schema, timeout_s=1.0) as log,
        await SqliteLeaseStore.open(tmp_path / "leases.db") as leases,
    ):
        ledger = Ledger(proxy)
        run_id = new_run_id()
        with pytest.raises(BackendUnavailableError):
            await log_runner(model(), log, leases, worker="w1").run(
                ledger.agent(), "pay", tenant=TENANT, run_id=run_id
            )

        await proxy.restore()
        resuming = asyncio.create_task(
            log_runner(model(), log, leases, worker="w2").resume(
                ledger.agent(), run_id, tenant=TENANT
            )
        )
        again = asyncio.create_task(ledger.slow_again.wait())
        await asyncio.wait({resuming, again}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        again.cancel()
        ledger.go.set()
        result = await asyncio.wait_for(resuming, 30)
        await asyncio.sleep(0.1)  # a call left running from the failed turn ends meanwhile

        assert result.status == "completed"
        assert sorted(ledger.made.values()) == [1, 1], ledger.made
